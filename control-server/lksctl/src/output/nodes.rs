//! Nodes: `node list`, `node get` and their certificates.

use super::*;

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
            // Of fetched_from_server, binary-delta patches (issue [delta]).
            "fetched_as_delta": b.fetched_as_delta,
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
        // The node's Node object in its tenant cluster; null: the cluster
        // has no kubeconfig.
        "kube": n.kube.as_ref().map(kube_json),
        // The node's release trust as it reported it; null: never reported.
        "trust": n.trust.as_ref().map(|t| json!({
            "enabled": t.enabled,
            "state": (t.enabled && !t.state.is_empty()).then_some(&t.state),
            "message": t.message,
            "release_version": t.release_version,
            "release_expires_at": rfc3339_ms(t.release_expires_at_ms),
            "release_expires_at_ms": t.release_expires_at_ms,
            "root_version": t.root_version,
        })),
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
        // The boot the node last reported; null: not reported.
        "boot_id": boot_id(n),
        // Whether it needs a reboot or is rebooting (issue [reboots]);
        // null: its agent never reported it (older than the feature).
        "reboot": n.reboot.as_ref().map(|r| reboot_json(r, n.reboot_request)),
        // Where it stands with its cluster's reboot lock (`node get` and
        // `node list`): `state` waiting, draining, rebooting, back, lost,
        // done, blocked or aborted; `message` why (a waiting node: why it
        // has no slot yet). Null: the lock is not about it.
        "reboot_lock": n.reboot_lock.as_ref().map(|l| json!({
            "state": l.state,
            "message": l.message,
        })),
    })
}

/// `node list -o json`'s `reboot` object: `state` one of `none`,
/// `required`, `rebooting`, `failed`.
pub fn reboot_json(r: &pb::RebootStatus, requested: u64) -> Value {
    json!({
        "state": if r.state.is_empty() { "none" } else { r.state.as_str() },
        "reason": (!r.reason.is_empty()).then_some(&r.reason),
        "since": rfc3339_ms(r.since_ms),
        "since_ms": r.since_ms,
        // The last request the node took on, and the last one made.
        "request": r.request,
        "requested": requested,
    })
}

/// The node's boot ID: from its reboot report, else its facts.
fn boot_id(n: &pb::Node) -> Option<&str> {
    n.reboot
        .as_ref()
        .map(|r| r.boot_id.as_str())
        .filter(|b| !b.is_empty())
        .or_else(|| {
            n.facts
                .as_ref()
                .map(|f| f.boot_id.as_str())
                .filter(|b| !b.is_empty())
        })
}

/// Longest reason the REBOOT column shows.
const REBOOT_COLUMN_REASON: usize = 40;

/// The REBOOT column: `required: <why>` (the reason cut short),
/// `rebooting`, `failed: <why>`, `-`.
pub fn reboot_text(r: Option<&pb::RebootStatus>) -> String {
    let Some(r) = r else { return "-".into() };
    let why = || {
        let mut w: String = r.reason.chars().take(REBOOT_COLUMN_REASON).collect();
        if r.reason.chars().count() > REBOOT_COLUMN_REASON {
            w.push('…');
        }
        w
    };
    match r.state.as_str() {
        "" => "-".into(),
        "rebooting" => "rebooting".into(),
        s if r.reason.is_empty() => s.to_string(),
        s => format!("{s}: {}", why()),
    }
}

/// Longest reason the REBOOT column gives from the reboot lock.
const REBOOT_COLUMN_LOCK: usize = 40;

/// The REBOOT column: [`reboot_text`], then where the node stands with its
/// cluster's reboot lock while that says something the state does not
/// (`required: kernel (waiting: every maintenance window is closed)`):
/// the lock's reason up to its first `;` or ` (`, cut short. A lock line
/// of a reboot that ended (`done`) is left out; `node get` and `-o json`
/// give the whole line.
pub fn reboot_cell(n: &pb::Node) -> String {
    let base = reboot_text(n.reboot.as_ref());
    let Some(l) = n.reboot_lock.as_ref() else {
        return base;
    };
    if l.state.is_empty() || l.state == "done" || l.state == base {
        return base;
    }
    let why = l
        .message
        .split("; ")
        .next()
        .unwrap_or_default()
        .split(" (")
        .next()
        .unwrap_or_default();
    let mut short: String = why.chars().take(REBOOT_COLUMN_LOCK).collect();
    if why.chars().count() > REBOOT_COLUMN_LOCK {
        short.push('…');
    }
    let lock = if short.is_empty() {
        l.state.clone()
    } else {
        format!("{}: {short}", l.state)
    };
    if base == "-" {
        lock
    } else {
        format!("{base} ({lock})")
    }
}

