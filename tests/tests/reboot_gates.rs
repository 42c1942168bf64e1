//! The reboot lock's gates (issue [reboots] item 3) with the real server,
//! lksctl and sandboxed agents whose reboot command simulates a reboot
//! (tests/src/reboot.rs):
//! - a real Prometheus (tests/src/prometheus.rs) scraping a target the
//!   test sets, its rules evaluated every second: while an alert the
//!   filter matches fires no node gets a slot (sampled); once it resolves
//!   the reboots proceed while an alert the filter does not match keeps
//!   firing; FleetLock's `pre-reboot` (curl as Zincati) is refused while
//!   it fires and granted once it resolved; Prometheus killed closes the
//!   gate, and the reason says so (and `lks_reboot_waiting_nodes` counts
//!   the nodes waiting by why: `alert`, then `gate_unanswered`); a
//!   blocking-pod selector on a cluster without a kubeconfig keeps nodes
//!   waiting, with the reason;
//! - a real kube-apiserver (tests/src/kube.rs): a pod the
//!   blocking-pod selector matches, bound to node-a, keeps node-a waiting
//!   while node-b reboots (`lks_reboot_waiting_nodes{reason="blocking_pod"}`
//!   counts it); once the pod is deleted node-a reboots too.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lks_e2e::agent::CONVERGE;
use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet, pod_manifest};
use lks_e2e::prometheus::{Prometheus, Target};
use lks_e2e::reboot::{Sim, drive, node_state, status};
use lks_e2e::server::Server;
use lks_e2e::{free_addr, one_line_error, wait_for_port, wait_until};

/// One FleetLock call of client `id` to cluster c1, as Zincati makes it:
/// the HTTP status and the body.
fn fleetlock(addr: std::net::SocketAddr, op: &str, id: &str) -> (u16, String) {
    lks_e2e::reboot::fleetlock_curl(&format!("http://{addr}/c/c1/v1/{op}"), id, true, &[])
}

/// Two alerts: one the gate's filter matches, one it does not.
const RULES: &str = "    - alert: KubeNodeNotReady\n      expr: lks_e2e_hold > 0\n    - alert: DiskAlmostFull\n      expr: lks_e2e_other > 0\n";

fn metrics(hold: u8, other: u8) -> String {
    format!(
        "# TYPE lks_e2e_hold gauge\nlks_e2e_hold {hold}\n# TYPE lks_e2e_other gauge\nlks_e2e_other {other}\n"
    )
}

