//! The reboot lock's step: slots given at most N at a time, only inside a
//! window, to connected, unheld nodes whose agent can reboot; a slot's way
//! through drain, reboot and Ready; a holder never back is lost, its slot
//! freed or kept; runs.

use std::collections::BTreeMap;

use lks_store::{
    AlertGate, RebootLock, RebootMode, RebootPolicy, RebootRun, RebootState, RebootTimeout, RunOutcome,
    RunState, SlotPhase,
};

use crate::KubeFact;
use crate::gates::{Wait, WaitKind, unanswered};
use crate::reboot::{RebootClock, RebootView, gated, status, step, waiting, why_waiting};

fn policy(mode: RebootMode, n: u32) -> RebootPolicy {
    RebootPolicy {
        mode,
        max_concurrent: n,
        ..Default::default()
    }
}

fn view(required: bool) -> RebootView {
    RebootView {
        connected: true,
        feature: true,
        boot_id: "b1".into(),
        state: Some(if required {
            RebootState::Required
        } else {
            RebootState::None
        }),
        reason: "bundle kernel@1".into(),
        ..Default::default()
    }
}

fn views(names: &[(&str, bool)]) -> BTreeMap<String, RebootView> {
    names.iter().map(|(n, r)| (n.to_string(), view(*r))).collect()
}

fn clock(now_ms: i64, tenant_api: bool) -> RebootClock {
    RebootClock {
        now_ms,
        window_open: true,
        next_window_ms: 0,
        tenant_api,
        alerts: None,
    }
}

#[test]
fn auto_gives_at_most_n_slots_to_required_nodes_and_off_none() {
    let v = views(&[("a", true), ("b", true), ("c", false), ("d", true)]);
    let d = step(
        &policy(RebootMode::Auto, 2),
        &RebootLock::default(),
        &v,
        &clock(10, false),
    )
    .unwrap();
    let held: Vec<&str> = d.lock.slots.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(held, ["a", "b"]);
    assert_eq!(d.request, ["a", "b"], "without a tenant API: asked at once");
    assert!(d.lock.slots.iter().all(|s| s.phase == SlotPhase::Rebooting));
    // Nothing more while both are taken.
    let again = step(&policy(RebootMode::Auto, 2), &d.lock, &v, &clock(20, false));
    assert!(
        again.as_ref().is_none_or(|a| a.lock.slots.len() == 2),
        "{again:?}"
    );
    for mode in [RebootMode::Off, RebootMode::Manual] {
        assert_eq!(
            step(&policy(mode, 2), &RebootLock::default(), &v, &clock(10, false)),
            None
        );
    }
}

#[test]
fn nothing_starts_outside_a_window_or_on_a_held_offline_or_old_node() {
    let mut v = views(&[("a", true), ("b", true), ("c", true)]);
    let mut closed = clock(10, false);
    closed.window_open = false;
    assert_eq!(
        step(&policy(RebootMode::Auto, 3), &RebootLock::default(), &v, &closed),
        None
    );
    v.get_mut("a").unwrap().held = true;
    v.get_mut("b").unwrap().connected = false;
    v.get_mut("c").unwrap().feature = false;
    assert_eq!(
        step(
            &policy(RebootMode::Auto, 3),
            &RebootLock::default(),
            &v,
            &clock(10, false)
        ),
        None
    );
    let lines = status(
        &policy(RebootMode::Auto, 3),
        &RebootLock::default(),
        &v,
        &clock(10, false),
    );
    let why: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l.name.as_str(), l.message.as_str()))
        .collect();
    assert_eq!(
        why,
        [
            ("a", "the node is held (node unhold)"),
            ("b", "the node is not connected"),
            ("c", "its agent does not announce the \"reboot\" feature"),
        ]
    );
}

