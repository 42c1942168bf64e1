//! Human output (aligned tables, timestamps) and JSON views.

use lks_proto::convert::bundle_state_from_i32;
use lks_proto::pb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `-o` formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Unix ms as RFC 3339 (UTC, whole seconds); `None` for 0.
pub fn rfc3339_ms(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    rfc3339_s(ms / 1000)
}

pub fn rfc3339_s(s: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(s).ok()?.format(&Rfc3339).ok()
}

fn or_dash(s: Option<String>) -> String {
    s.unwrap_or_else(|| "-".into())
}

/// Columns padded to their widest cell, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            s.push_str(c);
            if i + 1 < n {
                s.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

pub fn bundle_state_str(v: i32) -> &'static str {
    bundle_state_from_i32(v).map_or("pending", |s| s.as_str())
}

pub fn rollout_state_str(v: i32) -> &'static str {
    match pb::RolloutState::try_from(v) {
        Ok(pb::RolloutState::Running) => "running",
        Ok(pb::RolloutState::Paused) => "paused",
        Ok(pb::RolloutState::Completed) => "completed",
        Ok(pb::RolloutState::Failed) => "failed",
        Ok(pb::RolloutState::Aborted) => "aborted",
        Ok(pb::RolloutState::RolledBack) => "rolled_back",
        Ok(pb::RolloutState::RollingBack) => "rolling_back",
        _ => "unknown",
    }
}

fn labels_json(l: &std::collections::HashMap<String, String>) -> Value {
    let sorted: std::collections::BTreeMap<_, _> = l.iter().collect();
    json!(sorted)
}

pub fn labels_text(l: &std::collections::HashMap<String, String>) -> String {
    let sorted: std::collections::BTreeMap<_, _> = l.iter().collect();
    let s = sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    if s.is_empty() { "-".into() } else { s }
}

pub fn node_json(n: &pb::Node) -> Value {
    json!({
        "name": n.name,
        "cluster": n.cluster,
        "labels": labels_json(&n.labels),
        "connected": n.connected,
        "last_seen": rfc3339_ms(n.last_seen_ms),
        "bundles": n.bundles.iter().map(|b| json!({
            "name": b.name,
            "version": b.version,
            "state": bundle_state_str(b.state),
            "message": b.message,
            "fetched_from_server": b.fetched_from_server,
            "fetched_from_peers": b.fetched_from_peers,
        })).collect::<Vec<_>>(),
        "facts": n.facts.as_ref().map(|f| json!({
            "hostname": f.hostname,
            "os": f.os,
            "kernel": f.kernel,
            "arch": f.arch,
            "cpus": f.cpus,
            "memory_bytes": f.memory_bytes,
            "agent_version": f.agent_version,
            "addresses": f.addresses,
            "features": f.features,
            "architecture": (!f.architecture.is_empty()).then_some(&f.architecture),
        })),
        // Whose files of a multi-arch bundle it installs; null: not reported.
        "architecture": node_arch(n),
        "certificate_serial": n.certificate_serial,
        "enrolled_at": rfc3339_ms(n.enrolled_at_ms),
        "held": n.held,
        "hold_reason": n.held.then_some(&n.hold_reason),
        // DESIGN §6: the agent version the node last reported (its Hello).
        "agent_version": agent_version(n),
        "certificates": n.certificates.iter().map(|c| json!({
            "profile": c.profile,
            "path": c.path,
            "serial": c.serial,
            "not_after": rfc3339_ms(c.not_after_ms),
            "not_after_ms": c.not_after_ms,
            "bundle": c.bundle,
            "version": c.version,
            "state": cert_state(c, now_ms(), std::time::Duration::ZERO),
        })).collect::<Vec<_>>(),
    })
}

/// The architecture the node's agent reported (`amd64`), if any.
pub fn node_arch(n: &pb::Node) -> Option<&str> {
    n.facts
        .as_ref()
        .map(|f| f.architecture.as_str())
        .filter(|a| !a.is_empty())
}

