//! A throwaway etcd on loopback for the replicated-store tests: Debian's
//! `etcd-server` (`.ci/run` installs it), its data in a temp dir, its
//! ports picked at run time, killed and removed when the test ends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{Proc, free_addr, wait_for_port};

pub struct Etcd {
    dir: tempfile::TempDir,
    pub client: SocketAddr,
    peer: SocketAddr,
    proc: Option<Proc>,
    starts: u32,
    /// Runs etcd in a network namespace (`ip netns exec NS`), if not empty.
    wrapper: Vec<String>,
}

/// The etcd binary: `$LKS_ETCD`, else `etcd` on PATH.
fn etcd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LKS_ETCD") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    });
    found.expect("etcd not found: install Debian's etcd-server (bash scripts/setup.sh does) or set LKS_ETCD")
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_wrapped(Vec::new(), free_addr(), free_addr())
    }

    /// An etcd run under `wrapper` (`ip netns exec NS`: in a network
    /// namespace, beside the replicas there) on the `client` and `peer`
    /// addresses; the test reaches it only through the replicas.
    pub fn start_wrapped(wrapper: Vec<String>, client: SocketAddr, peer: SocketAddr) -> Etcd {
        let mut e = Etcd {
            dir: tempfile::tempdir().expect("temp dir"),
            client,
            peer,
            proc: None,
            starts: 0,
            wrapper,
        };
        e.spawn();
        e
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let peer = format!("http://{}", self.peer);
        let cmd = member_command(
            crate::wrapped(&self.wrapper, &etcd_bin()),
            "test",
            &self.dir.path().join("data"),
            &self.url(),
            &peer,
            &format!("test={peer}"),
        );
        let p = Proc::spawn(&format!("etcd-{}", self.starts), cmd, self.dir.path());
        self.proc = Some(p);
        if self.wrapper.is_empty() {
            wait_for_port(self.client, Duration::from_secs(20));
        } else {
            crate::wait_until(Duration::from_secs(20), "etcd in its namespace", || {
                crate::probe_tcp(&self.wrapper, self.client)
            });
        }
    }

    /// A control-server replica on this etcd under `prefix`, with a short
    /// lease (3 s) so that tests see failover quickly; `extra` is appended.
    pub fn replica(&self, prefix: &str, extra: &[&str]) -> crate::server::Server {
        self.replica_with_env(prefix, extra, &[])
    }

    /// Like [`Etcd::replica`], the server process getting `env` on top of
    /// the test's environment.
    pub fn replica_with_env(
        &self,
        prefix: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> crate::server::Server {
        replica_on(&self.url(), prefix, extra, env)
    }

    /// Its process id (0 when it is not running).
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map_or(0, Proc::pid)
    }

    /// SIGKILL: etcd lost without warning.
    pub fn kill9(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub fn start_again(&mut self) {
        self.spawn();
    }

    /// etcd's data dir (WAL and bbolt database).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The store's revision and how many keys it holds, through etcd's
    /// JSON gateway (no etcdctl needed): an unchanged revision proves that
    /// nothing was written.
    pub fn revision_and_keys(&self) -> (u64, u64) {
        // key = range_end = "\0": every key.
        self.count_range(b"\0", b"\0")
    }

    /// How many keys start with `prefix` (`/lks/blobs/`, say).
    pub fn keys_under(&self, prefix: &str) -> u64 {
        let mut end = prefix.as_bytes().to_vec();
        // The range end: the prefix with its last byte incremented.
        let last = end.pop().expect("a non-empty prefix");
        end.push(last + 1);
        self.count_range(prefix.as_bytes(), &end).1
    }

    /// Revision and key count of the range `[key, range_end)`.
    fn count_range(&self, key: &[u8], range_end: &[u8]) -> (u64, u64) {
        let body = format!(
            r#"{{"key":"{}","range_end":"{}","count_only":true}}"#,
            b64(key),
            b64(range_end)
        );
        let v = self.gateway("range", &body);
        let num = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        (num(&v["header"]["revision"]), num(&v["count"]))
    }

    /// Puts `value` at `key` (outside any control server's prefix, say, to
    /// age the store: every put raises etcd's revision by one).
    pub fn put(&self, key: &str, value: &str) {
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64(key.as_bytes()),
            b64(value.as_bytes())
        );
        let v = self.gateway("put", &body);
        assert!(v["header"]["revision"].is_string(), "etcd put answer: {v}");
    }

    /// POSTs `body` to `/v3/kv/{call}` of etcd's JSON gateway (no etcdctl
    /// needed) and returns the answer.
    fn gateway(&self, call: &str, body: &str) -> serde_json::Value {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.client).expect("connect to etcd");
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        write!(
            s,
            "POST /v3/kv/{call} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send request to etcd");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read etcd's answer");
        let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd {call} answer ({e}): {out}"))
    }

    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Killed (its log printed if the test failed) before the temp dir
        // goes: fields drop in order, the dir first, and a running etcd
        // may still write into it.
        drop(self.proc.take());
    }
}

