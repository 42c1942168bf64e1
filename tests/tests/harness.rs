//! Sanity checks of the harness itself.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// Ports come from below the kernel's ephemeral range (where no outgoing
/// connection takes them before the server binds) and never twice.
#[test]
fn free_addr_is_below_the_ephemeral_range_and_never_repeats() {
    let ports: Vec<u16> = (0..50).map(|_| free_addr().port()).collect();
    let mut unique = ports.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ports.len(), "{ports:?}");
    if let Some(low) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > 10_000)
    {
        assert!(ports.iter().all(|&p| (10_000..low).contains(&p)), "{ports:?}");
    }
}
