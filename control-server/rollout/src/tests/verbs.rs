//! The operator verbs: pause, resume, abort, rollback.

use super::*;

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