/// `node get`'s reboot lock message for `node`.
fn lock_message(server: &Server, node: &str) -> String {
    let got = server.lksctl_json(&["node", "get", node]);
    got["reboot_lock"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `lks_reboot_waiting_nodes{cluster="c1",reason}` on `/metrics`: nodes of
/// c1 waiting for a slot for that reason.
fn waiting_for(server: &Server, reason: &str) -> u64 {
    let series = format!("lks_reboot_waiting_nodes{{cluster=\"c1\",reason=\"{reason}\"}} ");
    server
        .http_get("/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.trim().parse().expect("a number"))
}

/// For `d`, every `status` of the cluster shows no slot held and no node
/// has rebooted more than the `before` times it had.
fn nothing_starts_for(server: &Server, sims: &[Sim], before: usize, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        let st = status(server, "c1");
        assert_eq!(
            st["slots_taken"], 0,
            "a slot was given through a closed gate: {st}"
        );
        assert!(
            sims.iter().all(|s| s.reboots() == before),
            "a node rebooted through a closed gate"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_firing_alert_holds_every_reboot_until_it_resolves() {
    let target = Target::start(&metrics(1, 0));
    let mut prom = Prometheus::start(target.addr, RULES);
    wait_until(Duration::from_secs(30), "KubeNodeNotReady firing", || {
        prom.firing() == ["KubeNodeNotReady"]
    });
    let fl = free_addr();
    let server = Server::start_with(&["--fleetlock-listen", &fl.to_string()]);
    wait_for_port(fl, Duration::from_secs(10));
    server.create_cluster("c1");
    let mut sims: Vec<Sim> = ["a", "b"].iter().map(|n| Sim::new(&server, "c1", n)).collect();
    wait_until(CONVERGE, "every node says it needs a reboot", || {
        let list = server.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .all(|n| n["reboot"]["state"] == "required")
    });

    // Bad input: one line each, nothing stored.
    let bad = server.lksctl(&["cluster", "set", "c1", "--alert-filter", "(Kube"]);
    assert_eq!(
        one_line_error(&bad, "a bad filter"),
        "error: set cluster c1: --alert-filter \"(Kube\" is not a regular expression: unclosed group"
    );
    let bad = server.lksctl(&["cluster", "set", "c1", "--alert-filter", "^Kube"]);
    assert_eq!(
        one_line_error(&bad, "a filter without a gate"),
        "error: set cluster c1: --alert-filter needs an alert gate: give --reboot-alert-gate URL too"
    );
    let bad = server.lksctl(&["cluster", "set", "c1", "--reboot-alert-gate", "prometheus:9090"]);
    assert_eq!(
        one_line_error(&bad, "a URL without a scheme"),
        "error: set cluster c1: --reboot-alert-gate \"prometheus:9090\": give http[s]://HOST:PORT[/PATH]"
    );

    // The gate is set with the reboots: a firing alert it matches holds them.
    let url = prom.url();
    let out = server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "auto",
        "--max-concurrent-reboots",
        "2",
        "--reboot-alert-gate",
        &format!("{url}/"),
        "--alert-filter",
        "^KubeNode",
    ]);
    assert!(
        out.contains(&format!(
            "then the slot is freed; gated on alerts matching ^KubeNode firing in {url}"
        )),
        "{out}"
    );
    let c = server.lksctl_json(&["cluster", "get", "c1"]);
    assert_eq!(
        c["reboots"]["alert_gate"],
        serde_json::json!({"url": url, "filter": "^KubeNode"}),
        "{c}"
    );
    let firing = format!("alert firing in {url}: KubeNodeNotReady");
    wait_until(CONVERGE, "a waits for the alert", || {
        lock_message(&server, "a") == firing
    });
    assert_eq!(lock_message(&server, "b"), firing);
    wait_until(CONVERGE, "/metrics counts both as waiting for the alert", || {
        waiting_for(&server, "alert") == 2
    });
    nothing_starts_for(&server, &sims, 0, Duration::from_secs(5));
    assert_eq!(waiting_for(&server, "alert"), 2);
    assert_eq!(waiting_for(&server, "slots"), 0);
    // Zincati is refused too, with the reason.
    let (code, body) = fleetlock(fl, "pre-reboot", "zincati-1");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, v["kind"].as_str()),
        (409, Some("reboot_gate_closed")),
        "{body}"
    );
    assert_eq!(
        v["value"],
        format!("a reboot gate of cluster c1 is closed: {firing}"),
        "{body}"
    );

    // It resolves while an alert the filter does not match fires: both
    // nodes reboot, two slots at most.
    target.set(&metrics(0, 1));
    wait_until(Duration::from_secs(30), "only DiskAlmostFull firing", || {
        prom.firing() == ["DiskAlmostFull"]
    });
    drive(&server, "c1", &mut sims, 2, |st| {
        node_state(st, "a").0 == "done" && node_state(st, "b").0 == "done"
    });
    assert_eq!(prom.firing(), ["DiskAlmostFull"], "it fired all along");
    assert_eq!((sims[0].reboots(), sims[1].reboots()), (1, 1));
    let (code, body) = fleetlock(fl, "pre-reboot", "zincati-1");
    assert_eq!(code, 200, "the gate is open for Zincati too: {body}");
    assert_eq!(fleetlock(fl, "steady-state", "zincati-1").0, 200);

    // Prometheus gone: the gate is closed, and says why. A rolling reboot
    // asks for slots (the nodes rebooted lately are not taken again for
    // `required`).
    prom.kill();
    // Past the 3 s an answer is kept (src/rebootgates.rs): its last answer
    // was "open".
    std::thread::sleep(Duration::from_secs(4));
    server.lksctl_ok(&["reboot", "start", "--cluster", "c1"]);
    let closed = format!("the alert gate is closed: Prometheus at {url} cannot be asked (");
    wait_until(CONVERGE, "the gate closed", || {
        lock_message(&server, "a").starts_with(&closed)
    });
    nothing_starts_for(&server, &sims, 1, Duration::from_secs(4));
    assert_eq!(
        (
            waiting_for(&server, "gate_unanswered"),
            waiting_for(&server, "alert")
        ),
        (2, 0),
        "both wait for a gate that cannot be asked"
    );

    // A blocking-pod selector on a cluster without a kubeconfig cannot be
    // checked: the nodes wait, and say why.
    let bad = server.lksctl(&["cluster", "set", "c1", "--blocking-pod-selector", "app in db"]);
    assert_eq!(
        one_line_error(&bad, "a bad selector"),
        "error: set cluster c1: --blocking-pod-selector \"app in db\": at \"db\": expected ( after in or notin"
    );
    server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--no-reboot-alert-gate",
        "--blocking-pod-selector",
        "app=db",
    ]);
    wait_until(CONVERGE, "the nodes wait for the tenant API", || {
        lock_message(&server, "a").contains("cannot be checked: the cluster has no kubeconfig")
    });
    nothing_starts_for(&server, &sims, 1, Duration::from_secs(3));
    let c = server.lksctl_json(&["cluster", "get", "c1"]);
    assert!(c["reboots"]["alert_gate"].is_null(), "{c}");
    assert_eq!(c["reboots"]["blocking_pod_selector"], "app=db", "{c}");
    server.lksctl_ok(&["reboot", "abort", "--cluster", "c1"]);
    for s in &mut sims {
        assert_eq!(s.agent.stop(), Some(0));
    }
}

