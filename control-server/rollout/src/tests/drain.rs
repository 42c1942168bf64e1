//! A draining rollout: drain, then assign, then the Ready gate; a blocked
//! drain fails (or skips) its node without touching it; pause, abort and a
//! failed rollout stop drains; the answers come as `KubeFact`s.

use super::*;
use lks_store::{DrainPolicy, DrainTimeout, KubeStep};

fn draining(nodes: &[&str], batch: u32, threshold: u32) -> RolloutRow {
    let mut r = rollout(nodes, batch, threshold);
    r.policy.drain = Some(DrainPolicy {
        timeout_ms: 60_000,
        ready_timeout_ms: 30_000,
        ..Default::default()
    });
    r
}

fn fact(v: &mut BTreeMap<String, NodeView>, node: &str, f: Option<KubeFact>) {
    v.get_mut(node).unwrap().kube = f;
}

fn node<'a>(r: &'a RolloutRow, name: &str) -> &'a RolloutNodeRow {
    r.nodes.iter().find(|n| n.name == name).unwrap()
}

#[test]
fn a_node_is_drained_before_its_version_and_ready_before_it_counts() {
    let mut r = draining(&["a", "b"], 1, 1);
    let mut v = views(&["a", "b"]);
    let mut g = 0;
    // Its turn: draining, holding the slot, nothing assigned.
    let d = step(&r, &v, at(1_000)).unwrap();
    assert!(d.assign.is_empty(), "no version before the drain");
    r = commit(d, &mut v, &mut g);
    assert_eq!(states(&r), ["applying", "waiting"]);
    assert_eq!(node(&r, "a").kube, KubeStep::Draining);
    assert!(!node(&r, "a").touched);
    // Still draining: nothing changes, b does not start (batch of 1).
    assert!(step(&r, &v, at(2_000)).is_none());

    // Drained: now the version.
    fact(&mut v, "a", Some(KubeFact::Drained("2 pods evicted".into())));
    let d = step(&r, &v, at(4_000)).unwrap();
    assert_eq!(d.assign, [("a".to_string(), Some(V.to_string()))]);
    assert!(
        d.notes
            .iter()
            .any(|n| n.kind == "drained" && n.message.contains("drained in 3.0s"))
    );
    r = commit(d, &mut v, &mut g);
    assert_eq!(node(&r, "a").kube, KubeStep::Upgrading);
    assert!(node(&r, "a").touched);
    fact(&mut v, "a", None);

    // Applied: not updated until the Node is Ready.
    reply(&mut v, &r, "a", V, BundleState::Applied);
    r = commit(step(&r, &v, at(5_000)).unwrap(), &mut v, &mut g);
    assert_eq!(states(&r), ["applying", "waiting"]);
    assert_eq!(node(&r, "a").kube, KubeStep::Readying);
    fact(
        &mut v,
        "a",
        Some(KubeFact::NotReady("the Node is NotReady".into())),
    );
    assert!(step(&r, &v, at(6_000)).is_none());
    fact(&mut v, "a", Some(KubeFact::Ready));
    let d = step(&r, &v, at(7_000)).unwrap();
    assert!(
        d.notes
            .iter()
            .any(|n| n.kind == "node_ready" && n.message.contains("Ready 2.0s after"))
    );
    r = commit(d, &mut v, &mut g);
    assert_eq!(node(&r, "a").state, NodeState::Updated);
    assert_eq!(node(&r, "a").kube, KubeStep::None, "the cordon is released");
    assert_eq!(
        node(&r, "a").message,
        "at 2; drained in 3.0s, Ready 2.0s after it applied",
        "the outcome says how long each phase took"
    );
    // b's turn came in the same step: draining now.
    assert_eq!(node(&r, "b").kube, KubeStep::Draining);
}

