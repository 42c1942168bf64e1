//! Coordinated reboots (issue [reboots]) with the real server, lksctl and
//! several sandboxed agents whose reboot command simulates a reboot: it
//! writes a new boot ID into the file `LKS_AGENT_BOOT_ID_FILE` names,
//! empties the sentinel and leaves a mark; the test then restarts the
//! agent, as the boot would. The cluster's reboot lock gives at most N
//! slots at once (sampled all along), nothing starts outside the
//! maintenance windows, a node that never comes back is `reboot-lost`
//! and its slot freed for the next, and on etcd replicas a leader killed
//! mid-reboot is replaced by one that reads who holds what from the store.
//! Why a node waits for a slot shows in `node get`, `node list` (table and
//! JSON) and the console's node table and page (headless Chromium).

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::agent::{CONVERGE, node_events};
use lks_e2e::reboot::{Sim, drive, node_state, status};
use lks_e2e::server::Server;
use lks_e2e::wait_until;

#[test]
fn auto_reboots_required_nodes_at_most_n_at_a_time_inside_windows() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut sims: Vec<Sim> = (0..4)
        .map(|i| Sim::new(&server, "c1", &format!("w{i}")))
        .collect();
    // w3's OS names the packages, in markup the console must show as text.
    std::fs::write(
        sims[3].agent.path("/var/run/reboot-required.pkgs"),
        format!("{MARKUP}\n"),
    )
    .unwrap();
    wait_until(CONVERGE, "every node says it needs a reboot", || {
        let list = server.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .all(|n| n["reboot"]["state"] == "required")
            && lks_e2e::server::node_json(&list, "w3")["reboot"]["reason"] == format!("packages: {MARKUP}")
    });
    // Off by default: nothing happens.
    let c = server.lksctl_json(&["cluster", "get", "c1"]);
    assert_eq!(c["reboots"]["mode"], "off", "{c}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(sims.iter().all(|s| s.reboots() == 0));
    // … and the lock is about no node.
    let list = server.lksctl_json(&["node", "list"]);
    for n in list.as_array().unwrap() {
        assert_eq!(n["reboot_lock"], serde_json::Value::Null, "{n}");
    }

    // A window closed now: the slots wait for it.
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        % 24;
    let from = (hour + 2) % 24;
    let window = format!("daily {from:02}:00-{:02}:00 UTC", (from + 1) % 24);
    server.lksctl_ok(&["cluster", "set", "c1", "--maintenance-window", &window]);
    let out = server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "auto",
        "--max-concurrent-reboots",
        "2",
    ]);
    assert!(
        out.contains("cluster c1: reboots auto, at most 2 at once, 30m to be back, then the slot is freed"),
        "{out}"
    );
    wait_until(CONVERGE, "the nodes wait for the window", || {
        node_state(&status(&server, "c1"), "w0")
            .1
            .starts_with("every maintenance window is closed")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        sims.iter().all(|s| s.reboots() == 0),
        "nothing outside the window"
    );
    // `node get` says why it waits.
    let got = server.lksctl_json(&["node", "get", "w1"]);
    assert_eq!(got["reboot_lock"]["state"], "waiting", "{got}");
    assert!(
        got["reboot_lock"]["message"]
            .as_str()
            .unwrap()
            .starts_with("every maintenance window is closed; the next opens at "),
        "{got}"
    );
    let text = server.lksctl_ok(&["node", "get", "w1"]);
    assert!(
        text.contains("Reboot lock:  waiting: every maintenance window"),
        "{text}"
    );
    the_reason_shows_in_node_list_and_the_console(&server, &got);
    let json = server.lksctl_json(&["cluster", "get", "c1"]);
    assert_eq!(
        json["reboots"],
        serde_json::json!({"mode": "auto", "max_concurrent": 2, "timeout": "30m", "timeout_ms": 1_800_000, "on_timeout": "free", "alert_gate": null, "blocking_pod_selector": null})
    );

    // The window opens (removed): every node once, two at most at a time.
    server.lksctl_ok(&["cluster", "set", "c1", "--no-maintenance-window"]);
    drive(&server, "c1", &mut sims, 2, |st| {
        ["w0", "w1", "w2", "w3"]
            .iter()
            .all(|n| node_state(st, n).0 == "done")
    });
    std::thread::sleep(Duration::from_secs(2));
    for s in &sims {
        assert_eq!(s.reboots(), 1, "{} rebooted once", s.agent.name);
    }
    let events = node_events(&server, "w0");
    for kind in ["reboot_slot_taken", "reboot_requested", "rebooted", "reboot_done"] {
        assert!(events.iter().any(|(k, _)| k == kind), "{kind}: {events:?}");
    }
    let list = server.lksctl_json(&["node", "list"]);
    for n in list.as_array().unwrap() {
        assert_eq!(n["reboot"]["state"], "none", "{n}");
        assert!(n["boot_id"].as_str().unwrap().ends_with("-boot-1"), "{n}");
    }
    for s in &mut sims {
        assert_eq!(s.agent.stop(), Some(0));
    }
}

