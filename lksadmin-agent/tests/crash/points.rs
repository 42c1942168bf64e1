//! Every fault point of an upgrade, a failing upgrade, the cache and the agent's own phases: killed there, the node converges.

use super::*;

#[test]
fn every_fault_point_is_documented() {
    let all: Vec<&str> = APPLY_POINTS
        .iter()
        .chain(["committed", "rolling-back", "rollback-partial", "state-saved"].iter())
        .chain(CACHE_POINTS)
        // Needs a server that makes patches: tests/tests/delta.rs
        // (`a_crash_while_rebuilding_leaves_the_old_file_and_converges`).
        .chain(["delta-rebuilding"].iter())
        .copied()
        .collect();
    let mut documented = fault::POINTS.to_vec();
    documented.sort();
    let mut tested = all.clone();
    tested.sort();
    assert_eq!(documented, tested, "every fault point is exercised below");
}

#[test]
fn crash_during_a_successful_upgrade_rolls_back_or_forward_then_converges() {
    let base = baseline();
    let mut crashes = 0;
    for point in APPLY_POINTS
        .iter()
        .chain(["committed", "state-saved"].iter())
        .chain(CACHE_POINTS)
    {
        crashes += 1;
        let n = base.clone_dirs();
        n.desire(2, vec![manifest("2", &v2_files(), false)]);
        n.crash_at(point);
        n.assert_each_file_old_or_new(&v1_files(), &v2_files(), point);
        n.assert_cache_verified(point);
        let after_crash_new = n.matches(&v2_files());
        if CACHE_POINTS.contains(point) {
            assert!(
                !n.cached(&v2_files()),
                "{point}: crashed before the cache copy was done"
            );
        }
        n.run_until("v2 applied and cached after restart", |n| {
            n.bundle_state() == Some(("2".into(), BundleState::Applied)) && n.cached(&v2_files())
        });
        assert!(n.matches(&v2_files()), "{point}: files are not all new");
        n.assert_clean(point);
        n.assert_cache_verified(point);
        if ["committed", "state-saved"]
            .iter()
            .chain(CACHE_POINTS)
            .any(|p| p == point)
        {
            assert!(
                after_crash_new,
                "{point}: crash after the commit record must leave the new files"
            );
        }
        let lines = std::fs::read_to_string(n.root.join("steps.log")).unwrap_or_default();
        assert_eq!(
            lines.lines().last(),
            Some("2"),
            "{point}: the last steps run are v2's"
        );
    }
    // Every count below is asserted above, per fault point.
    eprintln!(
        "CRASH agent-upgrade-at-each-fault-point: points={crashes} crashes={crashes} mixed_files=0 \
         converged={crashes} cached_after_restart={crashes} left_over=0 unverified_cached=0"
    );
}

#[test]
fn crash_during_a_failing_upgrade_always_ends_all_old_and_rolled_back() {
    let base = baseline();
    let mut crashes = 0;
    for point in APPLY_POINTS
        .iter()
        .chain(["rolling-back", "rollback-partial", "state-saved"].iter())
    {
        crashes += 1;
        let n = base.clone_dirs();
        n.desire(2, vec![manifest("2", &v2_files(), true)]);
        n.crash_at(point);
        n.assert_each_file_old_or_new(&v1_files(), &v2_files(), point);
        n.assert_cache_verified(point);
        n.run_until("v2 rolled back after restart", |n| {
            n.bundle_state() == Some(("2".into(), BundleState::RolledBack))
        });
        assert!(n.matches(&v1_files()), "{point}: files are not all old");
        n.assert_clean(point);
        let st = n.local_state();
        assert_eq!(
            st.bundles["app"].installed.as_ref().unwrap().version,
            "1",
            "{point}"
        );
        let lines = std::fs::read_to_string(n.root.join("steps.log")).unwrap_or_default();
        assert_eq!(
            lines.lines().last(),
            Some("1"),
            "{point}: v1's steps re-run after the rollback"
        );
    }
    eprintln!(
        "CRASH agent-failing-upgrade-at-each-fault-point: points={crashes} crashes={crashes} mixed_files=0 \
         rolled_back={crashes} left_over=0 unverified_cached=0"
    );
}

#[test]
fn an_unchanged_managed_file_is_backed_up_by_the_cache_and_a_drifted_one_by_a_copy() {
    let n = baseline();
    // b.conf drifted since v1 was applied (same size, other bytes); a.conf
    // still holds v1's blob.
    std::fs::write(n.root.join("etc/app/b.conf"), b"VERSION ONE OF B\n").unwrap();
    n.desire(2, vec![manifest("2", &v2_files(), true)]);
    n.crash_at("switching");
    let journal: serde_json::Value =
        serde_json::from_slice(&std::fs::read(StateDir::new(&n.state).journal()).unwrap()).unwrap();
    let backup = |path: &str| {
        journal["plans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"] == path)
            .unwrap_or_else(|| panic!("no plan for {path}: {journal:#}"))["backup"]
            .clone()
    };
    assert_eq!(backup("/etc/app/a.conf")["kind"], "cached", "{journal:#}");
    assert_eq!(backup("/etc/app/b.conf")["kind"], "file", "{journal:#}");
    assert_eq!(backup("/usr/bin/c")["kind"], "absent", "{journal:#}");
    let seq = journal["seq"].as_u64().unwrap();
    let stored: Vec<String> = std::fs::read_dir(StateDir::new(&n.state).txn(seq))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stored.len(), 1, "only the drifted file was copied: {stored:?}");

    // v2 fails its health check: both come back exactly, the drifted bytes
    // included.
    n.run_until("v2 rolled back", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::RolledBack))
    });
    let mut want = v1_files();
    want.insert("/etc/app/b.conf", Some((&b"VERSION ONE OF B\n"[..], 0o600)));
    assert!(n.matches(&want), "exact restore");
    n.assert_clean("after the rollback");
}

