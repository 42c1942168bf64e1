//! Operator control of rollouts with real agents: pause holds new starts
//! and resume finishes the rollout; abort stops for good; only one rollout
//! per cluster and bundle is active; rollback restores every touched node's
//! files exactly, or removes a bundle the nodes did not have before.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::agent::BundleFile;
use lks_e2e::one_line_error;
use lks_e2e::rollout::{Fleet, rollout_events, starts_per_node, wait_runs};

const CONF: &str = "/etc/kubernetes/kubelet.conf";
const BIN: &str = "/usr/local/bin/kubelet";

fn applying(st: &serde_json::Value) -> u64 {
    st["applying"].as_u64().unwrap()
}

#[test]
fn pause_resume_abort_and_one_active_rollout_per_bundle() {
    let f = Fleet::start("c1", 5);
    let v1 = [BundleFile {
        path: CONF,
        content: b"v1",
        mode: "0644",
    }];
    let b1 = f.publish("kubelet", "1", &v1, "1", "");
    let id = f.roll_out(&b1, &["--batch-size", "1"]);
    wait_runs(&f, 1);
    let p = f.server.lksctl_ok(&["rollout", "pause", &id]);
    assert!(p.contains("paused"), "{p}");

    // A second rollout of the bundle in the cluster is refused, naming the active one.
    let e = one_line_error(&f.start_rollout(&b1, &[]), "second start");
    assert!(
        e.contains(&format!("rollout {id} of kubelet in cluster c1 is still paused")),
        "{e}"
    );
    let e = one_line_error(&f.server.lksctl(&["rollout", "pause", &id]), "pause twice");
    assert!(e.contains("only a running rollout can be paused"), "{e}");

    // The node mid-apply finishes; nothing new starts while paused.
    let st = f.wait_state(&id, "paused");
    let started = f.runs().len();
    assert!(started <= 2, "{:?}", f.runs());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(f.runs().len(), started, "no node started while paused");
    let st2 = f.status(&id);
    assert_eq!(st2["updated"], st["updated"]);
    assert_eq!(st2["state"], "paused");
    assert_eq!(applying(&st2), 0);

    f.server.lksctl_ok(&["rollout", "resume", &id]);
    let st = f.wait_state(&id, "completed");
    assert_eq!(st["updated"], 5, "{st:#}");
    let per_node = starts_per_node(&f.runs(), "1");
    assert!(
        per_node.values().all(|n| *n == 1) && per_node.len() == 5,
        "{per_node:?}"
    );
    let ev = rollout_events(&f.server, &id);
    for k in ["paused", "resumed", "rollout_completed"] {
        assert!(ev.iter().any(|(kind, _)| kind == k), "{k} in {ev:?}");
    }

    // Abort: the node mid-apply finishes, no other node starts.
    let b2 = f.publish(
        "kubelet",
        "2",
        &[BundleFile {
            path: CONF,
            content: b"v2",
            mode: "0644",
        }],
        // Long enough that the abort lands while node-1 is still applying.
        "2",
        "",
    );
    let id2 = f.roll_out(&b2, &["--batch-size", "1"]);
    wait_until_v2_started(&f);
    let out = f.server.lksctl_ok(&["rollout", "abort", &id2]);
    assert!(out.contains("aborted"), "{out}");
    let st = f.wait_state(&id2, "aborted");
    assert_eq!(st["updated"], 1, "{st:#}");
    assert_eq!(st["pending"], 0, "{st:#}");
    std::thread::sleep(Duration::from_secs(2));
    let v2 = starts_per_node(&f.runs(), "2");
    assert_eq!(v2.keys().collect::<Vec<_>>(), ["node-1"], "{v2:?}");
    assert_eq!(f.agent("node-1").read(CONF).unwrap().0, b"v2");
    for n in ["node-2", "node-3", "node-4", "node-5"] {
        assert_eq!(f.agent(n).read(CONF).unwrap().0, b"v1", "{n}");
    }
    let e = one_line_error(&f.server.lksctl(&["rollout", "resume", &id2]), "resume aborted");
    assert!(e.contains("only a paused rollout can be resumed"), "{e}");
    let e = one_line_error(&f.server.lksctl(&["rollout", "abort", &id2]), "abort twice");
    assert!(e.contains("already ended (aborted)"), "{e}");
    // Aborted is not active: a new rollout of the bundle may start.
    let id3 = f.roll_out(&b2, &["--batch-size", "5"]);
    f.wait_state(&id3, "completed");
}

