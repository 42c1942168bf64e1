//! Starting batches, the failure threshold and completion.

use super::*;

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