#[test]
fn a_slot_drains_reboots_comes_back_ready_and_is_released() {
    let p = policy(RebootMode::Auto, 1);
    let mut v = views(&[("a", true)]);
    let d = step(&p, &RebootLock::default(), &v, &clock(10, true)).unwrap();
    assert_eq!(d.lock.slots[0].phase, SlotPhase::Draining);
    assert!(d.request.is_empty(), "not before it is drained");
    v.get_mut("a").unwrap().kube = Some(KubeFact::Drained("1 pod evicted".into()));
    let d = step(&p, &d.lock, &v, &clock(20, true)).unwrap();
    assert_eq!(
        (d.lock.slots[0].phase, d.request.clone()),
        (SlotPhase::Rebooting, vec!["a".to_string()])
    );
    let mut lock = d.lock;
    lock.slots[0].request = 7;
    // Same boot: still rebooting.
    v.get_mut("a").unwrap().kube = None;
    assert_eq!(step(&p, &lock, &v, &clock(30, true)), None);
    v.get_mut("a").unwrap().boot_id = "b2".into();
    let d = step(&p, &lock, &v, &clock(40, true)).unwrap();
    assert_eq!(d.lock.slots[0].phase, SlotPhase::Readying);
    v.get_mut("a").unwrap().kube = Some(KubeFact::Ready);
    v.get_mut("a").unwrap().state = Some(RebootState::None);
    let d = step(&p, &d.lock, &v, &clock(50, true)).unwrap();
    assert!(d.lock.slots.is_empty());
    assert_eq!(d.uncordon, ["a"]);
    assert_eq!(
        d.lock.last.get("a").map(|l| (l.at_ms, l.outcome)),
        Some((50, RunOutcome::Done))
    );
    assert!(d.notes.iter().any(|n| n.1 == "reboot_done"), "{:?}", d.notes);
}

#[test]
fn a_blocked_drain_releases_the_slot_without_a_reboot() {
    let p = policy(RebootMode::Auto, 1);
    let mut v = views(&[("a", true)]);
    let d = step(&p, &RebootLock::default(), &v, &clock(10, true)).unwrap();
    v.get_mut("a").unwrap().kube = Some(KubeFact::Blocked("drain-blocked after 10m".into()));
    let d = step(&p, &d.lock, &v, &clock(20, true)).unwrap();
    assert!(d.request.is_empty());
    assert_eq!(d.uncordon, ["a"]);
    assert!(d.notes.iter().any(|n| n.1 == "drain_blocked"));
}

#[test]
fn a_holder_never_back_is_lost_and_its_slot_freed_or_kept() {
    let mut v = views(&[("a", true), ("b", true)]);
    for (on_timeout, kept) in [(RebootTimeout::Free, false), (RebootTimeout::Keep, true)] {
        let p = RebootPolicy {
            on_timeout,
            timeout_ms: 1000,
            ..policy(RebootMode::Auto, 1)
        };
        let mut lock = step(&p, &RebootLock::default(), &v, &clock(10, false))
            .unwrap()
            .lock;
        lock.slots[0].request = 3;
        v.get_mut("a").unwrap().connected = false;
        assert_eq!(step(&p, &lock, &v, &clock(1000, false)), None, "not yet");
        let d = step(&p, &lock, &v, &clock(1011, false)).unwrap();
        assert_eq!(d.lost, 1);
        let lost = d.notes.iter().find(|n| n.1 == "reboot_lost").unwrap();
        assert!(
            lost.2.starts_with("reboot-lost: not back Ready within 1s"),
            "{}",
            lost.2
        );
        let holders: Vec<(&str, SlotPhase)> =
            d.lock.slots.iter().map(|s| (s.node.as_str(), s.phase)).collect();
        if kept {
            assert_eq!(holders, [("a", SlotPhase::Lost)], "kept: b waits");
            // Back at last: released.
            v.get_mut("a").unwrap().connected = true;
            v.get_mut("a").unwrap().boot_id = "b9".into();
            let back = step(&p, &d.lock, &v, &clock(2000, false)).unwrap();
            assert_eq!(
                back.lock
                    .slots
                    .iter()
                    .map(|s| s.node.as_str())
                    .collect::<Vec<_>>(),
                ["b"]
            );
        } else {
            assert_eq!(holders, [("b", SlotPhase::Rebooting)], "freed: b takes it");
        }
        v.get_mut("a").unwrap().connected = true;
        v.get_mut("a").unwrap().boot_id = "b1".into();
    }
}