/// Agent-owned phases: staging, backing up, switching.
const AGENT_POINTS: &[&str] = &[
    "staging",
    "staged-partial",
    "backing-up",
    "switching",
    "switch-partial",
];

#[test]
fn crashes_in_the_agents_own_phases_never_give_up() {
    let n = baseline();
    n.desire(2, vec![manifest("2", &v2_files(), false)]);
    // Twice at every agent-owned point: ten crashes in a row, far past the
    // crash-loop guard's three.
    for point in AGENT_POINTS.iter().chain(AGENT_POINTS) {
        n.crash_at(point);
        n.assert_each_file_old_or_new(&v1_files(), &v2_files(), point);
        let st = n.local_state();
        let r = &st.bundles["app"];
        assert_ne!(
            r.status.state,
            BundleState::Failed,
            "{point}: {}",
            r.status.message
        );
        assert_eq!(
            (r.interrupted, r.gave_up),
            (0, 0),
            "{point}: counted toward the guard"
        );
    }
    n.run_until("v2 applied after ten crashes", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Applied))
    });
    assert!(n.matches(&v2_files()));
    n.assert_clean("after the crashes");
}

#[test]
fn crashes_while_steps_run_give_up_after_three_then_retry_after_a_backoff_or_on_request() {
    let n = baseline();
    n.desire(2, vec![manifest("2", &v2_files(), false)]);
    for point in ["activating", "checking", "activating"] {
        n.crash_at(point);
    }
    let before = now_ms();
    n.run_until("v2 given up on", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Failed))
    });
    assert!(n.matches(&v1_files()), "v1 restored after giving up");
    let st = n.local_state();
    let r = &st.bundles["app"];
    assert!(
        r.status
            .message
            .starts_with("gave up after 3 interrupted attempts: the agent stopped during")
            && r.status.message.contains("trying again at")
            && r.status.message.contains("lksctl node retry crash-node"),
        "{}",
        r.status.message
    );
    assert_eq!(r.gave_up, 1);
    let wait = r.retry_at_ms - before;
    assert!((55_000..=70_000).contains(&wait), "first backoff {wait} ms");

    // Still within the backoff: a restart does not try again.
    let steps = std::fs::read_to_string(n.root.join("steps.log")).unwrap_or_default();
    let mut child = n.spawn(None);
    std::thread::sleep(Duration::from_secs(2));
    terminate(&mut child);
    assert_eq!(n.bundle_state(), Some(("2".into(), BundleState::Failed)));
    assert!(n.matches(&v1_files()));
    assert_eq!(
        std::fs::read_to_string(n.root.join("steps.log")).unwrap_or_default(),
        steps,
        "no step ran during the backoff"
    );

    // The operator asks for a retry (`lksctl node retry`): it applies.
    let d = StateDir::new(&n.state);
    let mut desired =
        lksadmin_agent::apply::state::parse_desired(&d.desired(), &std::fs::read(d.desired()).unwrap())
            .unwrap();
    desired.generation += 1;
    desired.retry.insert("app".into(), desired.generation);
    save_desired(&d.desired(), &Desired::from(&desired)).unwrap();
    n.run_until("v2 applied on request", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Applied))
    });
    let r = &n.local_state().bundles["app"];
    assert_eq!(
        (r.retry_seen, r.gave_up, r.retry_at_ms),
        (desired.generation, 0, 0)
    );
    assert!(n.matches(&v2_files()));

    // Give up again, then let the backoff run out (the clock moved on).
    let base = baseline();
    base.desire(2, vec![manifest("2", &v2_files(), false)]);
    for _ in 0..3 {
        base.crash_at("checking");
    }
    base.run_until("given up", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Failed))
    });
    let mut st = base.local_state();
    st.bundles.get_mut("app").unwrap().retry_at_ms = now_ms() - 1;
    st.save(&StateDir::new(&base.state).state()).unwrap();
    base.run_until("v2 applied after the backoff", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Applied))
    });
}

#[test]
fn a_rollback_finished_again_after_a_crash_counts_its_interruption_once() {
    let n = baseline();
    n.desire(2, vec![manifest("2", &v2_files(), false)]);
    n.crash_at("activating");
    // The rollback of that interruption is finished, and the agent dies
    // right after recording it, twice.
    for _ in 0..2 {
        n.crash_at("state-saved");
        assert_eq!(n.local_state().bundles["app"].interrupted, 1);
    }
    n.run_until("v2 applied", |n| {
        n.bundle_state() == Some(("2".into(), BundleState::Applied))
    });
    assert!(n.matches(&v2_files()));
}
