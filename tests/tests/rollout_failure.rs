//! Failures in rollouts with real agents: the failure threshold stops a
//! rollout and the nodes it never started keep their old files; a node that
//! is offline past the offline deadline (`--offline wait`) counts as failed and is left on its
//! old version.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::agent::{BundleFile, CONVERGE};
use lks_e2e::rollout::{Fleet, first_line, rollout_events, starts_per_node};
use lks_e2e::{one_line_error, wait_until};

const CONF: &str = "/etc/app/app.conf";

fn v1() -> [BundleFile<'static>; 1] {
    [BundleFile {
        path: CONF,
        content: b"app v1\n",
        mode: "0640",
    }]
}

#[test]
fn the_failure_threshold_stops_the_rollout_and_untouched_nodes_keep_v1() {
    let f = Fleet::start("c1", 5);
    let b1 = f.publish("app", "1", &v1(), "0.1", "");
    lks_e2e::ok_stdout(&f.start_rollout(&b1, &["--batch-size", "5", "--wait"]), "v1");

    // v2's health check always fails: each node restores v1 and reports it.
    let b2 = f.publish(
        "app",
        "2",
        &[BundleFile {
            path: CONF,
            content: b"app v2\n",
            mode: "0644",
        }],
        "0.5",
        "\n[health]\nrun = [\"sh\", \"-c\", \"echo not healthy >&2; exit 1\"]\nretries = 1\ninterval = \"100ms\"\n",
    );
    // One at a time, so exactly two nodes fail before the rollout stops.
    let out = f.start_rollout(&b2, &["--batch-size", "1", "--failure-threshold", "2", "--wait"]);
    let e = one_line_error(&out, "rollout --wait of a failing bundle");
    assert!(e.contains("ended failed"), "{e}");
    assert!(e.contains("not healthy"), "{e}");
    let id = first_line(&String::from_utf8_lossy(&out.stdout));
    let st = f.wait_state(&id, "failed");
    assert_eq!(st["failed"], 2, "{st:#}");
    assert_eq!(st["updated"], 0, "{st:#}");
    assert_eq!(st["pending"], 0, "{st:#}");
    let nodes = st["nodes"].as_array().unwrap();
    let state_of = |n: &str| {
        nodes
            .iter()
            .find(|x| x["name"] == n)
            .map(|x| x["state"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(state_of("node-1"), "failed");
    assert_eq!(state_of("node-2"), "failed");
    for n in ["node-3", "node-4", "node-5"] {
        assert_eq!(state_of(n), "skipped", "{st:#}");
    }

    // Only node-1 and node-2 ever ran v2's step; everyone holds v1's bytes.
    let v2_starts = starts_per_node(&f.runs(), "2");
    assert_eq!(
        v2_starts.keys().map(String::as_str).collect::<Vec<_>>(),
        ["node-1", "node-2"],
        "{v2_starts:?}"
    );
    for a in &f.agents {
        assert_eq!(a.read(CONF), Some((b"app v1\n".to_vec(), 0o640)), "{}", a.name);
    }
    for n in ["node-3", "node-4", "node-5"] {
        let (v, s, _) = f.agent(n).bundle("app").unwrap();
        assert_eq!((v.as_str(), s.as_str()), ("1", "applied"), "{n}");
    }
    let ev = rollout_events(&f.server, &id);
    assert!(ev.iter().any(|(k, n)| k == "failed" && n == "node-1"), "{ev:?}");
    assert!(ev.iter().any(|(k, _)| k == "rollout_failed"), "{ev:?}");
}

#[test]
fn a_node_offline_past_its_deadline_counts_as_failed_and_stays_on_its_version() {
    let mut f = Fleet::start("c1", 3);
    assert_eq!(f.agent_mut("node-2").stop(), Some(0));
    let b = f.publish("app", "1", &v1(), "0.1", "");
    let out = f.start_rollout(
        &b,
        &[
            "--batch-size",
            "1",
            "--failure-threshold",
            "2",
            "--offline",
            "wait",
            "--offline-deadline",
            "2s",
            "--wait",
        ],
    );
    let stdout = lks_e2e::ok_stdout(&out, "rollout with an offline node");
    let id = first_line(&stdout);
    let st = f.status(&id);
    assert_eq!(st["state"], "completed", "{st:#}");
    assert_eq!((&st["updated"], &st["failed"]), (&2.into(), &1.into()), "{st:#}");
    let n2 = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "node-2")
        .unwrap()
        .clone();
    assert_eq!(n2["state"], "failed");
    let msg = n2["message"].as_str().unwrap();
    assert!(msg.contains("offline for more than 2s"), "{msg}");
    assert!(st["message"].as_str().unwrap().contains("1 failed"), "{st:#}");

    // It never heard of the version: back online it stays without it.
    let a = f.agent_mut("node-2");
    a.start();
    a.wait_connected();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(a.read(CONF), None);
    assert!(a.bundle("app").is_none(), "{:?}", a.bundle("app"));
    // While a node that joins now gets the completed target.
    let late = f.add("node-4");
    late.wait_bundle("app", "1", "applied");
    wait_until(CONVERGE, "node-1 and node-3 updated", || {
        f.agent("node-1").read(CONF).is_some() && f.agent("node-3").read(CONF).is_some()
    });
}
