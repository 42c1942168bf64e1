//! A release plan at fleet scale (issue [fleet-plans] item 4): a real
//! server, `lksctl`, and one `lks-loadgen` holding 1,000 simulated agents
//! (each its own key, certificate and mTLS `Connect` stream) in 40
//! clusters of 25; the 25 agents of one cluster report every bundle failed
//! (`--fail-in`). One plan in three groups — two clusters by name, eight
//! by the label `tier=early` (`cluster set --labels`), the other thirty by
//! `*` — with a soak of 3 s and at most 4 clusters in flight.
//!
//! Sampled all along (`plan status -o json`): never more than 4 clusters
//! running or rolling back; going forward, no cluster of a group starts
//! while an earlier group has one unsettled; rolling back, no cluster goes
//! back while a newer one has not. Checked exactly afterwards, on the
//! server's clocks: each group's first rollout was stored no earlier than
//! the previous group's `plan_group_done` event plus the soak, and the
//! rollbacks began newest first (their `rollout_rolling_back` events, in
//! order, against the rollouts' `created_at`). The failing cluster halts
//! the plan at its budget of 1: the plan is `halted`, its running rollouts
//! are paused and no waiting cluster starts; `plan resume` counts the
//! budget afresh and carries the plan to the end (the failed cluster stays
//! `failed`, as the design has it); `plan rollback` rolls back every one of
//! the 40 rollouts.
//!
//! A second test pauses a plan of 120 clusters, all allowed in flight, in
//! the middle of the driver's pass that starts them: the starts left are
//! not made.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::server::Server;
use lks_e2e::{Proc, bin, wait_until};
use serde_json::Value;

const CLUSTERS: usize = 40;
const PER_CLUSTER: usize = 25;
const IN_FLIGHT: usize = 4;
const SOAK_MS: i64 = 3000;
/// The cluster whose agents fail the version: in the last group, which is
/// running when it fails.
const BAD: &str = "sc-25";
/// The cluster started just before it, whose agents take 10 s to apply:
/// still running at the halt, so the halt pauses its rollout.
const SLOW: &str = "sc-24";
const PLAN: &str = "scale";

fn cluster(k: usize) -> String {
    format!("sc-{k}")
}

/// Milliseconds since the epoch of an RFC 3339 time `lksctl` printed.
fn ms(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("a time: {v}"));
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap()
}

/// The load generator: 1,000 agents in clusters sc-0 … sc-39 (created by
/// it), held until the test ends; BAD's report every bundle failed, SLOW's
/// apply slowly.
fn loadgen(s: &Server) -> Proc {
    loadgen_of(
        s,
        "sc",
        CLUSTERS,
        CLUSTERS * PER_CLUSTER,
        &["--fail-in", BAD, "--slow-in", SLOW, "--slow-ms", "10000"],
    )
}

/// An lks-loadgen of `agents` agents spread over clusters PREFIX-0 …
/// PREFIX-(clusters-1), held until the test ends; `extra` is appended.
fn loadgen_of(s: &Server, prefix: &str, clusters: usize, agents: usize, extra: &[&str]) -> Proc {
    let mut cmd = Command::new(bin("lks-loadgen"));
    cmd.arg("--config")
        .arg(s.admin_conf_path())
        .args(["--cluster", prefix, "--clusters", &clusters.to_string()])
        .args(["--agents", &agents.to_string()])
        .args(extra)
        .args(["--hold", "900", "--keep-nodes", "-o", "json"]);
    Proc::spawn("lks-loadgen", cmd, s.work_dir())
}

/// Waits for `n` agents on `s` while `lg` runs.
fn connected(s: &Server, lg: &mut Proc, n: u64) {
    wait_until(Duration::from_secs(300), "the simulated agents connected", || {
        s.connected_agents() == n || !lg.running()
    });
    assert!(lg.running(), "lks-loadgen ended: {}", lg.log_text());
}

/// Every cluster of a plan's JSON: (group index, name, state, rollout state).
fn clusters(p: &Value) -> Vec<(usize, String, String, String)> {
    lks_e2e::plan::clusters(p)
        .into_iter()
        .map(|c| (c.group, c.name, c.state, c.rollout_state))
        .collect()
}

fn state_of<'a>(p: &'a Value, name: &str) -> &'a str {
    lks_e2e::plan::cluster(p, name)["state"]
        .as_str()
        .unwrap_or_default()
}