/// The architecture the node's agent reported (`amd64`), if any.
pub fn node_arch(n: &pb::Node) -> Option<&str> {
    n.facts
        .as_ref()
        .map(|f| f.architecture.as_str())
        .filter(|a| !a.is_empty())
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

pub fn nodes_table(nodes: &[pb::Node]) -> String {
    // KUBE only when some node's cluster has a kubeconfig.
    let kube = nodes.iter().any(|n| n.kube.is_some());
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let mut row = vec![
                n.name.clone(),
                n.cluster.clone(),
                if n.connected { "yes" } else { "no" }.into(),
                or_dash(rfc3339_ms(n.last_seen_ms)),
                agent_version(n).unwrap_or("-").to_string(),
                node_arch(n).unwrap_or("-").to_string(),
                labels_text(&n.labels),
                bundles_text(&n.bundles),
                certs_text(&n.certificates),
                trust_text(n.trust.as_ref()),
                reboot_cell(n),
            ];
            if kube {
                row.insert(3, kube_text(n.kube.as_ref()));
            }
            row
        })
        .collect();
    let mut headers = vec![
        "NAME",
        "CLUSTER",
        "CONNECTED",
        "LAST SEEN",
        "AGENT",
        "ARCH",
        "LABELS",
        "BUNDLES",
        "CERTS",
        "RELEASE",
        "REBOOT",
    ];
    if kube {
        headers.insert(3, "KUBE");
    }
    table(&headers, &rows)
}

/// The KUBE column: `Ready`, `NotReady`, `Unknown`, `cordoned`; `-` when
/// the tenant API has no Node of this name or the cluster no kubeconfig;
/// `unreachable` when the tenant API could not be read.
pub fn kube_text(k: Option<&pb::NodeKube>) -> String {
    match k.map(|k| k.state.as_str()) {
        None | Some("absent") | Some("") => "-".into(),
        Some(s) => s.to_string(),
    }
}

/// `node list -o json`'s `kube` object.
pub fn kube_json(k: &pb::NodeKube) -> Value {
    json!({
        "state": k.state,
        "ready": k.ready,
        "unschedulable": k.unschedulable,
        "kubelet_version": (!k.kubelet_version.is_empty()).then_some(&k.kubelet_version),
        "last_transition": rfc3339_ms(k.ready_since_ms),
        "cordoned_by": (!k.cordoned_by.is_empty()).then_some(&k.cordoned_by),
        "error": (!k.error.is_empty()).then_some(&k.error),
    })
}

