//! `lks-loadgen --storm` (issue [perf] item 2): 50 simulated agents, the
//! real server restarted under them (SIGTERM, then SIGKILL), every agent
//! back with its desired state and no auth error.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use lks_e2e::{bin, free_addr, ok_stdout, run};

fn storm(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut cmd = Command::new(bin("lks-loadgen"));
    cmd.arg("--config")
        .arg(data.join("admin.conf"))
        .args([
            "--cluster",
            "storm",
            "--agents",
            "50",
            "--storm",
            "--storm-timeout",
            "20",
        ])
        .args(extra)
        .args(["-o", "json", "--server-log"])
        .arg(dir.path().join("server.log"))
        .arg("--")
        .arg(bin("lks-control-server"))
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--listen",
            &free_addr().to_string(),
            "--advertise-address",
            "127.0.0.1",
        ]);
    let out = ok_stdout(&run(cmd), "lks-loadgen --storm");
    serde_json::from_str(&out).expect("loadgen JSON")
}

fn assert_all_back(r: &serde_json::Value) {
    assert_eq!(r["errors"], 0, "{r}");
    let s = &r["storm"];
    assert_eq!(s["back"], 50, "every agent came back: {r}");
    assert!(s["all_back_seconds"].as_f64().is_some_and(|t| t < 15.0), "{r}");
    assert_eq!(s["auth_errors"], 0, "{r}");
    assert!(s["attempts_p50"].as_u64().is_some_and(|a| a >= 1), "{r}");
}

#[test]
fn agents_come_back_after_a_server_restart() {
    let r = storm(&[]);
    assert_all_back(&r);
    assert_eq!(r["storm"]["signal"], "SIGTERM");
    // A graceful shutdown tells every agent to come back: no stream ends
    // without a status (which an agent would read as a clean end).
    assert_eq!(
        r["storm"]["dropped"]["unavailable"], 50,
        "every stream ends with unavailable: {r}"
    );
    assert!(r["storm"]["dropped"].get("closed").is_none(), "{r}");
}

#[test]
fn agents_come_back_after_a_server_crash() {
    let r = storm(&["--storm-kill"]);
    assert_all_back(&r);
    assert_eq!(r["storm"]["signal"], "SIGKILL");
}
