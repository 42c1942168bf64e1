//! FleetLock (issue [reboots]) with the real server and `curl` as the
//! client, as Zincati would call it: `POST /c/CLUSTER/v1/pre-reboot` and
//! `v1/steady-state` on `--fleetlock-listen`, two clients for one slot of
//! the cluster's reboot lock, and the refusals (missing header, closed
//! window, reboots off, unknown cluster) in the protocol's `{kind, value}`.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use lks_e2e::agent::Agent;
use lks_e2e::reboot::fleetlock_curl;
use lks_e2e::server::Server;
use lks_e2e::{free_addr, wait_for_port};

/// One FleetLock call with curl: the HTTP status and the body.
fn call(addr: SocketAddr, cluster: &str, op: &str, id: &str, header: bool) -> (u16, String) {
    fleetlock_curl(&format!("http://{addr}/c/{cluster}/v1/{op}"), id, header, &[])
}

/// The error `kind` of a refusal (and that its `value` is a line).
fn kind(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    assert!(!v["value"].as_str().unwrap().is_empty(), "{body}");
    v["kind"].as_str().unwrap().to_string()
}

fn holders(server: &Server, cluster: &str) -> Vec<(String, String)> {
    let st = server.lksctl_json(&["reboot", "status", "--cluster", cluster]);
    st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "fleetlock")
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn two_fleetlock_clients_share_one_slot_and_the_gates_refuse() {
    let fl = free_addr();
    let fl_arg = fl.to_string();
    let server = Server::start_with(&["--fleetlock-listen", &fl_arg]);
    wait_for_port(fl, Duration::from_secs(10));
    server.create_cluster("c1");
    server.create_cluster("off");
    server.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--reboots",
        "manual",
        "--max-concurrent-reboots",
        "1",
    ]);

    let (code, body) = call(fl, "off", "pre-reboot", "a", true);
    assert_eq!((code, kind(&body).as_str()), (409, "reboots_off"), "{body}");
    assert!(body.contains("--reboots manual"), "{body}");
    let (code, body) = call(fl, "nope", "pre-reboot", "a", true);
    assert_eq!((code, kind(&body).as_str()), (404, "unknown_cluster"), "{body}");
    let (code, body) = call(fl, "c1", "pre-reboot", "a", false);
    assert_eq!(
        (code, kind(&body).as_str()),
        (400, "missing_fleet_lock_header"),
        "{body}"
    );

    let (code, body) = call(fl, "c1", "pre-reboot", "a", true);
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(fl, "c1", "pre-reboot", "a", true);
    assert_eq!(code, 200, "recursive: {body}");
    let (code, body) = call(fl, "c1", "pre-reboot", "b", true);
    assert_eq!(
        (code, kind(&body).as_str()),
        (409, "failed_lock_semaphore_full"),
        "{body}"
    );
    let held = holders(&server, "c1");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].0, "a");
    assert!(held[0].1.contains("FleetLock"), "{held:?}");
    let table = server.lksctl_ok(&["reboot", "status", "--cluster", "c1"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("a ") && l.contains("fleetlock")),
        "{table}"
    );

    let (code, body) = call(fl, "c1", "steady-state", "a", true);
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(fl, "c1", "steady-state", "a", true);
    assert_eq!(code, 200, "idempotent: {body}");
    let (code, body) = call(fl, "c1", "pre-reboot", "b", true);
    assert_eq!(code, 200, "{body}");
    assert_eq!(holders(&server, "c1")[0].0, "b");
    let events = server.lksctl_json(&["event", "list", "--cluster", "c1"]);
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["message"].as_str().unwrap_or("").contains("FleetLock client"))
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"reboot_slot_taken") && kinds.contains(&"reboot_released"),
        "{events}"
    );
    call(fl, "c1", "steady-state", "b", true);

    // An id that names an enrolled node is that node: held, it is refused.
    let mut agent = Agent::new("w1");
    agent.join(&server, "c1", &[]);
    agent.start();
    agent.wait_connected();
    server.lksctl_ok(&["node", "hold", "w1", "--reason", "tenant migrates"]);
    let (code, body) = call(fl, "c1", "pre-reboot", "w1", true);
    assert_eq!((code, kind(&body).as_str()), (409, "node_held"), "{body}");
    server.lksctl_ok(&["node", "unhold", "w1"]);
    let (code, body) = call(fl, "c1", "pre-reboot", "w1", true);
    assert_eq!(code, 200, "{body}");
    call(fl, "c1", "steady-state", "w1", true);
    let series =
        |op: &str, result: &str| format!("lks_fleetlock_requests_total{{op=\"{op}\",result=\"{result}\"}}");
    assert_eq!(server.metric(&series("pre-reboot", "granted")), 3);
    assert_eq!(server.metric(&series("pre-reboot", "held")), 1);
    assert_eq!(
        server.metric(&series("pre-reboot", "refused")),
        3,
        "off, full, held"
    );
    assert_eq!(server.metric(&series("steady-state", "released")), 4);
    assert_eq!(
        server.metric(&series("other", "bad_request")),
        1,
        "the missing header"
    );

    // A window that is closed now: refused, and the next opening named.
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        % 24;
    let from = (hour + 2) % 24;
    let window = format!("daily {from:02}:00-{:02}:00 UTC", (from + 1) % 24);
    server.lksctl_ok(&["cluster", "set", "c1", "--maintenance-window", &window]);
    let (code, body) = call(fl, "c1", "pre-reboot", "a", true);
    assert_eq!(
        (code, kind(&body).as_str()),
        (409, "maintenance_window_closed"),
        "{body}"
    );
    assert!(body.contains("the next opens at"), "{body}");
    assert!(holders(&server, "c1").is_empty());
}

#[test]
fn fleetlock_over_tls_with_the_servers_certificate() {
    let fl = free_addr();
    let fl_arg = fl.to_string();
    let server = Server::start_with(&["--fleetlock-listen", &fl_arg, "--fleetlock-tls"]);
    wait_for_port(fl, Duration::from_secs(10));
    server.create_cluster("c1");
    server.lksctl_ok(&["cluster", "set", "c1", "--reboots", "auto"]);
    let ca = server.work_dir().join("fleetlock-ca.pem");
    std::fs::write(&ca, server.admin_conf().ca_cert).unwrap();
    let ca = ca.display().to_string();
    let url = format!("https://127.0.0.1:{}/c/c1/v1/pre-reboot", fl.port());
    let (code, body) = fleetlock_curl(&url, "a", true, &["--cacert", &ca]);
    assert_eq!(code, 200, "{body}");
    let (code, body) = fleetlock_curl(&url, "b", true, &["--cacert", &ca]);
    assert_eq!(
        (code, kind(&body).as_str()),
        (409, "failed_lock_semaphore_full"),
        "{body}"
    );
    // Plain HTTP on the TLS port gets no answer.
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-X",
            "POST",
            &url.replace("https", "http"),
        ])
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plain HTTP was answered on the TLS port");
    std::fs::remove_file(&ca).unwrap();
}
