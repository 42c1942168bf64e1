//! Release plans end to end (issue [fleet-plans]): a real server and
//! `lksctl`, seven clusters of test agents (each a real mTLS `Connect`
//! stream that reports every desired state applied — or, in one cluster,
//! failed) in three groups — by name, by cluster label and `*` — with a
//! soak of seconds. Sampled all along: the groups keep their order and
//! never more than `--max-clusters-in-flight` clusters run. The failing
//! cluster halts the plan at its budget, `plan resume` carries on to the
//! end, and `plan rollback` rolls back every cluster rollout the plan
//! started. `--dry-run` first shows the plan and stores nothing; a cluster
//! without nodes is skipped and listed. On etcd replicas, the leader killed
//! mid-plan (kill -9): the next one carries the plan on from the store, and
//! every cluster's rollout is started once.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lks_e2e::etcd::Etcd;
use lks_e2e::server::{Server, TestNode};
use lks_e2e::{one_line_error, wait_until};
use lks_proto::pb;
use serde_json::Value;

/// Groups: canary = c1 (by name), early = tier=early (c2, c3), rest = *
/// (c4, c5, c6 and c7, which has no node).
const CLUSTERS: [&str; 7] = ["c1", "c2", "c3", "c4", "c5", "c6", "c7"];
/// The cluster whose nodes fail the version, first of the last group.
const BAD: &str = "c4";
/// The cluster beside it, whose nodes take 2 s to apply: still running
/// when BAD fails, so the halt pauses its rollout and c6 is never started.
const SLOW: &str = "c5";
const IN_FLIGHT: usize = 2;

/// A test agent: reports every bundle of each desired state applied (or
/// failed while `fail` is set), and an empty report when nothing is desired.
async fn agent(node: TestNode, fail: Arc<AtomicBool>, delay: Duration) {
    let (tx, mut stream) = node.connect(Vec::new()).await.expect("connect");
    while let Ok(Some(m)) = stream.message().await {
        let Some(pb::server_message::Msg::Desired(d)) = m.msg else {
            continue;
        };
        tokio::time::sleep(delay).await;
        let state = if fail.load(Ordering::Relaxed) {
            pb::BundleState::Failed
        } else {
            pb::BundleState::Applied
        };
        let bundles = d
            .bundles
            .iter()
            .filter_map(|b| b.manifest.as_ref())
            .map(|m| pb::BundleStatus {
                name: m.name.clone(),
                version: m.version.clone(),
                state: state as i32,
                message: if state == pb::BundleState::Failed {
                    "health check failed".into()
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .collect();
        let report = pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Status(pb::StatusReport {
                generation: d.generation,
                bundles,
                trust: None,
                reboot: None,
            })),
        };
        if tx.send(report).await.is_err() {
            return;
        }
    }
}

fn status(s: &Server) -> Value {
    s.lksctl_json(&["plan", "status", "fleet"])
}

/// Every cluster of the plan's JSON with its group index and state.
fn cluster_states(p: &Value) -> Vec<(usize, String, String)> {
    lks_e2e::plan::clusters(p)
        .into_iter()
        .map(|c| (c.group, c.name, c.state))
        .collect()
}

/// The invariants every sample must hold: no more than IN_FLIGHT clusters
/// running (or rolling back); going forward, a group has a started cluster only once every earlier group
/// settled.
fn check_sample(p: &Value, max_seen: &mut usize) {
    let cs = cluster_states(p);
    let running = cs
        .iter()
        .filter(|(_, _, s)| s == "running" || s == "rolling_back")
        .count();
    assert!(running <= IN_FLIGHT, "{running} clusters in flight: {p:#}");
    *max_seen = (*max_seen).max(running);
    if p["state"] == "rolling_back" || p["state"] == "rolled_back" {
        // Newest first, across groups: the order is the rollback's own.
        return;
    }
    let settled = |s: &str| matches!(s, "completed" | "soaking" | "failed" | "skipped");
    for (gi, name, state) in &cs {
        if state != "waiting" && state != "skipped" {
            for (gj, other, ostate) in &cs {
                assert!(
                    gj >= gi || settled(ostate),
                    "{name} (group {gi}) is {state} while {other} (group {gj}) is {ostate}: {p:#}"
                );
            }
        }
    }
}

/// Samples the plan until `done` holds for it; the last sample.
fn sample_until(s: &Server, what: &str, max_seen: &mut usize, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let p = status(s);
        check_sample(&p, max_seen);
        if done(&p) {
            return p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "timed out waiting for {what}: {p:#}"
        );
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn state_of<'a>(p: &'a Value, cluster: &str) -> &'a Value {
    lks_e2e::plan::cluster(p, cluster)
}