/// Wall clock in Unix milliseconds (0 if the clock is before 1970), as
/// the server counts time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `valid`, `expiring` (less than a third of its life left, when the agent
/// should have renewed it, or within `within`), or `expired`.
pub fn cert_state(c: &pb::IssuedCertificate, now_ms: i64, within: std::time::Duration) -> &'static str {
    let left = c.not_after_ms - now_ms;
    if c.expired || left <= 0 {
        return "expired";
    }
    // The lifetime the node asked for: from issue, not from the issuer's
    // few minutes of backdating (which would make a short-lived
    // certificate look due at once).
    let third = (c.not_after_ms - c.not_before_ms.max(c.issued_at_ms)) / 3;
    let within = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
    if left < third || left <= within {
        "expiring"
    } else {
        "valid"
    }
}

/// `cluster certs -o json`: the API's fields plus `state`.
pub fn cert_json(c: &pb::IssuedCertificate, now_ms: i64, within: std::time::Duration) -> Value {
    json!({
        "cluster": c.cluster,
        "node": c.node,
        "serial": c.serial,
        "profile": c.profile,
        "bundle": c.bundle,
        "version": c.version,
        "path": c.path,
        "not_before_ms": c.not_before_ms,
        "not_after_ms": c.not_after_ms,
        "issued_at_ms": c.issued_at_ms,
        "expired": c.expired,
        "not_after": rfc3339_ms(c.not_after_ms),
        "state": cert_state(c, now_ms, within),
    })
}

pub fn certs_table(certs: &[pb::IssuedCertificate], now_ms: i64, within: std::time::Duration) -> String {
    let rows: Vec<Vec<String>> = certs
        .iter()
        .map(|c| {
            vec![
                c.node.clone(),
                c.profile.clone(),
                c.path.clone(),
                c.serial.clone(),
                or_dash(rfc3339_ms(c.not_after_ms)),
                cert_state(c, now_ms, within).into(),
            ]
        })
        .collect();
    table(
        &["NODE", "PROFILE", "PATH", "SERIAL", "NOT-AFTER", "STATE"],
        &rows,
    )
}

fn agent_version(n: &pb::Node) -> Option<&str> {
    n.facts
        .as_ref()
        .map(|f| f.agent_version.as_str())
        .filter(|v| !v.is_empty())
}

pub fn cluster_json(c: &pb::Cluster) -> Value {
    json!({
        "name": c.name,
        "nodes": c.node_count,
        "created_at": rfc3339_ms(c.created_at_ms),
        "maintenance_windows": c.maintenance_windows,
        "window_open": c.window_open,
        "next_window": (c.next_window_ms > 0).then(|| rfc3339_ms(c.next_window_ms)).flatten(),
        "window_closes": (c.window_closes_ms > 0).then(|| rfc3339_ms(c.window_closes_ms)).flatten(),
        "api_server": (!c.api_server.is_empty()).then_some(&c.api_server),
        "has_ca": c.has_ca,
        "ca_cert_hash": (!c.ca_cert_hash.is_empty()).then_some(&c.ca_cert_hash),
        "peer_sharing": c.peer_sharing.map(|p| json!({
            "port": p.port,
            "upload_rate": p.upload_rate,
            "max_uploads": p.max_uploads,
        })),
    })
}