/// The RELEASE column: `-` when the node reports no release trust (or has
/// it off); the release it follows (`7`), with its state unless `ok`
/// (`7 stale-release`, `- no-release`).
pub fn trust_text(t: Option<&pb::TrustStatus>) -> String {
    let Some(t) = t.filter(|t| t.enabled) else {
        return "-".into();
    };
    let version = match t.release_version {
        0 => "-".to_string(),
        v => v.to_string(),
    };
    if t.state == "ok" {
        version
    } else {
        format!("{version} {}", t.state)
    }
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
    if let Some(t) = n.trust.as_ref().filter(|t| t.enabled) {
        let mut line = trust_text(Some(t));
        if t.release_expires_at_ms > 0 {
            line.push_str(&format!(
                ", expires {}",
                or_dash(rfc3339_ms(t.release_expires_at_ms))
            ));
        }
        line.push_str(&format!(", root {}", t.root_version));
        if !t.message.is_empty() {
            line.push_str(&format!(": {}", t.message));
        }
        kv(&mut s, "Release:", line);
    }
    if let Some(r) = n.reboot.as_ref().filter(|r| !r.state.is_empty()) {
        let mut line = if r.reason.is_empty() {
            r.state.clone()
        } else {
            format!("{}: {}", r.state, r.reason)
        };
        if r.since_ms > 0 {
            line.push_str(&format!(" (since {})", or_dash(rfc3339_ms(r.since_ms))));
        }
        kv(&mut s, "Reboot:", line);
    }
    if let Some(l) = &n.reboot_lock {
        let line = if l.message.is_empty() {
            l.state.clone()
        } else {
            format!("{}: {}", l.state, l.message)
        };
        kv(&mut s, "Reboot lock:", line);
    }
    if let Some(b) = boot_id(n) {
        kv(&mut s, "Boot ID:", b.to_string());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_column_names_the_release_and_any_trouble() {
        let t = |enabled, state: &str, v| pb::TrustStatus {
            enabled,
            state: state.into(),
            release_version: v,
            ..Default::default()
        };
        assert_eq!(trust_text(None), "-");
        assert_eq!(trust_text(Some(&t(false, "", 0))), "-");
        assert_eq!(trust_text(Some(&t(true, "ok", 7))), "7");
        assert_eq!(trust_text(Some(&t(true, "stale-release", 7))), "7 stale-release");
        assert_eq!(trust_text(Some(&t(true, "no-release", 0))), "- no-release");
    }

    #[test]
    fn the_reboot_column_is_short_and_the_json_complete() {
        let r = |state: &str, reason: &str| pb::RebootStatus {
            state: state.into(),
            reason: reason.into(),
            since_ms: 1_700_000_000_000,
            boot_id: "b-2".into(),
            request: 3,
        };
        assert_eq!(reboot_text(None), "-");
        assert_eq!(reboot_text(Some(&r("", ""))), "-");
        assert_eq!(reboot_text(Some(&r("rebooting", "request 4 sent"))), "rebooting");
        assert_eq!(
            reboot_text(Some(&r("required", "bundle kernel@6.1"))),
            "required: bundle kernel@6.1"
        );
        let long = reboot_text(Some(&r("required", &"p".repeat(100))));
        assert_eq!(long, format!("required: {}…", "p".repeat(40)));
        let n = pb::Node {
            name: "w1".into(),
            reboot: Some(r("required", "bundle kernel@6.1")),
            reboot_request: 3,
            ..Default::default()
        };
        let v = node_json(&n);
        assert_eq!(v["boot_id"], "b-2");
        assert_eq!(
            v["reboot"],
            json!({
                "state": "required",
                "reason": "bundle kernel@6.1",
                "since": rfc3339_ms(1_700_000_000_000),
                "since_ms": 1_700_000_000_000i64,
                "request": 3,
                "requested": 3,
            })
        );
        assert_eq!(node_json(&pb::Node::default())["reboot"], Value::Null);
        assert_eq!(reboot_json(&r("", ""), 0)["state"], "none");
        let t = node_text(&n);
        assert!(
            t.contains("Reboot:       required: bundle kernel@6.1 (since "),
            "{t}"
        );
        assert!(nodes_table(&[n]).lines().next().unwrap().ends_with("REBOOT"));
    }

    #[test]
    fn the_reboot_column_says_why_the_lock_keeps_a_node_waiting() {
        let lock = |state: &str, message: &str| pb::RebootNodeState {
            name: "w1".into(),
            state: state.into(),
            message: message.into(),
            since_ms: 0,
        };
        let mut n = pb::Node {
            name: "w1".into(),
            reboot: Some(pb::RebootStatus {
                state: "required".into(),
                reason: "bundle kernel@6.1".into(),
                ..Default::default()
            }),
            reboot_lock: Some(lock(
                "waiting",
                "every maintenance window is closed; the next opens at 2026-11-29T16:00:00Z",
            )),
            ..Default::default()
        };
        assert_eq!(
            reboot_cell(&n),
            "required: bundle kernel@6.1 (waiting: every maintenance window is closed)"
        );
        n.reboot_lock = Some(lock("waiting", "the node is held (node unhold)"));
        assert_eq!(
            reboot_cell(&n),
            "required: bundle kernel@6.1 (waiting: the node is held)"
        );
        n.reboot_lock = Some(lock("waiting", &"x".repeat(60)));
        assert_eq!(
            reboot_cell(&n),
            format!("required: bundle kernel@6.1 (waiting: {}…)", "x".repeat(40))
        );
        // What the state says already, or a reboot that ended: left out.
        n.reboot_lock = Some(lock("done", ""));
        assert_eq!(reboot_cell(&n), "required: bundle kernel@6.1");
        n.reboot = None;
        n.reboot_lock = Some(lock("draining", "cordoned; draining its pods"));
        assert_eq!(reboot_cell(&n), "draining: cordoned");
        n.reboot_lock = None;
        assert_eq!(reboot_cell(&n), "-");
        // The JSON gives the whole line.
        n.reboot_lock = Some(lock("waiting", "the node is held (node unhold)"));
        assert_eq!(
            node_json(&n)["reboot_lock"],
            json!({"state": "waiting", "message": "the node is held (node unhold)"})
        );
    }
}