/// What every sample must hold, and what the samples saw.
#[derive(Default)]
struct Sampler {
    /// Most clusters in flight in one sample.
    max_in_flight: usize,
    samples: usize,
    /// Each cluster's rollout `created_at` (ms), once known: the rollback's
    /// order is checked against it.
    created: HashMap<String, i64>,
}

impl Sampler {
    fn sample(&mut self, s: &Server) -> Value {
        let p = s.lksctl_json(&["plan", "status", PLAN]);
        self.check(&p);
        p
    }

    fn check(&mut self, p: &Value) {
        self.samples += 1;
        let cs = clusters(p);
        let in_flight = cs
            .iter()
            .filter(|(_, _, st, _)| st == "running" || st == "rolling_back")
            .count();
        assert!(in_flight <= IN_FLIGHT, "{in_flight} clusters in flight: {p:#}");
        self.max_in_flight = self.max_in_flight.max(in_flight);
        if p["state"] == "rolling_back" || p["state"] == "rolled_back" {
            // Newest first: none went back while a newer one has not.
            let back = |st: &str| st == "rolling_back" || st == "rolled_back";
            for (_, name, st, _) in cs.iter().filter(|c| back(&c.2)) {
                for (_, other, ost, _) in cs.iter().filter(|c| c.2 == "completed" || c.2 == "failed") {
                    assert!(
                        self.created[name] >= self.created[other],
                        "{name} is {st} while {other}, started later, is {ost}: {p:#}"
                    );
                }
            }
            return;
        }
        let settled = |st: &str| matches!(st, "completed" | "soaking" | "failed" | "skipped");
        for (gi, name, st, _) in &cs {
            if st == "waiting" {
                continue;
            }
            for (gj, other, ost, _) in &cs {
                assert!(
                    gj >= gi || settled(ost),
                    "{name} (group {gi}) is {st} while {other} (group {gj}) is {ost}: {p:#}"
                );
            }
        }
    }

