//! Rollout decisions: given a rollout as stored and what its nodes report
//! now, what happens next — which nodes committed or failed, which start,
//! whether the rollout ends — and what the operator verbs do.
//!
//! Pure functions over store rows, so the rules are unit-tested without a
//! server. The rollout controller (`controller.rs`) is the only caller: it
//! stores each [`Decision`] in one transaction and then tells the agents.
//!
//! The rules:
//! - Nodes start in the rollout's node order (sorted by name). At most
//!   `batch_size` nodes are `applying` at once; a node holds its slot from
//!   the decision that changes its desired state until it reports the
//!   version applied (or failed / rolled back) for that desired state or a
//!   later one.
//! - A node that is offline when its turn comes is *deferred* (`--offline
//!   defer`, the default): it takes no slot and is no failure, and it starts
//!   like any other node once it is back — also after the rollout completed,
//!   until a newer rollout of the same bundle takes the node in.
//! - With `--offline wait` it is assigned all the same (it gets its desired
//!   state when it connects) and holds its slot. If it stays offline for
//!   longer than the offline deadline it counts as failed; if it never
//!   connected since its turn, its assignment is taken back in the same
//!   decision, so it stays on its old version. An applying node that
//!   disappears mid-apply for longer than the deadline fails under either
//!   policy.
//! - A held node (`lksctl node hold`) is skipped at its turn (`held`) and
//!   starts like a deferred node once released. A rollback does not move a
//!   held node either: it is skipped and keeps what it has.
//! - No node starts while every maintenance window of the cluster is closed
//!   (unless the rollout ignores windows); the rollout records that it is
//!   waiting and when the next window opens. Nodes mid-apply finish.
//! - Canaries (`--canary N`) are picked at the first decision — reachable,
//!   unheld nodes first, in an order fixed by the recorded seed — and are the
//!   only nodes started until every one of them is settled and has stayed
//!   committed for the soak time. A canary that fails, during its apply or
//!   the soak, fails the rollout at once, whatever the threshold.
//! - With a batch interval, batches are discrete: the next one starts only
//!   when the last has settled and the interval has passed since.
//! - A rollback is the operator's way out: it ignores windows, canaries and
//!   the batch interval.
//! - Once failures reach the threshold the rollout is `failed` and no node
//!   is started any more; nodes mid-apply finish and are still recorded.
//! - `completed` makes the version the cluster's target for joining nodes.
//! - A rollback returns every node the rollout changed to its previous
//!   version (or removes the bundle), in batches of the same size, waiting
//!   for each node like a forward step; failures do not stop it.
//!
//! A step runs in phases, one file each: `settle` (in-flight nodes
//! report, fail or stay offline too long), `canary` (canaries first, then
//! the soak), `batch` (start nodes: pacing, windows, holds, deferral) and
//! `complete` (the threshold, completion, the end of a rollback). The operator
//! verbs are in `verbs`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::store::{BundleStatusRow, EventRow, NodeState, RolloutRow, RolloutState, TargetChange};
use crate::windows::Window;

pub mod ages;
mod batch;
mod canary;
mod complete;
mod drain;
mod settle;
#[cfg(test)]
mod tests;
mod verbs;

pub use verbs::{Verb, VerbError, apply_verb};

use canary::Gate;

/// Failures tolerated before a rollout fails, when the operator gives none.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 1;
/// How long a node may be offline at its turn, when the operator gives none.
pub const DEFAULT_OFFLINE_DEADLINE: Duration = Duration::from_secs(600);
// The default batch is decided where a rollout's start is recorded.
pub use crate::store::{DEFAULT_BATCH_PERCENT, default_batch_size};

/// Per-state node counts of a rollout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub total: u32,
    pub updated: u32,
    pub failed: u32,
    /// Not done yet: waiting or applying.
    pub pending: u32,
    pub applying: u32,
    pub rolled_back: u32,
    pub skipped: u32,
    /// Offline at their turn; they start when they are back.
    pub deferred: u32,
    /// Held by the operator at their turn.
    pub held: u32,
}

pub fn counts(r: &RolloutRow) -> Counts {
    let mut c = Counts {
        total: r.nodes.len() as u32,
        ..Default::default()
    };
    for n in &r.nodes {
        match n.state {
            NodeState::Updated => c.updated += 1,
            NodeState::Failed => c.failed += 1,
            NodeState::Applying => {
                c.applying += 1;
                c.pending += 1;
            }
            NodeState::Waiting => c.pending += 1,
            NodeState::RolledBack => c.rolled_back += 1,
            NodeState::Skipped => c.skipped += 1,
            NodeState::Deferred => c.deferred += 1,
            NodeState::Held => c.held += 1,
        }
    }
    c
}

/// The one-line outcome of a forward rollout, e.g. "3 of 4 node(s)
/// updated, 1 deferred".
fn summary(c: &Counts) -> String {
    let mut m = format!("{} of {} node(s) updated", c.updated, c.total);
    for (n, what) in [
        (c.failed, "failed"),
        (c.skipped, "skipped"),
        (c.deferred, "deferred"),
        (c.held, "held"),
        (c.applying, "applying"),
    ] {
        if n > 0 {
            m.push_str(&format!(", {n} {what}"));
        }
    }
    m
}

