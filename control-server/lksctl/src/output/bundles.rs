//! Bundles and events: `bundle list` and `events`.

use super::*;

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