/// A rate in bytes per second as people read it: "50 MiB/s", "1.5 GiB/s",
/// "800 B/s"; "unlimited" for 0.
pub fn rate_text(bytes_per_s: u64) -> String {
    if bytes_per_s == 0 {
        return "unlimited".into();
    }
    let units = [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in units {
        if bytes_per_s >= size {
            return if bytes_per_s % size == 0 {
                format!("{} {name}/s", bytes_per_s / size)
            } else {
                format!("{:.1} {name}/s", bytes_per_s as f64 / size as f64)
            };
        }
    }
    format!("{bytes_per_s} B/s")
}

/// A cluster's peer sharing for a table cell: "off", or "on :PORT N
/// uploads RATE".
pub fn peer_text(c: &pb::Cluster) -> String {
    match &c.peer_sharing {
        None => "off".into(),
        Some(p) => format!(
            "on :{} {} upload{} {}",
            p.port,
            p.max_uploads,
            if p.max_uploads == 1 { "" } else { "s" },
            rate_text(p.upload_rate)
        ),
    }
}

/// What `cluster get` prints.
pub fn cluster_detail(c: &pb::Cluster) -> String {
    let mut s = String::new();
    let kv = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<22}{v}\n"));
    kv(&mut s, "Name:", c.name.clone());
    kv(&mut s, "Nodes:", c.node_count.to_string());
    kv(&mut s, "Created:", or_dash(rfc3339_ms(c.created_at_ms)));
    kv(
        &mut s,
        "API server:",
        if c.api_server.is_empty() {
            "-".into()
        } else {
            c.api_server.clone()
        },
    );
    kv(
        &mut s,
        "CA:",
        if c.has_ca {
            c.ca_cert_hash.clone()
        } else {
            "none".into()
        },
    );
    kv(&mut s, "Maintenance windows:", windows_text(c));
    kv(&mut s, "Peer sharing:", peer_text(c));
    s
}

/// A cluster's windows for a table cell: "-" when none.
pub fn windows_text(c: &pb::Cluster) -> String {
    if c.maintenance_windows.is_empty() {
        return "-".into();
    }
    let state = if c.window_open {
        format!("open now, until {}", or_dash(rfc3339_ms(c.window_closes_ms)))
    } else {
        format!("closed; next {}", or_dash(rfc3339_ms(c.next_window_ms)))
    };
    format!("{} ({state})", c.maintenance_windows.join("; "))
}

/// What `cluster set` prints.
pub fn cluster_windows_line(c: &pb::Cluster) -> String {
    if c.maintenance_windows.is_empty() {
        format!(
            "cluster {}: no maintenance windows; nodes may start at any time",
            c.name
        )
    } else {
        format!("cluster {}: maintenance windows {}", c.name, windows_text(c))
    }
}

pub fn nodes_table(nodes: &[pb::Node]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                n.cluster.clone(),
                if n.connected { "yes" } else { "no" }.into(),
                or_dash(rfc3339_ms(n.last_seen_ms)),
                agent_version(n).unwrap_or("-").to_string(),
                node_arch(n).unwrap_or("-").to_string(),
                labels_text(&n.labels),
                bundles_text(&n.bundles),
                certs_text(&n.certificates),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "CLUSTER",
            "CONNECTED",
            "LAST SEEN",
            "AGENT",
            "ARCH",
            "LABELS",
            "BUNDLES",
            "CERTS",
        ],
        &rows,
    )
}

/// `-`, or how many certificates the node holds and how many of them are
/// expired or expiring (`2`, `2 (1 expired)`).
fn certs_text(c: &[pb::IssuedCertificate]) -> String {
    if c.is_empty() {
        return "-".into();
    }
    let now = now_ms();
    let mut bad: std::collections::BTreeMap<&str, usize> = Default::default();
    for cert in c {
        let st = cert_state(cert, now, std::time::Duration::ZERO);
        if st != "valid" {
            *bad.entry(st).or_default() += 1;
        }
    }
    if bad.is_empty() {
        return c.len().to_string();
    }
    let parts: Vec<String> = bad.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!("{} ({})", c.len(), parts.join(", "))
}

