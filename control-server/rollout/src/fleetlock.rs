//! FleetLock (issue [reboots]): what a `pre-reboot` or `steady-state` of
//! a FleetLock client (Zincati on Fedora CoreOS / Flatcar) does to its
//! cluster's reboot lock — pure; the server's FleetLock listener reads the
//! lock, decides here and stores the lock if it is still the revision it
//! read. A holder is a slot of the same lock (phase `Fleetlock`, its `node`
//! the client's id): it counts toward `--max-concurrent-reboots` and obeys
//! the same gates; the client reboots itself, so the lock neither drains nor
//! asks it to reboot, and ends it on its own only past `--reboot-timeout`.

use lks_store::{LastReboot, RebootLock, RebootMode, RebootPolicy, RebootSlot, RunOutcome, RunState};

use crate::reboot::{RebootClock, RebootView};

/// Why a `pre-reboot` gets no slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The cluster's reboots are off.
    Off,
    /// Every maintenance window is closed (the next opening, 0: unknown).
    WindowClosed { next_ms: i64 },
    /// The id names a node of the cluster that is held (`node hold`).
    NodeHeld,
    /// The id names a node that holds a slot of the lock already.
    NodeBusy { phase: &'static str },
    /// The cluster's rolling reboot is paused.
    RunPaused,
    /// Every slot is taken.
    Full { max: u32 },
    /// A reboot gate is closed: an alert fires, a blocking pod runs on the
    /// node, or a gate could not be asked (the reason).
    GateClosed(String),
}

impl Refusal {
    /// The protocol's error `kind` (a small, fixed set).
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Off => "reboots_off",
            Refusal::WindowClosed { .. } => "maintenance_window_closed",
            Refusal::NodeHeld => "node_held",
            Refusal::NodeBusy { .. } => "node_rebooting",
            Refusal::RunPaused => "reboots_paused",
            Refusal::Full { .. } => "failed_lock_semaphore_full",
            Refusal::GateClosed(_) => "reboot_gate_closed",
        }
    }

    /// The protocol's error `value`: one line an operator acts on.
    pub fn message(&self, cluster: &str, id: &str) -> String {
        match self {
            Refusal::Off => format!(
                "cluster {cluster} has reboots off; first: lksctl cluster set {cluster} --reboots manual (or auto)"
            ),
            Refusal::WindowClosed { next_ms } if *next_ms > 0 => format!(
                "every maintenance window of cluster {cluster} is closed; the next opens at {}",
                lks_store::clock::rfc3339(*next_ms)
            ),
            Refusal::WindowClosed { .. } => {
                format!("every maintenance window of cluster {cluster} is closed")
            }
            Refusal::NodeHeld => format!("node {id} is held (lksctl node unhold {id})"),
            Refusal::NodeBusy { phase } => {
                format!("node {id} holds a reboot slot of the lock already ({phase})")
            }
            Refusal::RunPaused => {
                format!("the rolling reboot of cluster {cluster} is paused (lksctl reboot resume)")
            }
            Refusal::Full { max } => format!("all {max} reboot slot(s) of cluster {cluster} are taken"),
            Refusal::GateClosed(why) => format!("a reboot gate of cluster {cluster} is closed: {why}"),
        }
    }
}

/// A `pre-reboot` of client `id` (`node`: the cluster's node of that name,
/// if any). `Ok(None)`: it holds a slot already (the lock is unchanged);
/// `Ok(Some(lock))`: the lock with its new slot, to store.
pub fn take(
    policy: &RebootPolicy,
    lock: &RebootLock,
    id: &str,
    group: &str,
    node: Option<&RebootView>,
    clock: &RebootClock,
) -> Result<Option<RebootLock>, Refusal> {
    if let Some(s) = lock.slots.iter().find(|s| s.node == id) {
        return if s.phase.is_fleetlock() {
            Ok(None)
        } else {
            Err(Refusal::NodeBusy {
                phase: s.phase.as_str(),
            })
        };
    }
    if policy.mode == RebootMode::Off {
        return Err(Refusal::Off);
    }
    if !clock.window_open {
        return Err(Refusal::WindowClosed {
            next_ms: clock.next_window_ms,
        });
    }
    if node.is_some_and(|v| v.held) {
        return Err(Refusal::NodeHeld);
    }
    if lock.run.as_ref().is_some_and(|r| r.state == RunState::Paused) {
        return Err(Refusal::RunPaused);
    }
    if lock.slots.len() >= policy.max_concurrent as usize {
        return Err(Refusal::Full {
            max: policy.max_concurrent,
        });
    }
    let pods = node.map(|v| &v.blocking_pods);
    if let Some(why) = crate::gates::closed(policy, &clock.alerts, pods, clock.tenant_api) {
        return Err(Refusal::GateClosed(why.message));
    }
    let mut next = lock.clone();
    next.slots.push(RebootSlot {
        node: id.to_string(),
        phase: lks_store::SlotPhase::Fleetlock,
        taken_ms: clock.now_ms,
        since_ms: clock.now_ms,
        boot_id: node.map(|v| v.boot_id.clone()).unwrap_or_default(),
        drained: false,
        request: 0,
        message: format!("held by its FleetLock client (group {group})"),
    });
    Ok(Some(next))
}

/// A `steady-state` of client `id`: the lock without its slot, to store;
/// `None` when it holds none (nothing to do: the call is idempotent).
pub fn release(lock: &RebootLock, id: &str, now_ms: i64) -> Option<RebootLock> {
    let at = lock
        .slots
        .iter()
        .position(|s| s.node == id && s.phase.is_fleetlock())?;
    let mut next = lock.clone();
    next.slots.remove(at);
    next.last.insert(
        id.to_string(),
        LastReboot {
            at_ms: now_ms,
            outcome: RunOutcome::Done,
        },
    );
    Some(next)
}

