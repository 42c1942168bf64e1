//! Resources (issue [reliability] item 4): the control server at its
//! open-file limit. New connections cannot be accepted; the server must
//! neither die nor spin on the failing accept, the agents already connected
//! keep their streams and still receive work, `lksctl` says in one line
//! that it cannot get in (instead of hanging), and a node that could not get
//! in connects once descriptors are free again. Prints one `RESFAULT` line.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, node_connected, publish_and_roll_out, write_bundle};
use lks_e2e::server::Server;
use lks_e2e::wait_until;

/// Sets the soft open-file limit of a running process (the hard one stays,
/// so the limit can be raised again).
fn set_nofile(pid: u32, n: u64) {
    let out = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={n}:")])
        .output()
        .expect("run prlimit");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The soft open-file limit of a running process.
fn nofile(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .expect("soft open-file limit in /proc/PID/limits")
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// User + system CPU time of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

#[test]
fn at_its_open_file_limit_the_server_keeps_old_streams_and_takes_new_ones_once_free() {
    let t0 = Instant::now();
    let mut server = Server::start();
    server.create_cluster("c1");
    let mut old = Agent::new("old");
    old.join(&server, "c1", &[]);
    old.start();
    old.wait_connected();
    let mut late = Agent::new("late");
    late.join(&server, "c1", &[]);
    // Publish first: the CLI's own connection must get in.
    let dir = write_bundle(
        server.work_dir(),
        "motd",
        "1",
        &[BundleFile {
            path: "/etc/motd",
            content: b"at the limit\n",
            mode: "0644",
        }],
        "",
    );
    let pid = server.pid();
    // Below what it holds now, so that no descriptor closing meanwhile (a
    // CLI connection winding down) makes room for one accept.
    std::thread::sleep(Duration::from_millis(500));
    let before = nofile(pid);
    let full = open_fds(pid).saturating_sub(2);
    set_nofile(pid, full);
    late.start();
    let ticks = cpu_ticks(pid);
    let window = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let spent = cpu_ticks(pid) - ticks;
    let ticks_per_sec = 100;
    let busy = spent as f64 / ticks_per_sec as f64 / window.elapsed().as_secs_f64();
    assert!(
        server.running(),
        "the server died at its open-file limit:\n{}",
        server.log()
    );
    assert_eq!(
        late.status()["connection"]["connected"],
        false,
        "no descriptor, no new stream"
    );
    assert_eq!(
        old.status()["connection"]["connected"],
        true,
        "the old stream is kept"
    );
    let connects = |a: &Agent| a.log().matches(" connected server=").count();
    assert_eq!(connects(&old), 1, "the old agent never had to reconnect");
    assert!(
        busy < 0.5,
        "the server spins on the failing accept: {:.0} % of a core",
        busy * 100.0
    );
    // An operator's command waits in the backlog like any new connection:
    // it ends with one line instead of hanging.
    let out = server.lksctl(&["node", "list"]);
    let err = lks_e2e::one_line_error(&out, "lksctl while the server is at its limit");
    assert!(err.contains("no TLS handshake"), "{err}");
    // Descriptors free again: the late node gets in, everyone takes work.
    set_nofile(pid, before);
    late.wait_connected();
    publish_and_roll_out(&server, "c1", &dir, None);
    old.wait_bundle("motd", "1", "applied");
    late.wait_bundle("motd", "1", "applied");
    wait_until(CONVERGE, "both connected", || {
        node_connected(&server, "old") && node_connected(&server, "late")
    });
    assert_eq!(connects(&old), 1, "the old agent never had to reconnect");
    let log = server.log();
    assert_eq!(
        log.matches("cannot accept new connections").count(),
        1,
        "said once:\n{log}"
    );
    eprintln!(
        "RESFAULT server-open-file-limit: tries=1 server_alive=1 old_streams_kept=1/1 new_refused=1/1 lksctl_one_line=1 \
         cpu_at_limit={:.0}% late_node_joined_after=1 secs={:.1}",
        busy * 100.0,
        t0.elapsed().as_secs_f64()
    );
    server.stop();
}
