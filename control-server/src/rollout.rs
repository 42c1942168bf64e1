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
//! - A node that is offline when its turn comes is assigned all the same
//!   (it gets its desired state when it connects) and holds its slot. If it
//!   stays offline for longer than the offline deadline it counts as failed;
//!   if it never connected since its turn, its assignment is taken back in
//!   the same decision, so it stays on its old version. An applying node
//!   that disappears mid-apply for longer than the deadline fails too.
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

use crate::store::{BundleStatusRow, EventRow, NodeState, RolloutRow, RolloutState, TargetChange};

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
        }
    }
    c
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
}

/// The controller's clock: now, and when it started (a node is never held
/// offline for time the controller itself was not running).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub now_ms: i64,
    pub since_ms: i64,
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
fn offline_too_long(turn_at_ms: i64, v: &NodeView, clock: Clock, deadline_ms: u64) -> bool {
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

/// Marks every waiting node skipped.
fn skip_waiting(d: &mut Decision, why: &str) {
    let mut skipped = Vec::new();
    for n in d
        .rollout
        .nodes
        .iter_mut()
        .filter(|n| n.state == NodeState::Waiting)
    {
        n.state = NodeState::Skipped;
        n.message = why.to_string();
        skipped.push(n.name.clone());
    }
    for n in skipped {
        d.note(&n, "skipped", why);
    }
}

fn finish(r: &RolloutRow, mut d: Decision, clock: Clock) -> Option<Decision> {
    if d.rollout == *r && d.assign.is_empty() && d.notes.is_empty() {
        return None;
    }
    d.rollout.updated_at_ms = clock.now_ms;
    Some(d)
}

/// The next decision for `r` given its nodes' `views` (a node without a
/// view was deleted), or `None` if nothing changes.
pub fn step(r: &RolloutRow, views: &BTreeMap<String, NodeView>, clock: Clock) -> Option<Decision> {
    let mut d = Decision::new(r);
    let deadline = r.offline_deadline_ms;

    // Nodes that left, and applying nodes that committed, failed or stayed
    // away too long. This goes on after the rollout ended: nodes mid-apply
    // finish and their outcome is recorded.
    let mut notes = Vec::new();
    let mut unassign = Vec::new();
    for n in d.rollout.nodes.iter_mut() {
        let Some(v) = views.get(&n.name) else {
            if matches!(n.state, NodeState::Waiting | NodeState::Applying) {
                n.state = NodeState::Skipped;
                n.message = "node was deleted".into();
                notes.push((n.name.clone(), "skipped", n.message.clone()));
            }
            continue;
        };
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
    if d.rollout.state.is_terminal() {
        return finish(r, d, clock);
    }
    let reverting = d.rollout.state == RolloutState::RollingBack;

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

    if !reverting {
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

    // Start nodes, in order, while slots are free.
    let mut slots = (r.batch_size.max(1) as usize).saturating_sub(counts(&d.rollout).applying as usize);
    let mut assign = Vec::new();
    let waiting_for = format!(
        "offline; waiting up to {} for it to connect",
        format_duration(Duration::from_millis(deadline))
    );
    for n in d
        .rollout
        .nodes
        .iter_mut()
        .filter(|n| n.state == NodeState::Waiting)
    {
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
            n.touched = true;
            notes.push((
                n.name.clone(),
                "node_started",
                format!(
                    "{} → {}",
                    version_or_none(v.desired.as_deref().unwrap_or_default()),
                    r.version
                ),
            ));
            assign.push((n.name.clone(), Some(r.version.clone())));
        }
        n.state = NodeState::Applying;
        n.turn_at_ms = clock.now_ms;
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
    if !busy {
        let c = counts(&d.rollout);
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
            let mut m = format!("{} of {} node(s) updated", c.updated, c.total);
            if c.failed > 0 {
                m.push_str(&format!(", {} failed", c.failed));
            }
            if c.skipped > 0 {
                m.push_str(&format!(", {} skipped", c.skipped));
            }
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
    use crate::store::RolloutNodeRow;

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
        }
    }

    fn online(desired: &str) -> NodeView {
        NodeView {
            desired: Some(desired.into()),
            actual: Some(report(desired, BundleState::Applied, 1)),
            connected: true,
            last_seen_ms: 0,
        }
    }

    fn report(version: &str, state: BundleState, generation: u64) -> BundleStatusRow {
        BundleStatusRow {
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
}
