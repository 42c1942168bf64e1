//! Sanity checks of the harness itself.

use std::process::Command;
use std::time::Duration;

use lks_e2e::{Proc, free_addr, wait_until};

#[test]
fn proc_is_killed_on_drop_and_logs_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo started; exec sleep 30"]);
    let mut p = Proc::spawn("sleeper", cmd, dir.path());
    let pid = p.pid();
    assert!(p.running());
    wait_until(Duration::from_secs(5), "log line", || {
        p.log_text().contains("started")
    });
    drop(p);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "child still alive after drop"
    );
}

#[test]
fn free_addr_is_loopback() {
    assert!(free_addr().ip().is_loopback());
}