/// A package list in markup (the console must show it as text).
const MARKUP: &str = "<img src=x onerror=alert(1)>";

/// Why the nodes wait for a slot (`got`: `node get w1 -o json`) shows in
/// `node list` — the REBOOT column, and in the JSON the same `reboot_lock`
/// as `node get`, beside the `reboot` object it always had — and in the
/// console's node table and node page.
fn the_reason_shows_in_node_list_and_the_console(server: &Server, got: &serde_json::Value) {
    let list = server.lksctl_json(&["node", "list"]);
    for n in list.as_array().unwrap() {
        assert_eq!(n["reboot"]["state"], "required", "{n}");
        assert_eq!(n["reboot_lock"]["state"], "waiting", "{n}");
        assert!(
            n["reboot_lock"]["message"]
                .as_str()
                .unwrap()
                .starts_with("every maintenance window is closed; the next opens at "),
            "{n}"
        );
        if n["name"] == "w1" {
            assert_eq!(n["reboot_lock"], got["reboot_lock"], "as node get says it");
        }
    }
    let waiting = "(waiting: every maintenance window is closed)";
    let want = format!("required: /var/run/reboot-required {waiting}");
    let markup = format!("required: packages: {MARKUP} {waiting}");
    let table = server.lksctl_ok(&["node", "list", "--cluster", "c1"]);
    assert!(table.lines().next().unwrap().ends_with("REBOOT"), "{table}");
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{table}");
    for r in rows {
        let end = if r.starts_with("w3 ") { &markup } else { &want };
        assert!(r.ends_with(end.as_str()), "{r:?} should end with {end:?}");
    }

    use lks_e2e::console::{Browser, Console, screenshot_dir};
    let console = Console::start(server, None);
    let br = Browser::start();
    let shots = screenshot_dir();
    let url = console.url();
    let reboot_cell = |b: &Browser, node: &str| {
        b.js(
            "const t = document.getElementById('nodes-table'); if (!t) return '';
             const i = Array.from(t.tHead.rows[0].cells).findIndex((c) => c.textContent === 'Reboot');
             const row = Array.from(t.tBodies[0].rows).find((r) => r.cells[0].textContent === arguments[0]);
             return i < 0 || !row ? '' : row.cells[i].textContent;",
            serde_json::json!([node]),
        )
    };
    br.goto(&format!("{url}#/nodes"));
    br.wait("w1's reboot reason", |b| reboot_cell(b, "w1") == want);
    // The node's words are text, never markup.
    assert_eq!(reboot_cell(&br, "w3"), markup);
    assert_eq!(
        br.js(
            "return document.querySelectorAll('#nodes-table img').length;",
            serde_json::json!([])
        ),
        0
    );
    br.screenshot(&shots, "nodes-reboot");
    br.goto(&format!("{url}#/nodes/w1"));
    br.wait_text(
        "#node-reboot-lock",
        "waiting: every maintenance window is closed; the next opens at ",
    );
    br.wait_text("#node-reboot", "required: /var/run/reboot-required");
    br.screenshot(&shots, "node-reboot");
}

