//! Settling in-flight nodes: offline nodes, deferral, holds, deleted nodes.

use super::*;

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
