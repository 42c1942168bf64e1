//! `lks-loadgen --servers` (the HA rows of BENCHMARKS.md): simulated agents
//! spread over two replicas on one throwaway etcd, a rollout started
//! through the first reaches the agents on both, and each replica enrolled
//! its share; and the region shape of issue [scale-out] at CI size: a few
//! hundred agents over three replicas on a three-member etcd, with the
//! leading replica and an etcd member killed mid-rollout.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use std::time::Duration;

use lks_e2e::etcd::{Etcd, EtcdCluster};
use lks_e2e::server::Server;
use lks_e2e::{KillOnDrop, bin, ok_stdout, run, wait_until};

fn replica(etcd: &Etcd) -> Server {
    etcd.replica("/lks-test-loadgen/", &[])
}

fn enrolled_ok(s: &Server) -> String {
    let metrics = s.http_get("/metrics");
    metrics
        .lines()
        .find(|l| l.starts_with("lks_enrollments_total{result=\"ok\"}"))
        .unwrap_or("none")
        .to_string()
}

#[test]
fn loadgen_spreads_agents_over_the_replicas() {
    let etcd = Etcd::start();
    let r1 = replica(&etcd);
    let r2 = replica(&etcd);
    let mut cmd = Command::new(bin("lks-loadgen"));
    cmd.arg("--config")
        .arg(r1.admin_conf_path())
        .args(["--cluster", "lg", "--agents", "6", "--rollout", "-o", "json"])
        .arg("--servers")
        .arg(format!("{},{}", r1.url(), r2.url()));
    let out = ok_stdout(&run(cmd), "lks-loadgen --servers");
    let report: serde_json::Value = serde_json::from_str(&out).expect("loadgen JSON");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["first_message"]["count"], 6, "{report}");
    assert_eq!(
        report["fanout"]["count"], 6,
        "every agent got the rollout: {report}"
    );
    assert!(report["rollout_seconds"].is_number(), "{report}");
    for s in [&r1, &r2] {
        assert_eq!(
            enrolled_ok(s),
            "lks_enrollments_total{result=\"ok\"} 3",
            "each replica enrolled half the agents"
        );
    }
}

/// Agents held, per /metrics (`lks_connected_agents`).
fn connected(s: &Server) -> u64 {
    s.http_get("/metrics")
        .lines()
        .find_map(|l| l.strip_prefix("lks_connected_agents "))
        .map_or(0, |v| v.trim().parse().expect("a number"))
}

/// The failover part of a load generator's report, checked: `n` agents,
/// every one back on a survivor (`dead` is the killed replica's index),
/// no auth errors, none sent the version twice.
fn check_failover(report: &serde_json::Value, n: i64, dead: usize) {
    let f = &report["failover"];
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["auth_errors"], 0, "{report}");
    assert_eq!(report["assigned_twice"], 0, "{report}");
    let before: Vec<i64> = serde_json::from_value(f["held_before"].clone()).unwrap();
    let after: Vec<i64> = serde_json::from_value(f["held_after"].clone()).unwrap();
    // At the kill every agent was up somewhere, or between two replicas
    // because one asked it to move (the rebalance).
    let moving = f["moving_at_kill"].as_i64().expect("moving_at_kill");
    assert_eq!(before.iter().sum::<i64>() + moving, n, "{report}");
    assert!(before[dead] > 0, "the killed replica held agents: {report}");
    assert_eq!(after[dead], 0, "nobody is on the dead replica: {report}");
    assert_eq!(after.iter().sum::<i64>(), n, "every agent is back: {report}");
    assert!(
        f["reconnected"].as_i64() >= Some(before[dead]),
        "the dead replica's agents reconnected: {report}"
    );
    assert!(f["all_back_seconds"].is_number(), "{report}");
    assert_eq!(f["auth_errors"], 0, "{report}");
}

