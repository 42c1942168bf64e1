use std::collections::BTreeMap;

use lks_store::{
    OnHalt, PlanClusterRow, PlanClusterState as C, PlanGroupRow, PlanRow, PlanState, RolloutState,
};

use super::*;

/// A plan over groups of (name, [(cluster, nodes)]), soak 10 s, at most 2
/// clusters in flight, a budget of 1.
fn plan(groups: &[(&str, &[(&str, u32)])]) -> PlanRow {
    PlanRow {
        name: "p".into(),
        bundle: "k".into(),
        version: "2".into(),
        selector: Default::default(),
        policy: Vec::new(),
        soak_ms: 10_000,
        max_in_flight: 2,
        failure_budget: 1,
        on_halt: OnHalt::Pause,
        alert_after_ms: 0,
        state: PlanState::Running,
        groups: groups
            .iter()
            .map(|(name, clusters)| PlanGroupRow {
                name: name.to_string(),
                selector: "*".into(),
                done_at_ms: 0,
                clusters: clusters
                    .iter()
                    .map(|(c, n)| PlanClusterRow::waiting(c, *n))
                    .collect(),
            })
            .collect(),
        failures: 0,
        failures_at_resume: 0,
        message: String::new(),
        created_at_ms: 0,
        updated_at_ms: 0,
        state_since_ms: 0,
        started_by: String::new(),
        revision: 1,
    }
}

fn rid(cluster: &str) -> String {
    request_rollout_id(&request_id("p", cluster))
}

type Seen = BTreeMap<String, RolloutSeen>;

fn saw(seen: &mut Seen, cluster: &str, state: RolloutState) {
    seen.insert(
        rid(cluster),
        RolloutSeen {
            state,
            total: 3,
            updated: if state == RolloutState::Completed { 3 } else { 1 },
            failed: u32::from(state == RolloutState::Failed),
            message: String::new(),
        },
    );
}

fn state_of(p: &PlanRow, cluster: &str) -> C {
    p.clusters().find(|c| c.name == cluster).map(|c| c.state).unwrap()
}

fn started(d: &PlanDecision) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            PlanAction::Start { cluster, .. } => Some(cluster.clone()),
            _ => None,
        })
        .collect()
}

/// Steps `p` once, as the driver does: over the rollouts it follows
/// ([`rollouts_to_follow`]) and no other; the decision's plan becomes `p`.
/// Every test below thus checks that those are all a step needs.
fn go(p: &mut PlanRow, seen: &Seen, now: i64) -> PlanDecision {
    let follow = rollouts_to_follow(p);
    let read: Seen = seen
        .iter()
        .filter(|(id, _)| follow.contains(id))
        .map(|(id, r)| (id.clone(), r.clone()))
        .collect();
    let d = step(p, &read, now).expect("a decision");
    *p = d.plan.clone();
    d
}

#[test]
fn the_driver_follows_only_the_rollouts_that_run_until_a_rollback() {
    let mut p = plan(&[("g", &[("a", 3), ("b", 3)]), ("h", &[("c", 3)])]);
    p.soak_ms = 60_000;
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    assert_eq!(rollouts_to_follow(&p), [rid("a"), rid("b")]);
    saw(&mut seen, "a", RolloutState::Completed);
    saw(&mut seen, "b", RolloutState::Failed);
    p.failure_budget = 2;
    go(&mut p, &seen, 2);
    // Group g done, soaking: nothing runs, nothing is read.
    assert_eq!(state_of(&p, "b"), C::Failed);
    assert!(rollouts_to_follow(&p).is_empty());
    assert_eq!(step(&p, &Seen::new(), 3), None, "nothing to do while soaking");
    let p = apply_verb(&p, PlanVerb::Rollback, 4).unwrap();
    assert_eq!(rollouts_to_follow(&p), [rid("a"), rid("b")]);
}

