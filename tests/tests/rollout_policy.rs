//! Rollout policies with real agents (DESIGN §7): offline nodes are deferred
//! and catch up within the batch limit, held nodes are skipped until
//! released, closed maintenance windows start nothing (across a server
//! restart) unless `--ignore-windows`, and a failing canary stops a rollout
//! with every other node untouched. Bad input is one error line and stores
//! nothing.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lks_e2e::agent::{BundleFile, CONVERGE, node_connected};
use lks_e2e::rollout::{Fleet, first_line, max_concurrency, rollout_events, starts_per_node};
use lks_e2e::{one_line_error, wait_until};

const CONF: &str = "/etc/app/app.conf";

fn files(content: &'static [u8]) -> [BundleFile<'static>; 1] {
    [BundleFile {
        path: CONF,
        content,
        mode: "0644",
    }]
}

fn node<'a>(st: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    st["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name))
        .unwrap_or_else(|| panic!("no node {name} in {st:#}"))
}

fn count(events: &[(String, String)], kind: &str) -> usize {
    events.iter().filter(|(k, _)| k == kind).count()
}

fn stop(f: &mut Fleet, name: &str) {
    assert_eq!(f.agent_mut(name).stop(), Some(0));
    wait_until(CONVERGE, "server sees the node offline", || {
        !node_connected(&f.server, name)
    });
}

/// The three-letter name of the UTC weekday `days` days from now.
fn utc_weekday_in(days: u64) -> &'static str {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // 1970-01-01 was a Thursday.
    ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][((now / 86_400 + days) % 7) as usize]
}

#[test]
fn offline_nodes_are_deferred_and_catch_up_within_the_batch_size() {
    let mut f = Fleet::start("c1", 8);
    stop(&mut f, "node-3");
    stop(&mut f, "node-6");
    let b = f.publish("app", "1", &files(b"app v1\n"), "0.3", "");
    let started = Instant::now();
    let out = f.start_rollout(&b, &["--batch-size", "2", "--wait"]);
    let stdout = lks_e2e::ok_stdout(&out, "rollout start --wait with 2 nodes offline");
    let id = first_line(&stdout);
    // Two offline nodes neither blocked nor failed the rollout.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let st = f.status(&id);
    assert_eq!(st["state"], "completed", "{st:#}");
    assert_eq!(
        (&st["updated"], &st["failed"], &st["deferred"], &st["pending"]),
        (&6.into(), &0.into(), &2.into(), &0.into()),
        "{st:#}"
    );
    assert_eq!(st["offline"], "defer");
    assert_eq!(st["message"], "6 of 8 node(s) updated, 2 deferred");
    for n in ["node-3", "node-6"] {
        assert_eq!(node(&st, n)["state"], "deferred", "{st:#}");
        assert_eq!(f.agent(n).read(CONF), None, "{n} was offline");
    }
    let list = f.server.lksctl_ok(&["rollout", "list"]);
    assert!(list.contains("DEFERRED"), "{list}");

    // They come back: each applies the version, never more than 2 at once.
    for n in ["node-3", "node-6"] {
        f.agent_mut(n).start();
    }
    for n in ["node-3", "node-6"] {
        f.agent(n).wait_bundle("app", "1", "applied");
    }
    let st = f.wait_state(&id, "completed");
    wait_until(CONVERGE, "the rollout records the catch-ups", || {
        let st = f.status(&id);
        st["updated"] == 8 && st["deferred"] == 0
    });
    assert_eq!(f.status(&id)["message"], "8 of 8 node(s) updated", "{st:#}");
    let runs = f.runs();
    let per_node = starts_per_node(&runs, "1");
    assert_eq!(per_node.len(), 8, "{runs:?}");
    assert!(per_node.values().all(|n| *n == 1), "{per_node:?}");
    let c = max_concurrency(&runs);
    assert!(c <= 2, "at most 2 nodes applied at once, saw {c}: {runs:?}");

    let ev = rollout_events(&f.server, &id);
    assert_eq!(count(&ev, "deferred"), 2, "{ev:?}");
    assert_eq!(count(&ev, "node_started"), 8, "{ev:?}");
    assert_eq!(count(&ev, "rollout_completed"), 1, "{ev:?}");

    // A rollback includes the nodes that caught up.
    let out = f.server.lksctl(&["rollout", "rollback", &id]);
    lks_e2e::ok_stdout(&out, "rollback");
    let st = f.wait_state(&id, "rolled_back");
    assert_eq!(st["rolled_back"], 8, "{st:#}");
    for a in &f.agents {
        assert_eq!(a.read(CONF), None, "{} rolled back to nothing", a.name);
    }
}