    /// Samples until `done` holds (within `limit`); the last sample.
    fn until(&mut self, s: &Server, what: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let p = self.sample(s);
            if done(&p) {
                return p;
            }
            assert!(start.elapsed() < limit, "timed out waiting for {what}: {p:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The plan's rollouts (`rollout list`), by cluster: (ID, created_at ms, state).
fn rollouts(s: &Server) -> HashMap<String, (String, i64, String)> {
    rollouts_of(s, PLAN)
}

/// Plan `plan`'s rollouts (their request IDs are `plan:PLAN:CLUSTER`).
fn rollouts_of(s: &Server, plan: &str) -> HashMap<String, (String, i64, String)> {
    let list = s.lksctl_json(&["rollout", "list"]);
    let prefix = format!("plan:{plan}:");
    list.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["request_id"].as_str().is_some_and(|id| id.starts_with(&prefix)))
        .map(|r| {
            (
                r["cluster"].as_str().unwrap().to_string(),
                (
                    r["id"].as_str().unwrap().to_string(),
                    ms(&r["created_at"]),
                    r["state"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// Exactly, on the server's clocks: no rollout of a group was stored before
/// the previous group's `plan_group_done` event plus the soak.
fn groups_kept_their_order_and_soak(s: &Server, p: &Value, rs: &HashMap<String, (String, i64, String)>) {
    let events = s.lksctl_json(&["event", "list", "--limit", "10000"]);
    let groups = p["groups"].as_array().unwrap();
    for k in 1..groups.len() {
        let prev = groups[k - 1]["name"].as_str().unwrap();
        let done = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| {
                e["kind"] == "plan_group_done"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(&format!("plan {PLAN}: group {prev} done")))
            })
            .unwrap_or_else(|| panic!("no plan_group_done for {prev}"));
        let first = groups[k]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| rs[c["name"].as_str().unwrap()].1)
            .min()
            .unwrap();
        let done_ms = ms(&done["at"]);
        assert!(
            first >= done_ms + SOAK_MS,
            "group {} started {} ms after {prev} was done, within the soak of {SOAK_MS} ms",
            groups[k]["name"],
            first - done_ms
        );
    }
}

/// Exactly: the plan began the rollbacks (`rollout_rolling_back`, by event
/// ID) in the reverse order of the rollouts' starts.
fn rolled_back_newest_first(s: &Server, rs: &HashMap<String, (String, i64, String)>) {
    let mut began: Vec<(i64, i64, &str)> = Vec::new();
    for (name, (id, created, _)) in rs {
        let events = s.lksctl_json(&["event", "list", "--rollout", id, "--limit", "1000"]);
        let e = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "rollout_rolling_back")
            .unwrap_or_else(|| panic!("{name}: no rollout_rolling_back event: {events:#}"));
        began.push((e["id"].as_i64().unwrap(), *created, name));
    }
    began.sort();
    for w in began.windows(2) {
        assert!(
            w[0].1 >= w[1].1,
            "{} (started at {}) went back before {} (started later, at {})",
            w[0].2,
            w[0].1,
            w[1].2,
            w[1].1
        );
    }
}

#[test]
fn a_plan_over_forty_clusters_of_simulated_agents_keeps_order_and_limit_halts_resumes_and_rolls_back() {
    let s = Server::start();
    let mut lg = loadgen(&s);
    connected(&s, &mut lg, (CLUSTERS * PER_CLUSTER) as u64);
    for k in 2..10 {
        s.lksctl_ok(&["cluster", "set", &cluster(k), "--labels", "tier=early"]);
    }
    let dir = s.write_bundle("app-1", "app", "1", &[("/etc/app.conf", b"v1\n", "0644")]);
    assert_eq!(s.publish(&dir), "app@1");
    let in_flight = IN_FLIGHT.to_string();
    let create = [
        "plan",
        "create",
        PLAN,
        "--bundle",
        "app@1",
        "--group",
        "canary=sc-0,sc-1",
        "--group",
        "early=tier=early",
        "--group",
        "rest=*",
        "--soak",
        "3s",
        "--max-clusters-in-flight",
        &in_flight,
        "--failure-budget",
        "1",
        "--batch-size",
        "25",
    ];
    let dry = s.lksctl_json(&[&create[..], &["--dry-run"]].concat());
    let sizes: Vec<usize> = dry["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["clusters"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [2, 8, 30], "{dry:#}");
    let started = Instant::now();
    assert_eq!(s.lksctl_ok(&create).trim(), PLAN);

    // The failing cluster halts the plan at its budget.
    let mut smp = Sampler::default();
    let limit = Duration::from_secs(120);
    let p = smp.until(&s, "the halt", limit, |p| p["state"] == "halted");
    eprintln!("halted after {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(state_of(&p, BAD), "failed", "{p:#}");
    assert_eq!(state_of(&p, SLOW), "running", "{p:#}");
    assert_eq!(p["budget_used"], 1, "{p:#}");
    assert!(p["message"].as_str().unwrap().contains("failure budget"), "{p:#}");
    let waiting: BTreeSet<String> = clusters(&p)
        .into_iter()
        .filter(|c| c.2 == "waiting")
        .map(|c| c.1)
        .collect();
    assert!(
        !waiting.is_empty(),
        "the halt came before the last clusters: {p:#}"
    );
    // For three driver passes: nothing new starts, and what still runs is
    // paused by the plan.
    let halted_at = Instant::now();
    let mut p = p;
    while halted_at.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        p = smp.sample(&s);
        assert_eq!(p["state"], "halted", "{p:#}");
        for (_, name, st, _) in clusters(&p) {
            if waiting.contains(&name) {
                assert_eq!(st, "waiting", "{name} started after the halt: {p:#}");
            }
        }
    }
    for (_, name, st, rst) in clusters(&p) {
        if st == "running" {
            assert_eq!(rst, "paused", "{name} runs on after the halt: {p:#}");
        }
    }
    assert_eq!(state_of(&p, SLOW), "running", "its rollout paused: {p:#}");

    // Resume: the budget counts afresh, the rest runs, the failed cluster
    // stays failed.
    let line = s.lksctl_ok(&["plan", "resume", PLAN]);
    assert!(line.starts_with("plan scale running"), "{line}");
    let p = smp.until(&s, "completion", limit, |p| p["state"] == "completed");
    eprintln!(
        "completed after {:.1} s, {} samples",
        started.elapsed().as_secs_f64(),
        smp.samples
    );
    for k in 0..CLUSTERS {
        let want = if cluster(k) == BAD { "failed" } else { "completed" };
        assert_eq!(state_of(&p, &cluster(k)), want, "{}: {p:#}", cluster(k));
    }
    let rs = rollouts(&s);
    assert_eq!(rs.len(), CLUSTERS, "one rollout per cluster: {rs:?}");
    groups_kept_their_order_and_soak(&s, &p, &rs);
    smp.created = rs.iter().map(|(c, r)| (c.clone(), r.1)).collect();

    // Rollback: every cluster the plan touched, newest first.
    let slow = s.lksctl_json(&["rollout", "status", &rs[SLOW].0]);
    assert!(
        slow["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["state"] == "updated"),
        "the paused rollout resumed and completed: {slow:#}"
    );
    s.lksctl_ok(&["plan", "rollback", PLAN]);
    let p = smp.until(&s, "the rollback", limit, |p| p["state"] == "rolled_back");
    for k in 0..CLUSTERS {
        assert_eq!(state_of(&p, &cluster(k)), "rolled_back", "{}: {p:#}", cluster(k));
    }
    let rs = rollouts(&s);
    for (c, (id, _, state)) in &rs {
        assert_eq!(state, "rolled_back", "{c}: rollout {id}");
    }
    rolled_back_newest_first(&s, &rs);
    assert!(
        (2..=IN_FLIGHT).contains(&smp.max_in_flight),
        "{} clusters in flight at most",
        smp.max_in_flight
    );
    eprintln!(
        "rolled back after {:.1} s, {} samples, at most {} in flight",
        started.elapsed().as_secs_f64(),
        smp.samples,
        smp.max_in_flight
    );
    assert!(lg.running(), "lks-loadgen ended: {}", lg.log_text());
    lg.terminate(Duration::from_secs(20));
}

/// A plan that may start 120 clusters at once starts them in one driver
/// pass, which takes seconds: `plan pause` in the middle of it stops the
/// starts not yet made within a fraction of a second (the driver reads the
/// plan again between starts), those clusters go back to `waiting`, the
/// rollouts already started are paused, and `plan resume` finishes all 120
/// with one rollout each.
#[test]
fn a_pause_in_the_middle_of_a_pass_of_many_starts_stops_the_starts_left() {
    const N: usize = 120;
    const NAME: &str = "wide";
    let s = Server::start();
    let mut lg = loadgen_of(&s, "wd", N, N, &[]);
    connected(&s, &mut lg, N as u64);
    let dir = s.write_bundle("app-1", "app", "1", &[("/etc/app.conf", b"v1\n", "0644")]);
    assert_eq!(s.publish(&dir), "app@1");
    let n = N.to_string();
    let create = ["plan", "create", NAME, "--bundle", "app@1", "--group", "all=*"];
    s.lksctl_ok(&[&create[..], &["--max-clusters-in-flight", &n]].concat());
    wait_until(Duration::from_secs(60), "the first starts", || {
        rollouts_of(&s, NAME).len() >= 5
    });
    let line = s.lksctl_ok(&["plan", "pause", NAME]);
    assert!(line.starts_with("plan wide paused"), "{line}");
    let at_pause = rollouts_of(&s, NAME).len();
    // Three driver passes: what was left of the pass never starts.
    std::thread::sleep(Duration::from_secs(3));
    let rs = rollouts_of(&s, NAME);
    let p = s.lksctl_json(&["plan", "status", NAME]);
    eprintln!(
        "{at_pause} rollouts at the pause, {} three seconds later",
        rs.len()
    );
    assert!(
        rs.len() <= at_pause + 20 && rs.len() < N / 2,
        "the pass went on after the pause: {at_pause} rollouts at the pause, {} after",
        rs.len()
    );
    assert_eq!(p["state"], "paused", "{p:#}");
    let cs = clusters(&p);
    let waiting = cs.iter().filter(|c| c.2 == "waiting").count();
    assert_eq!(
        waiting,
        N - rs.len(),
        "the clusters not started wait again: {p:#}"
    );
    for (_, name, st, rst) in &cs {
        if st == "running" {
            assert!(rs.contains_key(name), "{name} is running with no rollout: {p:#}");
            assert!(
                rst == "paused" || rst == "completed",
                "{name}'s rollout runs on in a paused plan ({rst}): {p:#}"
            );
        }
    }

    let line = s.lksctl_ok(&["plan", "resume", NAME]);
    assert!(line.starts_with("plan wide running"), "{line}");
    wait_until(Duration::from_secs(180), "the plan completed", || {
        s.lksctl_json(&["plan", "status", NAME])["state"] == "completed"
    });
    let p = s.lksctl_json(&["plan", "status", NAME]);
    assert!(clusters(&p).iter().all(|c| c.2 == "completed"), "{p:#}");
    let rs = rollouts_of(&s, NAME);
    assert_eq!(rs.len(), N, "one rollout per cluster: {rs:?}");
    assert!(rs.values().all(|r| r.2 == "completed"), "{rs:?}");
    lg.terminate(Duration::from_secs(20));
}
