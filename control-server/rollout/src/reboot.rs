//! Reboots (issue [reboots]): what the leader decides over a cluster's
//! reboot lock ([`RebootLock`]) — pure, like the rollout step; the server's
//! reboot controller reads the nodes and the tenant cluster's answers,
//! stores each [`RebootDecision`] if the lock is still the revision it read,
//! then sends the reboot requests and lifts the cordons it names.
//!
//! A node's slot: taken (inside a maintenance window, below
//! `--max-concurrent-reboots`, the node connected, not held, its agent
//! announcing "reboot") → `Draining` (cordon and evictions, as a draining
//! rollout's turn; clusters without a kubeconfig skip it) → `Rebooting`
//! (the reboot request sent) → back in a new boot → `Readying` (the Node
//! `Ready` in the tenant API; clusters without a kubeconfig skip it) →
//! released (its cordon lifted). A holder not back within
//! `--reboot-timeout` of taking its slot is `reboot-lost`: its slot is
//! freed or kept (`Lost`, until it is back or the run is aborted) as the
//! policy says — never held for ever without a word.

use std::collections::BTreeMap;

use lks_proto::labels::Labels;
use lks_store::{
    EventRow, LastReboot, RebootLock, RebootMode, RebootPolicy, RebootRun, RebootSlot, RebootState,
    RebootTimeout, RunOutcome, RunState, SlotPhase,
};

use crate::decision::KubeFact;
use crate::gates::{self, GateAnswer, Wait, WaitKind};

/// A node rebooted through the lock is not taken again for `required`
/// within this (a node that says `required` after every boot would loop).
pub const COOL_DOWN_MS: i64 = 60 * 60 * 1000;
/// How long a node's last reboot through the lock is remembered.
const REMEMBER_MS: i64 = 24 * 60 * 60 * 1000;

/// The owner a reboot's cordon names (`lksadmin.io/cordoned-by`).
pub fn owner(cluster: &str) -> String {
    format!("reboot:{cluster}")
}

/// One node of the cluster as the reboot controller sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebootView {
    pub connected: bool,
    pub held: bool,
    /// Its agent announces the "reboot" feature.
    pub feature: bool,
    /// The boot ID it last reported (empty: none).
    pub boot_id: String,
    /// Its reported reboot state (`None` if never reported).
    pub state: Option<RebootState>,
    pub reason: String,
    /// The reboot request it last took on.
    pub taken: u64,
    /// The reboot request standing in its desired state (0: none).
    pub pending: u64,
    pub labels: Labels,
    /// The tenant cluster's answer for its slot's drain or Ready gate.
    pub kube: Option<KubeFact>,
    /// The blocking-pod gate's answer for it (`--blocking-pod-selector`).
    pub blocking_pods: GateAnswer,
}

/// The cluster as the step sees it.
#[derive(Clone, Debug, Default)]
pub struct RebootClock {
    pub now_ms: i64,
    /// Some maintenance window is open (or none is set).
    pub window_open: bool,
    /// When the next one opens (0: unknown, or open now).
    pub next_window_ms: i64,
    /// The cluster has a kubeconfig: slots drain first and wait for the
    /// Node to be `Ready` after boot.
    pub tenant_api: bool,
    /// The alert gate's answer: the firing alerts its filter matches
    /// (`--reboot-alert-gate`).
    pub alerts: GateAnswer,
}

/// What one step decided: the lock to store, and what to do once stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebootDecision {
    pub lock: RebootLock,
    /// Nodes to send a reboot request now (their slot at `Rebooting`).
    pub request: Vec<String>,
    /// Nodes whose cordon (this lock's) is to be lifted.
    pub uncordon: Vec<String>,
    /// (node, kind, message), recorded as events.
    pub notes: Vec<(String, &'static str, String)>,
    /// Holders that became `reboot-lost` in this step.
    pub lost: u32,
}

impl RebootDecision {
    fn note(&mut self, node: &str, kind: &'static str, message: impl Into<String>) {
        self.notes.push((node.to_string(), kind, message.into()));
    }

    /// The notes as event rows of `cluster`.
    pub fn events(&self, cluster: &str, at_ms: i64) -> Vec<EventRow> {
        self.notes
            .iter()
            .map(|(node, kind, message)| EventRow::about(cluster, node, kind, at_ms, message.clone()))
            .collect()
    }
}

