//! Canaries: the phase of a step after settle. With `--canary N` a
//! rollout picks its canaries at the first decision — reachable, unheld
//! nodes first, in an order fixed by the recorded seed — and starts only
//! them until every one is settled and has stayed committed for the soak
//! time. A canary that fails, during its apply or the soak, fails the
//! rollout at once, whatever the threshold.

use std::collections::BTreeMap;
use std::time::Duration;

use lks_proto::BundleState;
use lks_proto::duration::format_duration;
use lks_store::{NodeState, RolloutNodeRow, RolloutRow, RolloutState};
use sha2::{Digest as _, Sha256};

use crate::decision::{Decision, NodeView, skip_waiting};

/// What the canary phase lets the rest of the step do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// No canaries, or they passed: every node may start.
    Open,
    /// Canaries are settling or soaking: only they may start.
    CanariesOnly,
    /// A canary failed: the rollout failed and the step ends.
    Failed,
}

/// The canary phase of a forward rollout.
pub(super) fn gate(r: &RolloutRow, d: &mut Decision, views: &BTreeMap<String, NodeView>, now: i64) -> Gate {
    let policy = &r.policy;
    if policy.canary == 0 || d.rollout.pacing.canaries_passed {
        return Gate::Open;
    }
    if !d.rollout.nodes.iter().any(|n| n.canary) {
        let picked = pick_canaries(d, views);
        if picked.is_empty() {
            // Every node left or is held: nothing to learn from first.
            d.rollout.pacing.canaries_passed = true;
            d.note("", "canaries_passed", "no node could be picked as a canary");
        } else {
            let m = format!("{} (seed {})", picked.join(", "), policy.canary_seed);
            d.note("", "canaries_picked", m);
        }
    }
    let phase = !d.rollout.pacing.canaries_passed;
    if let Some(why) = failed_canary(r, d, views, phase) {
        d.rollout.state = RolloutState::Failed;
        d.rollout.message = format!("{why}; no other node was started");
        skip_waiting(d, "not started: a canary failed");
        let m = d.rollout.message.clone();
        d.note("", "rollout_failed", m);
        return Gate::Failed;
    }
    let settling = d
        .rollout
        .nodes
        .iter()
        .any(|n| n.canary && matches!(n.state, NodeState::Waiting | NodeState::Applying));
    if phase && settling {
        Gate::CanariesOnly
    } else if phase {
        soak(r, d, now)
    } else {
        Gate::Open
    }
}

/// Marks canaries that report a failure during the soak failed; returns
/// why the first failed canary failed, if one did.
fn failed_canary(
    r: &RolloutRow,
    d: &mut Decision,
    views: &BTreeMap<String, NodeView>,
    phase: bool,
) -> Option<String> {
    let mut notes = Vec::new();
    let mut failed = None;
    for n in d.rollout.nodes.iter_mut().filter(|n| phase && n.canary) {
        if n.state == NodeState::Updated
            && let Some(why) = reports_failure(r, n, views.get(&n.name))
        {
            n.state = NodeState::Failed;
            n.message = format!("failed during the canary soak: {why}");
            let m = n.message.clone();
            notes.push((n.name.clone(), "failed", m));
        }
        if n.state == NodeState::Failed && failed.is_none() {
            failed = Some(format!("canary {} failed: {}", n.name, n.message));
        }
    }
    for (node, kind, message) in notes {
        d.note(&node, kind, message);
    }
    failed
}

/// Every canary settled: the soak starts, and once it is over the other
/// nodes may start.
fn soak(r: &RolloutRow, d: &mut Decision, now: i64) -> Gate {
    let policy = &r.policy;
    let pacing = &mut d.rollout.pacing;
    if pacing.canaries_committed_at_ms == 0 {
        pacing.canaries_committed_at_ms = now;
        let m = format!(
            "canaries settled; soaking for {}",
            format_duration(Duration::from_millis(policy.canary_soak_ms))
        );
        d.note("", "canaries_settled", m);
    }
    let soak_ends = d
        .rollout
        .pacing
        .canaries_committed_at_ms
        .saturating_add(i64::try_from(policy.canary_soak_ms).unwrap_or(i64::MAX));
    if now < soak_ends {
        return Gate::CanariesOnly;
    }
    d.rollout.pacing.canaries_passed = true;
    let updated = d
        .rollout
        .nodes
        .iter()
        .filter(|n| n.canary && n.state == NodeState::Updated)
        .count();
    d.note(
        "",
        "canaries_passed",
        format!("{updated} canary node(s) stayed committed; the other nodes start"),
    );
    Gate::Open
}

/// The canary pick order: reachable, unheld nodes first, then by
/// SHA-256(seed ‖ name) — random-looking, yet the same for the same seed.
fn canary_key(seed: u64, name: &str, v: Option<&NodeView>) -> (bool, [u8; 32]) {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(name.as_bytes());
    let reachable = v.is_some_and(|v| v.connected && !v.held);
    (!reachable, h.finalize().into())
}

/// Marks the rollout's canaries; returns their names.
fn pick_canaries(d: &mut Decision, views: &BTreeMap<String, NodeView>) -> Vec<String> {
    let p = &d.rollout.policy;
    let (want, seed) = (p.canary as usize, p.canary_seed);
    let mut order: Vec<(bool, [u8; 32], usize)> = d
        .rollout
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.state == NodeState::Waiting && views.get(&n.name).is_some_and(|v| !v.held))
        .map(|(i, n)| {
            let (late, key) = canary_key(seed, &n.name, views.get(&n.name));
            (late, key, i)
        })
        .collect();
    order.sort();
    let mut picked: Vec<String> = Vec::new();
    for (_, _, i) in order.into_iter().take(want) {
        let n = &mut d.rollout.nodes[i];
        n.canary = true;
        picked.push(n.name.clone());
    }
    picked.sort();
    picked
}

/// True if the node reports the rollout's version failed or rolled back
/// since the rollout gave it that version.
fn reports_failure(r: &RolloutRow, n: &RolloutNodeRow, v: Option<&NodeView>) -> Option<String> {
    let a = v?.actual.as_ref()?;
    if a.version != r.version || a.generation < n.generation {
        return None;
    }
    matches!(a.state, BundleState::Failed | BundleState::RolledBack).then(|| {
        if a.message.is_empty() {
            format!("{} {}", a.version, a.state)
        } else {
            a.message.clone()
        }
    })
}
