//! Batched rollouts with real agents: the batch size is never exceeded as
//! measured from the agents' own step timestamps, every node is updated
//! exactly once, status counts and events add up, and a node joining after
//! completion receives the cluster's target.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::agent::BundleFile;
use lks_e2e::rollout::{Fleet, first_line, max_concurrency, rollout_events, starts_per_node};

const CONF: &str = "/etc/kubernetes/kubelet.conf";

#[test]
fn batches_never_exceed_the_batch_size_and_every_node_updates_once() {
    let mut f = Fleet::start("c1", 6);
    let b = f.publish(
        "kubelet",
        "1",
        &[BundleFile {
            path: CONF,
            content: b"kubelet v1\n",
            mode: "0600",
        }],
        "1",
        "",
    );
    let out = f.start_rollout(&b, &["--batch-size", "2", "--wait"]);
    let stdout = lks_e2e::ok_stdout(&out, "rollout start --wait");
    let id = first_line(&stdout);
    assert!(
        stdout.lines().skip(1).any(|l| l.contains("completed")),
        "--wait prints progress lines when not on a terminal:\n{stdout}"
    );

    let runs = f.runs();
    let per_node = starts_per_node(&runs, "1");
    assert_eq!(per_node.len(), 6, "{runs:?}");
    assert!(
        per_node.values().all(|n| *n == 1),
        "each node applied once: {per_node:?}"
    );
    let c = max_concurrency(&runs);
    assert!(
        c <= 2,
        "at most 2 nodes ran their step at once, saw {c}: {runs:?}"
    );
    assert!(c >= 1);
    // Nodes start in name order: the first batch is node-1 and node-2.
    let order: Vec<&str> = runs.iter().map(|r| r.node.as_str()).collect();
    assert!(
        order[..2].iter().all(|n| *n == "node-1" || *n == "node-2"),
        "{order:?}"
    );

    let st = f.status(&id);
    assert_eq!(st["id"], id.as_str());
    assert_eq!(st["state"], "completed");
    assert_eq!(
        (&st["total"], &st["updated"], &st["failed"], &st["pending"]),
        (&6.into(), &6.into(), &0.into(), &0.into()),
        "{st:#}"
    );
    assert_eq!(st["batch_size"], 2);
    for a in &f.agents {
        assert_eq!(
            a.read(CONF),
            Some((b"kubelet v1\n".to_vec(), 0o600)),
            "{}",
            a.name
        );
    }

    let ev = rollout_events(&f.server, &id);
    let count = |k: &str| ev.iter().filter(|(kind, _)| kind == k).count();
    assert_eq!(count("rollout_started"), 1, "{ev:?}");
    assert_eq!(count("node_started"), 6, "{ev:?}");
    assert_eq!(count("applied"), 6, "{ev:?}");
    assert_eq!(count("rollout_completed"), 1, "{ev:?}");
    let m = f.server.http_get("/metrics");
    assert!(m.contains("lks_rollout_events_total{kind=\"applied\"} 6"), "{m}");
    assert!(
        m.contains("lks_rollout_events_total{kind=\"node_started\"} 6"),
        "{m}"
    );
    assert!(m.contains("lks_active_rollouts 0"), "{m}");
    let list = f.server.lksctl_ok(&["rollout", "list"]);
    assert!(list.contains(&id) && list.contains("completed"), "{list}");

    // A node that joins after completion gets the target at once.
    let late = f.add("node-7");
    late.wait_bundle("kubelet", "1", "applied");
    assert_eq!(late.read(CONF), Some((b"kubelet v1\n".to_vec(), 0o600)));
}

#[test]
fn the_default_batch_is_one_node_in_ten() {
    let f = Fleet::start("c1", 3);
    let b = f.publish(
        "conf",
        "1",
        &[BundleFile {
            path: "/etc/conf",
            content: b"one",
            mode: "0644",
        }],
        "0.3",
        "",
    );
    let out = f.start_rollout(&b, &["--wait", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(out.status.success(), "{v:#}");
    assert_eq!(v["state"], "completed");
    assert_eq!(v["batch_size"], 1, "10% of 3 nodes, rounded up");
    assert_eq!(max_concurrency(&f.runs()), 1);
}
