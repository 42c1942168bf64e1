//! Server state → custom resources: an `LksNode` status from a node as the
//! admin API lists it, an `LksBundleVersion` from a published version, and
//! the Kubernetes object name each gets. Pure, so the mapping is tested on
//! plain values.

use lks_proto::pb;
use sha2::{Digest as _, Sha256};

use crate::crd::{LksBundleVersionSpec, LksNodeStatus, NodeBundle, NodeKube, NodeTrust};

/// Longest object name Kubernetes takes for these kinds (DNS subdomain).
const MAX_NAME: usize = 253;

/// A DNS-subdomain object name for `text`: lower case, `[a-z0-9.-]`,
/// starting and ending alphanumeric. When that changes `text` (or it is too
/// long), 8 hex digits of its SHA-256 are appended, so two different texts
/// never share a name.
pub fn object_name(text: &str) -> String {
    let mut name: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            _ => '-',
        })
        .collect();
    name = name
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    if name == text && name.len() <= MAX_NAME {
        return name;
    }
    let hash = hex_prefix(text);
    name.truncate(MAX_NAME - hash.len() - 1);
    let name = name.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if name.is_empty() {
        hash
    } else {
        format!("{name}-{hash}")
    }
}

fn hex_prefix(text: &str) -> String {
    Sha256::digest(text.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The object name of a bundle version: `NAME-VERSION`, sanitised.
pub fn bundle_version_name(b: &pb::BundleInfo) -> String {
    object_name(&format!("{}-{}", b.name, b.version))
}

fn rfc3339_ms(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    t.replace_nanosecond(0)
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

fn bundle_state(s: i32) -> &'static str {
    match pb::BundleState::try_from(s) {
        Ok(pb::BundleState::Pending) => "pending",
        Ok(pb::BundleState::Applying) => "applying",
        Ok(pb::BundleState::Applied) => "applied",
        Ok(pb::BundleState::Failed) => "failed",
        Ok(pb::BundleState::RolledBack) => "rolled_back",
        _ => "unknown",
    }
}

/// An `LksNode`'s status for a node as `ListNodes` shows it.
pub fn node_status(n: &pb::Node) -> LksNodeStatus {
    let facts = n.facts.as_ref();
    let bundles: Vec<NodeBundle> = n
        .bundles
        .iter()
        .map(|b| NodeBundle {
            name: b.name.clone(),
            version: b.version.clone(),
            state: bundle_state(b.state).to_string(),
            message: b.message.clone(),
        })
        .collect();
    LksNodeStatus {
        cluster: n.cluster.clone(),
        connected: n.connected,
        last_seen: rfc3339_ms(n.last_seen_ms),
        agent_version: facts.map(|f| f.agent_version.clone()).unwrap_or_default(),
        architecture: facts.map(|f| f.architecture.clone()).unwrap_or_default(),
        labels: n.labels.clone().into_iter().collect(),
        bundle_summary: bundles
            .iter()
            .map(|b| format!("{}@{} {}", b.name, b.version, b.state))
            .collect::<Vec<_>>()
            .join(", "),
        bundles,
        trust: n.trust.as_ref().filter(|t| t.enabled).map(|t| NodeTrust {
            state: t.state.clone(),
            release_version: t.release_version,
            message: t.message.clone(),
        }),
        kube: n.kube.as_ref().map(|k| NodeKube {
            state: k.state.clone(),
            kubelet_version: k.kubelet_version.clone(),
            unschedulable: k.unschedulable,
            cordoned_by: k.cordoned_by.clone(),
        }),
    }
}

/// An `LksBundleVersion`'s spec for a published version.
pub fn bundle_spec(b: &pb::BundleInfo) -> LksBundleVersionSpec {
    LksBundleVersionSpec {
        bundle: b.name.clone(),
        version: b.version.clone(),
        files: b.files,
        signed: b.signed,
        architectures: b.architectures.clone(),
        published_at: rfc3339_ms(b.published_at_ms).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_dns_names_and_never_collide() {
        assert_eq!(object_name("kubelet-1.37.2"), "kubelet-1.37.2");
        let a = object_name("kubelet-1.37.2+build_1");
        assert!(a.starts_with("kubelet-1.37.2-build-1-"), "{a}");
        let b = object_name("kubelet-1.37.2-build-1");
        assert_eq!(b, "kubelet-1.37.2-build-1");
        assert_ne!(a, b, "a sanitised name carries a hash");
        assert_ne!(object_name("A"), object_name("a"));
        let long = object_name(&"x".repeat(400));
        assert!(long.len() <= 253, "{}", long.len());
        assert!(object_name("__").chars().all(|c| c.is_ascii_hexdigit()));
        for n in [a, long] {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
            );
            assert!(n.starts_with(|c: char| c.is_ascii_alphanumeric()));
            assert!(n.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn a_node_reads_as_its_status() {
        let n = pb::Node {
            name: "w1".into(),
            cluster: "a".into(),
            connected: true,
            last_seen_ms: 1_767_225_600_123,
            bundles: vec![pb::BundleStatus {
                name: "kubelet".into(),
                version: "2".into(),
                state: pb::BundleState::Applied as i32,
                ..Default::default()
            }],
            facts: Some(pb::NodeFactsView {
                agent_version: "0.1.0".into(),
                architecture: "amd64".into(),
                ..Default::default()
            }),
            kube: Some(pb::NodeKube {
                state: "Ready".into(),
                kubelet_version: "v1.37.2".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = node_status(&n);
        assert_eq!(s.cluster, "a");
        assert_eq!(s.last_seen.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(s.bundle_summary, "kubelet@2 applied");
        assert_eq!(s.kube.unwrap().state, "Ready");
        assert!(s.trust.is_none());
    }
}
