//! How a rollout ends: it fails once failures reach the threshold (nodes
//! mid-apply still finish and are recorded), completes when no node is
//! waiting or applying — which makes the version the cluster's target for
//! joining nodes — or, rolling back, ends rolled back and restores the
//! previous target. A completed rollout's outcome line follows nodes that
//! catch up later.

use lks_store::{NodeState, RolloutNodeRow, RolloutRow, RolloutState, TargetChange};

use crate::decision::{Decision, counts, skip_waiting, summary};

/// True if the rollout had already ended and no node is left to catch up:
/// the step records only what the settle phase found. A node that caught
/// up and settled moves a completed rollout's outcome line.
pub(super) fn ended(r: &RolloutRow, d: &mut Decision) -> bool {
    let catching_up =
        d.rollout.state == RolloutState::Completed && d.rollout.nodes.iter().any(RolloutNodeRow::startable);
    if !d.rollout.state.is_terminal() || catching_up {
        return false;
    }
    if d.rollout.state == RolloutState::Completed && counts(&d.rollout) != counts(r) {
        // A node that caught up settled: the outcome line follows it.
        d.rollout.message = summary(&counts(&d.rollout));
    }
    true
}

/// Fails the rollout if its failures reached the threshold: no node is
/// started any more. True if it failed.
pub(super) fn fail_at_threshold(r: &RolloutRow, d: &mut Decision) -> bool {
    let c = counts(&d.rollout);
    let threshold = r.failure_threshold.max(1);
    if c.failed < threshold {
        return false;
    }
    let first = d
        .rollout
        .nodes
        .iter()
        .find(|n| n.state == NodeState::Failed)
        .map(|n| format!(" (first: {}: {})", n.name, n.message))
        .unwrap_or_default();
    d.rollout.state = RolloutState::Failed;
    d.rollout.message = format!("{} node(s) failed, threshold {threshold}{first}", c.failed);
    skip_waiting(d, "not started: the rollout failed");
    crate::drain::stop_drains(
        d,
        NodeState::Skipped,
        "not started: the rollout failed during its drain",
    );
    let m = d.rollout.message.clone();
    d.note("", "rollout_failed", m);
    true
}

/// Ends the rollout once no node is waiting or applying: completed, or
/// rolled back; a completed rollout's outcome line follows its nodes.
pub(super) fn conclude(d: &mut Decision, reverting: bool) {
    let busy = d
        .rollout
        .nodes
        .iter()
        .any(|n| matches!(n.state, NodeState::Waiting | NodeState::Applying));
    let c = counts(&d.rollout);
    if d.rollout.state == RolloutState::Completed {
        // Catching up: the outcome line follows the nodes.
        d.rollout.message = summary(&c);
    } else if !busy {
        if reverting {
            d.rollout.state = RolloutState::RolledBack;
            d.rollout.message = if c.failed == 0 {
                format!("{} node(s) rolled back", c.rolled_back)
            } else {
                format!("{} node(s) rolled back, {} failed", c.rolled_back, c.failed)
            };
            d.target = TargetChange::RestorePrevious;
            let m = d.rollout.message.clone();
            d.note("", "rollout_rolled_back", m);
        } else {
            d.rollout.state = RolloutState::Completed;
            d.rollout.pacing.waiting_for_window = false;
            d.rollout.pacing.next_window_ms = 0;
            let m = summary(&c);
            d.rollout.message = m.clone();
            d.target = TargetChange::SetToRollout;
            d.note("", "rollout_completed", m);
        }
    }
}
