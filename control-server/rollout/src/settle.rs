//! Settle: the first phase of a step. Nodes that left the cluster, parked
//! (deferred or held) nodes something else moved on, and applying nodes
//! that committed, failed or stayed away too long. This phase runs even
//! after a rollout ended: nodes mid-apply finish and their outcome is
//! recorded. Also the turn of a rollback: nodes the rollout changed go
//! back once their forward apply is over.

use std::collections::BTreeMap;
use std::time::Duration;

use lks_proto::BundleState;
use lks_proto::duration::format_duration;
use lks_store::{KubeStep, NodeState, RolloutNodeRow, RolloutRow};

use crate::decision::{Clock, Decision, NodeView, version_or_none};
use crate::drain;

/// An event to record for a node, gathered while the nodes are borrowed.
type NodeNote = (String, &'static str, String);

/// Settles every node of `d` against its view (a node without a view was
/// deleted). Assignments taken back replace `d.assign`.
pub(super) fn settle(r: &RolloutRow, d: &mut Decision, views: &BTreeMap<String, NodeView>, clock: &Clock) {
    let mut notes = Vec::new();
    let mut unassign = Vec::new();
    for n in d.rollout.nodes.iter_mut() {
        let Some(v) = views.get(&n.name) else {
            if matches!(n.state, NodeState::Applying) || n.startable() {
                n.state = NodeState::Skipped;
                n.kube = KubeStep::None;
                n.message = "node was deleted".into();
                notes.push((n.name.clone(), "skipped", n.message.clone()));
            }
            continue;
        };
        if matches!(n.state, NodeState::Deferred | NodeState::Held) {
            settle_parked(r, n, v, &mut notes);
            continue;
        }
        if n.state != NodeState::Applying {
            continue;
        }
        match (&r.policy.drain, n.kube) {
            (Some(p), KubeStep::Draining) if !d.rollout.state.is_terminal() => {
                drain::settle_draining(r, p, n, v, clock, &mut notes, &mut unassign);
            }
            (Some(p), KubeStep::Readying) => drain::settle_readying(r, p, n, v, clock, &mut notes),
            _ => settle_applying(r, n, v, clock, &mut notes, &mut unassign),
        }
    }
    d.assign = unassign;
    for (node, kind, message) in notes {
        d.note(&node, kind, message);
    }
}

/// A deferred or held node that a newer rollout took in, or that something
/// else moved, is skipped: catching it up to this version would only undo that.
fn settle_parked(r: &RolloutRow, n: &mut RolloutNodeRow, v: &NodeView, notes: &mut Vec<NodeNote>) {
    let moved = v.desired.as_deref().unwrap_or_default();
    let why = if let Some(id) = &v.claimed_by {
        Some(format!("not started: superseded by rollout {id}"))
    } else if moved != n.previous_version && moved != r.version {
        Some(format!(
            "not started: it was moved to {} meanwhile",
            version_or_none(moved)
        ))
    } else {
        None
    };
    if let Some(why) = why {
        n.state = NodeState::Skipped;
        n.message = why;
        notes.push((n.name.clone(), "skipped", n.message.clone()));
    }
}

/// An applying node committed, failed, or stayed away for longer than the
/// offline deadline; a node that never heard of the new version is taken
/// back (pushed to `unassign`).
fn settle_applying(
    r: &RolloutRow,
    n: &mut RolloutNodeRow,
    v: &NodeView,
    clock: &Clock,
    notes: &mut Vec<NodeNote>,
    unassign: &mut Vec<(String, Option<String>)>,
) {
    let deadline = r.offline_deadline_ms;
    if n.unreached && v.connected {
        // It connected, so it received its desired state.
        n.unreached = false;
        n.message.clear();
    }
    match verdict(r, n.reverting, &n.previous_version, n.generation, v) {
        Some(Verdict::Committed) if n.kube == KubeStep::Upgrading => {
            // A drained node: applied, now the Node must be Ready.
            let to = if n.reverting {
                version_or_none(&n.previous_version).to_string()
            } else {
                r.version.clone()
            };
            drain::applied(n, &to, clock.now_ms);
        }
        Some(Verdict::Committed) => {
            let (state, kind) = if n.reverting {
                (NodeState::RolledBack, "rolled_back")
            } else {
                (NodeState::Updated, "applied")
            };
            n.state = state;
            n.message.clear();
            let to = if n.reverting {
                version_or_none(&n.previous_version)
            } else {
                r.version.as_str()
            };
            notes.push((n.name.clone(), kind, format!("at {to}")));
        }
        Some(Verdict::Failed(why)) => {
            n.state = NodeState::Failed;
            n.kube = KubeStep::None;
            n.message = why;
            notes.push((n.name.clone(), "failed", n.message.clone()));
        }
        None if offline_too_long(n.turn_at_ms, v, clock, deadline) => {
            n.state = NodeState::Failed;
            n.kube = KubeStep::None;
            n.message = offline_message(deadline);
            if !n.reverting && n.unreached && v.last_seen_ms < n.turn_at_ms {
                // It never heard of the new version: take it back.
                n.touched = false;
                n.unreached = false;
                n.message
                    .push_str(&format!("; left on {}", version_or_none(&n.previous_version)));
                let to = (!n.previous_version.is_empty()).then(|| n.previous_version.clone());
                unassign.push((n.name.clone(), to));
            }
            notes.push((n.name.clone(), "failed", n.message.clone()));
        }
        None => {}
    }
}

/// A rollback's nodes: those the rollout changed go back once their
/// forward apply is over.
pub(super) fn queue_rollback(d: &mut Decision) {
    for n in d.rollout.nodes.iter_mut() {
        if n.touched && !n.reverting && matches!(n.state, NodeState::Updated | NodeState::Failed) {
            n.reverting = true;
            n.state = NodeState::Waiting;
            n.message.clear();
            n.turn_at_ms = 0;
        }
    }
}

fn offline_message(deadline_ms: u64) -> String {
    format!(
        "offline for more than {}",
        format_duration(Duration::from_millis(deadline_ms))
    )
}

/// True if `n` has been unreachable for longer than the deadline.
fn offline_too_long(turn_at_ms: i64, v: &NodeView, clock: &Clock, deadline_ms: u64) -> bool {
    if v.connected {
        return false;
    }
    let since = turn_at_ms.max(v.last_seen_ms).max(clock.since_ms);
    clock.now_ms.saturating_sub(since) > i64::try_from(deadline_ms).unwrap_or(i64::MAX)
}

/// What an applying node reported about this rollout's attempt.
enum Verdict {
    Committed,
    /// Failed or rolled back: the node's own words, or its state.
    Failed(String),
}

/// The verdict of an applying node: committed, failed (why), or not yet.
fn verdict(
    r: &RolloutRow,
    reverting: bool,
    previous: &str,
    generation: u64,
    v: &NodeView,
) -> Option<Verdict> {
    // A report counts only if it answers the desired state this rollout
    // gave the node (or a later one): an older verdict on the same version
    // says nothing about this attempt.
    let fresh = v.actual.as_ref().filter(|a| a.generation >= generation);
    let (want, prefix) = if reverting {
        if previous.is_empty() {
            // Back to nothing: done once the node no longer reports the bundle.
            return v.actual.is_none().then_some(Verdict::Committed);
        }
        (previous, format!("rollback to {previous} failed: "))
    } else {
        (r.version.as_str(), String::new())
    };
    let a = fresh.filter(|a| a.version == want)?;
    match a.state {
        BundleState::Applied => Some(Verdict::Committed),
        BundleState::Failed | BundleState::RolledBack => {
            let why = if a.message.is_empty() {
                format!("{want} {}", a.state)
            } else {
                a.message.clone()
            };
            Some(Verdict::Failed(format!("{prefix}{why}")))
        }
        BundleState::Pending | BundleState::Applying => None,
    }
}
