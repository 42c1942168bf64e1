//! A throwaway etcd on loopback for the replicated-store tests: Debian's
//! `etcd-server` (`.ci/run` installs it), its data in a temp dir, its
//! ports picked at run time, killed and removed when the test ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{Proc, free_addr, wait_for_port};

pub struct Etcd {
    dir: tempfile::TempDir,
    pub client: SocketAddr,
    peer: SocketAddr,
    proc: Option<Proc>,
    starts: u32,
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
        let mut e = Etcd {
            dir: tempfile::tempdir().expect("temp dir"),
            client: free_addr(),
            peer: free_addr(),
            proc: None,
            starts: 0,
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
        let mut cmd = Command::new(etcd_bin());
        let client = self.url();
        let peer = format!("http://{}", self.peer);
        cmd.arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .arg("--initial-cluster")
            .arg(format!("test={peer}"))
            // Like a production etcd: keep an hour of history at most.
            .args(["--auto-compaction-retention", "1"])
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        let p = Proc::spawn(&format!("etcd-{}", self.starts), cmd, self.dir.path());
        self.proc = Some(p);
        wait_for_port(self.client, Duration::from_secs(20));
    }

    /// A control-server replica on this etcd under `prefix`, with a short
    /// lease (3 s) so that tests see failover quickly; `extra` is appended.
    pub fn replica(&self, prefix: &str, extra: &[&str]) -> crate::server::Server {
        let url = self.url();
        let mut args = vec![
            "--store",
            "etcd",
            "--etcd-endpoints",
            &url,
            "--etcd-prefix",
            prefix,
            "--lease-ttl",
            "3s",
        ];
        args.extend_from_slice(extra);
        crate::server::Server::start_with(&args)
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
        use std::io::{Read, Write};
        // key = range_end = "\0": every key.
        let body = r#"{"key":"AA==","range_end":"AA==","count_only":true}"#;
        let mut s = std::net::TcpStream::connect(self.client).expect("connect to etcd");
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        write!(
            s,
            "POST /v3/kv/range HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send range request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read range response");
        let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd range answer ({e}): {out}"));
        let num = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        (num(&v["header"]["revision"]), num(&v["count"]))
    }

    pub fn log(&self) -> String {
        self.proc.as_ref().map(Proc::log_text).unwrap_or_default()
    }
}