#[test]
fn a_blocking_pod_holds_its_node_while_another_reboots() {
    let cp = KubeControlPlane::start();
    for n in ["node-a", "node-b"] {
        SimulatedKubelet::new(&cp, n).register(true, "v1.37.2");
    }
    cp.create_namespace("db");
    cp.apply(&pod_manifest("db", "pg-0", "node-a", "db", None));

    let server = Server::start();
    server.create_cluster("c1");
    let conf = cp.admin_kubeconfig.to_str().unwrap().to_string();
    server.lksctl_ok(&["cluster", "set", "c1", "--kubeconfig", &conf]);
    let mut sims: Vec<Sim> = ["node-a", "node-b"]
        .iter()
        .map(|n| Sim::new(&server, "c1", n))
        .collect();
    let out = server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "auto",
        "--blocking-pod-selector",
        "app in (db, cache), !lksadmin.io/ignore",
    ]);
    assert!(
        out.contains("gated on blocking pods app in (db,cache),!lksadmin.io/ignore"),
        "{out}"
    );

    // node-a waits for its pod; node-b takes the slot, drains, reboots.
    let blocked = "blocking pod(s) on the node: db/pg-0";
    let mut seen_waiting = false;
    drive(&server, "c1", &mut sims, 1, |st| {
        let (state, message) = node_state(st, "node-a");
        assert!(
            state == "waiting" || state.is_empty(),
            "node-a got a slot with its blocking pod: {st}"
        );
        seen_waiting |= message == blocked;
        node_state(st, "node-b").0 == "done"
    });
    assert!(seen_waiting, "node-a said why it waits");
    assert_eq!(sims[0].reboots(), 0, "node-a held by its pod");
    assert_eq!(sims[1].reboots(), 1);
    assert_eq!(lock_message(&server, "node-a"), blocked);
    wait_until(CONVERGE, "/metrics counts node-a as held by a pod", || {
        waiting_for(&server, "blocking_pod") == 1
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sims[0].reboots(), 0, "node-a still held");

    // The pod goes: node-a reboots.
    cp.kubectl_ok(&["delete", "pod", "pg-0", "-n", "db", "--grace-period=0", "--force"]);
    drive(&server, "c1", &mut sims, 1, |st| {
        node_state(st, "node-a").0 == "done"
    });
    assert_eq!((sims[0].reboots(), sims[1].reboots()), (1, 1));
    for s in &mut sims {
        assert_eq!(s.agent.stop(), Some(0));
    }
}