/// [scale-out] item 6, in two load generator processes as the benchmark
/// runs a fleet larger than one process may hold: 2 × 150 simulated agents
/// in three clusters over three replicas on a three-member etcd; a rollout
/// of a 20-file bundle in each cluster, in batches of 50; once 30 % of its agents have it, the
/// first process SIGKILLs the leading replica and one etcd member and tells
/// the second. The rollout completes on the survivors, every agent of the
/// dead replica is back on a survivor, none was refused for its
/// credentials and none was sent the version twice.
#[test]
fn three_hundred_agents_ride_out_the_leader_and_an_etcd_member_dying_mid_rollout() {
    let etcd = EtcdCluster::start(3);
    let prefix = "/lks-test-region-lg/";
    let r1 = etcd.replica(prefix, &[]);
    wait_until(Duration::from_secs(15), "r1 elected", || {
        r1.log().contains("elected: this replica drives rollouts")
    });
    let r2 = etcd.replica(prefix, &[]);
    let r3 = etcd.replica(prefix, &[]);
    let servers = format!("{},{},{}", r1.url(), r2.url(), r3.url());
    // The second process: holds its agents until told to stop.
    let mut other = loadgen(&r2, &servers, "150");
    let mut other = KillOnDrop(Some(
        other
            .args(["--hold", "600"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start the second lks-loadgen"),
    ));
    let other_pid = other.0.as_ref().unwrap().id();
    let victims = format!("{},{}", r1.pid(), etcd.pid(0));
    the_run_that_kills_the_leader_and_an_etcd_member_completes_the_rollout(
        &r2, &servers, &victims, other_pid,
    );
    the_held_agents_move_to_the_survivors_and_end_cleanly(&r2, &r3, &mut other, other_pid);
    every_node_has_the_version_applied_and_nothing_else(&r3);
}

/// An lks-loadgen of `agents` agents of clusters region-0..2 on `servers`,
/// configured through `r2`.
fn loadgen(r2: &Server, servers: &str, agents: &str) -> Command {
    let mut cmd = Command::new(bin("lks-loadgen"));
    cmd.arg("--config")
        .arg(r2.admin_conf_path())
        .args([
            "--cluster",
            "region",
            "--clusters",
            "3",
            "--agents",
            agents,
            "-o",
            "json",
        ])
        .args(["--keep-nodes", "--servers", servers]);
    cmd
}

/// The first lks-loadgen rolls out to all 300 nodes and kills the leader
/// and an etcd member 30 % of the way in: every agent of its own gets
/// the version, and the rollout completes after the kill.
fn the_run_that_kills_the_leader_and_an_etcd_member_completes_the_rollout(
    r2: &Server,
    servers: &str,
    victims: &str,
    other_pid: u32,
) {
    let mut first = loadgen(r2, servers, "150");
    first
        .args([
            "--rollout",
            "--files",
            "20",
            "--batch-size",
            "50",
            "--rollout-after-nodes",
            "300",
        ])
        .args(["--kill-mid-rollout", victims, "--kill-at", "0.3"])
        .args([
            "--notify-at-kill",
            &other_pid.to_string(),
            "--rollout-timeout",
            "180",
        ]);
    let out = ok_stdout(&run(first), "lks-loadgen --kill-mid-rollout");
    let report: serde_json::Value = serde_json::from_str(&out).expect("loadgen JSON");
    eprintln!("{}", report["failover"]);
    assert_eq!(
        report["fanout"]["count"], 150,
        "every agent got the version: {report}"
    );
    assert!(
        report["failover"]["rollout_done_after_kill_seconds"].is_number(),
        "{report}"
    );
    check_failover(&report, 150, 0);
}

/// The first has ended its agents' streams; the second's are all on the
/// survivors, and it ends cleanly when told to, with no failover missed.
fn the_held_agents_move_to_the_survivors_and_end_cleanly(
    r2: &Server,
    r3: &Server,
    other: &mut KillOnDrop,
    other_pid: u32,
) {
    let mut held = (0, 0);
    let t = std::time::Instant::now();
    while held.0 + held.1 != 150 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "150 agents on the survivors: {held:?}\n{}",
            r2.http_get("/metrics")
        );
        std::thread::sleep(Duration::from_millis(200));
        held = (connected(r2), connected(r3));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(other_pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM the second lks-loadgen");
    let out = other
        .0
        .take()
        .unwrap()
        .wait_with_output()
        .expect("the second lks-loadgen");
    assert!(out.status.success(), "second lks-loadgen: {:?}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("loadgen JSON");
    eprintln!("{}", report["failover"]);
    assert_eq!(
        report["failover"]["killed_pids"],
        serde_json::json!([]),
        "{report}"
    );
    check_failover(&report, 150, 0);
}

/// A survivor says so too (the load generators have ended the streams):
/// every node has the version applied and nothing else.
fn every_node_has_the_version_applied_and_nothing_else(r3: &Server) {
    let nodes = r3.lksctl_json(&["node", "list"]);
    let nodes = nodes.as_array().expect("a JSON array");
    assert_eq!(nodes.len(), 300);
    for k in 0..3 {
        let cluster = format!("region-{k}");
        let in_it = nodes.iter().filter(|n| n["cluster"] == cluster.as_str()).count();
        assert_eq!(in_it, 100, "agents spread over the clusters");
    }
    for node in nodes {
        let b = node["bundles"].as_array().expect("bundles");
        assert_eq!(b.len(), 1, "{node}");
        assert_eq!(
            (&b[0]["version"], &b[0]["state"]),
            (&"1".into(), &"applied".into()),
            "{node}"
        );
    }
}