fn mins(ms: i64) -> String {
    lks_proto::duration::format_duration(std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Whether `v` is back from the reboot its slot asked for: connected in
/// another boot than the one it took the slot in.
fn back(slot: &RebootSlot, v: &RebootView) -> bool {
    v.connected && !v.boot_id.is_empty() && v.boot_id != slot.boot_id
}

/// One step over `lock`: settle every slot, end a finished run, give free
/// slots. `None` when nothing changes.
pub fn step(
    policy: &RebootPolicy,
    lock: &RebootLock,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
) -> Option<RebootDecision> {
    let mut d = RebootDecision {
        lock: lock.clone(),
        ..Default::default()
    };
    let now = clock.now_ms;
    d.lock
        .last
        .retain(|_, l| now.saturating_sub(l.at_ms) < REMEMBER_MS);
    let slots = std::mem::take(&mut d.lock.slots);
    for slot in slots {
        if let Some(kept) = settle(policy, slot, views, clock, &mut d) {
            d.lock.slots.push(kept);
        }
    }
    end_run(&mut d, views);
    give_slots(policy, views, clock, &mut d);
    (d.lock != *lock || !d.request.is_empty()).then_some(d)
}

/// How a slot ends.
fn end(d: &mut RebootDecision, slot: &RebootSlot, outcome: RunOutcome, now_ms: i64) {
    if slot.drained {
        d.uncordon.push(slot.node.clone());
    }
    d.lock.last.insert(
        slot.node.clone(),
        LastReboot {
            at_ms: now_ms,
            outcome,
        },
    );
    if let Some(run) = d.lock.run.as_mut()
        && !slot.phase.is_fleetlock()
        && run.waiting.iter().all(|n| *n != slot.node)
        && !run.ended.contains_key(&slot.node)
        && run.state != RunState::Completed
    {
        run.ended.insert(slot.node.clone(), outcome);
    }
}

/// One slot, settled; `None` once it is released.
fn settle(
    policy: &RebootPolicy,
    mut slot: RebootSlot,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
    d: &mut RebootDecision,
) -> Option<RebootSlot> {
    let now = clock.now_ms;
    if slot.phase.is_fleetlock() {
        return settle_fleetlock(policy, slot, clock, d);
    }
    let Some(v) = views.get(&slot.node) else {
        d.note(
            &slot.node,
            "reboot_released",
            "the node was deleted; its reboot slot is released",
        );
        end(d, &slot, RunOutcome::Lost, now);
        return None;
    };
    match slot.phase {
        SlotPhase::Draining => match &v.kube {
            Some(KubeFact::Drained(what)) => {
                d.note(&slot.node, "drained", format!("drained for its reboot: {what}"));
                slot.phase = SlotPhase::Rebooting;
                slot.since_ms = now;
                slot.message = "drained; asked to reboot".into();
                d.request.push(slot.node.clone());
                return Some(slot);
            }
            Some(KubeFact::Blocked(why)) => {
                d.note(
                    &slot.node,
                    "drain_blocked",
                    format!("{why}; not rebooted, its slot released"),
                );
                end(d, &slot, RunOutcome::Blocked, now);
                return None;
            }
            _ => {}
        },
        SlotPhase::Rebooting => {
            if back(&slot, v) {
                let after = mins(now - slot.since_ms);
                d.note(
                    &slot.node,
                    "rebooted",
                    format!("back in a new boot ({}) after {after}", v.boot_id),
                );
                if !clock.tenant_api {
                    return released(d, slot, now, format!("rebooted; back after {after}"));
                }
                slot.phase = SlotPhase::Readying;
                slot.since_ms = now;
                slot.message = format!("back in a new boot after {after}; waiting for the Node to be Ready");
                return Some(slot);
            }
            if slot.request == 0 {
                // A request sent before a leader change that did not
                // record it is adopted, not sent twice.
                if v.pending > 0 {
                    slot.request = v.pending;
                } else {
                    d.request.push(slot.node.clone());
                }
            } else if v.taken >= slot.request && v.state == Some(RebootState::Failed) {
                return lost(
                    policy,
                    slot,
                    d,
                    now,
                    format!("its reboot command did not reboot it: {}", v.reason),
                );
            }
        }
        SlotPhase::Readying => {
            if v.kube == Some(KubeFact::Ready) {
                let after = mins(now - slot.since_ms);
                d.note(
                    &slot.node,
                    "node_ready",
                    format!("Ready {after} after its reboot"),
                );
                return released(d, slot, now, format!("rebooted; Ready {after} after boot"));
            }
        }
        SlotPhase::Fleetlock | SlotPhase::FleetlockLost => return Some(slot),
        SlotPhase::Lost => {
            if back(&slot, v) {
                d.note(
                    &slot.node,
                    "reboot_back",
                    "back in a new boot after it was reboot-lost; its slot is released",
                );
                return released(d, slot, now, "back after it was reboot-lost".into());
            }
            return Some(slot);
        }
    }
    let timeout = i64::try_from(policy.timeout_ms).unwrap_or(i64::MAX);
    if now.saturating_sub(slot.taken_ms) > timeout {
        let why = match (&slot.phase, &v.kube) {
            (SlotPhase::Readying, Some(KubeFact::NotReady(w))) => format!("back, but not Ready: {w}"),
            (SlotPhase::Draining, _) => "still draining".into(),
            (SlotPhase::Readying, _) => "back, but not Ready".into(),
            _ if !v.connected => "not connected since".into(),
            _ => "no new boot reported".into(),
        };
        return lost(policy, slot, d, now, why);
    }
    Some(slot)
}

/// A FleetLock holder: the client reboots itself and gives its slot back
/// (`steady-state`); the lock only ends it past the timeout.
fn settle_fleetlock(
    policy: &RebootPolicy,
    slot: RebootSlot,
    clock: &RebootClock,
    d: &mut RebootDecision,
) -> Option<RebootSlot> {
    let timeout = i64::try_from(policy.timeout_ms).unwrap_or(i64::MAX);
    if slot.phase == SlotPhase::Fleetlock && clock.now_ms.saturating_sub(slot.taken_ms) > timeout {
        let why = "its FleetLock client sent no steady-state".to_string();
        return lost(policy, slot, d, clock.now_ms, why);
    }
    Some(slot)
}

/// A slot done with: the node rebooted (and is Ready).
fn released(d: &mut RebootDecision, slot: RebootSlot, now_ms: i64, message: String) -> Option<RebootSlot> {
    d.note(&slot.node, "reboot_done", message);
    end(d, &slot, RunOutcome::Done, now_ms);
    None
}

/// A holder not back in time: `reboot-lost`, its slot freed or kept.
fn lost(
    policy: &RebootPolicy,
    mut slot: RebootSlot,
    d: &mut RebootDecision,
    now_ms: i64,
    why: String,
) -> Option<RebootSlot> {
    d.lost += 1;
    let within = mins(i64::try_from(policy.timeout_ms).unwrap_or(i64::MAX));
    let what = match policy.on_timeout {
        RebootTimeout::Free => "its slot is freed",
        RebootTimeout::Keep => "its slot is kept until it is back (--on-reboot-timeout keep)",
    };
    let message = format!("reboot-lost: not back Ready within {within} of taking its slot ({why}); {what}");
    d.note(&slot.node, "reboot_lost", message.clone());
    match policy.on_timeout {
        RebootTimeout::Free => {
            end(d, &slot, RunOutcome::Lost, now_ms);
            None
        }
        RebootTimeout::Keep => {
            if let Some(run) = d.lock.run.as_mut().filter(|_| !slot.phase.is_fleetlock()) {
                run.ended.insert(slot.node.clone(), RunOutcome::Lost);
            }
            slot.phase = if slot.phase.is_fleetlock() {
                SlotPhase::FleetlockLost
            } else {
                SlotPhase::Lost
            };
            slot.since_ms = now_ms;
            slot.message = message;
            Some(slot)
        }
    }
}

/// A run with nobody left to wait for and no holder in its slots is over.
fn end_run(d: &mut RebootDecision, views: &BTreeMap<String, RebootView>) {
    let slots: Vec<String> = d
        .lock
        .slots
        .iter()
        .filter(|s| !s.phase.is_lost() && !s.phase.is_fleetlock())
        .map(|s| s.node.clone())
        .collect();
    let Some(run) = d.lock.run.as_mut() else {
        return;
    };
    if !run.state.is_active() {
        return;
    }
    // Deleted nodes are not waited for.
    run.waiting.retain(|n| views.contains_key(n));
    let busy = slots.iter().any(|n| !run.ended.contains_key(n));
    if run.waiting.is_empty() && !busy {
        run.state = RunState::Completed;
        let done = run.ended.values().filter(|o| **o == RunOutcome::Done).count();
        let m = format!(
            "rolling reboot completed: {done} of {} node(s) rebooted",
            run.ended.len()
        );
        d.note("", "reboot_run_completed", m);
    }
}

/// Why node `name` does not take a slot now; `None`: it may.
pub fn why_waiting(
    policy: &RebootPolicy,
    lock: &RebootLock,
    name: &str,
    v: &RebootView,
    clock: &RebootClock,
) -> Option<Wait> {
    use WaitKind as K;
    if policy.mode == RebootMode::Off {
        return Some(Wait::new(
            K::Off,
            "reboots are off for the cluster (cluster set --reboots)",
        ));
    }
    if !clock.window_open {
        return Some(Wait::new(
            K::Window,
            if clock.next_window_ms > 0 {
                format!(
                    "every maintenance window is closed; the next opens at {}",
                    lks_store::clock::rfc3339(clock.next_window_ms)
                )
            } else {
                "every maintenance window is closed".into()
            },
        ));
    }
    if v.held {
        return Some(Wait::new(K::Held, "the node is held (node unhold)"));
    }
    if !v.connected {
        return Some(Wait::new(K::Offline, "the node is not connected"));
    }
    if !v.feature {
        return Some(Wait::new(
            K::NoFeature,
            "its agent does not announce the \"reboot\" feature",
        ));
    }
    let taken = lock.slots.len();
    if taken >= policy.max_concurrent as usize {
        return Some(Wait::new(
            K::Slots,
            format!("all {} reboot slot(s) are taken", policy.max_concurrent),
        ));
    }
    let _ = name;
    gates::closed(policy, &clock.alerts, Some(&v.blocking_pods), clock.tenant_api)
}

/// How many nodes that want a slot wait, by why (`lks_reboot_waiting_nodes`):
/// the [`candidates`] that [`why_waiting`] keeps from one. A node the next
/// step gives a slot is not counted, nor one of a paused run.
pub fn waiting(
    policy: &RebootPolicy,
    lock: &RebootLock,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
) -> BTreeMap<WaitKind, u64> {
    let mut out = BTreeMap::new();
    for (name, _) in candidates(policy, lock, views, clock.now_ms) {
        if let Some(w) = views
            .get(&name)
            .and_then(|v| why_waiting(policy, lock, &name, v, clock))
        {
            *out.entry(w.kind).or_default() += 1;
        }
    }
    out
}

/// The nodes that want a slot and that only the gates could keep from it
/// now (every other reason to wait aside), in order: whom the server asks
/// the gates for, so a cluster with nobody to reboot asks nothing.
pub fn gated(
    policy: &RebootPolicy,
    lock: &RebootLock,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
) -> Vec<String> {
    if policy.alert_gate.is_none() && policy.blocking_pod_selector.is_empty() {
        return Vec::new();
    }
    let open = RebootPolicy {
        alert_gate: None,
        blocking_pod_selector: String::new(),
        ..policy.clone()
    };
    candidates(policy, lock, views, clock.now_ms)
        .into_iter()
        .filter(|(n, _)| {
            views
                .get(n)
                .is_some_and(|v| why_waiting(&open, lock, n, v, clock).is_none())
        })
        .map(|(n, _)| n)
        .collect()
}

/// The nodes that want a slot, in order: the run's waiting ones (while it
/// runs), then (`--reboots auto`) those that report `required`, by name,
/// unless rebooted through the lock within the cool-down.
pub fn candidates(
    policy: &RebootPolicy,
    lock: &RebootLock,
    views: &BTreeMap<String, RebootView>,
    now_ms: i64,
) -> Vec<(String, bool)> {
    let holds = |n: &str| lock.slots.iter().any(|s| s.node == n);
    let mut out: Vec<(String, bool)> = Vec::new();
    if let Some(run) = lock.run.as_ref().filter(|r| r.state == RunState::Running) {
        out.extend(
            run.waiting
                .iter()
                .filter(|n| !holds(n))
                .map(|n| (n.clone(), true)),
        );
    }
    if policy.mode == RebootMode::Auto {
        for (name, v) in views {
            let cooling = lock
                .last
                .get(name)
                .is_some_and(|l| now_ms.saturating_sub(l.at_ms) < COOL_DOWN_MS);
            if v.state == Some(RebootState::Required)
                && !cooling
                && !holds(name)
                && out.iter().all(|(n, _)| n != name)
            {
                out.push((name.clone(), false));
            }
        }
    }
    out
}

fn give_slots(
    policy: &RebootPolicy,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
    d: &mut RebootDecision,
) {
    for (name, by_run) in candidates(policy, &d.lock, views, clock.now_ms) {
        let Some(v) = views.get(&name) else { continue };
        if why_waiting(policy, &d.lock, &name, v, clock).is_some() {
            continue;
        }
        let phase = if clock.tenant_api {
            SlotPhase::Draining
        } else {
            SlotPhase::Rebooting
        };
        let why = if by_run {
            "rolling reboot".to_string()
        } else {
            format!("required: {}", v.reason)
        };
        let n = d.lock.slots.len() + 1;
        d.note(
            &name,
            "reboot_slot_taken",
            format!("took reboot slot {n} of {} ({why})", policy.max_concurrent),
        );
        if phase == SlotPhase::Rebooting {
            d.request.push(name.clone());
        }
        d.lock.slots.push(RebootSlot {
            node: name.clone(),
            phase,
            taken_ms: clock.now_ms,
            since_ms: clock.now_ms,
            boot_id: v.boot_id.clone(),
            drained: clock.tenant_api,
            request: 0,
            message: if clock.tenant_api {
                "cordoned; draining its pods".into()
            } else {
                "asked to reboot".into()
            },
        });
        if let Some(run) = d.lock.run.as_mut() {
            run.waiting.retain(|n| *n != name);
        }
    }
}

/// One node's line of `reboot status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    pub name: String,
    /// waiting, draining, rebooting, back, lost, done, blocked, aborted.
    pub state: &'static str,
    pub message: String,
    pub since_ms: i64,
}

/// Every node the lock is about: holders, the run's nodes, and (auto)
/// those that report `required`; then those rebooted through it lately.
pub fn status(
    policy: &RebootPolicy,
    lock: &RebootLock,
    views: &BTreeMap<String, RebootView>,
    clock: &RebootClock,
) -> Vec<NodeLine> {
    let mut out: Vec<NodeLine> = lock
        .slots
        .iter()
        .map(|s| NodeLine {
            name: s.node.clone(),
            state: s.phase.as_str(),
            message: s.message.clone(),
            since_ms: s.since_ms,
        })
        .collect();
    let listed = |out: &[NodeLine], n: &str| out.iter().any(|l| l.name == n);
    for (name, _) in candidates(policy, lock, views, clock.now_ms) {
        let message = views
            .get(&name)
            .and_then(|v| why_waiting(policy, lock, &name, v, clock))
            .map_or_else(|| "next".into(), |w| w.message);
        out.push(NodeLine {
            name,
            state: "waiting",
            message,
            since_ms: 0,
        });
    }
    if let Some(run) = &lock.run {
        waiting_run_lines(run, &mut out);
        for (name, o) in &run.ended {
            if !listed(&out, name) {
                out.push(NodeLine {
                    name: name.clone(),
                    state: o.as_str(),
                    message: String::new(),
                    since_ms: 0,
                });
            }
        }
    }
    for (name, l) in &lock.last {
        if !listed(&out, name) {
            out.push(NodeLine {
                name: name.clone(),
                state: l.outcome.as_str(),
                message: String::new(),
                since_ms: l.at_ms,
            });
        }
    }
    out
}

/// The waiting nodes of a run that is not running: paused or aborted.
fn waiting_run_lines(run: &RebootRun, out: &mut Vec<NodeLine>) {
    let (state, message) = match run.state {
        RunState::Paused => ("waiting", "the rolling reboot is paused (reboot resume)"),
        RunState::Aborted => ("aborted", "the rolling reboot was aborted"),
        RunState::Running | RunState::Completed => return,
    };
    for n in &run.waiting {
        if out.iter().all(|l| l.name != *n) {
            out.push(NodeLine {
                name: n.clone(),
                state,
                message: message.into(),
                since_ms: 0,
            });
        }
    }
}
