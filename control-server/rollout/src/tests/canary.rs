//! Canaries: first, then the soak; a failed canary fails the rollout.

use super::*;

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
