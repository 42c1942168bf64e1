//! Start a batch: the phase of a step that starts nodes. Nodes start in
//! the rollout's node order while slots are free, unless a batch interval
//! holds the next batch back or every maintenance window is closed. At a
//! node's turn it may be already there, held (`held`), unable to carry the
//! bundle (`failed`), or offline (`deferred` under `--offline defer`); a
//! rollback skips nodes that moved on or are held.

use std::collections::BTreeMap;
use std::time::Duration;

use lks_proto::BundleState;
use lks_proto::duration::format_duration;
use lks_proto::windows;
use lks_store::{NodeState, OfflinePolicy, RolloutNodeRow, RolloutRow};

use crate::decision::{Clock, Decision, NodeView, counts, version_or_none};

/// What a node's turn comes to.
enum Turn {
    /// Nothing to start for this node; go on with the next.
    Pass,
    /// No slot left: no further node starts.
    Stop,
    /// The node starts: assign it this version (`None`: remove the bundle).
    Start(Option<String>),
}

/// Starts what may start now. `only_canaries`: the canary phase lets no
/// other node start yet.
pub(super) fn start(
    r: &RolloutRow,
    d: &mut Decision,
    views: &BTreeMap<String, NodeView>,
    clock: &Clock,
    reverting: bool,
    only_canaries: bool,
) {
    let applying = counts(&d.rollout).applying as usize;
    let paced = paced(r, d, clock.now_ms, reverting, applying);
    let window_open = window_open(r, d, views, clock, reverting, only_canaries);
    let mut slots = (r.batch_size.max(1) as usize).saturating_sub(applying);
    if !window_open || paced {
        slots = 0;
    }
    start_nodes(r, d, views, clock.now_ms, reverting, only_canaries, slots);
}

/// With a batch interval, batches are discrete: true while the last batch
/// is still applying or the interval since it settled has not passed.
fn paced(r: &RolloutRow, d: &mut Decision, now: i64, reverting: bool, applying: usize) -> bool {
    let policy = &r.policy;
    if reverting || policy.batch_interval_ms == 0 {
        return false;
    }
    if applying == 0 && counts(r).applying > 0 && d.rollout.nodes.iter().any(RolloutNodeRow::startable) {
        d.rollout.pacing.next_batch_at_ms =
            now.saturating_add(i64::try_from(policy.batch_interval_ms).unwrap_or(i64::MAX));
    }
    applying > 0 || now < d.rollout.pacing.next_batch_at_ms
}

/// Windows: nothing starts while they are all closed. Records that the
/// rollout waits for one (and when the next opens), and when one opens.
fn window_open(
    r: &RolloutRow,
    d: &mut Decision,
    views: &BTreeMap<String, NodeView>,
    clock: &Clock,
    reverting: bool,
    only_canaries: bool,
) -> bool {
    let policy = &r.policy;
    let now = clock.now_ms;
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
                    lks_store::clock::rfc3339(next)
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
    window_open
}

/// Starts nodes, in order, while slots are free.
fn start_nodes(
    r: &RolloutRow,
    d: &mut Decision,
    views: &BTreeMap<String, NodeView>,
    now: i64,
    reverting: bool,
    only_canaries: bool,
    mut slots: usize,
) {
    let mut notes = Vec::new();
    let mut assign = Vec::new();
    let waiting_for = format!(
        "offline; waiting up to {} for it to connect",
        format_duration(Duration::from_millis(r.offline_deadline_ms))
    );
    for n in d.rollout.nodes.iter_mut().filter(|n| n.startable()) {
        if only_canaries && !n.canary {
            continue;
        }
        let Some(v) = views.get(&n.name) else { continue };
        let turn = if reverting {
            revert_turn(r, n, v, slots, &mut notes)
        } else {
            forward_turn(r, n, v, slots, &mut notes)
        };
        let to = match turn {
            Turn::Pass => continue,
            Turn::Stop => break,
            Turn::Start(to) => to,
        };
        n.state = NodeState::Applying;
        n.turn_at_ms = now;
        slots -= 1;
        if r.policy.drain.is_some() {
            // Drained first: the version is assigned once its pods are gone.
            n.touched = n.reverting && n.touched;
            crate::drain::begin(n, now);
            continue;
        }
        assign.push((n.name.clone(), to));
        n.unreached = !v.connected;
        n.message = if v.connected {
            String::new()
        } else {
            waiting_for.clone()
        };
    }
    d.assign.extend(assign);
    for (node, kind, message) in notes {
        d.note(&node, kind, message);
    }
}

/// A node's turn in a rollback: back to its previous version, unless it
/// moved on or is held.
fn revert_turn(
    r: &RolloutRow,
    n: &mut RolloutNodeRow,
    v: &NodeView,
    slots: usize,
    notes: &mut Vec<(String, &'static str, String)>,
) -> Turn {
    if v.desired.as_deref() != Some(r.version.as_str()) {
        n.state = NodeState::Skipped;
        n.message = match &v.desired {
            Some(x) => format!("not rolled back: it has moved on to {x}"),
            None => "not rolled back: the bundle was removed from it".into(),
        };
        notes.push((n.name.clone(), "skipped", n.message.clone()));
        return Turn::Pass;
    }
    if v.held {
        n.state = NodeState::Skipped;
        n.message = format!("not rolled back: the node is held; it keeps {}", r.version);
        notes.push((n.name.clone(), "skipped", n.message.clone()));
        return Turn::Pass;
    }
    if slots == 0 {
        return Turn::Stop;
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
    Turn::Start(to)
}

/// A node's turn in a forward rollout.
fn forward_turn(
    r: &RolloutRow,
    n: &mut RolloutNodeRow,
    v: &NodeView,
    slots: usize,
    notes: &mut Vec<(String, &'static str, String)>,
) -> Turn {
    let applied = v
        .actual
        .as_ref()
        .is_some_and(|a| a.version == r.version && a.state == BundleState::Applied);
    if v.desired.as_deref() == Some(r.version.as_str()) && applied {
        // Already there: nothing to assign, no slot needed.
        n.state = NodeState::Updated;
        n.message = format!("already at {}", r.version);
        notes.push((n.name.clone(), "applied", n.message.clone()));
        return Turn::Pass;
    }
    if slots == 0 {
        return Turn::Stop;
    }
    if v.held {
        if n.state != NodeState::Held {
            n.state = NodeState::Held;
            n.message = "held by the operator; starts after `lksctl node unhold`".into();
            notes.push((n.name.clone(), "held", n.message.clone()));
        }
        return Turn::Pass;
    }
    if let Some(why) = &v.unsupported {
        n.state = NodeState::Failed;
        n.message = why.clone();
        notes.push((n.name.clone(), "failed", n.message.clone()));
        return Turn::Pass;
    }
    if !v.connected && r.policy.offline == OfflinePolicy::Defer {
        if n.state != NodeState::Deferred {
            n.state = NodeState::Deferred;
            n.message = "offline at its turn; it applies the version when it is back".into();
            notes.push((n.name.clone(), "deferred", n.message.clone()));
        }
        return Turn::Pass;
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
    Turn::Start(Some(r.version.clone()))
}
