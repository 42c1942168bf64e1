//! Server state → custom resources: an `LksNode` status from a node as the
//! admin API lists it, an `LksBundleVersion` from a published version, and
//! the Kubernetes object name each gets. Pure, so the mapping is tested on
//! plain values.

use std::time::Duration;

use lks_proto::convert::{bundle_state_from_i32, rollout_state_str};
use lks_proto::pb;
use lks_rollout::policy::{DrainOptions, DrainTimeout, OfflinePolicy, Policy};
use sha2::{Digest as _, Sha256};

use crate::crd::{
    Condition, LksBundleVersionSpec, LksNodeStatus, LksRolloutSpec, LksRolloutStatus, NodeBundle, NodeKube,
    NodeTrust,
};
use crate::policy;

/// The label on every object the controller mirrors ...
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// ... and its value.
pub const ME: &str = "lks-kube-controller";
/// On an LksRollout that mirrors a rollout started with lksctl (or the
/// console), not declared in Git.
pub const OUTSIDE_GIT: &str = "lksadmin.io/created-outside-git";

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

pub fn rfc3339_ms(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    t.replace_nanosecond(0)
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
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
            state: bundle_state_from_i32(b.state)
                .map_or("pending", |s| s.as_str())
                .to_string(),
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

/// The object name of a rollout's mirror: `BUNDLE-VERSION-ID`, sanitised.
pub fn rollout_name(r: &pb::Rollout) -> String {
    object_name(&format!("{}-{}-{}", r.bundle, r.version, r.id))
}

/// The policy a started rollout was started with, as the server shows it.
fn rollout_policy(r: &pb::Rollout) -> Policy {
    let given = |s: u64| (s > 0).then(|| Duration::from_secs(s));
    Policy {
        batch_size: Some(r.batch_size),
        failure_threshold: Some(r.failure_threshold),
        offline: OfflinePolicy::parse(&r.offline),
        offline_deadline: None,
        canary: r.canary,
        canary_soak: given(r.canary_soak_seconds),
        batch_interval: given(r.batch_interval_seconds),
        ignore_windows: r.ignore_windows,
        drain: r
            .drain
            .as_ref()
            .map(|d| DrainOptions {
                enabled: Some(true),
                timeout: given(d.timeout_seconds),
                ready_timeout: given(d.ready_timeout_seconds),
                delete_local_data: d.delete_local_data,
                on_timeout: DrainTimeout::parse(&d.on_timeout),
                kubelet_version: (!d.kubelet_version.is_empty()).then(|| d.kubelet_version.clone()),
            })
            .unwrap_or_default(),
    }
}

/// The spec of a mirror of a rollout started outside Git (`lksctl rollout
/// start`), as it was started.
pub fn rollout_spec(r: &pb::Rollout) -> LksRolloutSpec {
    LksRolloutSpec {
        cluster: r.cluster.clone(),
        bundle: format!("{}@{}", r.bundle, r.version),
        selector: r.selector.clone().into_iter().collect(),
        policy: policy::with_policy(&rollout_policy(r)),
        paused: pb::RolloutState::try_from(r.state) == Ok(pb::RolloutState::Paused),
        rollback_of: None,
    }
}

/// A rollout's status with the conditions GitOps tools read: `Progressing`
/// while it runs (False with reason `Paused` while paused), `Completed`,
/// `Failed` (reason `Failed` or `Aborted`). `since` is the RFC 3339 time
/// of the rollout's last change, the conditions' transition time.
pub fn rollout_status(r: &pb::Rollout, generation: i64) -> LksRolloutStatus {
    let phase = rollout_state_str(r.state);
    let since = rfc3339_ms(r.updated_at_ms).unwrap_or_default();
    let cond = |type_: &str, on: bool, reason: &str| Condition {
        type_: type_.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: r.message.clone(),
        last_transition_time: since.clone(),
        observed_generation: generation,
    };
    let (progressing, why) = match phase {
        "running" => (true, "Running"),
        "rolling_back" => (true, "RollingBack"),
        "paused" => (false, "Paused"),
        "completed" => (false, "Completed"),
        "rolled_back" => (false, "RolledBack"),
        "aborted" => (false, "Aborted"),
        _ => (false, "Failed"),
    };
    LksRolloutStatus {
        id: r.id.clone(),
        phase: phase.to_string(),
        total: r.total,
        updated: r.updated,
        failed: r.failed,
        pending: r.pending,
        deferred: r.deferred,
        held: r.held,
        applying: r.applying,
        next_batch_at: rfc3339_ms(r.next_batch_at_ms).unwrap_or_default(),
        canary_phase: r.canary_phase.clone(),
        message: r.message.clone(),
        started_spec_digest: String::new(),
        observed_generation: generation,
        conditions: vec![
            cond("Progressing", progressing, why),
            cond(
                "Completed",
                phase == "completed",
                if phase == "completed" { "Completed" } else { why },
            ),
            cond(
                "Failed",
                matches!(phase, "failed" | "aborted"),
                if matches!(phase, "failed" | "aborted") {
                    why
                } else {
                    "NotFailed"
                },
            ),
        ],
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
    fn a_rollouts_conditions_say_what_gitops_tools_read() {
        let mut r = pb::Rollout {
            id: "abc".into(),
            bundle: "kubelet".into(),
            version: "2".into(),
            state: pb::RolloutState::Running as i32,
            ..Default::default()
        };
        let by = |s: &LksRolloutStatus, t: &str| {
            let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
            (c.status.clone(), c.reason.clone())
        };
        r.applying = 2;
        r.next_batch_at_ms = 1_767_225_600_000;
        r.canary_phase = "soaking".into();
        let s = rollout_status(&r, 1);
        assert_eq!(by(&s, "Progressing"), ("True".into(), "Running".into()));
        assert_eq!(
            (s.applying, s.next_batch_at.as_str(), s.canary_phase.as_str()),
            (2, "2026-01-01T00:00:00Z", "soaking"),
            "batch progress"
        );
        assert_eq!(by(&s, "Completed").0, "False");
        r.state = pb::RolloutState::Completed as i32;
        let s = rollout_status(&r, 1);
        assert_eq!(by(&s, "Completed"), ("True".into(), "Completed".into()));
        assert_eq!(by(&s, "Progressing").0, "False");
        r.state = pb::RolloutState::Aborted as i32;
        let s = rollout_status(&r, 2);
        assert_eq!(by(&s, "Failed"), ("True".into(), "Aborted".into()));
        assert!(s.conditions.iter().all(|c| c.observed_generation == 2));
        r.state = pb::RolloutState::Paused as i32;
        assert_eq!(
            by(&rollout_status(&r, 1), "Progressing"),
            ("False".into(), "Paused".into())
        );
        assert!(rollout_spec(&r).paused);
        assert_eq!(rollout_spec(&r).bundle, "kubelet@2");
        assert_eq!(rollout_name(&r), "kubelet-2-abc");
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
