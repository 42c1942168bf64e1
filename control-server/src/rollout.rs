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

use std::collections::BTreeMap;
use std::time::Duration;

use lks_proto::BundleState;
use lks_proto::duration::format_duration;
use sha2::{Digest as _, Sha256};

use crate::store::{
    BundleStatusRow, EventRow, NodeState, OfflinePolicy, RolloutNodeRow, RolloutRow, RolloutState,
    TargetChange,
};
use crate::windows::{self, Window};

/// Failures tolerated before a rollout fails, when the operator gives none.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 1;
/// How long a node may be offline at its turn, when the operator gives none.
pub const DEFAULT_OFFLINE_DEADLINE: Duration = Duration::from_secs(600);
/// Default batch: this share (percent, rounded up, at least one node) of
/// the rollout's nodes.
pub const DEFAULT_BATCH_PERCENT: usize = 10;

/// The batch size used when the operator gives none.
pub fn default_batch_size(nodes: usize) -> u32 {
    let n = nodes.saturating_mul(DEFAULT_BATCH_PERCENT).div_ceil(100).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

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
}

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

fn version_or_none(v: &str) -> &str {
    if v.is_empty() { "no version" } else { v }
}

/// The verdict of an applying node: committed, failed (why), or not yet.
fn verdict(
    r: &RolloutRow,
    reverting: bool,
    previous: &str,
    generation: u64,
    v: &NodeView,
) -> Option<Result<(), String>> {
    // A report counts only if it answers the desired state this rollout
    // gave the node (or a later one): an older verdict on the same version
    // says nothing about this attempt.
    let fresh = v.actual.as_ref().filter(|a| a.generation >= generation);
    let (want, prefix) = if reverting {
        if previous.is_empty() {
            // Back to nothing: done once the node no longer reports the bundle.
            return v.actual.is_none().then_some(Ok(()));
        }
        (previous, format!("rollback to {previous} failed: "))
    } else {
        (r.version.as_str(), String::new())
    };
    let a = fresh.filter(|a| a.version == want)?;
    match a.state {
        BundleState::Applied => Some(Ok(())),
        BundleState::Failed | BundleState::RolledBack => {
            let why = if a.message.is_empty() {
                format!("{want} {}", a.state)
            } else {
                a.message.clone()
            };
            Some(Err(format!("{prefix}{why}")))
        }
        BundleState::Pending | BundleState::Applying => None,
    }
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

fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{ms} ms"))
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

/// The next decision for `r` given its nodes' `views` (a node without a
/// view was deleted), or `None` if nothing changes.
pub fn step(r: &RolloutRow, views: &BTreeMap<String, NodeView>, clock: Clock) -> Option<Decision> {
    let clock = &clock;
    let mut d = Decision::new(r);
    let deadline = r.offline_deadline_ms;
    let now = clock.now_ms;

    // Nodes that left, and applying nodes that committed, failed or stayed
    // away too long. This goes on after the rollout ended: nodes mid-apply
    // finish and their outcome is recorded.
    let mut notes = Vec::new();
    let mut unassign = Vec::new();
    for n in d.rollout.nodes.iter_mut() {
        let Some(v) = views.get(&n.name) else {
            if matches!(n.state, NodeState::Applying) || n.startable() {
                n.state = NodeState::Skipped;
                n.message = "node was deleted".into();
                notes.push((n.name.clone(), "skipped", n.message.clone()));
            }
            continue;
        };
        if matches!(n.state, NodeState::Deferred | NodeState::Held) {
            // A newer rollout took the node in, or something else moved it:
            // catching it up to this version would only undo that.
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
            continue;
        }
        if n.state != NodeState::Applying {
            continue;
        }
        if n.unreached && v.connected {
            // It connected, so it received its desired state.
            n.unreached = false;
            n.message.clear();
        }
        match verdict(r, n.reverting, &n.previous_version, n.generation, v) {
            Some(Ok(())) => {
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
            Some(Err(why)) => {
                n.state = NodeState::Failed;
                n.message = why;
                notes.push((n.name.clone(), "failed", n.message.clone()));
            }
            None if offline_too_long(n.turn_at_ms, v, clock, deadline) => {
                n.state = NodeState::Failed;
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
    d.assign = unassign;
    for (node, kind, message) in notes.drain(..) {
        d.note(&node, kind, message);
    }
    let catching_up =
        d.rollout.state == RolloutState::Completed && d.rollout.nodes.iter().any(RolloutNodeRow::startable);
    if d.rollout.state.is_terminal() && !catching_up {
        if d.rollout.state == RolloutState::Completed && counts(&d.rollout) != counts(r) {
            // A node that caught up settled: the outcome line follows it.
            d.rollout.message = summary(&counts(&d.rollout));
        }
        return finish(r, d, clock);
    }
    let reverting = d.rollout.state == RolloutState::RollingBack;
    let policy = r.policy.clone();

    if reverting {
        // Nodes the rollout changed go back once their forward apply is over.
        for n in d.rollout.nodes.iter_mut() {
            if n.touched && !n.reverting && matches!(n.state, NodeState::Updated | NodeState::Failed) {
                n.reverting = true;
                n.state = NodeState::Waiting;
                n.message.clear();
                n.turn_at_ms = 0;
            }
        }
    }

    // The canary phase: canaries first, then the soak; a canary failure
    // ends the rollout whatever the threshold.
    let mut only_canaries = false;
    if !reverting && policy.canary > 0 && !d.rollout.pacing.canaries_passed {
        if !d.rollout.nodes.iter().any(|n| n.canary) {
            let picked = pick_canaries(&mut d, views);
            if picked.is_empty() {
                // Every node left or is held: nothing to learn from first.
                d.rollout.pacing.canaries_passed = true;
                d.note("", "canaries_passed", "no node could be picked as a canary");
            } else {
                let m = format!("{} (seed {})", picked.join(", "), policy.canary_seed);
                d.note("", "canaries_picked", m);
            }
        }
        let mut failed = None;
        let phase = !d.rollout.pacing.canaries_passed;
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
        for (node, kind, message) in notes.drain(..) {
            d.note(&node, kind, message);
        }
        if let Some(why) = failed {
            d.rollout.state = RolloutState::Failed;
            d.rollout.message = format!("{why}; no other node was started");
            skip_waiting(&mut d, "not started: a canary failed");
            let m = d.rollout.message.clone();
            d.note("", "rollout_failed", m);
            return finish(r, d, clock);
        }
        let settling = d
            .rollout
            .nodes
            .iter()
            .any(|n| n.canary && matches!(n.state, NodeState::Waiting | NodeState::Applying));
        if phase && settling {
            only_canaries = true;
        } else if phase {
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
            if now >= soak_ends {
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
            } else {
                only_canaries = true;
            }
        }
    }

    if !reverting && d.rollout.state != RolloutState::Completed {
        let c = counts(&d.rollout);
        let threshold = r.failure_threshold.max(1);
        if c.failed >= threshold {
            let first = d
                .rollout
                .nodes
                .iter()
                .find(|n| n.state == NodeState::Failed)
                .map(|n| format!(" (first: {}: {})", n.name, n.message))
                .unwrap_or_default();
            d.rollout.state = RolloutState::Failed;
            d.rollout.message = format!("{} node(s) failed, threshold {threshold}{first}", c.failed);
            skip_waiting(&mut d, "not started: the rollout failed");
            let m = d.rollout.message.clone();
            d.note("", "rollout_failed", m);
            return finish(r, d, clock);
        }
    }
    if d.rollout.state == RolloutState::Paused {
        return finish(r, d, clock);
    }

    let applying = counts(&d.rollout).applying as usize;
    // Discrete batches with a pause between them.
    let mut paced = false;
    if !reverting && policy.batch_interval_ms > 0 {
        if applying == 0 && counts(r).applying > 0 && d.rollout.nodes.iter().any(RolloutNodeRow::startable) {
            d.rollout.pacing.next_batch_at_ms =
                now.saturating_add(i64::try_from(policy.batch_interval_ms).unwrap_or(i64::MAX));
        }
        paced = applying > 0 || now < d.rollout.pacing.next_batch_at_ms;
    }
    // Windows: nothing starts while they are all closed.
    let window_open = reverting
        || policy.ignore_windows
        || (!clock.windows_unreadable && windows::is_open(&clock.windows, now));
    let ready = d.rollout.nodes.iter().any(|n| {
        n.startable()
            && (!only_canaries || n.canary)
            && views
                .get(&n.name)
                .is_some_and(|v| !v.held && (v.connected || policy.offline == OfflinePolicy::Wait))
    });
    let pacing = &mut d.rollout.pacing;
    if !window_open && ready {
        let next = windows::next_open(&clock.windows, now).unwrap_or(0);
        if !pacing.waiting_for_window || pacing.next_window_ms != next {
            pacing.waiting_for_window = true;
            pacing.next_window_ms = next;
            let m = if next > 0 {
                format!(
                    "every maintenance window is closed; the next opens at {}",
                    rfc3339(next)
                )
            } else {
                "every maintenance window is closed".to_string()
            };
            d.note("", "waiting_for_window", m);
        }
    } else if pacing.waiting_for_window && window_open {
        pacing.waiting_for_window = false;
        pacing.next_window_ms = 0;
        d.note("", "window_open", "a maintenance window is open; nodes start");
    }

    // Start nodes, in order, while slots are free.
    let mut slots = (r.batch_size.max(1) as usize).saturating_sub(applying);
    if !window_open || paced {
        slots = 0;
    }
    let mut assign = Vec::new();
    let waiting_for = format!(
        "offline; waiting up to {} for it to connect",
        format_duration(Duration::from_millis(deadline))
    );
    for n in d.rollout.nodes.iter_mut().filter(|n| n.startable()) {
        if only_canaries && !n.canary {
            continue;
        }
        let Some(v) = views.get(&n.name) else { continue };
        if reverting {
            if v.desired.as_deref() != Some(r.version.as_str()) {
                n.state = NodeState::Skipped;
                n.message = match &v.desired {
                    Some(x) => format!("not rolled back: it has moved on to {x}"),
                    None => "not rolled back: the bundle was removed from it".into(),
                };
                notes.push((n.name.clone(), "skipped", n.message.clone()));
                continue;
            }
            if v.held {
                n.state = NodeState::Skipped;
                n.message = format!("not rolled back: the node is held; it keeps {}", r.version);
                notes.push((n.name.clone(), "skipped", n.message.clone()));
                continue;
            }
            if slots == 0 {
                break;
            }
            let to = (!n.previous_version.is_empty()).then(|| n.previous_version.clone());
            notes.push((
                n.name.clone(),
                "node_started",
                format!(
                    "rolling back to {}",
                    to.as_deref().unwrap_or("no version (removing the bundle)")
                ),
            ));
            assign.push((n.name.clone(), to));
        } else {
            let applied = v
                .actual
                .as_ref()
                .is_some_and(|a| a.version == r.version && a.state == BundleState::Applied);
            if v.desired.as_deref() == Some(r.version.as_str()) && applied {
                // Already there: nothing to assign, no slot needed.
                n.state = NodeState::Updated;
                n.message = format!("already at {}", r.version);
                notes.push((n.name.clone(), "applied", n.message.clone()));
                continue;
            }
            if slots == 0 {
                break;
            }
            if v.held {
                if n.state != NodeState::Held {
                    n.state = NodeState::Held;
                    n.message = "held by the operator; starts after `lksctl node unhold`".into();
                    notes.push((n.name.clone(), "held", n.message.clone()));
                }
                continue;
            }
            if let Some(why) = &v.unsupported {
                n.state = NodeState::Failed;
                n.message = why.clone();
                notes.push((n.name.clone(), "failed", n.message.clone()));
                continue;
            }
            if !v.connected && policy.offline == OfflinePolicy::Defer {
                if n.state != NodeState::Deferred {
                    n.state = NodeState::Deferred;
                    n.message = "offline at its turn; it applies the version when it is back".into();
                    notes.push((n.name.clone(), "deferred", n.message.clone()));
                }
                continue;
            }
            let from = version_or_none(v.desired.as_deref().unwrap_or_default());
            let message = match n.state {
                NodeState::Deferred => {
                    format!("{from} → {} (caught up: it was offline at its turn)", r.version)
                }
                NodeState::Held => format!("{from} → {} (caught up: it was held)", r.version),
                _ => format!("{from} → {}", r.version),
            };
            n.touched = true;
            notes.push((n.name.clone(), "node_started", message));
            assign.push((n.name.clone(), Some(r.version.clone())));
        }
        n.state = NodeState::Applying;
        n.turn_at_ms = now;
        n.unreached = !v.connected;
        n.message = if v.connected {
            String::new()
        } else {
            waiting_for.clone()
        };
        slots -= 1;
    }
    d.assign.extend(assign);
    for (node, kind, message) in notes.drain(..) {
        d.note(&node, kind, message);
    }

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
    finish(r, d, clock)
}

/// An operator's command on a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Pause,
    Resume,
    Abort,
    Rollback,
}

/// A verb the rollout's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    #[error("rollout {id} is {state}; only a running rollout can be paused")]
    NotRunning { id: String, state: &'static str },
    #[error("rollout {id} is {state}; only a paused rollout can be resumed")]
    NotPaused { id: String, state: &'static str },
    #[error("rollout {id} has already ended ({state})")]
    Ended { id: String, state: &'static str },
    #[error("rollout {id} is rolling back; wait for the rollback to finish")]
    RollingBack { id: String },
    #[error("rollout {id} was already rolled back")]
    RolledBack { id: String },
}

/// What `verb` does to `r`. The controller steps the result at once (so a
/// resume starts nodes and a rollback with nothing to undo ends).
pub fn apply_verb(r: &RolloutRow, verb: Verb, now_ms: i64) -> Result<Decision, VerbError> {
    let id = r.id.clone();
    let state = r.state.as_str();
    let mut d = Decision::new(r);
    d.rollout.updated_at_ms = now_ms;
    match (verb, r.state) {
        (Verb::Pause, RolloutState::Running) => {
            d.rollout.state = RolloutState::Paused;
            d.rollout.message = "paused by operator: no new node is started".into();
            d.note("", "paused", "");
        }
        (Verb::Pause, _) => return Err(VerbError::NotRunning { id, state }),
        (Verb::Resume, RolloutState::Paused) => {
            d.rollout.state = RolloutState::Running;
            d.rollout.message.clear();
            d.note("", "resumed", "");
        }
        (Verb::Resume, _) => return Err(VerbError::NotPaused { id, state }),
        (Verb::Abort, RolloutState::Running | RolloutState::Paused) => {
            d.rollout.state = RolloutState::Aborted;
            d.rollout.message = "aborted by operator; nodes already started keep the new version".into();
            skip_waiting(&mut d, "not started: the rollout was aborted");
            d.note("", "aborted", "");
        }
        (Verb::Abort | Verb::Rollback, RolloutState::RollingBack) => {
            return Err(VerbError::RollingBack { id });
        }
        (Verb::Abort, _) => return Err(VerbError::Ended { id, state }),
        (Verb::Rollback, RolloutState::RolledBack) => return Err(VerbError::RolledBack { id }),
        (Verb::Rollback, _) => {
            d.rollout.state = RolloutState::RollingBack;
            let touched = r.nodes.iter().filter(|n| n.touched).count();
            d.rollout.message =
                format!("rolling back: {touched} node(s) return to the version they had before");
            skip_waiting(&mut d, "not started: the rollout was rolled back");
            d.note("", "rollout_rolling_back", format!("from {state}"));
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RolloutPolicy;

    const V: &str = "2";

    fn rollout(nodes: &[&str], batch: u32, threshold: u32) -> RolloutRow {
        RolloutRow {
            id: "r".into(),
            cluster: "c".into(),
            bundle: "k".into(),
            version: V.into(),
            selector: Default::default(),
            batch_size: batch,
            failure_threshold: threshold,
            offline_deadline_ms: 10_000,
            state: RolloutState::Running,
            nodes: nodes.iter().map(|n| RolloutNodeRow::waiting(n, "1")).collect(),
            created_at_ms: 0,
            updated_at_ms: 0,
            message: String::new(),
            revision: 0,
            previous_target: None,
            policy: RolloutPolicy::legacy(),
            pacing: Default::default(),
        }
    }

    fn online(desired: &str) -> NodeView {
        NodeView {
            desired: Some(desired.into()),
            actual: Some(report(desired, BundleState::Applied, 1)),
            connected: true,
            last_seen_ms: 0,
            held: false,
            claimed_by: None,
            unsupported: None,
        }
    }

    fn report(version: &str, state: BundleState, generation: u64) -> BundleStatusRow {
        BundleStatusRow {
            fetched_from_server: 0,
            fetched_from_peers: 0,
            name: "k".into(),
            version: version.into(),
            state,
            message: if state == BundleState::Applied {
                String::new()
            } else {
                "boom".into()
            },
            updated_at_ms: 0,
            generation,
        }
    }

    fn views(nodes: &[&str]) -> BTreeMap<String, NodeView> {
        nodes.iter().map(|n| (n.to_string(), online("1"))).collect()
    }

    fn at(ms: i64) -> Clock {
        Clock {
            now_ms: ms,
            since_ms: 0,
            windows: Vec::new(),
            windows_unreadable: false,
        }
    }

    /// Stores the decision the way the store does: assigned nodes get a
    /// generation, desired states follow.
    fn commit(d: Decision, v: &mut BTreeMap<String, NodeView>, generation: &mut u64) -> RolloutRow {
        let mut r = d.rollout;
        for (node, version) in d.assign {
            *generation += 1;
            if let Some(n) = r.nodes.iter_mut().find(|n| n.name == node) {
                n.generation = *generation;
            }
            if let Some(view) = v.get_mut(&node) {
                view.desired = version;
            }
        }
        r.revision += 1;
        r
    }

    fn states(r: &RolloutRow) -> Vec<&'static str> {
        r.nodes.iter().map(|n| n.state.as_str()).collect()
    }

    fn reply(
        v: &mut BTreeMap<String, NodeView>,
        r: &RolloutRow,
        node: &str,
        version: &str,
        state: BundleState,
    ) {
        let g = r.nodes.iter().find(|n| n.name == node).unwrap().generation;
        v.get_mut(node).unwrap().actual = Some(report(version, state, g));
    }

    #[test]
    fn default_batch_is_ten_percent_rounded_up() {
        assert_eq!(default_batch_size(0), 1);
        assert_eq!(default_batch_size(5), 1);
        assert_eq!(default_batch_size(10), 1);
        assert_eq!(default_batch_size(11), 2);
        assert_eq!(default_batch_size(250), 25);
    }

    #[test]
    fn a_node_whose_agent_lacks_a_feature_fails_at_its_turn_and_gets_nothing() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        v.get_mut("a").unwrap().unsupported = Some("its agent does not announce \"certificates\"".into());
        let r = rollout(&nodes, 1, 5);
        let d = step(&r, &v, at(1)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))], "a takes no slot");
        let a = d.rollout.nodes.iter().find(|n| n.name == "a").unwrap();
        assert_eq!(a.state, NodeState::Failed);
        assert!(a.message.contains("certificates"), "{}", a.message);
    }

    #[test]
    fn starts_in_order_never_more_than_the_batch_and_completes() {
        let nodes = ["a", "b", "c", "d", "e"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = rollout(&nodes, 2, 1);
        let d = step(&r, &v, at(1)).unwrap();
        assert_eq!(
            d.assign,
            vec![("a".into(), Some(V.into())), ("b".into(), Some(V.into()))]
        );
        let r = commit(d, &mut v, &mut g);
        assert_eq!(
            states(&r),
            ["applying", "applying", "waiting", "waiting", "waiting"]
        );
        assert!(step(&r, &v, at(2)).is_none(), "nothing reported, nothing to do");

        // A stale report (older generation) for the version does not count.
        v.get_mut("a").unwrap().actual = Some(report(V, BundleState::Applied, 0));
        assert!(step(&r, &v, at(3)).is_none());

        reply(&mut v, &r, "a", V, BundleState::Applied);
        let d = step(&r, &v, at(4)).unwrap();
        assert_eq!(d.assign, vec![("c".into(), Some(V.into()))], "one slot freed");
        assert!(d.notes.iter().any(|n| n.node == "a" && n.kind == "applied"));
        let mut r = commit(d, &mut v, &mut g);
        for _ in 0..4 {
            let applying: Vec<String> = r
                .nodes
                .iter()
                .filter(|n| n.state == NodeState::Applying)
                .map(|n| n.name.clone())
                .collect();
            assert!(applying.len() <= 2);
            for n in &applying {
                reply(&mut v, &r, n, V, BundleState::Applied);
            }
            if let Some(d) = step(&r, &v, at(5)) {
                r = commit(d, &mut v, &mut g);
            }
        }
        assert_eq!(r.state, RolloutState::Completed, "{r:?}");
        assert_eq!(counts(&r).updated, 5);
        assert!(r.nodes.iter().all(|n| n.touched));
    }

    #[test]
    fn completion_sets_the_target_and_an_empty_rollout_completes_at_once() {
        let r = rollout(&[], 1, 1);
        let d = step(&r, &BTreeMap::new(), at(1)).unwrap();
        assert_eq!(d.rollout.state, RolloutState::Completed);
        assert_eq!(d.target, TargetChange::SetToRollout);
        assert!(d.notes.iter().any(|n| n.kind == "rollout_completed"));
    }

    #[test]
    fn threshold_stops_starting_nodes_and_in_flight_nodes_still_settle() {
        let nodes = ["a", "b", "c", "d"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 2, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        reply(&mut v, &r, "a", V, BundleState::RolledBack);
        let d = step(&r, &v, at(2)).unwrap();
        assert!(d.assign.is_empty(), "no new node after the threshold");
        let r = commit(d, &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Failed);
        assert!(
            r.message
                .contains("1 node(s) failed, threshold 1 (first: a: boom)"),
            "{}",
            r.message
        );
        assert_eq!(states(&r), ["failed", "applying", "skipped", "skipped"]);
        assert_eq!(counts(&r).pending, 1);

        reply(&mut v, &r, "b", V, BundleState::Applied);
        let r = commit(step(&r, &v, at(3)).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Failed, "an ended rollout stays ended");
        assert_eq!(states(&r), ["failed", "updated", "skipped", "skipped"]);
        assert!(step(&r, &v, at(4)).is_none());
    }

    #[test]
    fn failures_below_the_threshold_do_not_stop_it() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 2), &v, at(1)).unwrap(), &mut v, &mut g);
        reply(&mut v, &r, "a", V, BundleState::Failed);
        let r = commit(step(&r, &v, at(2)).unwrap(), &mut v, &mut g);
        assert_eq!(states(&r), ["failed", "applying"]);
        reply(&mut v, &r, "b", V, BundleState::Applied);
        let r = commit(step(&r, &v, at(3)).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Completed);
        assert_eq!(r.message, "1 of 2 node(s) updated, 1 failed");
    }

    #[test]
    fn offline_nodes_hold_their_slot_then_fail_and_are_taken_back() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        v.get_mut("a").unwrap().connected = false;
        v.get_mut("a").unwrap().last_seen_ms = 500;
        let mut g = 0;
        let r = rollout(&nodes, 1, 5);
        let d = step(&r, &v, at(1_000)).unwrap();
        assert_eq!(
            d.assign,
            vec![("a".into(), Some(V.into()))],
            "assigned while offline"
        );
        let r = commit(d, &mut v, &mut g);
        assert_eq!(states(&r), ["applying", "waiting"], "it holds the only slot");
        assert!(r.nodes[0].unreached);
        assert!(
            r.nodes[0].message.contains("offline; waiting up to 10s"),
            "{}",
            r.nodes[0].message
        );

        // Within the deadline nothing happens.
        assert!(step(&r, &v, at(11_000)).is_none());
        let d = step(&r, &v, at(11_001)).unwrap();
        assert_eq!(
            d.assign,
            vec![("a".into(), Some("1".into())), ("b".into(), Some(V.into()))],
            "a is taken back in the same decision that starts b"
        );
        let r = commit(d, &mut v, &mut g);
        assert_eq!(r.nodes[0].state, NodeState::Failed);
        assert_eq!(r.nodes[0].message, "offline for more than 10s; left on 1");
        assert!(!r.nodes[0].touched, "a rollback has nothing to undo on it");
        assert_eq!(v["a"].desired.as_deref(), Some("1"));
    }

    #[test]
    fn an_offline_node_that_comes_back_in_time_goes_on() {
        let nodes = ["a"];
        let mut v = views(&nodes);
        v.get_mut("a").unwrap().connected = false;
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        v.get_mut("a").unwrap().connected = true;
        let d = step(&r, &v, at(5)).unwrap();
        assert!(d.assign.is_empty());
        assert!(!d.rollout.nodes[0].unreached);
        assert_eq!(d.rollout.nodes[0].message, "");
        let r = commit(d, &mut v, &mut g);
        // Gone again after it connected: it may have started, so it keeps
        // its assignment when the deadline passes.
        let a = v.get_mut("a").unwrap();
        a.connected = false;
        a.last_seen_ms = 6;
        let d = step(&r, &v, at(20_000)).unwrap();
        assert!(d.assign.is_empty());
        assert_eq!(d.rollout.nodes[0].message, "offline for more than 10s");
        assert!(d.rollout.nodes[0].touched);
    }

    #[test]
    fn an_applying_node_gone_for_longer_than_the_deadline_fails() {
        let nodes = ["a"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 2), &v, at(1)).unwrap(), &mut v, &mut g);
        let a = v.get_mut("a").unwrap();
        a.connected = false;
        a.last_seen_ms = 5_000;
        assert!(step(&r, &v, at(15_000)).is_none());
        // Time the controller was not running does not count.
        let late = Clock {
            now_ms: 16_000,
            since_ms: 14_000,
            windows: Vec::new(),
            windows_unreadable: false,
        };
        assert!(step(&r, &v, late).is_none());
        let r = commit(step(&r, &v, at(15_001)).unwrap(), &mut v, &mut g);
        assert_eq!(r.nodes[0].state, NodeState::Failed);
        assert!(r.nodes[0].touched);
    }

    #[test]
    fn nodes_already_at_the_version_need_no_slot() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        *v.get_mut("a").unwrap() = online(V);
        let d = step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))]);
        assert_eq!(states(&d.rollout), ["updated", "applying"]);
        assert!(!d.rollout.nodes[0].touched);
    }

    #[test]
    fn deleted_nodes_are_skipped_and_free_their_slot() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        v.remove("a");
        let d = step(&r, &v, at(2)).unwrap();
        assert_eq!(states(&d.rollout), ["skipped", "applying"]);
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))]);
    }

    #[test]
    fn pause_holds_new_starts_and_resume_continues() {
        let nodes = ["a", "b", "c"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        let d = apply_verb(&r, Verb::Pause, 2).unwrap();
        assert!(d.notes.iter().any(|n| n.kind == "paused"));
        let r = commit(d, &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Paused);
        assert_eq!(
            apply_verb(&r, Verb::Pause, 3).unwrap_err().to_string(),
            "rollout r is paused; only a running rollout can be paused"
        );
        // The node mid-apply finishes; nothing new starts.
        reply(&mut v, &r, "a", V, BundleState::Applied);
        let d = step(&r, &v, at(3)).unwrap();
        assert!(d.assign.is_empty());
        let r = commit(d, &mut v, &mut g);
        assert_eq!(states(&r), ["updated", "waiting", "waiting"]);
        assert!(step(&r, &v, at(4)).is_none());

        let r = commit(apply_verb(&r, Verb::Resume, 5).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Running);
        let d = step(&r, &v, at(6)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))]);
        assert!(apply_verb(&r, Verb::Resume, 7).is_err());
    }

    #[test]
    fn abort_skips_waiting_nodes_and_lets_applying_ones_finish() {
        let nodes = ["a", "b", "c"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        let r = commit(apply_verb(&r, Verb::Abort, 2).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Aborted);
        assert_eq!(states(&r), ["applying", "skipped", "skipped"]);
        reply(&mut v, &r, "a", V, BundleState::Applied);
        let r = commit(step(&r, &v, at(3)).unwrap(), &mut v, &mut g);
        assert_eq!(states(&r), ["updated", "skipped", "skipped"]);
        assert_eq!(r.state, RolloutState::Aborted);
        assert_eq!(
            apply_verb(&r, Verb::Abort, 4).unwrap_err(),
            VerbError::Ended {
                id: "r".into(),
                state: "aborted"
            }
        );
        assert!(apply_verb(&r, Verb::Pause, 4).is_err());
    }

    #[test]
    fn rollback_returns_touched_nodes_in_batches() {
        let nodes = ["a", "b", "c", "d"];
        let mut v = views(&nodes);
        // d never had the bundle.
        v.get_mut("d").unwrap().desired = None;
        v.get_mut("d").unwrap().actual = None;
        let mut g = 0;
        let mut r = rollout(&nodes, 2, 1);
        r.nodes[3].previous_version = String::new();
        let mut r = commit(step(&r, &v, at(1)).unwrap(), &mut v, &mut g);
        while r.state == RolloutState::Running {
            let applying: Vec<String> = r
                .nodes
                .iter()
                .filter(|n| n.state == NodeState::Applying)
                .map(|n| n.name.clone())
                .collect();
            for n in &applying {
                reply(&mut v, &r, n, V, BundleState::Applied);
            }
            r = commit(step(&r, &v, at(2)).unwrap(), &mut v, &mut g);
        }
        assert_eq!(r.state, RolloutState::Completed);

        let d = apply_verb(&r, Verb::Rollback, 3).unwrap();
        assert_eq!(d.rollout.state, RolloutState::RollingBack);
        let r = commit(d, &mut v, &mut g);
        let d = step(&r, &v, at(4)).unwrap();
        assert_eq!(
            d.assign,
            vec![("a".into(), Some("1".into())), ("b".into(), Some("1".into()))]
        );
        let mut r = commit(d, &mut v, &mut g);
        assert_eq!(states(&r), ["applying", "applying", "waiting", "waiting"]);
        assert!(r.nodes.iter().all(|n| n.reverting));
        let mut rounds = 0;
        while r.state == RolloutState::RollingBack {
            rounds += 1;
            assert!(rounds < 10);
            for n in r.nodes.clone().iter().filter(|n| n.state == NodeState::Applying) {
                assert!(n.reverting);
                if n.previous_version.is_empty() {
                    v.get_mut(&n.name).unwrap().actual = None;
                } else {
                    reply(&mut v, &r, &n.name, &n.previous_version, BundleState::Applied);
                }
            }
            let d = step(&r, &v, at(5)).unwrap();
            if d.assign.iter().any(|(n, _)| n == "d") {
                assert_eq!(
                    d.assign.iter().find(|(n, _)| n == "d").unwrap().1,
                    None,
                    "removed"
                );
            }
            r = commit(d, &mut v, &mut g);
        }
        assert_eq!(r.state, RolloutState::RolledBack);
        assert_eq!(states(&r), ["rolled_back"; 4]);
        assert_eq!(r.message, "4 node(s) rolled back");
        assert_eq!(v["a"].desired.as_deref(), Some("1"));
        assert_eq!(v["d"].desired, None);
        assert_eq!(
            apply_verb(&r, Verb::Rollback, 6).unwrap_err().to_string(),
            "rollout r was already rolled back"
        );
    }

    #[test]
    fn rollback_of_a_running_rollout_waits_for_in_flight_nodes_and_skips_untouched() {
        let nodes = ["a", "b", "c"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&rollout(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        let r = commit(apply_verb(&r, Verb::Rollback, 2).unwrap(), &mut v, &mut g);
        assert_eq!(states(&r), ["applying", "skipped", "skipped"]);
        assert!(apply_verb(&r, Verb::Abort, 3).is_err());
        assert!(
            step(&r, &v, at(3)).is_none(),
            "a still applies its forward version"
        );
        reply(&mut v, &r, "a", V, BundleState::Applied);
        let d = step(&r, &v, at(4)).unwrap();
        assert_eq!(d.assign, vec![("a".into(), Some("1".into()))]);
        let r = commit(d, &mut v, &mut g);
        reply(&mut v, &r, "a", "1", BundleState::Failed);
        let r = commit(step(&r, &v, at(5)).unwrap(), &mut v, &mut g);
        assert_eq!(
            r.state,
            RolloutState::RolledBack,
            "failures do not stop a rollback"
        );
        assert_eq!(r.nodes[0].message, "rollback to 1 failed: boom");
        assert_eq!(r.message, "0 node(s) rolled back, 1 failed");
    }

    #[test]
    fn rollback_of_an_untouched_rollout_ends_at_once() {
        // Its only node was already at the version: nothing was changed.
        let mut v = views(&["a"]);
        *v.get_mut("a").unwrap() = online(V);
        let mut g = 0;
        let r = commit(step(&rollout(&["a"], 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Completed);
        let r = commit(apply_verb(&r, Verb::Rollback, 2).unwrap(), &mut v, &mut g);
        let d = step(&r, &v, at(3)).unwrap();
        assert_eq!(d.rollout.state, RolloutState::RolledBack);
        assert_eq!(d.target, TargetChange::RestorePrevious);
        assert!(d.assign.is_empty());
    }

    // ---- policies: deferral, holds, windows, canaries, pacing ----

    fn deferring(nodes: &[&str], batch: u32, threshold: u32) -> RolloutRow {
        let mut r = rollout(nodes, batch, threshold);
        r.policy = RolloutPolicy::default();
        r
    }

    fn offline(v: &mut BTreeMap<String, NodeView>, node: &str) {
        v.get_mut(node).unwrap().connected = false;
    }

    /// Replies "applied" for every applying node and steps, until the
    /// rollout stops changing; returns it.
    fn settle(
        mut r: RolloutRow,
        v: &mut BTreeMap<String, NodeView>,
        g: &mut u64,
        clock: &Clock,
    ) -> RolloutRow {
        for _ in 0..50 {
            for n in r.nodes.clone().iter().filter(|n| n.state == NodeState::Applying) {
                if v[&n.name].connected {
                    reply(v, &r, &n.name, V, BundleState::Applied);
                }
            }
            match step(&r, v, clock.clone()) {
                Some(d) => r = commit(d, v, g),
                None => return r,
            }
        }
        panic!("the rollout never settled: {r:?}");
    }

    /// A deferring rollout of `nodes` started at t=1 and settled (every
    /// reachable node replies "applied").
    fn run_deferring(
        nodes: &[&str],
        batch: u32,
        v: &mut BTreeMap<String, NodeView>,
        g: &mut u64,
    ) -> RolloutRow {
        let r = commit(step(&deferring(nodes, batch, 1), v, at(1)).unwrap(), v, g);
        settle(r, v, g, &at(1))
    }

    fn windowed(ms: i64, specs: &[&str]) -> Clock {
        let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        Clock {
            now_ms: ms,
            since_ms: 0,
            windows: windows::parse_all(&specs).unwrap(),
            windows_unreadable: false,
        }
    }

    fn ms(rfc3339: &str) -> i64 {
        rfc3339.parse::<jiff::Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn an_offline_node_is_deferred_and_the_rollout_completes_without_it() {
        // The reported case: 4 nodes, one powered off, batch size 1.
        let nodes = ["a", "b", "c", "d"];
        let mut v = views(&nodes);
        offline(&mut v, "a");
        let mut g = 0;
        let d = step(&deferring(&nodes, 1, 1), &v, at(1)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))], "a holds no slot");
        assert!(d.notes.iter().any(|n| n.node == "a" && n.kind == "deferred"));
        let r = commit(d, &mut v, &mut g);
        assert_eq!(states(&r), ["deferred", "applying", "waiting", "waiting"]);
        let r = settle(r, &mut v, &mut g, &at(2));
        assert_eq!(r.state, RolloutState::Completed);
        assert_eq!(states(&r), ["deferred", "updated", "updated", "updated"]);
        let c = counts(&r);
        assert_eq!((c.deferred, c.failed, c.pending), (1, 0, 0));
        assert_eq!(r.message, "3 of 4 node(s) updated, 1 deferred");
        assert!(
            r.needs_driving(),
            "a completed rollout keeps driving its deferred node"
        );
        assert_eq!(v["a"].desired.as_deref(), Some("1"), "a was never assigned");

        // It comes back: it receives the version and its result is recorded.
        v.get_mut("a").unwrap().connected = true;
        let d = step(&r, &v, at(3)).unwrap();
        assert_eq!(d.assign, vec![("a".into(), Some(V.into()))]);
        assert!(
            d.notes
                .iter()
                .any(|n| n.kind == "node_started" && n.message.contains("caught up"))
        );
        assert_eq!(d.target, TargetChange::Keep, "the target was set at completion");
        let r = commit(d, &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Completed);
        reply(&mut v, &r, "a", V, BundleState::Failed);
        let r = commit(step(&r, &v, at(4)).unwrap(), &mut v, &mut g);
        assert_eq!(
            r.nodes[0].state,
            NodeState::Failed,
            "a failure after completion is shown"
        );
        assert_eq!(r.message, "3 of 4 node(s) updated, 1 failed");
        assert_eq!(r.state, RolloutState::Completed);
        assert!(!r.needs_driving());
        assert!(r.nodes[0].touched, "a rollback includes the caught-up node");
    }

    #[test]
    fn deferred_nodes_coming_back_together_respect_the_batch_size() {
        let nodes = ["a", "b", "c", "d", "e"];
        let mut v = views(&nodes);
        for n in ["a", "b", "c"] {
            offline(&mut v, n);
        }
        let mut g = 0;
        let r = run_deferring(&nodes, 2, &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Completed);
        assert_eq!(counts(&r).deferred, 3);
        for n in ["a", "b", "c"] {
            v.get_mut(n).unwrap().connected = true;
        }
        let d = step(&r, &v, at(2)).unwrap();
        assert_eq!(d.assign.len(), 2, "{:?}", d.assign);
        let r = commit(d, &mut v, &mut g);
        assert!(step(&r, &v, at(3)).is_none(), "no slot until one reports");
        let r = settle(r, &mut v, &mut g, &at(4));
        assert_eq!(states(&r), ["updated"; 5]);
        assert_eq!(r.message, "5 of 5 node(s) updated");
    }

    #[test]
    fn offline_wait_keeps_the_old_behaviour() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        offline(&mut v, "a");
        let mut r = deferring(&nodes, 1, 1);
        r.policy.offline = OfflinePolicy::Wait;
        let d = step(&r, &v, at(1)).unwrap();
        assert_eq!(d.assign, vec![("a".into(), Some(V.into()))]);
        assert_eq!(states(&d.rollout), ["applying", "waiting"]);
    }

    #[test]
    fn a_node_gone_mid_apply_still_fails_at_the_deadline_when_deferring() {
        let nodes = ["a"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(step(&deferring(&nodes, 1, 1), &v, at(1)).unwrap(), &mut v, &mut g);
        let a = v.get_mut("a").unwrap();
        a.connected = false;
        a.last_seen_ms = 2;
        let r = commit(step(&r, &v, at(20_000)).unwrap(), &mut v, &mut g);
        assert_eq!(r.nodes[0].state, NodeState::Failed);
        assert_eq!(r.state, RolloutState::Failed);
    }

    #[test]
    fn held_nodes_are_skipped_and_catch_up_after_unhold() {
        let nodes = ["a", "b", "c"];
        let mut v = views(&nodes);
        v.get_mut("b").unwrap().held = true;
        let mut g = 0;
        let r = run_deferring(&nodes, 3, &mut v, &mut g);
        assert_eq!(states(&r), ["updated", "held", "updated"]);
        assert_eq!(r.state, RolloutState::Completed);
        assert_eq!(r.message, "2 of 3 node(s) updated, 1 held");
        assert_eq!(v["b"].desired.as_deref(), Some("1"), "no new desired state");
        assert!(step(&r, &v, at(2)).is_none(), "held stays held");

        v.get_mut("b").unwrap().held = false;
        let d = step(&r, &v, at(3)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some(V.into()))]);
        let r = settle(commit(d, &mut v, &mut g), &mut v, &mut g, &at(4));
        assert_eq!(states(&r), ["updated"; 3]);
    }

    #[test]
    fn a_rollback_leaves_held_nodes_alone() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = run_deferring(&nodes, 2, &mut v, &mut g);
        v.get_mut("a").unwrap().held = true;
        let r = commit(apply_verb(&r, Verb::Rollback, 2).unwrap(), &mut v, &mut g);
        let d = step(&r, &v, at(3)).unwrap();
        assert_eq!(d.assign, vec![("b".into(), Some("1".into()))]);
        assert_eq!(d.rollout.nodes[0].state, NodeState::Skipped);
        assert!(
            d.rollout.nodes[0].message.contains("held"),
            "{}",
            d.rollout.nodes[0].message
        );
    }

    #[test]
    fn deferred_nodes_a_newer_rollout_took_in_are_not_caught_up() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        offline(&mut v, "a");
        let mut g = 0;
        let r = run_deferring(&nodes, 1, &mut v, &mut g);
        assert_eq!(states(&r), ["deferred", "updated"]);
        let a = v.get_mut("a").unwrap();
        a.connected = true;
        a.claimed_by = Some("newer".into());
        let d = step(&r, &v, at(2)).unwrap();
        assert!(d.assign.is_empty());
        assert_eq!(d.rollout.nodes[0].state, NodeState::Skipped);
        assert_eq!(
            d.rollout.nodes[0].message,
            "not started: superseded by rollout newer"
        );
        // Or it was moved by anything else meanwhile.
        let a = v.get_mut("a").unwrap();
        a.claimed_by = None;
        a.desired = Some("3".into());
        let d = step(&r, &v, at(2)).unwrap();
        assert!(d.assign.is_empty());
        assert_eq!(
            d.rollout.nodes[0].message,
            "not started: it was moved to 3 meanwhile"
        );
        let r = commit(d, &mut v, &mut g);
        assert!(!r.needs_driving());
    }

    #[test]
    fn closed_windows_start_nothing_and_the_rollout_resumes_when_one_opens() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        let mut g = 0;
        let win = ["Sat,Sun 02:00-06:00 Europe/Berlin"];
        // Tuesday 2026-11-24, noon in Berlin.
        let tuesday = ms("2026-11-24T11:00:00Z");
        let d = step(&deferring(&nodes, 2, 1), &v, windowed(tuesday, &win)).unwrap();
        assert!(d.assign.is_empty(), "nothing starts outside every window");
        assert!(d.rollout.pacing.waiting_for_window);
        // Saturday 2026-11-28 02:00 CET = 01:00 UTC.
        assert_eq!(d.rollout.pacing.next_window_ms, ms("2026-11-28T01:00:00Z"));
        assert!(
            d.notes
                .iter()
                .any(|n| n.kind == "waiting_for_window" && n.message.contains("2026-11-28T01:00:00Z"))
        );
        let r = commit(d, &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Running);
        assert!(
            step(&r, &v, windowed(tuesday + 3_600_000, &win)).is_none(),
            "no churn while waiting"
        );

        let d = step(&r, &v, windowed(ms("2026-11-28T01:30:00Z"), &win)).unwrap();
        assert_eq!(d.assign.len(), 2);
        assert!(!d.rollout.pacing.waiting_for_window);
        assert!(d.notes.iter().any(|n| n.kind == "window_open"));
        let r = commit(d, &mut v, &mut g);
        // Nodes already applying finish after the window closed.
        let sunday_evening = ms("2026-11-29T20:00:00Z");
        let r = settle(r, &mut v, &mut g, &windowed(sunday_evening, &win));
        assert_eq!(r.state, RolloutState::Completed);
    }

    #[test]
    fn ignore_windows_starts_outside_them_and_unreadable_windows_start_nothing() {
        let nodes = ["a"];
        let v = views(&nodes);
        let tuesday = ms("2026-11-24T11:00:00Z");
        let mut r = deferring(&nodes, 1, 1);
        r.policy.ignore_windows = true;
        let d = step(&r, &v, windowed(tuesday, &["Sat 02:00-06:00 UTC"])).unwrap();
        assert_eq!(d.assign.len(), 1);
        let mut clock = at(tuesday);
        clock.windows_unreadable = true;
        let d = step(&deferring(&nodes, 1, 1), &v, clock).unwrap();
        assert!(d.assign.is_empty());
        assert!(d.rollout.pacing.waiting_for_window);
    }

    #[test]
    fn a_rollback_is_not_held_back_by_windows() {
        let nodes = ["a"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = run_deferring(&nodes, 1, &mut v, &mut g);
        let r = commit(apply_verb(&r, Verb::Rollback, 2).unwrap(), &mut v, &mut g);
        let d = step(
            &r,
            &v,
            windowed(ms("2026-11-24T11:00:00Z"), &["Sat 02:00-06:00 UTC"]),
        )
        .unwrap();
        assert_eq!(d.assign, vec![("a".into(), Some("1".into()))]);
    }

    fn canaried(nodes: &[&str], batch: u32, canary: u32, soak_ms: u64) -> RolloutRow {
        let mut r = deferring(nodes, batch, 5);
        r.policy.canary = canary;
        r.policy.canary_soak_ms = soak_ms;
        r.policy.canary_seed = 42;
        r
    }

    #[test]
    fn canaries_go_first_soak_and_then_the_others_start() {
        let nodes = ["a", "b", "c", "d", "e"];
        let mut v = views(&nodes);
        let mut g = 0;
        let d = step(&canaried(&nodes, 5, 2, 10_000), &v, at(1)).unwrap();
        let canaries: Vec<String> = d
            .rollout
            .nodes
            .iter()
            .filter(|n| n.canary)
            .map(|n| n.name.clone())
            .collect();
        assert_eq!(canaries.len(), 2);
        let mut started: Vec<String> = d.assign.iter().map(|(n, _)| n.clone()).collect();
        started.sort();
        assert_eq!(started, canaries, "only canaries start, although the batch is 5");
        assert!(
            d.notes
                .iter()
                .any(|n| n.kind == "canaries_picked" && n.message.contains("seed 42"))
        );
        let r = commit(d, &mut v, &mut g);
        for c in &canaries {
            reply(&mut v, &r, c, V, BundleState::Applied);
        }
        let d = step(&r, &v, at(100)).unwrap();
        assert!(d.assign.is_empty(), "the soak starts");
        assert_eq!(d.rollout.pacing.canaries_committed_at_ms, 100);
        let r = commit(d, &mut v, &mut g);
        assert!(step(&r, &v, at(10_099)).is_none(), "still soaking");
        let d = step(&r, &v, at(10_100)).unwrap();
        assert_eq!(d.assign.len(), 3, "the others start after the soak");
        assert!(d.rollout.pacing.canaries_passed);
        let r = settle(commit(d, &mut v, &mut g), &mut v, &mut g, &at(10_200));
        assert_eq!(r.state, RolloutState::Completed);

        // The same seed picks the same nodes; offline and held ones last.
        let d2 = step(&canaried(&nodes, 5, 2, 10_000), &views(&nodes), at(1)).unwrap();
        let again: Vec<&str> = d2
            .rollout
            .nodes
            .iter()
            .filter(|n| n.canary)
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(again, canaries);
        let mut v3 = views(&nodes);
        offline(&mut v3, &canaries[0]);
        v3.get_mut(&canaries[1]).unwrap().held = true;
        let d3 = step(&canaried(&nodes, 5, 2, 10_000), &v3, at(1)).unwrap();
        assert!(
            d3.rollout
                .nodes
                .iter()
                .filter(|n| n.canary)
                .all(|n| !canaries.contains(&n.name))
        );
    }

    #[test]
    fn a_failed_canary_fails_the_rollout_and_no_other_node_is_touched() {
        let nodes = ["a", "b", "c", "d"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(
            step(&canaried(&nodes, 4, 1, 60_000), &v, at(1)).unwrap(),
            &mut v,
            &mut g,
        );
        let canary = r.nodes.iter().find(|n| n.canary).unwrap().name.clone();
        reply(&mut v, &r, &canary, V, BundleState::RolledBack);
        let d = step(&r, &v, at(2)).unwrap();
        assert!(d.assign.is_empty());
        let r = commit(d, &mut v, &mut g);
        assert_eq!(
            r.state,
            RolloutState::Failed,
            "threshold 5, yet one canary fails it"
        );
        assert!(
            r.message.starts_with(&format!("canary {canary} failed: boom")),
            "{}",
            r.message
        );
        for n in r.nodes.iter().filter(|n| n.name != canary) {
            assert_eq!(n.state, NodeState::Skipped);
            assert!(!n.touched);
            assert_eq!(v[&n.name].desired.as_deref(), Some("1"));
        }
    }

    #[test]
    fn a_canary_that_fails_during_the_soak_fails_the_rollout() {
        let nodes = ["a", "b"];
        let mut v = views(&nodes);
        let mut g = 0;
        let r = commit(
            step(&canaried(&nodes, 2, 1, 60_000), &v, at(1)).unwrap(),
            &mut v,
            &mut g,
        );
        let canary = r.nodes.iter().find(|n| n.canary).unwrap().name.clone();
        reply(&mut v, &r, &canary, V, BundleState::Applied);
        let r = commit(step(&r, &v, at(2)).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Running);
        // Its health check fails while it soaks.
        reply(&mut v, &r, &canary, V, BundleState::Failed);
        let r = commit(step(&r, &v, at(3)).unwrap(), &mut v, &mut g);
        assert_eq!(r.state, RolloutState::Failed);
        assert!(r.message.contains("during the canary soak"), "{}", r.message);
        assert!(
            r.nodes
                .iter()
                .filter(|n| !n.canary)
                .all(|n| n.state == NodeState::Skipped)
        );
    }

    #[test]
    fn a_batch_interval_makes_batches_discrete_and_spaced() {
        let nodes = ["a", "b", "c", "d"];
        let mut v = views(&nodes);
        let mut g = 0;
        let mut r = deferring(&nodes, 2, 1);
        r.policy.batch_interval_ms = 5_000;
        let r = commit(step(&r, &v, at(1)).unwrap(), &mut v, &mut g);
        assert_eq!(states(&r), ["applying", "applying", "waiting", "waiting"]);
        reply(&mut v, &r, "a", V, BundleState::Applied);
        let r = commit(step(&r, &v, at(2)).unwrap(), &mut v, &mut g);
        assert_eq!(
            states(&r),
            ["updated", "applying", "waiting", "waiting"],
            "no refill mid-batch"
        );
        reply(&mut v, &r, "b", V, BundleState::Applied);
        let r = commit(step(&r, &v, at(3)).unwrap(), &mut v, &mut g);
        assert_eq!(r.pacing.next_batch_at_ms, 5_003);
        assert!(step(&r, &v, at(5_002)).is_none());
        let d = step(&r, &v, at(5_003)).unwrap();
        assert_eq!(d.assign.len(), 2);
    }

    mod props {
        use proptest::prelude::*;

        use super::*;

        /// One random event in a rollout's life.
        #[derive(Clone, Debug)]
        enum Event {
            Step(i64),
            Report(usize, BundleState),
            Connect(usize, bool),
            Hold(usize, bool),
        }

        fn event() -> impl Strategy<Value = Event> {
            prop_oneof![
                (0i64..4 * 3_600_000).prop_map(Event::Step),
                (
                    0usize..8,
                    prop_oneof![Just(BundleState::Applied), Just(BundleState::Failed)]
                )
                    .prop_map(|(n, s)| Event::Report(n, s)),
                (0usize..8, any::<bool>()).prop_map(|(n, c)| Event::Connect(n, c)),
                (0usize..8, any::<bool>()).prop_map(|(n, h)| Event::Hold(n, h)),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            /// Whatever happens: no decision exceeds the batch size,
            /// starts a held node, or starts a node while every window is
            /// closed (unless windows are ignored).
            #[test]
            fn decisions_keep_the_batch_holds_and_windows(
                batch in 1u32..4,
                canary in 0u32..3,
                wait in any::<bool>(),
                ignore in any::<bool>(),
                interval in prop_oneof![Just(0u64), Just(600_000u64)],
                events in proptest::collection::vec(event(), 1..60),
            ) {
                let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
                let mut v = views(&names);
                let mut r = deferring(&names, batch, 3);
                r.policy.offline = if wait { OfflinePolicy::Wait } else { OfflinePolicy::Defer };
                r.policy.ignore_windows = ignore;
                r.policy.canary = canary;
                r.policy.canary_soak_ms = 600_000;
                r.policy.batch_interval_ms = interval;
                let win = ["daily 01:00-02:00 UTC"];
                let mut now = ms("2026-11-24T00:30:00Z");
                let mut g = 0;
                for e in events {
                    match e {
                        Event::Step(dt) => {
                            now += dt;
                            let clock = windowed(now, &win);
                            let open = windows::is_open(&clock.windows, now);
                            if let Some(d) = step(&r, &v, clock) {
                                let applying = counts(&d.rollout).applying as usize;
                                prop_assert!(applying <= batch as usize, "{applying} applying, batch {batch}");
                                for (node, _) in &d.assign {
                                    let reverting = d.rollout.nodes.iter().any(|n| n.name == *node && n.reverting);
                                    let taken_back = d.rollout.nodes.iter()
                                        .any(|n| n.name == *node && n.state == NodeState::Failed);
                                    if reverting || taken_back {
                                        continue;
                                    }
                                    prop_assert!(!v[node].held, "started held node {node}");
                                    prop_assert!(open || ignore, "started {node} outside every window");
                                }
                                r = commit(d, &mut v, &mut g);
                            }
                        }
                        Event::Report(i, state) => {
                            let n = names[i];
                            if r.nodes.iter().any(|x| x.name == n && x.state == NodeState::Applying) {
                                reply(&mut v, &r, n, V, state);
                            }
                        }
                        Event::Connect(i, c) => v.get_mut(names[i]).unwrap().connected = c,
                        Event::Hold(i, h) => v.get_mut(names[i]).unwrap().held = h,
                    }
                }
            }
        }
    }
}
