//! Clusters: `cluster list`, `cluster get`, peer sharing, maintenance windows and the reboot policy.

use super::*;

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
        // Whether the server holds a kubeconfig for the tenant API (never
        // the kubeconfig), and whether rollouts drain by default.
        "kubeconfig": c.has_kubeconfig,
        "drain": c.drain,
        "labels": c.labels.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "reboots": reboot_policy_json(c.reboots.as_ref()),
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
    kv(&mut s, "Labels:", labels_text(&c.labels));
    kv(&mut s, "Maintenance windows:", windows_text(c));
    kv(&mut s, "Peer sharing:", peer_text(c));
    kv(&mut s, "Tenant API:", kube_access_text(c));
    kv(&mut s, "Reboots:", reboot_policy_text(c.reboots.as_ref()));
    kv(&mut s, "Reboot gates:", reboot_gates_text(c.reboots.as_ref()));
    s
}

/// Whether the server can reach the tenant API, and whether rollouts
/// drain: "kubeconfig, drain on", "kubeconfig, drain off", "-".
pub fn kube_access_text(c: &pb::Cluster) -> String {
    match (c.has_kubeconfig, c.drain) {
        (false, false) => "-".into(),
        (false, true) => "no kubeconfig, drain on".into(),
        (true, d) => format!("kubeconfig, drain {}", if d { "on" } else { "off" }),
    }
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

fn mode_name(m: i32) -> &'static str {
    match pb::RebootMode::try_from(m).unwrap_or(pb::RebootMode::Unspecified) {
        pb::RebootMode::Manual => "manual",
        pb::RebootMode::Auto => "auto",
        pb::RebootMode::Off | pb::RebootMode::Unspecified => "off",
    }
}

fn timeout_name(m: i32) -> &'static str {
    match pb::RebootTimeoutPolicy::try_from(m).unwrap_or(pb::RebootTimeoutPolicy::Unspecified) {
        pb::RebootTimeoutPolicy::Keep => "keep",
        pb::RebootTimeoutPolicy::Free | pb::RebootTimeoutPolicy::Unspecified => "free",
    }
}

/// A cluster's reboot policy as `cluster get/list -o json` and `reboot
/// status -o json` show it (issue [reboots]).
pub fn reboot_policy_json(p: Option<&pb::RebootPolicy>) -> Value {
    let p = p.cloned().unwrap_or_default();
    json!({
        "mode": mode_name(p.mode),
        "max_concurrent": p.max_concurrent,
        "timeout": lks_proto::duration::format_duration(std::time::Duration::from_millis(p.timeout_ms)),
        "timeout_ms": p.timeout_ms,
        "on_timeout": timeout_name(p.on_timeout),
        "alert_gate": p.alert_gate.as_ref().map(|g| json!({"url": g.url, "filter": g.filter})),
        "blocking_pod_selector": (!p.blocking_pod_selector.is_empty()).then_some(&p.blocking_pod_selector),
    })
}

/// The reboot gates as `cluster get` shows them: "alerts in URL matching
/// F; blocking pods app=db", "-" for none.
pub fn reboot_gates_text(p: Option<&pb::RebootPolicy>) -> String {
    let p = p.cloned().unwrap_or_default();
    let mut parts = Vec::new();
    if let Some(g) = &p.alert_gate {
        parts.push(if g.filter.is_empty() {
            format!("any alert firing in {}", g.url)
        } else {
            format!("alerts matching {} firing in {}", g.filter, g.url)
        });
    }
    if !p.blocking_pod_selector.is_empty() {
        parts.push(format!("blocking pods {}", p.blocking_pod_selector));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}

/// "auto, 2 at once, 30m, free" for a table cell; "off" when off.
pub fn reboot_policy_text(p: Option<&pb::RebootPolicy>) -> String {
    let p = p.cloned().unwrap_or_default();
    match mode_name(p.mode) {
        "off" => "off".into(),
        m => format!(
            "{m}, {} at once, {}, {}",
            p.max_concurrent,
            lks_proto::duration::format_duration(std::time::Duration::from_millis(p.timeout_ms)),
            timeout_name(p.on_timeout)
        ),
    }
}

/// "reboots auto, at most 2 at once, 30m to be back, then the slot is
/// freed": what `cluster set` says it set.
pub fn reboot_policy_sentence(p: Option<&pb::RebootPolicy>) -> String {
    let p = p.cloned().unwrap_or_default();
    let gates = match reboot_gates_text(Some(&p)).as_str() {
        "-" => String::new(),
        g => format!("; gated on {g}"),
    };
    format!(
        "reboots {}, at most {} at once, {} to be back, then the slot is {}{gates}",
        mode_name(p.mode),
        p.max_concurrent,
        lks_proto::duration::format_duration(std::time::Duration::from_millis(p.timeout_ms)),
        if timeout_name(p.on_timeout) == "keep" {
            "kept"
        } else {
            "freed"
        }
    )
}
