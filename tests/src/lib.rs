//! End-to-end test harness: finds the real binaries, picks free loopback
//! ports, and owns every process a test starts so it is killed (and its
//! files removed) when the test ends, pass or fail.
//!
//! The binaries come from the workspace's target directory; the README's test
//! command builds them (`cargo build --workspace --bins`) before running the
//! suite. `LKS_BIN_DIR` overrides the location.

#![forbid(unsafe_code)]
// Test code: a harness step that fails panics with what it was doing, and
// the test that called it fails there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Directory holding the workspace binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LKS_BIN_DIR") {
        return PathBuf::from(d);
    }
    // target/debug/deps/<test-binary> → target/debug
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("test binary has a parent").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a workspace binary; panics with the fix if it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} not found: run `cargo build --workspace --bins` first (or set LKS_BIN_DIR)",
        p.display()
    );
    p
}

/// A loopback address with a port that was free a moment ago, for a
/// process the test starts to listen on.
///
/// Taken at random below the kernel's ephemeral range
/// (`ip_local_port_range`), not by binding port 0: a port from that range
/// can be taken by an outgoing connection (a load generator opens hundreds)
/// between this call and the server's bind, which then fails "Address
/// already in use" (seen in loadgen_replicas on 2 cores). No outgoing
/// connection uses a port below the range, and a port is handed out once
/// per test process.
pub fn free_addr() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    const LOWEST: u16 = 10_000;
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if below > LOWEST {
        for _ in 0..1_000 {
            let span = f64::from(below - LOWEST);
            let port = LOWEST + (lks_proto::backoff::unit_random() * span) as u16;
            if given.contains(&port) {
                continue;
            }
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                given.push(port);
                return l.local_addr().expect("local_addr");
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local_addr")
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) {
    wait_until(timeout, &format!("{addr} to accept connections"), || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    });
}

/// A child process that is killed when dropped. stdout/stderr go to files in
/// `log_dir` so a failing test can print them.
pub struct Proc {
    name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `cmd`, logging to `log_dir/<name>.log`.
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open log file");
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone().expect("clone log fd"))
            .stderr(f)
            .env("RUST_BACKTRACE", "1");
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How it ended, once it has (reaped); None while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(st)
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait up to `grace` for a clean exit; returns the exit code
    /// (None if it had to be killed).
    pub fn terminate(&mut self, grace: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "{} did not stop within {grace:?} of SIGTERM; killing it",
            self.name
        );
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if std::thread::panicking() {
                eprintln!("---- log of {} ----\n{}", self.name, self.log_text());
            }
        }
    }
}

/// A command running `program` under `wrapper` (e.g. `ip netns exec NS`);
/// just `program` when the wrapper is empty.
pub fn wrapped(wrapper: &[String], program: &Path) -> Command {
    match wrapper.split_first() {
        None => Command::new(program),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
    }
}

/// True if a TCP connection to `addr` opens within 2 s from where
/// `wrapper` runs commands (bash's `/dev/tcp`).
pub fn probe_tcp(wrapper: &[String], addr: SocketAddr) -> bool {
    let mut c = wrapped(wrapper, Path::new("timeout"));
    c.args([
        "2",
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port()),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    run(c).status.success()
}

/// Runs a command to completion and returns its output.
pub fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null());
    cmd.output().expect("run command")
}

/// Asserts success and returns stdout as text.
pub fn ok_stdout(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts failure with exactly one line on stderr and returns that line.
pub fn one_line_error(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} unexpectedly succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(
        err.lines().count(),
        1,
        "{what}: expected one error line, got:\n{err}"
    );
    err
}

pub mod agent;
pub mod console;
pub mod etcd;
pub mod hostile;
pub mod kube;
pub mod kube_controller;
pub mod netns;
pub mod plan;
pub mod prometheus;
pub mod reboot;
pub mod rogue;
pub mod rollout;
pub mod s3;
pub mod server;
pub mod trust;

/// Random instants for the crash tests: xorshift64 seeded from the clock,
/// reproducible from the seed a test prints.
pub struct KillTimer {
    x: u64,
    /// The seed, for the test's summary line and failure messages.
    pub seed: u64,
}

impl KillTimer {
    pub fn new() -> KillTimer {
        let seed = u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos(),
        ) | 1;
        KillTimer { x: seed, seed }
    }

    /// A duration in `[0, window_ms)` milliseconds.
    pub fn within(&mut self, window_ms: u64) -> Duration {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        Duration::from_millis(self.x % window_ms.max(1))
    }
}

impl Default for KillTimer {
    fn default() -> Self {
        Self::new()
    }
}

/// `len` bytes that never repeat in a way a misplaced chunk could hide
/// behind (xorshift64 from `seed`), unlike zeros or a short cycle.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A child process killed (and reaped) if the test fails before it is
/// waited for; `.0.take()` it to wait for it yourself.
pub struct KillOnDrop(pub Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