fn bundles_text(b: &[pb::BundleStatus]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter()
        .map(|b| format!("{}@{}:{}", b.name, b.version, bundle_state_str(b.state)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a node fetched for a version: "-" for nothing, else the total and
/// the part from peers, e.g. "64.0 MiB, 60.0 from peers".
pub fn fetched_text(from_server: u64, from_peers: u64) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    match (from_server, from_peers) {
        (0, 0) => "-".into(),
        (s, 0) => format!("{:.1} MiB", mib(s)),
        (s, p) => format!("{:.1} MiB, {:.1} from peers", mib(s + p), mib(p)),
    }
}

pub fn node_text(n: &pb::Node) -> String {
    let mut s = String::new();
    let kv = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<14}{v}\n"));
    kv(&mut s, "Name:", n.name.clone());
    kv(&mut s, "Cluster:", n.cluster.clone());
    kv(&mut s, "Labels:", labels_text(&n.labels));
    kv(
        &mut s,
        "Connected:",
        if n.connected { "yes" } else { "no" }.into(),
    );
    kv(&mut s, "Last seen:", or_dash(rfc3339_ms(n.last_seen_ms)));
    kv(&mut s, "Enrolled:", or_dash(rfc3339_ms(n.enrolled_at_ms)));
    kv(&mut s, "Certificate:", n.certificate_serial.clone());
    if n.held {
        let why = if n.hold_reason.is_empty() {
            "yes".to_string()
        } else {
            format!("yes: {}", n.hold_reason)
        };
        kv(&mut s, "Held:", why);
    }
    if let Some(f) = &n.facts {
        kv(
            &mut s,
            "Host:",
            format!("{} ({} {}, {})", f.hostname, f.os, f.kernel, f.arch),
        );
        kv(&mut s, "Agent:", f.agent_version.clone());
        kv(
            &mut s,
            "Arch:",
            node_arch(n)
                .unwrap_or("- (not reported: an agent before multi-arch bundles)")
                .to_string(),
        );
    }
    s.push_str("Bundles:\n");
    let rows: Vec<Vec<String>> = n
        .bundles
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.version.clone(),
                bundle_state_str(b.state).into(),
                fetched_text(b.fetched_from_server, b.fetched_from_peers),
                b.message.clone(),
            ]
        })
        .collect();
    for l in table(&["NAME", "VERSION", "STATE", "FETCHED", "MESSAGE"], &rows).lines() {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
    if !n.certificates.is_empty() {
        s.push_str("Certificates:\n");
        let now = now_ms();
        let rows: Vec<Vec<String>> = n
            .certificates
            .iter()
            .map(|c| {
                vec![
                    c.profile.clone(),
                    c.path.clone(),
                    c.serial.clone(),
                    or_dash(rfc3339_ms(c.not_after_ms)),
                    cert_state(c, now, std::time::Duration::ZERO).into(),
                ]
            })
            .collect();
        for l in table(&["PROFILE", "PATH", "SERIAL", "NOT-AFTER", "STATE"], &rows).lines() {
            s.push_str("  ");
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

pub fn rollout_json(r: &pb::Rollout) -> Value {
    json!({
        "id": r.id,
        "cluster": r.cluster,
        "bundle": r.bundle,
        "version": r.version,
        "selector": labels_json(&r.selector),
        "batch_size": r.batch_size,
        "failure_threshold": r.failure_threshold,
        "state": rollout_state_str(r.state),
        "total": r.total,
        "updated": r.updated,
        "failed": r.failed,
        "pending": r.pending,
        "applying": r.applying,
        "deferred": r.deferred,
        "held": r.held,
        "skipped": r.skipped,
        "rolled_back": r.rolled_back,
        "waiting_for_window": r.waiting_for_window,
        "next_window": (r.waiting_for_window && r.next_window_ms > 0)
            .then(|| rfc3339_ms(r.next_window_ms))
            .flatten(),
        "offline": r.offline,
        "canary": r.canary,
        "canary_soak": (r.canary > 0).then(|| format_secs(r.canary_soak_seconds)),
        "canary_phase": (!r.canary_phase.is_empty()).then_some(&r.canary_phase),
        "canary_soak_until": (r.canary_soak_until_ms > 0).then(|| rfc3339_ms(r.canary_soak_until_ms)).flatten(),
        "canaries": r.nodes.iter().filter(|n| n.canary).map(|n| &n.name).collect::<Vec<_>>(),
        "batch_interval": (r.batch_interval_seconds > 0).then(|| format_secs(r.batch_interval_seconds)),
        "next_batch_at": (r.next_batch_at_ms > 0).then(|| rfc3339_ms(r.next_batch_at_ms)).flatten(),
        "ignore_windows": r.ignore_windows,
        "nodes": r.nodes.iter().map(|n| json!({
            "name": n.name,
            "previous_version": n.previous_version,
            "state": n.state,
            "message": n.message,
            "canary": n.canary,
        })).collect::<Vec<_>>(),
        "created_at": rfc3339_ms(r.created_at_ms),
        "updated_at": rfc3339_ms(r.updated_at_ms),
        "message": r.message,
    })
}

fn format_secs(s: u64) -> String {
    lks_proto::duration::format_duration(std::time::Duration::from_secs(s))
}

/// Counts beyond updated/failed/pending that are not zero, e.g. ", 2 deferred".
fn extra_counts(r: &pb::Rollout) -> String {
    let mut s = String::new();
    for (n, what) in [(r.deferred, "deferred"), (r.held, "held"), (r.skipped, "skipped")] {
        if n > 0 {
            s.push_str(&format!(", {n} {what}"));
        }
    }
    s
}

/// What the rollout waits for, if anything: a window, the canaries, the
/// batch interval.
fn waiting_for(r: &pb::Rollout) -> Option<String> {
    if r.waiting_for_window {
        return Some(format!(
            "waiting for a maintenance window (next opens {})",
            or_dash(rfc3339_ms(r.next_window_ms))
        ));
    }
    match r.canary_phase.as_str() {
        "applying" => return Some("canaries applying".into()),
        "soaking" => {
            return Some(format!(
                "canaries soaking until {}",
                or_dash(rfc3339_ms(r.canary_soak_until_ms))
            ));
        }
        _ => {}
    }
    (r.next_batch_at_ms > 0 && r.applying == 0)
        .then(|| format!("next batch at {}", or_dash(rfc3339_ms(r.next_batch_at_ms))))
}

/// The progress bar's message.
pub fn rollout_progress(r: &pb::Rollout) -> String {
    let mut m = format!(
        "{} — {} updated, {} failed, {} applying, {} pending{}",
        rollout_state_str(r.state),
        r.updated,
        r.failed,
        r.applying,
        r.pending,
        extra_counts(r)
    );
    if let Some(w) = waiting_for(r) {
        m.push_str(&format!("; {w}"));
    }
    m
}

/// One line summing up a rollout's progress.
pub fn rollout_line(r: &pb::Rollout) -> String {
    let mut line = format!(
        "rollout {} {}@{} on {}: {} — {}/{} updated, {} failed, {} pending{}",
        r.id,
        r.bundle,
        r.version,
        r.cluster,
        rollout_state_str(r.state),
        r.updated,
        r.total,
        r.failed,
        r.pending,
        extra_counts(r)
    );
    if let Some(w) = waiting_for(r) {
        line.push_str(&format!("; {w}"));
    }
    line
}

pub fn rollout_text(r: &pb::Rollout) -> String {
    let mut s = String::new();
    let kv = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12}{v}\n"));
    kv(&mut s, "ID:", r.id.clone());
    kv(&mut s, "Cluster:", r.cluster.clone());
    kv(&mut s, "Bundle:", format!("{}@{}", r.bundle, r.version));
    kv(&mut s, "Selector:", labels_text(&r.selector));
    kv(&mut s, "State:", rollout_state_str(r.state).into());
    kv(
        &mut s,
        "Progress:",
        format!(
            "{}/{} updated, {} failed, {} pending ({} applying){}",
            r.updated,
            r.total,
            r.failed,
            r.pending,
            r.applying,
            extra_counts(r)
        ),
    );
    let mut policy = format!("offline nodes: {}", r.offline);
    if r.canary > 0 {
        policy.push_str(&format!(
            "; {} canary node(s), soak {}",
            r.canary,
            format_secs(r.canary_soak_seconds)
        ));
    }
    if r.batch_interval_seconds > 0 {
        policy.push_str(&format!(
            "; {} between batches",
            format_secs(r.batch_interval_seconds)
        ));
    }
    if r.ignore_windows {
        policy.push_str("; ignores maintenance windows");
    }
    kv(&mut s, "Policy:", policy);
    if let Some(w) = waiting_for(r) {
        kv(&mut s, "Waiting:", w);
    }
    kv(
        &mut s,
        "Batch:",
        format!(
            "{} node(s) at a time, stops at {} failure(s)",
            r.batch_size, r.failure_threshold
        ),
    );
    if !r.message.is_empty() {
        kv(&mut s, "Message:", r.message.clone());
    }
    kv(&mut s, "Started:", or_dash(rfc3339_ms(r.created_at_ms)));
    if !r.nodes.is_empty() {
        s.push_str("Nodes:\n");
        let rows: Vec<Vec<String>> = r
            .nodes
            .iter()
            .map(|n| {
                vec![
                    n.name.clone(),
                    if n.previous_version.is_empty() {
                        "-".into()
                    } else {
                        n.previous_version.clone()
                    },
                    if n.canary {
                        format!("{} (canary)", n.state)
                    } else {
                        n.state.clone()
                    },
                    n.message.clone(),
                ]
            })
            .collect();
        for l in table(&["NAME", "PREVIOUS", "STATE", "MESSAGE"], &rows).lines() {
            s.push_str("  ");
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

pub fn rollouts_table(rs: &[pb::Rollout]) -> String {
    let rows: Vec<Vec<String>> = rs
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.cluster.clone(),
                format!("{}@{}", r.bundle, r.version),
                rollout_state_str(r.state).into(),
                format!("{}/{}", r.updated, r.total),
                r.failed.to_string(),
                r.deferred.to_string(),
                r.held.to_string(),
                waiting_for(r).unwrap_or_else(|| "-".into()),
                or_dash(rfc3339_ms(r.created_at_ms)),
            ]
        })
        .collect();
    table(
        &[
            "ID", "CLUSTER", "BUNDLE", "STATE", "UPDATED", "FAILED", "DEFERRED", "HELD", "WAITING", "STARTED",
        ],
        &rows,
    )
}

pub fn bundle_json(b: &pb::BundleInfo) -> Value {
    json!({
        "name": b.name,
        "version": b.version,
        "files": b.files,
        "total_size": b.total_size,
        "held_bytes": b.held_bytes,
        "signed": b.signed,
        "published_at": rfc3339_ms(b.published_at_ms),
        "manifest_digest": b.manifest_digest,
        // Empty: arch-neutral, for any node.
        "architectures": b.architectures,
    })
}

/// `amd64,arm64`, or `any` for an arch-neutral bundle.
pub fn arches_text(a: &[String]) -> String {
    if a.is_empty() { "any".into() } else { a.join(",") }
}

pub fn bundles_table(bs: &[pb::BundleInfo]) -> String {
    let rows: Vec<Vec<String>> = bs
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.version.clone(),
                b.files.to_string(),
                b.total_size.to_string(),
                b.held_bytes.to_string(),
                if b.signed { "yes" } else { "no" }.into(),
                arches_text(&b.architectures),
                or_dash(rfc3339_ms(b.published_at_ms)),
                b.manifest_digest.chars().take(19).collect(),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "VERSION",
            "FILES",
            "BYTES",
            "HELD",
            "SIGNED",
            "ARCH",
            "PUBLISHED",
            "DIGEST",
        ],
        &rows,
    )
}