fn wait_until_v2_started(f: &Fleet) {
    lks_e2e::wait_until(lks_e2e::agent::CONVERGE, "v2 step started", || {
        f.runs().iter().any(|r| r.version == "2")
    });
}

#[test]
fn rollback_restores_every_touched_node_exactly() {
    let f = Fleet::start("c1", 5);
    let v1 = [
        BundleFile {
            path: CONF,
            content: b"kubelet config v1\n",
            mode: "0600",
        },
        BundleFile {
            path: BIN,
            content: b"\x7fELF kubelet v1",
            mode: "0755",
        },
    ];
    let b1 = f.publish("kubelet", "1", &v1, "0.1", "");
    lks_e2e::ok_stdout(&f.start_rollout(&b1, &["--batch-size", "5", "--wait"]), "v1");
    let b2 = f.publish(
        "kubelet",
        "2",
        &[
            BundleFile {
                path: CONF,
                content: b"kubelet config v2\n",
                mode: "0644",
            },
            BundleFile {
                path: BIN,
                content: b"\x7fELF kubelet v2",
                mode: "0755",
            },
            BundleFile {
                path: "/etc/kubernetes/extra.conf",
                content: b"new in v2",
                mode: "0644",
            },
        ],
        "0.1",
        "",
    );
    // A bundle no node had before: rolling it back removes it.
    // (Its own version string, so the step log tells its runs apart.)
    let e1 = f.publish(
        "extra",
        "e1",
        &[BundleFile {
            path: "/etc/extra/only.conf",
            content: b"extra",
            mode: "0644",
        }],
        "0.1",
        "",
    );
    let id2 = lks_e2e::rollout::first_line(&lks_e2e::ok_stdout(
        &f.start_rollout(&b2, &["--batch-size", "2", "--wait"]),
        "v2",
    ));
    let ide = lks_e2e::rollout::first_line(&lks_e2e::ok_stdout(
        &f.start_rollout(&e1, &["--batch-size", "5", "--wait"]),
        "extra",
    ));
    for a in &f.agents {
        assert_eq!(a.read(CONF).unwrap().0, b"kubelet config v2\n");
        assert!(a.read("/etc/extra/only.conf").is_some());
    }

    let out = f.server.lksctl_ok(&["rollout", "rollback", &id2]);
    assert!(out.contains("rolling_back"), "{out}");
    let e = one_line_error(&f.server.lksctl(&["rollout", "abort", &id2]), "abort a rollback");
    assert!(e.contains("rolling back"), "{e}");
    f.server.lksctl_ok(&["rollout", "rollback", &ide]);
    let st = f.wait_state(&id2, "rolled_back");
    let nodes = st["nodes"].as_array().unwrap();
    assert!(nodes.iter().all(|n| n["state"] == "rolled_back"), "{st:#}");
    f.wait_state(&ide, "rolled_back");
    for a in &f.agents {
        assert_eq!(
            a.read(CONF),
            Some((b"kubelet config v1\n".to_vec(), 0o600)),
            "{}",
            a.name
        );
        assert_eq!(
            a.read(BIN),
            Some((b"\x7fELF kubelet v1".to_vec(), 0o755)),
            "{}",
            a.name
        );
        assert_eq!(a.read("/etc/kubernetes/extra.conf"), None, "{}", a.name);
        assert_eq!(a.read("/etc/extra/only.conf"), None, "{}", a.name);
    }
    // The rollback itself went in batches of two.
    let back: Vec<_> = f
        .runs()
        .into_iter()
        .filter(|r| r.version == "1")
        .skip(5)
        .collect();
    assert_eq!(back.len(), 5, "v1's step ran again once per node: {back:?}");
    assert!(lks_e2e::rollout::max_concurrency(&back) <= 2, "{back:?}");
    let ev = rollout_events(&f.server, &id2);
    assert_eq!(ev.iter().filter(|(k, _)| k == "rolled_back").count(), 5, "{ev:?}");
    assert!(ev.iter().any(|(k, _)| k == "rollout_rolled_back"), "{ev:?}");

    // The cluster target is v1 again: a joiner gets v1 and no extra.
    let mut f = f;
    let late = f.add("node-6");
    late.wait_bundle("kubelet", "1", "applied");
    assert!(late.bundle("extra").is_none());
}