#[test]
fn a_run_reboots_every_selected_node_in_manual_mode_and_completes() {
    let p = policy(RebootMode::Manual, 1);
    let mut v = views(&[("a", false), ("b", false)]);
    let lock = RebootLock {
        run: Some(RebootRun {
            state: RunState::Running,
            selector: Default::default(),
            started_ms: 1,
            started_by: "alice".into(),
            waiting: vec!["a".into(), "b".into()],
            ended: Default::default(),
        }),
        ..Default::default()
    };
    let d = step(&p, &lock, &v, &clock(10, false)).unwrap();
    assert_eq!(d.request, ["a"]);
    let mut lock = d.lock;
    lock.slots[0].request = 4;
    // Paused: the holder finishes, nobody else starts.
    lock.run.as_mut().unwrap().state = RunState::Paused;
    v.get_mut("a").unwrap().boot_id = "b2".into();
    let d = step(&p, &lock, &v, &clock(20, false)).unwrap();
    assert!(d.lock.slots.is_empty() && d.request.is_empty());
    let mut lock = d.lock;
    lock.run.as_mut().unwrap().state = RunState::Running;
    let d = step(&p, &lock, &v, &clock(30, false)).unwrap();
    assert_eq!(d.request, ["b"]);
    let mut lock = d.lock;
    lock.slots[0].request = 5;
    v.get_mut("b").unwrap().boot_id = "b2".into();
    let d = step(&p, &lock, &v, &clock(40, false)).unwrap();
    let run = d.lock.run.as_ref().unwrap();
    assert_eq!(run.state, RunState::Completed);
    assert_eq!(run.ended.get("a"), Some(&RunOutcome::Done));
    assert!(d.notes.iter().any(|n| n.1 == "reboot_run_completed"));
}

#[test]
fn a_request_sent_before_a_leader_change_is_adopted_not_sent_again() {
    let p = policy(RebootMode::Auto, 1);
    let mut v = views(&[("a", true)]);
    let lock = step(&p, &RebootLock::default(), &v, &clock(10, false))
        .unwrap()
        .lock;
    v.get_mut("a").unwrap().pending = 9;
    let d = step(&p, &lock, &v, &clock(20, false)).unwrap();
    assert!(d.request.is_empty());
    assert_eq!(d.lock.slots[0].request, 9);
}

#[test]
fn a_node_rebooted_lately_is_not_taken_again_for_required() {
    let p = policy(RebootMode::Auto, 1);
    let v = views(&[("a", true)]);
    let mut lock = RebootLock::default();
    lock.last.insert(
        "a".into(),
        lks_store::LastReboot {
            at_ms: 1000,
            outcome: RunOutcome::Done,
        },
    );
    assert_eq!(step(&p, &lock, &v, &clock(2000, false)), None);
    let later = 1000 + crate::reboot::COOL_DOWN_MS + 1;
    assert_eq!(step(&p, &lock, &v, &clock(later, false)).unwrap().request, ["a"]);
}

