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
        })).collect::<Vec<_>>(),
        "facts": n.facts.as_ref().map(|f| json!({
            "hostname": f.hostname,
            "os": f.os,
            "kernel": f.kernel,
            "arch": f.arch,
            "cpus": f.cpus,
            "memory_bytes": f.memory_bytes,
            "agent_version": f.agent_version,
        })),
        "certificate_serial": n.certificate_serial,
        "enrolled_at": rfc3339_ms(n.enrolled_at_ms),
    })
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
                labels_text(&n.labels),
                bundles_text(&n.bundles),
            ]
        })
        .collect();
    table(
        &["NAME", "CLUSTER", "CONNECTED", "LAST SEEN", "LABELS", "BUNDLES"],
        &rows,
    )
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
    if let Some(f) = &n.facts {
        kv(
            &mut s,
            "Host:",
            format!("{} ({} {}, {})", f.hostname, f.os, f.kernel, f.arch),
        );
        kv(&mut s, "Agent:", f.agent_version.clone());
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
                b.message.clone(),
            ]
        })
        .collect();
    for l in table(&["NAME", "VERSION", "STATE", "MESSAGE"], &rows).lines() {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
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
        "nodes": r.nodes.iter().map(|n| json!({
            "name": n.name,
            "previous_version": n.previous_version,
            "state": n.state,
            "message": n.message,
        })).collect::<Vec<_>>(),
        "created_at": rfc3339_ms(r.created_at_ms),
        "updated_at": rfc3339_ms(r.updated_at_ms),
        "message": r.message,
    })
}

/// One line summing up a rollout's progress.
pub fn rollout_line(r: &pb::Rollout) -> String {
    format!(
        "rollout {} {}@{} on {}: {} — {}/{} updated, {} failed, {} pending",
        r.id,
        r.bundle,
        r.version,
        r.cluster,
        rollout_state_str(r.state),
        r.updated,
        r.total,
        r.failed,
        r.pending
    )
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
            "{}/{} updated, {} failed, {} pending ({} applying)",
            r.updated, r.total, r.failed, r.pending, r.applying
        ),
    );
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
                    n.state.clone(),
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
                or_dash(rfc3339_ms(r.created_at_ms)),
            ]
        })
        .collect();
    table(
        &["ID", "CLUSTER", "BUNDLE", "STATE", "UPDATED", "FAILED", "STARTED"],
        &rows,
    )
}

pub fn bundle_json(b: &pb::BundleInfo) -> Value {
    json!({
        "name": b.name,
        "version": b.version,
        "files": b.files,
        "total_size": b.total_size,
        "signed": b.signed,
        "published_at": rfc3339_ms(b.published_at_ms),
        "manifest_digest": b.manifest_digest,
    })
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
                if b.signed { "yes" } else { "no" }.into(),
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
            "SIGNED",
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
        for k in ["name", "cluster", "labels", "connected", "last_seen", "bundles"] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(v["last_seen"].is_null());
        assert!(v["labels"].is_object());
        assert_eq!(v["bundles"][0]["state"], "rolled_back");
    }
}