#[test]
fn groups_go_in_order_within_the_in_flight_limit_and_soak_between() {
    let mut p = plan(&[("canary", &[("a", 3)]), ("rest", &[("b", 3), ("c", 3), ("d", 3)])]);
    let mut seen = Seen::new();
    let d = go(&mut p, &seen, 1);
    assert_eq!(started(&d), ["a"], "only the first group starts");
    assert_eq!(
        p.groups[0].clusters[0].rollout_id,
        rid("a"),
        "the ID is known before the start"
    );
    assert!(step(&p, &seen, 2).is_none() || started(&step(&p, &seen, 2).unwrap()) == ["a"]);

    saw(&mut seen, "a", RolloutState::Running);
    assert!(
        step(&p, &seen, 3).is_none_or(|d| d.actions.is_empty()),
        "nothing new while a runs"
    );
    saw(&mut seen, "a", RolloutState::Completed);
    let d = go(&mut p, &seen, 100);
    assert!(started(&d).is_empty(), "the soak comes first");
    assert_eq!(p.groups[0].done_at_ms, 100);
    assert_eq!(group_state_at(&p, 0, 200), "soaking");
    assert_eq!(cluster_state_at(&p, 0, &p.groups[0].clusters[0], 200), "soaking");
    assert!(step(&p, &seen, 5_000).is_none(), "still soaking");

    let d = go(&mut p, &seen, 10_100);
    assert_eq!(started(&d), ["b", "c"], "two at most, in the group's order");
    assert_eq!(
        cluster_state_at(&p, 0, &p.groups[0].clusters[0], 10_100),
        "completed"
    );
    saw(&mut seen, "b", RolloutState::Completed);
    saw(&mut seen, "c", RolloutState::Running);
    let d = go(&mut p, &seen, 10_200);
    assert_eq!(started(&d), ["d"], "a freed slot is filled");
    assert_eq!(p.clusters().filter(|c| c.state == C::Running).count(), 2);
    saw(&mut seen, "c", RolloutState::Completed);
    saw(&mut seen, "d", RolloutState::Completed);
    let d = go(&mut p, &seen, 10_300);
    assert_eq!(p.state, PlanState::Completed, "no soak after the last group");
    assert!(d.notes.iter().any(|n| n.kind == "plan_completed"));
    assert!(step(&p, &seen, 20_000).is_none());
    let seqs: Vec<u32> = p.clusters().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "start order recorded");
}

#[test]
fn clusters_without_nodes_are_skipped_and_listed() {
    let mut p = plan(&[("g", &[("a", 0), ("b", 2)]), ("h", &[("c", 0)])]);
    p.soak_ms = 0;
    let mut seen = Seen::new();
    let d = go(&mut p, &seen, 1);
    assert_eq!(started(&d), ["b"]);
    assert_eq!(state_of(&p, "a"), C::Skipped);
    // A rollout that found no node at its start is skipped too.
    seen.insert(
        rid("b"),
        RolloutSeen {
            state: RolloutState::Completed,
            total: 0,
            updated: 0,
            failed: 0,
            message: String::new(),
        },
    );
    let d = go(&mut p, &seen, 2);
    assert_eq!(state_of(&p, "b"), C::Skipped);
    let done = d.notes.iter().find(|n| n.kind == "plan_group_done").unwrap();
    assert_eq!(done.message, "group g done; skipped: a, b");
    assert_eq!(p.state, PlanState::Completed, "an empty group passes at once");
}

#[test]
fn a_failure_at_the_budget_halts_and_pauses_the_running_rollouts() {
    let mut p = plan(&[("g", &[("a", 3), ("b", 3), ("c", 3)])]);
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    saw(&mut seen, "a", RolloutState::Failed);
    saw(&mut seen, "b", RolloutState::Running);
    let d = go(&mut p, &seen, 2);
    assert_eq!(p.state, PlanState::Halted);
    assert_eq!(p.failures, 1);
    assert_eq!(state_of(&p, "a"), C::Failed);
    assert!(started(&d).is_empty(), "nothing new starts");
    assert_eq!(d.actions, [PlanAction::Pause { rollout_id: rid("b") }]);
    assert!(p.groups[0].clusters[1].paused_by_plan);
    assert!(d.notes.iter().any(|n| n.kind == "plan_halted"));
    saw(&mut seen, "b", RolloutState::Paused);
    assert!(
        step(&p, &seen, 3).is_none(),
        "paused once, and progress alone writes nothing"
    );

    // Resume: the plan's pause is lifted, the budget counts afresh, c starts.
    let mut p = apply_verb(&p, PlanVerb::Resume, 4).unwrap();
    assert_eq!(p.budget_used(), 0);
    let d = go(&mut p, &seen, 5);
    assert!(d.actions.contains(&PlanAction::Resume { rollout_id: rid("b") }));
    assert_eq!(started(&d), ["c"]);
    assert_eq!(p.state, PlanState::Running);
}

#[test]
fn on_halt_finish_leaves_running_rollouts_and_a_larger_budget_goes_on() {
    let mut p = plan(&[("g", &[("a", 3), ("b", 3), ("c", 3)])]);
    p.on_halt = OnHalt::Finish;
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    saw(&mut seen, "a", RolloutState::Failed);
    saw(&mut seen, "b", RolloutState::Running);
    let d = go(&mut p, &seen, 2);
    assert_eq!(p.state, PlanState::Halted);
    assert!(d.actions.is_empty(), "left to finish");
    saw(&mut seen, "b", RolloutState::Completed);
    go(&mut p, &seen, 3);
    assert_eq!(
        state_of(&p, "b"),
        C::Completed,
        "a halted plan still follows its rollouts"
    );
    assert_eq!(state_of(&p, "c"), C::Waiting);

    let mut p = plan(&[("g", &[("a", 3), ("b", 3), ("c", 3)])]);
    p.failure_budget = 2;
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    saw(&mut seen, "a", RolloutState::Aborted);
    saw(&mut seen, "b", RolloutState::Running);
    let d = go(&mut p, &seen, 2);
    assert_eq!(p.state, PlanState::Running, "one failure of a budget of two");
    assert_eq!(started(&d), ["c"]);
    assert_eq!(p.groups[0].clusters[0].message, "rollout aborted");
}