/// One node of a rollout as the controller sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// The bundle's desired version on the node.
    pub desired: Option<String>,
    /// What the node last reported about the bundle.
    pub actual: Option<BundleStatusRow>,
    pub connected: bool,
    /// Last time the node was heard from (Unix ms).
    pub last_seen_ms: i64,
    /// Held by the operator (`lksctl node hold`).
    pub held: bool,
    /// A newer rollout of the same cluster and bundle that includes the
    /// node and is still driven: a deferred or held node is its business now.
    pub claimed_by: Option<String>,
    /// Why the node's agent cannot carry out this bundle (it did not
    /// announce a feature the bundle needs): the node fails at its turn
    /// instead of silently dropping part of the bundle.
    pub unsupported: Option<String>,
    /// In a draining rollout, what the tenant cluster said of the node's
    /// current step (its drain, its Ready gate); `None`: nothing yet.
    pub kube: Option<KubeFact>,
}

/// What the tenant cluster said of a draining node's current step, as the
/// controller's kube work found it (module `drain` says what each does);
/// `lks-kube` owns it, since its tasks make it.
pub use lks_kube::work::KubeFact;

/// The controller's clock: now, when it started (a node is never held
/// offline for time the controller itself was not running), and the
/// maintenance windows of the rollout's cluster (empty: always open).
#[derive(Clone, Debug)]
pub struct Clock {
    pub now_ms: i64,
    pub since_ms: i64,
    pub windows: Vec<Window>,
    /// The cluster's stored windows no longer parse: treated as closed.
    pub windows_unreadable: bool,
}

/// Something that happened, to be recorded as an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Empty for the rollout as a whole.
    pub node: String,
    pub kind: &'static str,
    pub message: String,
}

/// What to store: the rollout's next state, desired-state changes, the
/// target change and what to record.
#[derive(Clone, Debug)]
pub struct Decision {
    pub rollout: RolloutRow,
    /// Node → version to assign (`None`: remove the bundle).
    pub assign: Vec<(String, Option<String>)>,
    pub target: TargetChange,
    pub notes: Vec<Note>,
}

impl Decision {
    fn new(r: &RolloutRow) -> Self {
        Decision {
            rollout: r.clone(),
            assign: Vec::new(),
            target: TargetChange::Keep,
            notes: Vec::new(),
        }
    }

    fn note(&mut self, node: &str, kind: &'static str, message: impl Into<String>) {
        self.notes.push(Note {
            node: node.to_string(),
            kind,
            message: message.into(),
        });
    }

    /// The notes as event rows.
    pub fn events(&self, at_ms: i64) -> Vec<EventRow> {
        let r = &self.rollout;
        self.notes
            .iter()
            .map(|n| EventRow {
                id: 0,
                at_ms,
                cluster: r.cluster.clone(),
                node: n.node.clone(),
                rollout_id: r.id.clone(),
                kind: n.kind.to_string(),
                bundle: r.bundle.clone(),
                version: r.version.clone(),
                message: n.message.clone(),
            })
            .collect()
    }
}

fn version_or_none(v: &str) -> &str {
    if v.is_empty() { "no version" } else { v }
}

/// Marks every node that has not started (waiting, deferred, held) skipped.
fn skip_waiting(d: &mut Decision, why: &str) {
    let mut skipped = Vec::new();
    for n in d.rollout.nodes.iter_mut().filter(|n| n.startable()) {
        n.state = NodeState::Skipped;
        n.message = why.to_string();
        skipped.push(n.name.clone());
    }
    for n in skipped {
        d.note(&n, "skipped", why);
    }
}

fn finish(r: &RolloutRow, mut d: Decision, clock: &Clock) -> Option<Decision> {
    if d.rollout == *r && d.assign.is_empty() && d.notes.is_empty() {
        return None;
    }
    d.rollout.updated_at_ms = clock.now_ms;
    Some(d)
}

/// The next decision for `r` given its nodes' `views` (a node without a
/// view was deleted), or `None` if nothing changes.
pub fn step(r: &RolloutRow, views: &BTreeMap<String, NodeView>, clock: Clock) -> Option<Decision> {
    let clock = &clock;
    let mut d = Decision::new(r);
    settle::settle(r, &mut d, views, clock);
    if complete::ended(r, &mut d) {
        return finish(r, d, clock);
    }
    let reverting = d.rollout.state == RolloutState::RollingBack;
    if reverting {
        settle::queue_rollback(&mut d);
    }
    let gate = if reverting {
        Gate::Open
    } else {
        canary::gate(r, &mut d, views, clock.now_ms)
    };
    if gate == Gate::Failed {
        return finish(r, d, clock);
    }
    if !reverting && d.rollout.state != RolloutState::Completed && complete::fail_at_threshold(r, &mut d) {
        return finish(r, d, clock);
    }
    if d.rollout.state == RolloutState::Paused {
        return finish(r, d, clock);
    }
    batch::start(r, &mut d, views, clock, reverting, gate == Gate::CanariesOnly);
    complete::conclude(&mut d, reverting);
    finish(r, d, clock)
}