#[cfg(test)]
mod tests {
    use lks_store::SlotPhase;

    use super::*;

    fn policy(mode: RebootMode, max: u32) -> RebootPolicy {
        RebootPolicy {
            mode,
            max_concurrent: max,
            ..RebootPolicy::default()
        }
    }

    fn open() -> RebootClock {
        RebootClock {
            now_ms: 1_000,
            window_open: true,
            ..RebootClock::default()
        }
    }

    #[test]
    fn two_clients_one_slot() {
        let p = policy(RebootMode::Manual, 1);
        let lock = RebootLock::default();
        let a = take(&p, &lock, "a", "default", None, &open()).unwrap().unwrap();
        assert_eq!(a.slots.len(), 1);
        assert_eq!(a.slots[0].phase, SlotPhase::Fleetlock);
        assert_eq!(take(&p, &a, "a", "default", None, &open()), Ok(None), "recursive");
        let refused = take(&p, &a, "b", "default", None, &open()).unwrap_err();
        assert_eq!(refused, Refusal::Full { max: 1 });
        assert_eq!(refused.kind(), "failed_lock_semaphore_full");
        let freed = release(&a, "a", 2_000).unwrap();
        assert!(freed.slots.is_empty());
        assert_eq!(release(&freed, "a", 2_000), None, "idempotent");
        assert!(take(&p, &freed, "b", "default", None, &open()).unwrap().is_some());
    }

    #[test]
    fn the_gates_refuse_in_order() {
        let lock = RebootLock::default();
        let off = take(&policy(RebootMode::Off, 1), &lock, "a", "g", None, &open()).unwrap_err();
        assert_eq!(off, Refusal::Off);
        assert!(
            off.message("c1", "a").contains("--reboots manual"),
            "{}",
            off.message("c1", "a")
        );
        let closed = RebootClock {
            window_open: false,
            ..open()
        };
        let p = policy(RebootMode::Auto, 2);
        assert_eq!(
            take(&p, &lock, "a", "g", None, &closed),
            Err(Refusal::WindowClosed { next_ms: 0 })
        );
        let held = RebootView {
            held: true,
            ..RebootView::default()
        };
        assert_eq!(
            take(&p, &lock, "w1", "g", Some(&held), &open()),
            Err(Refusal::NodeHeld)
        );
    }

    #[test]
    fn a_closed_gate_refuses_a_pre_reboot() {
        let lock = RebootLock::default();
        let mut p = policy(RebootMode::Manual, 1);
        p.alert_gate = Some(lks_store::AlertGate {
            url: "http://prom:9090".into(),
            filter: String::new(),
        });
        p.blocking_pod_selector = "app=db".into();
        let firing = RebootClock {
            alerts: Some(Ok(vec!["KubeNodeNotReady".into()])),
            tenant_api: true,
            ..open()
        };
        let r = take(&p, &lock, "zincati-1", "default", None, &firing).unwrap_err();
        assert_eq!(r.kind(), "reboot_gate_closed");
        assert_eq!(
            r.message("c1", "zincati-1"),
            "a reboot gate of cluster c1 is closed: alert firing in http://prom:9090: KubeNodeNotReady"
        );
        let quiet = RebootClock {
            alerts: Some(Ok(vec![])),
            ..firing
        };
        let node = RebootView {
            blocking_pods: Some(Ok(vec!["db/pg-0".into()])),
            ..RebootView::default()
        };
        let r = take(&p, &lock, "w1", "default", Some(&node), &quiet).unwrap_err();
        assert_eq!(
            r,
            Refusal::GateClosed("blocking pod(s) on the node: db/pg-0".into())
        );
        // An id that names no node: no pod can run on it.
        assert!(
            take(&p, &lock, "zincati-1", "default", None, &quiet)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn a_node_the_lock_reboots_is_not_taken_twice_and_not_released_by_fleetlock() {
        let mut lock = RebootLock::default();
        lock.slots.push(RebootSlot {
            node: "w1".into(),
            phase: SlotPhase::Rebooting,
            taken_ms: 0,
            since_ms: 0,
            boot_id: String::new(),
            drained: false,
            request: 1,
            message: String::new(),
        });
        let p = policy(RebootMode::Auto, 2);
        assert_eq!(
            take(&p, &lock, "w1", "g", None, &open()),
            Err(Refusal::NodeBusy { phase: "rebooting" })
        );
        assert_eq!(release(&lock, "w1", 5), None);
    }

    #[test]
    fn the_step_leaves_a_holder_alone_until_the_timeout() {
        let p = policy(RebootMode::Manual, 1);
        let lock = take(&p, &RebootLock::default(), "zincati-1", "default", None, &open())
            .unwrap()
            .unwrap();
        let views = std::collections::BTreeMap::new();
        assert_eq!(
            crate::reboot::step(&p, &lock, &views, &open()),
            None,
            "no node, no request"
        );
        let late = RebootClock {
            now_ms: 1_000 + i64::try_from(p.timeout_ms).unwrap() + 1,
            ..open()
        };
        let d = crate::reboot::step(&p, &lock, &views, &late).unwrap();
        assert!(d.lock.slots.is_empty(), "freed past the timeout");
        assert!(d.request.is_empty());
        assert_eq!(d.lost, 1);
        let keep = RebootPolicy {
            on_timeout: lks_store::RebootTimeout::Keep,
            ..p.clone()
        };
        let d = crate::reboot::step(&keep, &lock, &views, &late).unwrap();
        assert_eq!(d.lock.slots[0].phase, SlotPhase::FleetlockLost);
        assert_eq!(
            crate::reboot::step(&keep, &d.lock, &views, &late),
            None,
            "kept, noted once"
        );
    }
}