/// The case that was reported: four nodes, one powered off, batch size 1.
#[test]
fn one_node_of_four_offline_does_not_stall_a_batch_of_one() {
    let mut f = Fleet::start("c1", 4);
    stop(&mut f, "node-1");
    let b = f.publish("app", "1", &files(b"app v1\n"), "0.1", "");
    let started = Instant::now();
    let out = f.start_rollout(&b, &["--batch-size", "1", "--wait", "-o", "json"]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{st:#}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (&st["state"], &st["updated"], &st["deferred"], &st["failed"]),
        (&"completed".into(), &3.into(), &1.into(), &0.into()),
        "{st:#}"
    );
    f.agent_mut("node-1").start();
    f.agent("node-1").wait_bundle("app", "1", "applied");
    let id = st["id"].as_str().unwrap();
    wait_until(CONVERGE, "the catch-up is recorded", || {
        f.status(id)["updated"] == 4
    });
}

#[test]
fn a_held_node_is_skipped_and_catches_up_after_unhold() {
    let f = Fleet::start("c1", 3);
    let out = f
        .server
        .lksctl(&["node", "hold", "node-2", "--reason", "tenant is migrating data"]);
    lks_e2e::ok_stdout(&out, "node hold");
    let n = f.server.lksctl_json(&["node", "get", "node-2"]);
    assert_eq!(
        (&n["held"], &n["hold_reason"]),
        (&true.into(), &"tenant is migrating data".into())
    );
    let text = f.server.lksctl_ok(&["node", "get", "node-2"]);
    assert!(
        text.contains("Held:") && text.contains("tenant is migrating data"),
        "{text}"
    );

    let b = f.publish("app", "1", &files(b"app v1\n"), "0.1", "");
    let out = f.start_rollout(&b, &["--batch-size", "3", "--wait", "-o", "json"]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{st:#}");
    assert_eq!(
        (&st["state"], &st["updated"], &st["held"]),
        (&"completed".into(), &2.into(), &1.into())
    );
    assert_eq!(node(&st, "node-2")["state"], "held");
    assert_eq!(f.agent("node-2").read(CONF), None);
    // Still held: nothing reaches it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(f.agent("node-2").read(CONF), None);
    let id = st["id"].as_str().unwrap().to_string();

    lks_e2e::ok_stdout(&f.server.lksctl(&["node", "unhold", "node-2"]), "node unhold");
    f.agent("node-2").wait_bundle("app", "1", "applied");
    wait_until(CONVERGE, "the rollout records the catch-up", || {
        let st = f.status(&id);
        st["updated"] == 3 && st["held"] == 0
    });
    let n = f.server.lksctl_json(&["node", "get", "node-2"]);
    assert_eq!(n["held"], false);
    let ev = lks_e2e::agent::node_events(&f.server, "node-2");
    assert!(
        ev.iter()
            .any(|(k, m)| k == "held" && m.ends_with(": tenant is migrating data")),
        "{ev:?}"
    );
    assert!(ev.iter().any(|(k, _)| k == "unheld"), "{ev:?}");

    // Bad input: one line, nothing stored.
    let before = lks_e2e::agent::node_events(&f.server, "node-9").len();
    let e = one_line_error(
        &f.server.lksctl(&["node", "hold", "node-9"]),
        "hold of an unknown node",
    );
    assert!(e.contains("node node-9 does not exist"), "{e}");
    assert_eq!(lks_e2e::agent::node_events(&f.server, "node-9").len(), before);
}

#[test]
fn closed_windows_start_nothing_until_one_opens_even_across_a_restart() {
    let mut f = Fleet::start("c1", 2);
    let day = utc_weekday_in(3);
    let closed = format!("{day} 00:00-00:01 UTC");

    bad_windows_are_one_error_line_each_and_store_nothing(&f);
    let id = a_rollout_waits_for_its_closed_window(&f, &closed);
    ignore_windows_starts_anyway_and_says_who_did(&f);
    a_server_restart_keeps_it_waiting(&mut f, &id);
    the_window_opening_resumes_it_by_itself(&f, &closed, &id);
}

/// Bad windows: one error line each, nothing stored.
fn bad_windows_are_one_error_line_each_and_store_nothing(f: &Fleet) {
    for bad in [
        "Sat 25:00-06:00 UTC",
        "Sax 02:00-06:00 UTC",
        "Sat 02:00-06:00 Europe/Berln",
        "Sat 02:00-02:00 UTC",
    ] {
        let e = one_line_error(
            &f.server
                .lksctl(&["cluster", "set", "c1", "--maintenance-window", bad]),
            bad,
        );
        assert!(e.contains(bad), "{e}");
    }
    let cl = f.server.lksctl_json(&["cluster", "list"]);
    assert_eq!(cl[0]["maintenance_windows"], serde_json::json!([]), "{cl:#}");
}

/// With only a closed window, a rollout starts nothing and says it waits
/// for its window (the next one named). Returns its ID.
fn a_rollout_waits_for_its_closed_window(f: &Fleet, closed: &str) -> String {
    let out = f
        .server
        .lksctl(&["cluster", "set", "c1", "--maintenance-window", closed]);
    let said = lks_e2e::ok_stdout(&out, "cluster set");
    assert!(said.contains("closed; next"), "{said}");
    let cl = f.server.lksctl_json(&["cluster", "list"]);
    assert_eq!(cl[0]["maintenance_windows"], serde_json::json!([closed]));
    assert_eq!(cl[0]["window_open"], false);

    let b = f.publish("app", "1", &files(b"app v1\n"), "0.1", "");
    let id = f.roll_out(&b, &["--batch-size", "2"]);
    wait_until(CONVERGE, "the rollout waits for its window", || {
        f.status(&id)["waiting_for_window"] == true
    });
    let st = f.status(&id);
    assert_eq!(
        (&st["state"], &st["updated"]),
        (&"running".into(), &0.into()),
        "{st:#}"
    );
    let next = st["next_window"].as_str().unwrap();
    assert!(next.ends_with("T00:00:00Z"), "{next}");
    let line = f.server.lksctl_ok(&["rollout", "status", &id]);
    assert!(line.contains("waiting for a maintenance window"), "{line}");

    id
}

/// --ignore-windows starts anyway and says who did.
fn ignore_windows_starts_anyway_and_says_who_did(f: &Fleet) {
    let b2 = f.publish(
        "urgent",
        "1",
        &[BundleFile {
            path: "/etc/app/urgent.conf",
            content: b"fix\n",
            mode: "0644",
        }],
        "0.1",
        "",
    );
    let out = f.start_rollout(&b2, &["--ignore-windows", "--wait"]);
    let id2 = first_line(&lks_e2e::ok_stdout(&out, "rollout --ignore-windows"));
    let ev = f
        .server
        .lksctl_json(&["event", "list", "--rollout", &id2, "--limit", "100"]);
    let started = ev
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "rollout_started")
        .unwrap();
    let m = started["message"].as_str().unwrap();
    assert!(
        m.contains("ignoring maintenance windows") && m.contains("started by "),
        "{m}"
    );
}

/// A server restart keeps it waiting: nothing installed, the wait
/// recorded once.
fn a_server_restart_keeps_it_waiting(f: &mut Fleet, id: &str) {
    f.server.kill9();
    f.server.start_again();
    for a in &f.agents {
        a.wait_connected();
    }
    std::thread::sleep(Duration::from_secs(2));
    let st = f.status(id);
    assert_eq!(
        (&st["state"], &st["updated"], &st["waiting_for_window"]),
        (&"running".into(), &0.into(), &true.into())
    );
    for a in &f.agents {
        assert_eq!(a.read(CONF), None, "{} started outside its window", a.name);
    }
    assert_eq!(count(&rollout_events(&f.server, id), "waiting_for_window"), 1);
}

/// The window opens (the operator widens it): the rollout resumes by
/// itself; the windows can be cleared.
fn the_window_opening_resumes_it_by_itself(f: &Fleet, closed: &str, id: &str) {
    let out = f.server.lksctl(&[
        "cluster",
        "set",
        "c1",
        "--maintenance-window",
        closed,
        "--maintenance-window",
        "daily 00:00-24:00 UTC",
    ]);
    let said = lks_e2e::ok_stdout(&out, "cluster set with an open window");
    assert!(said.contains("open now, until "), "{said}");
    let cl = f.server.lksctl_json(&["cluster", "list"]);
    assert_eq!(cl[0]["window_open"], true);
    assert!(
        cl[0]["window_closes"].as_str().unwrap().ends_with("T00:00:00Z"),
        "{cl:#}"
    );
    let st = f.wait_state(id, "completed");
    assert_eq!(st["updated"], 2, "{st:#}");
    assert_eq!(st["waiting_for_window"], false);
    let ev = rollout_events(&f.server, id);
    assert_eq!(count(&ev, "window_open"), 1, "{ev:?}");
    lks_e2e::ok_stdout(
        &f.server
            .lksctl(&["cluster", "set", "c1", "--no-maintenance-window"]),
        "clear windows",
    );
    assert_eq!(
        f.server.lksctl_json(&["cluster", "list"])[0]["maintenance_windows"],
        serde_json::json!([])
    );
}

#[test]
fn a_failing_canary_stops_the_rollout_with_every_other_node_untouched() {
    let f = Fleet::start("c1", 4);
    let e = one_line_error(
        &f.start_rollout("app@0", &["--canary", "1"]),
        "rollout of an unpublished bundle",
    );
    assert!(e.contains("not published"), "{e}");
    let good = f.publish("app", "1", &files(b"app v1\n"), "0.1", "");
    let e = one_line_error(&f.start_rollout(&good, &["--canary", "5"]), "--canary 5 of 4");
    assert!(e.contains("more than the 4 node(s)"), "{e}");
    assert_eq!(f.server.lksctl_json(&["rollout", "list"]), serde_json::json!([]));

    let bad = f.publish(
        "app",
        "2",
        &files(b"app v2\n"),
        "0.1",
        "[health]\nrun = [\"false\"]\ntimeout = \"5s\"\nretries = 1\ninterval = \"1s\"\n",
    );
    let out = f.start_rollout(
        &bad,
        &[
            "--canary",
            "1",
            "--canary-soak",
            "1s",
            "--failure-threshold",
            "3",
            "--batch-size",
            "4",
            "--wait",
            "-o",
            "json",
        ],
    );
    assert!(!out.status.success());
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["state"], "failed", "{st:#}");
    let canaries = st["canaries"].as_array().unwrap();
    assert_eq!(canaries.len(), 1);
    let canary = canaries[0].as_str().unwrap();
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("canary {canary} failed")),
        "{st:#}"
    );
    for a in &f.agents {
        if a.name == canary {
            continue;
        }
        assert_eq!(node(&st, &a.name)["state"], "skipped", "{st:#}");
        assert_eq!(a.read(CONF), None, "{} was touched", a.name);
        assert!(a.bundle("app").is_none(), "{}: {:?}", a.name, a.bundle("app"));
    }
    assert_eq!(starts_per_node(&f.runs(), "2").len(), 1, "only the canary ran v2");

    // A good version: the canary goes first and soaks, then the others.
    let out = f.start_rollout(
        &good,
        &[
            "--canary",
            "1",
            "--canary-soak",
            "3s",
            "--batch-size",
            "4",
            "--wait",
            "-o",
            "json",
        ],
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{st:#}");
    assert_eq!(
        (&st["updated"], &st["canary_phase"]),
        (&4.into(), &"passed".into()),
        "{st:#}"
    );
    let canary = st["canaries"][0].as_str().unwrap().to_string();
    let runs: Vec<_> = f.runs().into_iter().filter(|r| r.version == "1").collect();
    let canary_end = runs.iter().find(|r| r.node == canary).unwrap().end_ns;
    for r in runs.iter().filter(|r| r.node != canary) {
        assert!(
            r.start_ns >= canary_end + 3_000_000_000,
            "{} started before the canary's 3s soak ended: {runs:?}",
            r.node
        );
    }
    let ev = rollout_events(&f.server, st["id"].as_str().unwrap());
    for k in ["canaries_picked", "canaries_settled", "canaries_passed"] {
        assert_eq!(count(&ev, k), 1, "{k}: {ev:?}");
    }
}