pub fn event_json(e: &pb::Event) -> Value {
    json!({
        "id": e.id,
        "at": rfc3339_ms(e.at_ms),
        "cluster": e.cluster,
        "node": e.node,
        "rollout_id": e.rollout_id,
        "kind": e.kind,
        "bundle": e.bundle,
        "version": e.version,
        "message": e.message,
    })
}

pub fn events_table(es: &[pb::Event]) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let rows: Vec<Vec<String>> = es
        .iter()
        .map(|e| {
            vec![
                or_dash(rfc3339_ms(e.at_ms)),
                e.kind.clone(),
                dash(&e.cluster),
                dash(&e.node),
                if e.bundle.is_empty() {
                    "-".into()
                } else {
                    format!("{}@{}", e.bundle, e.version)
                },
                e.message.clone(),
            ]
        })
        .collect();
    table(&["TIME", "KIND", "CLUSTER", "NODE", "BUNDLE", "MESSAGE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz\n");
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339_ms(0), None);
        assert_eq!(rfc3339_ms(1_700_000_000_123).unwrap(), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn peer_sharing_is_shown_only_while_on() {
        let mut c = pb::Cluster {
            name: "a".into(),
            ..Default::default()
        };
        assert_eq!(peer_text(&c), "off");
        assert!(cluster_json(&c)["peer_sharing"].is_null());
        assert!(cluster_detail(&c).contains("Peer sharing:         off\n"));
        c.peer_sharing = Some(pb::PeerSharing {
            port: 7444,
            upload_rate: 50 << 20,
            max_uploads: 4,
        });
        assert_eq!(peer_text(&c), "on :7444 4 uploads 50 MiB/s");
        assert_eq!(
            cluster_json(&c)["peer_sharing"],
            json!({"port": 7444, "upload_rate": 52_428_800u64, "max_uploads": 4})
        );
        c.peer_sharing = Some(pb::PeerSharing {
            port: 9000,
            upload_rate: 0,
            max_uploads: 1,
        });
        assert_eq!(peer_text(&c), "on :9000 1 upload unlimited");
    }

    #[test]
    fn rates_read_as_people_write_them() {
        assert_eq!(rate_text(0), "unlimited");
        assert_eq!(rate_text(800), "800 B/s");
        assert_eq!(rate_text(10 << 10), "10 KiB/s");
        assert_eq!(rate_text(25_000_000), "23.8 MiB/s");
        assert_eq!(rate_text(3 << 29), "1.5 GiB/s");
    }

    #[test]
    fn what_a_node_fetched_reads_by_source() {
        assert_eq!(fetched_text(0, 0), "-");
        assert_eq!(fetched_text(64 << 20, 0), "64.0 MiB");
        assert_eq!(fetched_text(4 << 20, 60 << 20), "64.0 MiB, 60.0 from peers");
        let n = pb::Node {
            bundles: vec![pb::BundleStatus {
                name: "k".into(),
                version: "1".into(),
                fetched_from_server: 4 << 20,
                fetched_from_peers: 60 << 20,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(
            node_text(&n).contains("64.0 MiB, 60.0 from peers"),
            "{}",
            node_text(&n)
        );
        assert_eq!(node_json(&n)["bundles"][0]["fetched_from_peers"], 60 << 20);
    }

    #[test]
    fn node_json_has_the_contract_fields() {
        let n = pb::Node {
            name: "w1".into(),
            cluster: "a".into(),
            bundles: vec![pb::BundleStatus {
                name: "k".into(),
                version: "1".into(),
                state: pb::BundleState::RolledBack as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = node_json(&n);
        for k in [
            "name",
            "cluster",
            "labels",
            "connected",
            "last_seen",
            "bundles",
            "agent_version",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(v["last_seen"].is_null());
        assert!(v["agent_version"].is_null(), "never connected: no version");
        let n = pb::Node {
            facts: Some(pb::NodeFactsView {
                agent_version: "0.1.0".into(),
                ..Default::default()
            }),
            ..n
        };
        assert_eq!(node_json(&n)["agent_version"], "0.1.0");
        assert!(nodes_table(&[n]).lines().nth(1).unwrap().contains("0.1.0"));
        assert!(v["labels"].is_object());
        assert_eq!(v["bundles"][0]["state"], "rolled_back");
    }
}