#[test]
fn a_node_that_never_comes_back_is_reboot_lost_and_its_slot_freed() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut sims: Vec<Sim> = ["a", "b"].iter().map(|n| Sim::new(&server, "c1", n)).collect();
    sims[0].comes_back = false;
    // Manual: only a run reboots, every node it picks, in name order.
    server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "manual",
        "--reboot-timeout",
        "5s",
        "--on-reboot-timeout",
        "free",
    ]);
    let refused = server.lksctl(&["reboot", "pause", "--cluster", "c1"]);
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "error: pause the rolling reboot of c1: cluster c1 has no rolling reboot to pause"
    );
    let out = server.lksctl_ok(&["reboot", "start", "--cluster", "c1"]);
    assert!(
        out.starts_with("cluster c1: rolling reboot started (2 node(s) waiting)"),
        "{out}"
    );
    drive(&server, "c1", &mut sims, 1, |st| node_state(st, "b").0 == "done");
    let st = status(&server, "c1");
    assert_eq!(node_state(&st, "a").0, "lost", "{st}");
    assert_eq!(st["run"]["state"], "completed", "{st}");
    let events = node_events(&server, "a");
    let lost = events
        .iter()
        .find(|(k, _)| k == "reboot_lost")
        .expect("reboot_lost event");
    assert!(
        lost.1
            .starts_with("reboot-lost: not back Ready within 5s of taking its slot (")
            && lost.1.ends_with("; its slot is freed"),
        "{}",
        lost.1
    );
    assert!(server.metric("lks_reboot_lost_total{cluster=\"c1\"}") >= 1);
    assert_eq!(sims[1].reboots(), 1);
    for s in &mut sims {
        s.agent.stop();
    }
}

fn is_leader(s: &Server) -> bool {
    s.log().contains("elected: this replica drives rollouts")
}

#[test]
fn a_leader_killed_mid_reboot_is_replaced_by_one_that_knows_who_holds_what() {
    let etcd = lks_e2e::etcd::Etcd::start();
    let prefix = "/lks-reboot-ha/";
    let mut r1 = etcd.replica(prefix, &[]);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let r2 = etcd.replica(prefix, &[]);
    r2.lksctl_ok(&["cluster", "create", "c1"]);
    let mut sims: Vec<Sim> = ["a", "b"].iter().map(|n| Sim::new(&r2, "c1", n)).collect();
    // a stays down until the leader is gone.
    sims[0].comes_back = false;
    r2.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "manual",
        "--reboot-timeout",
        "2m",
    ]);
    r2.lksctl_ok(&["reboot", "start", "--cluster", "c1"]);
    wait_until(CONVERGE, "a's reboot command ran", || sims[0].reboots() == 1);
    wait_until(CONVERGE, "the lock records a's request", || {
        let st = status(&r2, "c1");
        node_state(&st, "a").0 == "rebooting" && st["slots_taken"] == 1
    });

    // The leader dies mid-reboot; r2 takes over from the stored lock.
    r1.kill9();
    wait_until(Duration::from_secs(30), "r2 elected", || is_leader(&r2));
    let st = status(&r2, "c1");
    assert_eq!(node_state(&st, "a").0, "rebooting", "{st}");
    assert_eq!(node_state(&st, "b").0, "waiting", "b waits for a's slot: {st}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sims[1].reboots(), 0, "no second slot under the new leader");

    // a boots; the new leader releases its slot and reboots b.
    sims[0].comes_back = true;
    drive(&r2, "c1", &mut sims, 1, |st| {
        node_state(st, "a").0 == "done" && node_state(st, "b").0 == "done"
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        (sims[0].reboots(), sims[1].reboots()),
        (1, 1),
        "each node rebooted once: the new leader sent no second request"
    );
    assert_eq!(status(&r2, "c1")["run"]["state"], "completed");
    for s in &mut sims {
        s.agent.stop();
    }
}