async fn fleet(s: &Server) -> HashMap<String, Arc<AtomicBool>> {
    let mut fail = HashMap::new();
    for c in CLUSTERS {
        s.create_cluster(c);
        let f = Arc::new(AtomicBool::new(c == BAD));
        fail.insert(c.to_string(), f.clone());
        if c == "c7" {
            continue;
        }
        let t = s.token(c, &["--uses", "2"]);
        for i in 0..2 {
            let node = TestNode::enroll(s, &t, &format!("{c}-n{i}"), &[("role", "worker")]).await;
            let delay = Duration::from_millis(if c == SLOW { 2000 } else { 0 });
            tokio::spawn(agent(node, f.clone(), delay));
        }
    }
    for c in ["c2", "c3"] {
        s.lksctl_ok(&["cluster", "set", c, "--labels", "tier=early"]);
    }
    wait_until(Duration::from_secs(20), "12 agents connected", || {
        s.connected_agents() == 12
    });
    fail
}

/// `plan create --dry-run` shows every group and cluster (JSON and text),
/// and stores nothing.
fn dry_run_shows_every_group_and_stores_nothing(s: &Server, create: &[&str]) {
    let dry = s.lksctl_json(&[create, &["--dry-run"]].concat());
    assert_eq!(dry["dry_run"], true);
    let names: Vec<Vec<&str>> = dry["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g["clusters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        names,
        [vec!["c1"], vec!["c2", "c3"], vec!["c4", "c5", "c6", "c7"]],
        "{dry:#}"
    );
    assert_eq!(state_of(&dry, "c1")["nodes"], 2);
    assert_eq!(state_of(&dry, "c7")["nodes"], 0);
    let text = s.lksctl_ok(&[create, &["--dry-run"]].concat());
    assert!(text.contains("group early (tier=early): waiting"), "{text}");
    let none = s.lksctl(&["plan", "status", "fleet"]);
    assert!(one_line_error(&none, "status of a dry run").contains("plan fleet does not exist"));
}