#[test]
fn pause_resume_and_abort() {
    let mut p = plan(&[("g", &[("a", 3), ("b", 3), ("c", 3)])]);
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    saw(&mut seen, "a", RolloutState::Running);
    saw(&mut seen, "b", RolloutState::Completed);
    let mut p = apply_verb(&p, PlanVerb::Pause, 2).unwrap();
    assert!(apply_verb(&p, PlanVerb::Pause, 2).is_err());
    let d = go(&mut p, &seen, 3);
    assert_eq!(d.actions, [PlanAction::Pause { rollout_id: rid("a") }]);
    assert_eq!(state_of(&p, "c"), C::Waiting, "nothing starts while paused");

    let mut p = apply_verb(&p, PlanVerb::Abort, 4).unwrap();
    saw(&mut seen, "a", RolloutState::Paused);
    let d = go(&mut p, &seen, 5);
    assert_eq!(d.actions, [PlanAction::Abort { rollout_id: rid("a") }]);
    assert_eq!(state_of(&p, "c"), C::Skipped);
    assert!(needs_driving(&p), "its rollout still runs");
    saw(&mut seen, "a", RolloutState::Aborted);
    go(&mut p, &seen, 6);
    assert!(!needs_driving(&p));
    let e = apply_verb(&p, PlanVerb::Resume, 7).unwrap_err();
    assert_eq!(e.to_string(), "cannot resume plan p: it is aborted");
}

#[test]
fn rollback_goes_newest_first_within_the_limit() {
    let mut p = plan(&[("g", &[("a", 3), ("b", 3)]), ("h", &[("c", 3), ("d", 3)])]);
    p.soak_ms = 0;
    let mut seen = Seen::new();
    go(&mut p, &seen, 1);
    saw(&mut seen, "a", RolloutState::Completed);
    saw(&mut seen, "b", RolloutState::Completed);
    go(&mut p, &seen, 2);
    saw(&mut seen, "c", RolloutState::Running);
    saw(&mut seen, "d", RolloutState::Failed);
    go(&mut p, &seen, 3);
    assert_eq!(p.state, PlanState::Halted);

    let mut p = apply_verb(&p, PlanVerb::Rollback, 4).unwrap();
    let d = go(&mut p, &seen, 5);
    // d (seq 4) and c (seq 3) first: the newest.
    assert_eq!(
        d.actions,
        [
            PlanAction::Rollback { rollout_id: rid("d") },
            PlanAction::Rollback { rollout_id: rid("c") }
        ]
    );
    saw(&mut seen, "d", RolloutState::RolledBack);
    saw(&mut seen, "c", RolloutState::RollingBack);
    let d = go(&mut p, &seen, 6);
    assert_eq!(d.actions, [PlanAction::Rollback { rollout_id: rid("b") }]);
    saw(&mut seen, "c", RolloutState::RolledBack);
    saw(&mut seen, "b", RolloutState::RolledBack);
    let d = go(&mut p, &seen, 7);
    assert_eq!(d.actions, [PlanAction::Rollback { rollout_id: rid("a") }]);
    saw(&mut seen, "a", RolloutState::RolledBack);
    let d = go(&mut p, &seen, 8);
    assert!(d.actions.is_empty());
    assert_eq!(p.state, PlanState::RolledBack);
    assert!(p.clusters().all(|c| c.state == C::RolledBack));
    assert!(!needs_driving(&p));
}

#[test]
fn a_start_lost_in_a_crash_is_started_again_or_waits_again() {
    let mut p = plan(&[("g", &[("a", 3)])]);
    let seen = Seen::new();
    go(&mut p, &seen, 1);
    // The new leader finds a stored as running, its rollout missing.
    let d = step(&p, &seen, 2).unwrap();
    assert_eq!(
        d.actions,
        [PlanAction::Start {
            cluster: "a".into(),
            rollout_id: rid("a")
        }]
    );
    assert_eq!(
        d.plan.groups[0].clusters[0].seq, 1,
        "the same start, not a new one"
    );
    // Paused meanwhile: it waits again.
    let mut q = apply_verb(&p, PlanVerb::Pause, 3).unwrap();
    go(&mut q, &seen, 4);
    assert_eq!(state_of(&q, "a"), C::Waiting);
}

#[test]
fn the_request_id_and_rollout_id_are_stable() {
    assert_eq!(request_id("fleet", "tenant-a"), "plan:fleet:tenant-a");
    assert_eq!(request_rollout_id("x"), request_rollout_id("x"));
    assert_eq!(request_rollout_id("x").len(), 12);
    assert_ne!(request_rollout_id("x"), request_rollout_id("y"));
}
