//! Rollout decisions: given a rollout as stored and what its nodes report
//! now, what happens next — which nodes committed or failed, which start,
//! whether the rollout ends — and what the operator verbs do.
//!
//! Pure functions over store rows, so the rules are unit-tested without a
//! server: this crate links the store's rows (`lks-store`) and the
//! maintenance windows (`lks-proto`), nothing that does I/O. The server's
//! rollout controller (`controller.rs`) is the only caller: it stores each
//! [`Decision`] in one transaction and then tells the agents.
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
//! What a step decides over (the views, the clock, the decision) is in
//! `decision`. A step runs in phases, one file each: `settle` (in-flight nodes
//! report, fail or stay offline too long), `canary` (canaries first, then
//! the soak), `batch` (start nodes: pacing, windows, holds, deferral) and
//! `complete` (the threshold, completion, the end of a rollback). The operator
//! verbs are in `verbs`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use lks_store::{RolloutRow, RolloutState};

pub mod ages;
mod batch;
mod canary;
mod complete;
mod decision;
mod drain;
pub mod fleetlock;
pub mod gates;
pub mod plan;
pub mod policy;
pub mod reboot;
mod settle;
#[cfg(test)]
mod tests;
mod verbs;

use canary::Gate;
pub use decision::{Clock, Counts, Decision, KubeFact, NodeView, Note, counts};
pub use verbs::{Verb, VerbError, apply_verb};

pub use policy::{DEFAULT_FAILURE_THRESHOLD, DEFAULT_OFFLINE_DEADLINE, Policy, PolicyError};
// The default batch is decided where a rollout's start is recorded.
pub use lks_store::{DEFAULT_BATCH_PERCENT, default_batch_size};

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
