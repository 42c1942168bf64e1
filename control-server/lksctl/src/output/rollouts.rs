//! Rollouts: `rollout list`, `rollout get` and the progress lines of `--wait`.

use super::*;

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
        // What its nodes holding the version fetched for it (a watch reads
        // it at most every 2 s): from the server, split into binary-delta
        // patches and whole files, and from peers.
        "fetched": {
            "from_server": r.fetched_from_server,
            "as_delta": r.fetched_as_delta,
            "whole": r.fetched_from_server.saturating_sub(r.fetched_as_delta),
            "from_peers": r.fetched_from_peers,
        },
        // How the rollout drains each node; null: it does not.
        "drain": r.drain.as_ref().map(|d| json!({
            "timeout": format_secs(d.timeout_seconds),
            "ready_timeout": format_secs(d.ready_timeout_seconds),
            "delete_local_data": d.delete_local_data,
            "on_timeout": d.on_timeout,
            "kubelet_version": (!d.kubelet_version.is_empty()).then_some(&d.kubelet_version),
        })),
        "nodes": r.nodes.iter().map(|n| json!({
            "name": n.name,
            "previous_version": n.previous_version,
            "state": n.state,
            "message": n.message,
            "canary": n.canary,
            // In a draining rollout: "draining", "upgrading" or "readying"
            // while the rollout owns the node's cordon; null otherwise.
            "kube_step": (!n.kube_step.is_empty()).then_some(&n.kube_step),
            "kube_since": (n.kube_since_ms > 0).then(|| rfc3339_ms(n.kube_since_ms)).flatten(),
        })).collect::<Vec<_>>(),
        "created_at": rfc3339_ms(r.created_at_ms),
        "updated_at": rfc3339_ms(r.updated_at_ms),
        "message": r.message,
        // `rollout start --request-id` (lks-kube-controller: "kube:<UID>");
        // null: started without one.
        "request_id": (!r.request_id.is_empty()).then_some(&r.request_id),
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

/// Bytes as people read them: "226 B", "1.5 KiB", "64.0 MiB", "1.2 GiB".
pub fn bytes_text(n: u64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in units {
        if n >= size {
            return format!("{:.1} {name}", n as f64 / size as f64);
        }
    }
    format!("{n} B")
}

/// What the rollout's nodes fetched, or `None` for nothing (yet): e.g.
/// "1.2 MiB from the server (1.0 MiB as deltas), 3.6 MiB from peers".
pub fn rollout_fetched(r: &pb::Rollout) -> Option<String> {
    let (server, delta, peers) = (r.fetched_from_server, r.fetched_as_delta, r.fetched_from_peers);
    if (server, peers) == (0, 0) {
        return None;
    }
    let mut s = format!("{} from the server", bytes_text(server));
    if delta > 0 {
        s.push_str(&format!(" ({} as deltas)", bytes_text(delta)));
    }
    if peers > 0 {
        s.push_str(&format!(", {} from peers", bytes_text(peers)));
    }
    Some(s)
}

/// `rollout list`'s FETCHED column: from the server / of it as deltas /
/// from peers, "-" for nothing.
fn fetched_cell(r: &pb::Rollout) -> String {
    if (r.fetched_from_server, r.fetched_from_peers) == (0, 0) {
        return "-".into();
    }
    format!(
        "{}/{}/{}",
        bytes_text(r.fetched_from_server),
        bytes_text(r.fetched_as_delta),
        bytes_text(r.fetched_from_peers)
    )
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
    if let Some(f) = rollout_fetched(r) {
        m.push_str(&format!("; fetched {f}"));
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
    if let Some(f) = rollout_fetched(r) {
        line.push_str(&format!("; fetched {f}"));
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
    if let Some(d) = &r.drain {
        policy.push_str(&format!(
            "; drains each node (timeout {}, {} on timeout{}), Ready within {}{}",
            format_secs(d.timeout_seconds),
            d.on_timeout,
            if d.delete_local_data {
                ", evicts hostPath pods"
            } else {
                ""
            },
            format_secs(d.ready_timeout_seconds),
            if d.kubelet_version.is_empty() {
                String::new()
            } else {
                format!(" running kubelet {}", d.kubelet_version)
            }
        ));
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
    kv(
        &mut s,
        "Fetched:",
        rollout_fetched(r).unwrap_or_else(|| "-".into()),
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
                    match (n.canary, n.kube_step.as_str()) {
                        (true, "") => format!("{} (canary)", n.state),
                        (true, k) => format!("{} (canary, {k})", n.state),
                        (false, "") => n.state.clone(),
                        (false, k) => format!("{} ({k})", n.state),
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
                fetched_cell(r),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "CLUSTER",
            "BUNDLE",
            "STATE",
            "UPDATED",
            "FAILED",
            "DEFERRED",
            "HELD",
            "WAITING",
            "STARTED",
            "FETCHED(SERVER/DELTA/PEERS)",
        ],
        &rows,
    )
}
