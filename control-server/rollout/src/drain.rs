//! Drain: a draining rollout's node turn with its tenant cluster (issue
//! [kube-drain]). A node's turn takes it through [`KubeStep`]s:
//!
//! 1. `Draining`: the controller cordons the Node and evicts its pods
//!    (`lks_kube::drain`); the node holds its slot, but its version is
//!    not assigned yet. Drained → its version is assigned (`Upgrading`).
//!    The drain gave up (`--drain-timeout`, no Node, the tenant API
//!    unusable) → the node is `failed` (or `skipped`, `--on-drain-timeout
//!    skip`) with the drain's one line, naming the pods left and the
//!    budgets that refused them.
//! 2. `Upgrading`: the agent applies, as without draining (settle).
//! 3. `Readying`: the agent applied; the Node must be `Ready` (and run the
//!    kubelet the bundle declares) within `--ready-timeout`, else the node
//!    fails with the gate's last answer.
//!
//! At every end the step goes back to `None`: the rollout no longer owns
//! the cordon, and the controller lifts it. A pause stops a drain (the node
//! waits again and drains anew on resume); an abort, a rollback or a
//! failed rollout stops it for good (`skipped`). Pure, like the rest of
//! the step: the controller's kube work supplies the facts
//! ([`KubeFact`]).

use std::time::Duration;

use lks_proto::duration::format_duration;
use lks_store::{DrainPolicy, DrainTimeout, KubeStep, NodeState, RolloutNodeRow, RolloutRow};

use crate::decision::{Clock, Decision, KubeFact, NodeView, version_or_none};

/// Beyond the drain timeout, how long a drain may stay unanswered before
/// the step gives up on it itself: the drain's own deadline should come
/// first, this keeps a turn from waiting for ever on a controller that
/// cannot reach the tenant API at all.
pub const ANSWER_GRACE: Duration = Duration::from_secs(60);

type Notes = Vec<(String, &'static str, String)>;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn took(since_ms: i64, now_ms: i64) -> String {
    let d = Duration::from_millis(u64::try_from(now_ms.saturating_sub(since_ms)).unwrap_or(0));
    // Whole seconds read better, but a sub-second drain says "0s".
    if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format_duration(Duration::from_secs(d.as_secs()))
    }
}

/// A node's turn begins with its drain: it takes its slot, its version
/// waits.
pub(super) fn begin(n: &mut RolloutNodeRow, now_ms: i64) {
    n.kube = KubeStep::Draining;
    n.kube_since_ms = now_ms;
    n.drain_started_ms = now_ms;
    n.message = "cordoned; draining its pods".into();
}

/// The version a node's turn assigns: this rollout's, or back to the one
/// it had (`None`: remove the bundle).
fn target(r: &RolloutRow, n: &RolloutNodeRow) -> Option<String> {
    if n.reverting {
        (!n.previous_version.is_empty()).then(|| n.previous_version.clone())
    } else {
        Some(r.version.clone())
    }
}

/// A draining node: drained (assign its version), blocked (fail or skip
/// it), or still draining.
pub(super) fn settle_draining(
    r: &RolloutRow,
    policy: &DrainPolicy,
    n: &mut RolloutNodeRow,
    v: &NodeView,
    clock: &Clock,
    notes: &mut Notes,
    assign: &mut Vec<(String, Option<String>)>,
) {
    let now = clock.now_ms;
    match &v.kube {
        Some(KubeFact::Drained(what)) => {
            let to = target(r, n);
            // The same instant `begin` kept, or the start of a drain a
            // previous release began (it kept none).
            n.drain_started_ms = n.kube_since_ms;
            let drained = format!("drained in {}", took(n.drain_started_ms, now));
            notes.push((n.name.clone(), "drained", format!("{drained}: {what}")));
            n.kube = KubeStep::Upgrading;
            n.kube_since_ms = now;
            n.turn_at_ms = now;
            n.touched |= !n.reverting;
            n.unreached = !v.connected;
            n.message = format!(
                "{drained}; {} → {}",
                version_or_none(&n.previous_version),
                version_or_none(to.as_deref().unwrap_or_default())
            );
            assign.push((n.name.clone(), to));
        }
        Some(KubeFact::Blocked(why)) => blocked(policy, n, why.clone(), notes),
        _ => {
            let limit = ms(Duration::from_millis(policy.timeout_ms) + ANSWER_GRACE);
            if now.saturating_sub(n.kube_since_ms.max(clock.since_ms)) > limit {
                let why = format!(
                    "drain-blocked: no answer from the tenant API within {}",
                    format_duration(Duration::from_millis(policy.timeout_ms))
                );
                blocked(policy, n, why, notes);
            }
        }
    }
}