#[test]
fn a_firing_alert_gives_no_slot_but_takes_none_back() {
    let mut p = policy(RebootMode::Auto, 2);
    p.alert_gate = Some(AlertGate {
        url: "http://prom:9090".into(),
        filter: "^Kube".into(),
    });
    let v = views(&[("a", true), ("b", true), ("c", false)]);
    let lock = RebootLock::default();
    assert_eq!(
        gated(&p, &lock, &v, &clock(10, false)),
        ["a", "b"],
        "whom to ask for"
    );
    // Not asked yet, or Prometheus cannot be asked: closed.
    assert_eq!(step(&p, &lock, &v, &clock(10, false)), None);
    let down = RebootClock {
        alerts: Some(Err(unanswered("connection refused"))),
        ..clock(10, false)
    };
    assert_eq!(step(&p, &lock, &v, &down), None);
    assert_eq!(
        why_waiting(&p, &lock, "a", &v["a"], &down).unwrap(),
        Wait::new(
            WaitKind::GateUnanswered,
            "the alert gate is closed: Prometheus at http://prom:9090 cannot be asked (connection refused)"
        )
    );
    assert_eq!(
        waiting(&p, &lock, &v, &down),
        BTreeMap::from([(WaitKind::GateUnanswered, 2)]),
        "c reports no reboot required: not counted"
    );
    let firing = RebootClock {
        alerts: Some(Ok(vec!["KubeNodeNotReady".into()])),
        ..clock(10, false)
    };
    assert_eq!(step(&p, &lock, &v, &firing), None);
    assert_eq!(
        why_waiting(&p, &lock, "a", &v["a"], &firing).unwrap(),
        Wait::new(
            WaitKind::Alert,
            "alert firing in http://prom:9090: KubeNodeNotReady"
        )
    );
    assert_eq!(
        waiting(&p, &lock, &v, &firing),
        BTreeMap::from([(WaitKind::Alert, 2)])
    );
    let lines = status(&p, &lock, &v, &firing);
    assert!(
        lines.iter().all(|l| l.message.starts_with("alert firing")),
        "{lines:?}"
    );
    // Resolved: both go.
    let quiet = RebootClock {
        alerts: Some(Ok(vec![])),
        ..clock(10, false)
    };
    let d = step(&p, &lock, &v, &quiet).unwrap();
    assert_eq!(d.request, ["a", "b"]);
    assert_eq!(
        waiting(&p, &lock, &v, &quiet),
        BTreeMap::new(),
        "both go: none waits"
    );
    assert_eq!(
        waiting(&p, &d.lock, &v, &quiet),
        BTreeMap::new(),
        "slot holders do not wait"
    );
    // Firing again: the slots held stay held.
    let after = RebootClock { now_ms: 20, ..firing };
    let kept = step(&p, &d.lock, &v, &after);
    assert!(kept.is_none_or(|k| k.lock.slots.len() == 2));
    // Every slot taken: the gates are not asked.
    assert!(gated(&p, &d.lock, &v, &after).is_empty());
}

#[test]
fn a_blocking_pod_holds_its_node_while_another_reboots() {
    let mut p = policy(RebootMode::Auto, 1);
    p.blocking_pod_selector = "app=db".into();
    let mut v = views(&[("a", true), ("b", true)]);
    let lock = RebootLock::default();
    assert_eq!(step(&p, &lock, &v, &clock(10, true)), None, "not asked yet");
    v.get_mut("a").unwrap().blocking_pods = Some(Ok(vec!["db/pg-0".into()]));
    v.get_mut("b").unwrap().blocking_pods = Some(Ok(vec![]));
    let d = step(&p, &lock, &v, &clock(10, true)).unwrap();
    let held: Vec<&str> = d.lock.slots.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(held, ["b"], "a waits, b drains");
    assert_eq!(
        why_waiting(&p, &RebootLock::default(), "a", &v["a"], &clock(10, true)).unwrap(),
        Wait::new(WaitKind::BlockingPod, "blocking pod(s) on the node: db/pg-0")
    );
    assert_eq!(
        waiting(&p, &lock, &v, &clock(10, true)),
        BTreeMap::from([(WaitKind::BlockingPod, 1)]),
        "b would take the slot: not counted"
    );
    assert_eq!(
        waiting(&p, &d.lock, &v, &clock(10, true)),
        BTreeMap::from([(WaitKind::Slots, 1)]),
        "with b holding the only slot, a waits for it first"
    );
    // An error of the tenant API closes the gate.
    v.get_mut("b").unwrap().blocking_pods = Some(Err(unanswered("403 Forbidden")));
    assert_eq!(step(&p, &lock, &v, &clock(10, true)), None);
    // Without a kubeconfig the selector cannot be checked: nobody goes.
    v.get_mut("b").unwrap().blocking_pods = Some(Ok(vec![]));
    assert_eq!(step(&p, &lock, &v, &clock(10, false)), None);
    let w = why_waiting(&p, &lock, "b", &v["b"], &clock(10, false)).unwrap();
    assert_eq!(w.kind, WaitKind::GateUnanswered);
    assert!(w.message.contains("the cluster has no kubeconfig"), "{w}");
}