/// `plan rollback`: every cluster rollout the plan started goes back, and
/// the plan ends `rolled_back`.
fn rollback_returns_every_cluster(s: &Server, ids: &[String], max_seen: &mut usize) {
    s.lksctl_ok(&["plan", "rollback", "fleet"]);
    let p = sample_until(s, "the rollback", max_seen, |p| p["state"] == "rolled_back");
    for (c, id) in CLUSTERS[..6].iter().zip(ids) {
        assert_eq!(state_of(&p, c)["state"], "rolled_back", "{c}: {p:#}");
        let r = s.lksctl_json(&["rollout", "status", id]);
        assert_eq!(r["state"], "rolled_back", "{c}: {r:#}");
    }
    let list = s.lksctl_json(&["plan", "list"]);
    assert_eq!(list[0]["state"], "rolled_back");
    let again = s.lksctl(&["plan", "resume", "fleet"]);
    assert_eq!(
        one_line_error(&again, "resume of a rolled-back plan"),
        "error: resume plan fleet: cannot resume plan fleet: it is rolled_back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_goes_group_by_group_halts_at_its_budget_resumes_and_rolls_back() {
    let s = Server::start();
    let fail = fleet(&s).await;
    let dir = s.write_bundle("app-1", "app", "1", &[("/etc/app.conf", b"v1\n", "0644")]);
    assert_eq!(s.publish(&dir), "app@1");

    let got = s.lksctl_json(&["cluster", "get", "c2"]);
    assert_eq!(got["labels"]["tier"], "early", "{got:#}");

    let create = [
        "plan",
        "create",
        "fleet",
        "--bundle",
        "app@1",
        "--group",
        "canary=c1",
        "--group",
        "early=tier=early",
        "--group",
        "rest=*",
        "--soak",
        "2s",
        "--max-clusters-in-flight",
        "2",
        "--failure-budget",
        "1",
        "--selector",
        "role=worker",
        "--batch-size",
        "2",
        "--alert-after",
        "1s",
    ];
    dry_run_shows_every_group_and_stores_nothing(&s, &create);

    // A group naming an unknown cluster: one line, nothing stored.
    let bad = s.lksctl(&["plan", "create", "x", "--bundle", "app@1", "--group", "g=nope"]);
    assert!(one_line_error(&bad, "unknown cluster").contains("group g: cluster nope does not exist"));

    assert_eq!(s.lksctl_ok(&create).trim(), "fleet");
    let mut max_seen = 0;
    let p = sample_until(&s, "the halt", &mut max_seen, |p| p["state"] == "halted");
    assert_eq!(state_of(&p, BAD)["state"], "failed", "{p:#}");
    assert_eq!(
        state_of(&p, "c6")["state"],
        "waiting",
        "nothing new starts: {p:#}"
    );
    assert_eq!(state_of(&p, "c7")["state"], "skipped", "no node: {p:#}");
    assert_eq!(p["budget_used"], 1);
    for c in ["c1", "c2", "c3"] {
        assert_eq!(state_of(&p, c)["state"], "completed", "{c}: {p:#}");
    }
    assert!(p["message"].as_str().unwrap().contains("failure budget"), "{p:#}");
    assert_eq!(s.metric("lks_plans{state=\"halted\"}"), 1);
    // Under way for longer than --alert-after 1s.
    assert_eq!(p["overdue"], true, "{p:#}");
    assert_eq!(s.metric("lks_plans_overdue"), 1);

    // Resume: the rest of the last group runs and the plan completes.
    fail[BAD].store(false, Ordering::Relaxed);
    let line = s.lksctl_ok(&["plan", "resume", "fleet"]);
    assert!(line.starts_with("plan fleet running"), "{line}");
    let p = sample_until(&s, "completion", &mut max_seen, |p| p["state"] == "completed");
    assert_eq!(state_of(&p, "c6")["state"], "completed", "{p:#}");
    assert_eq!(
        state_of(&p, SLOW)["state"],
        "completed",
        "its rollout resumed: {p:#}"
    );
    assert_eq!(
        state_of(&p, BAD)["state"],
        "failed",
        "a failed cluster stays failed: {p:#}"
    );
    assert!(
        p["skipped"].as_array().unwrap().iter().any(|c| c == "c7"),
        "{p:#}"
    );
    assert!(
        (1..=IN_FLIGHT).contains(&max_seen),
        "{max_seen} clusters in flight at most"
    );
    let ids: Vec<String> = CLUSTERS[..6]
        .iter()
        .map(|c| state_of(&p, c)["rollout_id"].as_str().unwrap().to_string())
        .collect();
    let r = s.lksctl_json(&["rollout", "status", &ids[0]]);
    assert_eq!(r["request_id"], "plan:fleet:c1", "{r:#}");

    rollback_returns_every_cluster(&s, &ids, &mut max_seen);
}

fn is_leader(s: &Server) -> bool {
    s.log().contains("elected: this replica drives rollouts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_mid_plan_is_replaced_by_one_that_finishes_it() {
    let etcd = Etcd::start();
    let prefix = "/lks-plans-ha/";
    let mut r1 = etcd.replica(prefix, &[]);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let r2 = etcd.replica(prefix, &[]);
    let clusters = ["h1", "h2", "h3", "h4"];
    let never_fail = Arc::new(AtomicBool::new(false));
    for c in clusters {
        r2.create_cluster(c);
        let t = r2.token(c, &["--uses", "2"]);
        for i in 0..2 {
            // Agents on r2, which survives.
            let node = TestNode::enroll(&r2, &t, &format!("{c}-n{i}"), &[]).await;
            tokio::spawn(agent(node, never_fail.clone(), Duration::ZERO));
        }
    }
    let dir = r2.write_bundle("app-1", "app", "1", &[("/etc/app.conf", b"v1\n", "0644")]);
    assert_eq!(r2.publish(&dir), "app@1");
    r2.lksctl_ok(&[
        "plan",
        "create",
        "ha",
        "--bundle",
        "app@1",
        "--group",
        "first=h1,h2",
        "--group",
        "rest=*",
        "--soak",
        "4s",
        "--max-clusters-in-flight",
        "1",
    ]);
    let plan = |s: &Server| s.lksctl_json(&["plan", "status", "ha"]);
    // Mid-plan: the first group done, the second soaking.
    let start = Instant::now();
    loop {
        let p = plan(&r2);
        if p["groups"][0]["state"] == "soaking" {
            assert_eq!(p["groups"][1]["clusters"][0]["state"], "waiting", "{p:#}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "first group never done: {p:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    r1.kill9();
    wait_until(Duration::from_secs(30), "r2 elected", || is_leader(&r2));
    let start = Instant::now();
    let p = loop {
        let p = plan(&r2);
        if p["state"] == "completed" {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the plan never completed: {p:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for c in clusters {
        assert_eq!(state_of(&p, c)["state"], "completed", "{c}: {p:#}");
    }
    // One rollout per cluster, each started once (its request ID the plan's).
    let rollouts = r2.lksctl_json(&["rollout", "list"]);
    let rows = rollouts.as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rollouts:#}");
    for c in clusters {
        let r: Vec<&Value> = rows.iter().filter(|r| r["cluster"] == c).collect();
        assert_eq!(r.len(), 1, "{c}: {rollouts:#}");
        assert_eq!(r[0]["state"], "completed", "{c}: {rollouts:#}");
        assert_eq!(r[0]["request_id"], format!("plan:ha:{c}"), "{c}: {rollouts:#}");
    }
}