/// A drain that gave up: the node fails (or is skipped), nothing was
/// assigned, the cordon is lifted.
fn blocked(policy: &DrainPolicy, n: &mut RolloutNodeRow, why: String, notes: &mut Notes) {
    n.state = match policy.on_timeout {
        DrainTimeout::Fail => NodeState::Failed,
        DrainTimeout::Skip => NodeState::Skipped,
    };
    n.kube = KubeStep::None;
    n.message = why;
    notes.push((n.name.clone(), "drain_blocked", n.message.clone()));
}

/// "drained in 3.2s": from when the turn's drain began to when it drained
/// (and the version was assigned), so its outcome says how long each
/// phase took. `None` for a row stored before the start was kept.
fn drained_in(n: &RolloutNodeRow) -> Option<String> {
    (n.drain_started_ms > 0 && n.turn_at_ms >= n.drain_started_ms)
        .then(|| format!("drained in {}", took(n.drain_started_ms, n.turn_at_ms)))
}

/// The agent applied: the Node must now be `Ready`.
pub(super) fn applied(n: &mut RolloutNodeRow, to: &str, now_ms: i64) {
    n.kube = KubeStep::Readying;
    n.kube_since_ms = now_ms;
    n.message = match drained_in(n) {
        Some(d) => format!("applied {to} ({d}); waiting for the Node to be Ready"),
        None => format!("applied {to}; waiting for the Node to be Ready"),
    };
}

/// A node waiting for its Node to be `Ready`: done, timed out, or waiting.
pub(super) fn settle_readying(
    r: &RolloutRow,
    policy: &DrainPolicy,
    n: &mut RolloutNodeRow,
    v: &NodeView,
    clock: &Clock,
    notes: &mut Notes,
) {
    let now = clock.now_ms;
    if v.kube == Some(KubeFact::Ready) {
        let (state, kind, to) = if n.reverting {
            (
                NodeState::RolledBack,
                "rolled_back",
                version_or_none(&n.previous_version).to_string(),
            )
        } else {
            (NodeState::Updated, "applied", r.version.clone())
        };
        let after = took(n.kube_since_ms, now);
        notes.push((
            n.name.clone(),
            "node_ready",
            format!("Ready {after} after it applied {to}"),
        ));
        n.state = state;
        n.kube = KubeStep::None;
        n.message = match drained_in(n) {
            Some(d) => format!("at {to}; {d}, Ready {after} after it applied"),
            None => format!("at {to}; Ready {after} after it applied"),
        };
        notes.push((n.name.clone(), kind, format!("at {to}")));
        return;
    }
    let timeout = Duration::from_millis(policy.ready_timeout_ms);
    if now.saturating_sub(n.kube_since_ms.max(clock.since_ms)) > ms(timeout) {
        let why = match &v.kube {
            Some(KubeFact::NotReady(why)) => why.clone(),
            _ => "no answer from the tenant API".into(),
        };
        n.state = NodeState::Failed;
        n.kube = KubeStep::None;
        n.message = format!("not Ready within {} of applying: {why}", format_duration(timeout));
        notes.push((n.name.clone(), "failed", n.message.clone()));
    }
}

/// Stops every drain in progress: the node goes back to waiting (a pause:
/// it drains anew on resume) or is skipped (`why`), unassigned; the
/// controller lifts the cordon.
pub(super) fn stop_drains(d: &mut Decision, to: NodeState, why: &str) {
    let mut stopped = Vec::new();
    for n in d
        .rollout
        .nodes
        .iter_mut()
        .filter(|n| n.state == NodeState::Applying && n.kube == KubeStep::Draining)
    {
        n.state = to;
        n.kube = KubeStep::None;
        n.message = why.to_string();
        if to == NodeState::Waiting {
            n.turn_at_ms = 0;
        }
        stopped.push(n.name.clone());
    }
    for n in stopped {
        d.note(&n, "drain_stopped", why);
    }
}