/// One etcd member on loopback: its name, data dir, client and peer URLs,
/// and `--initial-cluster`; an hour of history at most, like a production
/// etcd.
fn member_command(
    mut cmd: Command,
    name: &str,
    data: &std::path::Path,
    client: &str,
    peer: &str,
    initial: &str,
) -> Command {
    cmd.arg("--name")
        .arg(name)
        .arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", client, "--advertise-client-urls", client])
        .args(["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer])
        .args(["--initial-cluster", initial])
        .args(["--auto-compaction-retention", "1"])
        .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
    cmd
}

/// A throwaway etcd cluster of `n` members on loopback (Debian's
/// etcd-server), as kube0 runs it: each member its own process, data dir
/// and ports; killed and removed when dropped.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    clients: Vec<SocketAddr>,
    peers: Vec<SocketAddr>,
    procs: Vec<Option<Proc>>,
}

impl EtcdCluster {
    pub fn start(n: usize) -> EtcdCluster {
        let mut c = EtcdCluster {
            dir: tempfile::tempdir().expect("temp dir"),
            clients: (0..n).map(|_| free_addr()).collect(),
            peers: (0..n).map(|_| free_addr()).collect(),
            procs: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            c.spawn(i);
        }
        for a in &c.clients {
            wait_for_port(*a, Duration::from_secs(20));
        }
        c
    }

    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self
            .peers
            .iter()
            .enumerate()
            .map(|(k, p)| format!("m{k}=http://{p}"))
            .collect();
        let mut cmd = member_command(
            Command::new(etcd_bin()),
            &format!("m{i}"),
            &self.dir.path().join(format!("m{i}")),
            &format!("http://{}", self.clients[i]),
            &format!("http://{}", self.peers[i]),
            &initial.join(","),
        );
        cmd.args([
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "lks-test",
        ]);
        self.procs[i] = Some(Proc::spawn(&format!("etcd-m{i}"), cmd, self.dir.path()));
    }

    /// Every member's client URL, comma-separated (`--etcd-endpoints`).
    pub fn endpoints(&self) -> String {
        self.clients
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s process id (0 when it is not running).
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].as_ref().map_or(0, Proc::pid)
    }

    /// SIGKILL member `i`: the cluster keeps its quorum with the others.
    pub fn kill9(&mut self, i: usize) {
        if let Some(p) = self.procs[i].as_mut() {
            p.kill9();
        }
    }

    /// A control-server replica on this cluster under `prefix` (short
    /// lease, as [`Etcd::replica`]).
    pub fn replica(&self, prefix: &str, extra: &[&str]) -> crate::server::Server {
        replica_on(&self.endpoints(), prefix, extra, &[])
    }

    /// Like [`EtcdCluster::replica`], running `program` (another release's
    /// lks-control-server).
    pub fn replica_of(&self, program: &Path, prefix: &str, extra: &[&str]) -> crate::server::Server {
        crate::server::Server::start_program(program, &replica_args(&self.endpoints(), prefix, extra), &[])
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // The processes before their data dirs.
        for p in &mut self.procs {
            drop(p.take());
        }
    }
}

/// A control-server replica on the etcd at `endpoints` under `prefix`, with
/// a short lease (3 s) so that tests see failover quickly; `extra` is
/// appended and `env` added to the process's environment.
fn replica_on(
    endpoints: &str,
    prefix: &str,
    extra: &[&str],
    env: &[(String, String)],
) -> crate::server::Server {
    crate::server::Server::start_with_env(&replica_args(endpoints, prefix, extra), env)
}

fn replica_args<'a>(endpoints: &'a str, prefix: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--store",
        "etcd",
        "--etcd-endpoints",
        endpoints,
        "--etcd-prefix",
        prefix,
        "--lease-ttl",
        "3s",
    ];
    args.extend_from_slice(extra);
    args
}

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}