#[test]
fn a_blocked_drain_fails_the_node_untouched_and_the_rollout_at_its_threshold() {
    let mut r = draining(&["a", "b"], 1, 1);
    let mut v = views(&["a", "b"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    let why = "drain-blocked after 1m: 1 pod remains (work/web-1), refused by PodDisruptionBudget work/web";
    fact(&mut v, "a", Some(KubeFact::Blocked(why.into())));
    let d = step(&r, &v, at(61_000)).unwrap();
    assert!(
        d.assign.is_empty(),
        "nothing assigned: the node keeps its version"
    );
    assert!(d.notes.iter().any(|n| n.kind == "drain_blocked" && n.node == "a"));
    r = commit(d, &mut v, &mut g);
    assert_eq!(r.state, RolloutState::Failed);
    assert_eq!(node(&r, "a").state, NodeState::Failed);
    assert_eq!(node(&r, "a").message, why);
    assert_eq!(node(&r, "a").kube, KubeStep::None);
    assert!(!node(&r, "a").touched);
    assert_eq!(node(&r, "b").state, NodeState::Skipped);
    assert!(
        r.message.contains("PodDisruptionBudget work/web"),
        "{}",
        r.message
    );
}

#[test]
fn with_on_drain_timeout_skip_the_node_is_skipped_and_the_rollout_goes_on() {
    let mut r = draining(&["a", "b"], 1, 1);
    r.policy.drain.as_mut().unwrap().on_timeout = DrainTimeout::Skip;
    let mut v = views(&["a", "b"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", Some(KubeFact::Blocked("drain-blocked".into())));
    r = commit(step(&r, &v, at(2_000)).unwrap(), &mut v, &mut g);
    assert_eq!(r.state, RolloutState::Running);
    assert_eq!(states(&r), ["skipped", "applying"]);
    assert_eq!(node(&r, "b").kube, KubeStep::Draining);
}

#[test]
fn a_drain_nobody_answers_gives_up_after_its_timeout_and_the_grace() {
    let mut r = draining(&["a"], 1, 1);
    let mut v = views(&["a"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    assert!(step(&r, &v, at(1_000 + 60_000 + 59_000)).is_none());
    r = commit(step(&r, &v, at(1_000 + 60_000 + 61_000)).unwrap(), &mut v, &mut g);
    assert_eq!(node(&r, "a").state, NodeState::Failed);
    assert!(node(&r, "a").message.contains("no answer from the tenant API"));
}

#[test]
fn a_node_that_is_never_ready_fails_with_the_gates_last_answer() {
    let mut r = draining(&["a"], 1, 1);
    let mut v = views(&["a"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", Some(KubeFact::Drained("0 pods evicted".into())));
    r = commit(step(&r, &v, at(2_000)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", None);
    reply(&mut v, &r, "a", V, BundleState::Applied);
    r = commit(step(&r, &v, at(3_000)).unwrap(), &mut v, &mut g);
    fact(
        &mut v,
        "a",
        Some(KubeFact::NotReady(
            "the kubelet reports v1.37.1, not v1.37.2".into(),
        )),
    );
    assert!(step(&r, &v, at(33_000)).is_none(), "within the ready timeout");
    r = commit(step(&r, &v, at(33_001)).unwrap(), &mut v, &mut g);
    assert_eq!(r.state, RolloutState::Failed);
    let a = node(&r, "a");
    assert_eq!(a.state, NodeState::Failed);
    assert_eq!(a.kube, KubeStep::None);
    assert_eq!(
        a.message,
        "not Ready within 30s of applying: the kubelet reports v1.37.1, not v1.37.2"
    );
    // It was touched: a rollback returns it.
    assert!(a.touched);
}

#[test]
fn pause_stops_a_drain_and_resume_drains_again_abort_skips() {
    let mut r = draining(&["a", "b"], 2, 1);
    let mut v = views(&["a", "b"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    assert_eq!(states(&r), ["applying", "applying"]);
    let d = apply_verb(&r, Verb::Pause, 2_000).unwrap();
    r = commit(d, &mut v, &mut g);
    assert_eq!(states(&r), ["waiting", "waiting"]);
    assert!(r.nodes.iter().all(|n| n.kube == KubeStep::None));
    // A Drained answer that arrives late changes nothing while paused.
    fact(&mut v, "a", Some(KubeFact::Drained("late".into())));
    assert!(
        step(&r, &v, at(3_000))
            .map(|d| d.assign.is_empty())
            .unwrap_or(true)
    );
    fact(&mut v, "a", None);
    let d = apply_verb(&r, Verb::Resume, 4_000).unwrap();
    r = commit(d, &mut v, &mut g);
    r = commit(step(&r, &v, at(4_000)).unwrap(), &mut v, &mut g);
    assert_eq!(node(&r, "a").kube, KubeStep::Draining);
    assert_eq!(node(&r, "a").kube_since_ms, 4_000, "a new drain");
    let d = apply_verb(&r, Verb::Abort, 5_000).unwrap();
    assert!(d.notes.iter().any(|n| n.kind == "drain_stopped"));
    r = commit(d, &mut v, &mut g);
    assert_eq!(states(&r), ["skipped", "skipped"]);
    assert!(r.nodes.iter().all(|n| n.kube == KubeStep::None && !n.touched));
}

#[test]
fn a_rollback_drains_each_node_it_returns() {
    let mut r = draining(&["a"], 1, 1);
    let mut v = views(&["a"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", Some(KubeFact::Drained("ok".into())));
    r = commit(step(&r, &v, at(2_000)).unwrap(), &mut v, &mut g);
    reply(&mut v, &r, "a", V, BundleState::Applied);
    r = commit(step(&r, &v, at(3_000)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", Some(KubeFact::Ready));
    r = commit(step(&r, &v, at(4_000)).unwrap(), &mut v, &mut g);
    assert_eq!(r.state, RolloutState::Completed);
    fact(&mut v, "a", None);
    r = commit(apply_verb(&r, Verb::Rollback, 5_000).unwrap(), &mut v, &mut g);
    let d = step(&r, &v, at(5_000)).unwrap();
    assert!(d.assign.is_empty(), "drained before it goes back");
    r = commit(d, &mut v, &mut g);
    assert_eq!(node(&r, "a").kube, KubeStep::Draining);
    fact(&mut v, "a", Some(KubeFact::Drained("ok".into())));
    let d = step(&r, &v, at(6_000)).unwrap();
    assert_eq!(d.assign, [("a".to_string(), Some("1".to_string()))]);
}

#[test]
fn the_drain_time_comes_from_the_row_not_its_message() {
    let mut r = draining(&["a"], 1, 1);
    let mut v = views(&["a"]);
    let mut g = 0;
    r = commit(step(&r, &v, at(1_000)).unwrap(), &mut v, &mut g);
    assert_eq!(node(&r, "a").drain_started_ms, 1_000, "kept when the drain began");
    fact(&mut v, "a", Some(KubeFact::Drained("0 pods evicted".into())));
    r = commit(step(&r, &v, at(4_500)).unwrap(), &mut v, &mut g);
    fact(&mut v, "a", None);
    // Whatever the message says now, the outcome is computed.
    r.nodes[0].message = "drained in 99s; something else".into();
    reply(&mut v, &r, "a", V, BundleState::Applied);
    r = commit(step(&r, &v, at(5_000)).unwrap(), &mut v, &mut g);
    assert_eq!(
        node(&r, "a").message,
        "applied 2 (drained in 3.5s); waiting for the Node to be Ready"
    );
    // A row a previous release stored has no start: no drain time, no guess.
    r.nodes[0].drain_started_ms = 0;
    fact(&mut v, "a", Some(KubeFact::Ready));
    r = commit(step(&r, &v, at(6_000)).unwrap(), &mut v, &mut g);
    assert_eq!(node(&r, "a").message, "at 2; Ready 1.0s after it applied");
}
