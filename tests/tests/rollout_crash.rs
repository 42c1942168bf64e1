//! A control server killed with SIGKILL in the middle of a rollout carries
//! on after a restart on the same data dir: the rollout completes, no node
//! applies the version twice, none is skipped, and the batch limit holds
//! across the crash — measured from the agents' step timestamps.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::agent::BundleFile;
use lks_e2e::rollout::{Fleet, max_concurrency, rollout_events, starts_per_node, wait_runs};

#[test]
fn kill9_mid_rollout_then_restart_completes_without_double_applies() {
    let mut f = Fleet::start("c1", 6);
    let b = f.publish(
        "kubelet",
        "1",
        &[BundleFile {
            path: "/etc/kubelet.conf",
            content: b"v1",
            mode: "0644",
        }],
        "2",
        "",
    );
    let id = f.roll_out(&b, &["--batch-size", "2"]);
    // The first batch is mid-apply on the nodes.
    wait_runs(&f, 1);
    f.server.kill9();
    std::thread::sleep(std::time::Duration::from_millis(500));
    f.server.start_again();

    let st = f.wait_state(&id, "completed");
    assert_eq!((&st["updated"], &st["failed"]), (&6.into(), &0.into()), "{st:#}");
    let runs = f.runs();
    let per_node = starts_per_node(&runs, "1");
    assert_eq!(per_node.len(), 6, "no node skipped: {runs:?}");
    assert!(
        per_node.values().all(|n| *n == 1),
        "no node applied twice: {per_node:?}"
    );
    let c = max_concurrency(&runs);
    assert!(c <= 2, "batch limit held across the crash, saw {c}: {runs:?}");
    for a in &f.agents {
        assert_eq!(a.read("/etc/kubelet.conf").unwrap().0, b"v1", "{}", a.name);
    }
    let ev = rollout_events(&f.server, &id);
    assert_eq!(
        ev.iter().filter(|(k, _)| k == "node_started").count(),
        6,
        "{ev:?}"
    );
    assert!(
        f.server.log().contains("rollout state changed"),
        "the restarted server finished it"
    );
    eprintln!(
        "CRASH server-kill9-mid-rollout: kills=1 nodes=6 updated=6 skipped=0 double_applies=0 \
         max_concurrent={c}/2 rollout=completed"
    );
}
