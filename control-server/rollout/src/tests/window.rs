//! Maintenance windows: nothing starts while every one is closed.

use super::*;

#[test]
fn closed_windows_start_nothing_and_the_rollout_resumes_when_one_opens() {
    let nodes = ["a", "b"];
    let mut v = views(&nodes);
    let mut g = 0;
    let win = ["Sat,Sun 02:00-06:00 Europe/Berlin"];
    // Tuesday 2026-11-24, noon in Berlin.
    let tuesday = ms("2026-11-24T11:00:00Z");
    let d = step(&deferring(&nodes, 2, 1), &v, windowed(tuesday, &win)).unwrap();
    assert!(d.assign.is_empty(), "nothing starts outside every window");
    assert!(d.rollout.pacing.waiting_for_window);
    // Saturday 2026-11-28 02:00 CET = 01:00 UTC.
    assert_eq!(d.rollout.pacing.next_window_ms, ms("2026-11-28T01:00:00Z"));
    assert!(
        d.notes
            .iter()
            .any(|n| n.kind == "waiting_for_window" && n.message.contains("2026-11-28T01:00:00Z"))
    );
    let r = commit(d, &mut v, &mut g);
    assert_eq!(r.state, RolloutState::Running);
    assert!(
        step(&r, &v, windowed(tuesday + 3_600_000, &win)).is_none(),
        "no churn while waiting"
    );

    let d = step(&r, &v, windowed(ms("2026-11-28T01:30:00Z"), &win)).unwrap();
    assert_eq!(d.assign.len(), 2);
    assert!(!d.rollout.pacing.waiting_for_window);
    assert!(d.notes.iter().any(|n| n.kind == "window_open"));
    let r = commit(d, &mut v, &mut g);
    // Nodes already applying finish after the window closed.
    let sunday_evening = ms("2026-11-29T20:00:00Z");
    let r = settle(r, &mut v, &mut g, &windowed(sunday_evening, &win));
    assert_eq!(r.state, RolloutState::Completed);
}

#[test]
fn ignore_windows_starts_outside_them_and_unreadable_windows_start_nothing() {
    let nodes = ["a"];
    let v = views(&nodes);
    let tuesday = ms("2026-11-24T11:00:00Z");
    let mut r = deferring(&nodes, 1, 1);
    r.policy.ignore_windows = true;
    let d = step(&r, &v, windowed(tuesday, &["Sat 02:00-06:00 UTC"])).unwrap();
    assert_eq!(d.assign.len(), 1);
    let mut clock = at(tuesday);
    clock.windows_unreadable = true;
    let d = step(&deferring(&nodes, 1, 1), &v, clock).unwrap();
    assert!(d.assign.is_empty());
    assert!(d.rollout.pacing.waiting_for_window);
}

#[test]
fn a_rollback_is_not_held_back_by_windows() {
    let nodes = ["a"];
    let mut v = views(&nodes);
    let mut g = 0;
    let r = run_deferring(&nodes, 1, &mut v, &mut g);
    let r = commit(apply_verb(&r, Verb::Rollback, 2).unwrap(), &mut v, &mut g);
    let d = step(
        &r,
        &v,
        windowed(ms("2026-11-24T11:00:00Z"), &["Sat 02:00-06:00 UTC"]),
    )
    .unwrap();
    assert_eq!(d.assign, vec![("a".into(), Some("1".into()))]);
}
