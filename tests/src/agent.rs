//! Harness for agent end-to-end tests: a real `lksadmin-agent` with its own
//! state dir and `--root` sandbox, joined to a real control server, plus
//! helpers to publish bundles, roll them out and watch node state from both
//! sides (`lksctl node list` and `lksadmin-agent status`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::server::Server;
use crate::{Proc, bin, ok_stdout, run, wait_until};

/// Long enough for a rollout to reach a node on a loaded CI machine.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// What `token create -o json` hands to a joining node.
#[derive(Clone, Debug)]
pub struct JoinInfo {
    pub token: String,
    pub ca_cert_hash: String,
    pub server: String,
}

/// A fresh token for `cluster`, with the CA pin and server URL.
pub fn join_info(server: &Server, cluster: &str, extra: &[&str]) -> JoinInfo {
    let mut args = vec!["token", "create", "--cluster", cluster];
    args.extend_from_slice(extra);
    let v = server.lksctl_json(&args);
    JoinInfo {
        token: v["token"].as_str().expect("token").to_string(),
        ca_cert_hash: v["ca_cert_hash"].as_str().expect("ca_cert_hash").to_string(),
        server: v["server"].as_str().expect("server").to_string(),
    }
}

/// One node: an agent process, its state dir and its root sandbox.
pub struct Agent {
    dir: tempfile::TempDir,
    pub state_dir: PathBuf,
    pub root: PathBuf,
    pub name: String,
    proc: Option<Proc>,
    starts: u32,
    pub heal_interval: String,
    /// The binary `start` runs (the workspace's agent unless a test, like
    /// the self-update one, runs a copy inside the root).
    pub exe: PathBuf,
    /// Prefix of every command this agent runs (`run`, `join`, `status`),
    /// e.g. `ip netns exec NS`; empty on the host.
    pub wrapper: Vec<String>,
    /// More arguments for `run` (e.g. `--peer-listen`).
    pub run_args: Vec<String>,
    /// More environment for `run` (e.g. `LKS_AGENT_FAULT`).
    pub run_env: Vec<(String, String)>,
}

impl Agent {
    pub fn new(name: &str) -> Agent {
        let dir = tempfile::tempdir().expect("create temp dir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).expect("create root");
        Agent {
            state_dir: dir.path().join("state"),
            root,
            dir,
            name: name.to_string(),
            proc: None,
            starts: 0,
            heal_interval: "60s".into(),
            exe: bin("lksadmin-agent"),
            wrapper: Vec::new(),
            run_args: Vec::new(),
            run_env: Vec::new(),
        }
    }

    /// A scratch directory removed with the agent.
    pub fn work_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `lksadmin-agent ARGS`.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = crate::wrapped(&self.wrapper, &bin("lksadmin-agent"));
        cmd.args(args);
        run(cmd)
    }

    /// `join` with this agent's state dir and root; `extra` is appended.
    pub fn join_raw(&self, server: &str, token: &str, pin: &str, extra: &[&str]) -> Output {
        let mut args = vec![
            "join",
            "--server",
            server,
            "--token",
            token,
            "--ca-cert-hash",
            pin,
            "--node-name",
            &self.name,
        ];
        let state = self.state_dir.to_string_lossy().into_owned();
        let root = self.root.to_string_lossy().into_owned();
        args.extend(["--state-dir", &state, "--root", &root]);
        args.extend_from_slice(extra);
        self.cli(&args)
    }

    /// Joins `cluster` of `server` with a fresh token; asserts success.
    pub fn join(&self, server: &Server, cluster: &str, extra: &[&str]) -> String {
        let j = join_info(server, cluster, &[]);
        ok_stdout(
            &self.join_raw(&j.server, &j.token, &j.ca_cert_hash, extra),
            "lksadmin-agent join",
        )
    }

    /// Joins with `tok` (`token create -o json`) given every replica in
    /// `urls`, in an order starting at replica `i % urls.len()`: agents
    /// joined with consecutive `i` start on different replicas.
    pub fn join_spread(&self, urls: &[String], i: usize, tok: &serde_json::Value) {
        let mut list = urls.to_vec();
        let n = list.len().max(1);
        list.rotate_left(i % n);
        let out = self.join_raw(
            &list.join(","),
            tok["token"].as_str().expect("token"),
            tok["ca_cert_hash"].as_str().expect("ca_cert_hash"),
            &[],
        );
        ok_stdout(&out, &format!("lksadmin-agent join {}", self.name));
    }

    /// Starts `run`.
    pub fn start(&mut self) {
        self.starts += 1;
        let mut cmd = crate::wrapped(&self.wrapper, &self.exe);
        cmd.arg("run")
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--heal-interval")
            .arg(&self.heal_interval)
            .env("RUST_LOG", "info,lksadmin_agent=debug")
            .env("LKS_LOG_STDERR", "1")
            .env_remove("NOTIFY_SOCKET")
            .args(&self.run_args)
            .envs(self.run_env.iter().map(|(k, v)| (k, v)));
        let name = format!("agent-{}-{}", self.name, self.starts);
        self.proc = Some(Proc::spawn(&name, cmd, self.dir.path()));
    }

    /// SIGTERM; the exit code (None if it had to be killed).
    pub fn stop(&mut self) -> Option<i32> {
        self.proc
            .as_mut()
            .and_then(|p| p.terminate(Duration::from_secs(15)))
    }

    /// How the agent process ended, once it has (None while it runs).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.as_mut()?.exited()
    }

    pub fn kill9(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
    }

    /// The running agent's process id.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::running)
    }

    /// Bytes this agent fetched through peer sharing so far, by source:
    /// (from the server, from peers), from its `blob fetched` log lines.
    pub fn fetched_bytes(&self) -> (u64, u64) {
        let field = |l: &str, k: &str| -> u64 {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        self.log()
            .lines()
            .filter(|l| l.contains("blob fetched and verified"))
            .fold((0, 0), |(s, p), l| {
                (s + field(l, "from_server="), p + field(l, "from_peers="))
            })
    }

    /// Every log of every start so far.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("agent-{}-{i}.log", self.name)))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `status -o json`.
    pub fn status(&self) -> serde_json::Value {
        let state = self.state_dir.to_string_lossy().into_owned();
        let out = ok_stdout(
            &self.cli(&["status", "--state-dir", &state, "-o", "json"]),
            "lksadmin-agent status",
        );
        serde_json::from_str(&out).expect("status JSON")
    }

    /// `(version, state, message)` of a bundle in the local view.
    pub fn bundle(&self, name: &str) -> Option<(String, String, String)> {
        let s = self.status();
        s["bundles"]
            .as_array()?
            .iter()
            .find(|b| b["name"] == name)
            .map(|b| {
                (
                    b["version"].as_str().unwrap_or_default().to_string(),
                    b["state"].as_str().unwrap_or_default().to_string(),
                    b["message"].as_str().unwrap_or_default().to_string(),
                )
            })
    }

    /// Waits until the local view shows `name@version` in `state`; returns
    /// its message.
    pub fn wait_bundle(&self, name: &str, version: &str, state: &str) -> String {
        let mut last = None;
        let mut found = String::new();
        let start = std::time::Instant::now();
        while start.elapsed() < CONVERGE {
            last = self.bundle(name);
            if let Some((v, s, m)) = &last
                && v == version
                && s == state
            {
                found = m.clone();
                return found;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {name}@{version} to be {state} (last: {last:?}); agent log:\n{}{found}",
            self.log()
        );
    }

    /// Waits until `status` reports a live connection.
    pub fn wait_connected(&self) {
        wait_until(CONVERGE, "agent connected", || {
            self.status()["connection"]["connected"] == true
        });
    }

    /// Host path of a bundle path inside the root.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Bytes and permission bits of a file in the root.
    pub fn read(&self, p: &str) -> Option<(Vec<u8>, u32)> {
        let path = self.path(p);
        let bytes = std::fs::read(&path).ok()?;
        let mode = std::fs::metadata(&path).ok()?.permissions().mode() & 0o7777;
        Some((bytes, mode))
    }

    /// True if the state dir holds any identity material.
    pub fn has_identity(&self) -> bool {
        ["join.toml", "agent.toml", "pki"]
            .iter()
            .any(|p| self.state_dir.join(p).exists())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- agent {} log ----\n{}", self.name, self.log());
        }
        // Killed before the temp dir goes (fields drop in order, the dir
        // first): a running agent writing into it made its removal fail
        // and left the dir behind. Its log was printed above.
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
    }
}

/// `(version, state, message)` of a bundle on a node, from the server.
pub fn node_bundle(server: &Server, node: &str, bundle: &str) -> Option<(String, String, String)> {
    let list = server.lksctl_json(&["node", "list"]);
    let n = list.as_array()?.iter().find(|n| n["name"] == node)?;
    n["bundles"]
        .as_array()?
        .iter()
        .find(|b| b["name"] == bundle)
        .map(|b| {
            (
                b["version"].as_str().unwrap_or_default().to_string(),
                b["state"].as_str().unwrap_or_default().to_string(),
                b["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Waits until the server sees `bundle@version` in `state` on `node`.
pub fn wait_node_bundle(server: &Server, node: &str, bundle: &str, version: &str, state: &str) -> String {
    let mut last = None;
    let start = std::time::Instant::now();
    while start.elapsed() < CONVERGE {
        last = node_bundle(server, node, bundle);
        if let Some((v, s, m)) = &last
            && v == version
            && s == state
        {
            return m.clone();
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    panic!("timed out waiting for the server to see {bundle}@{version} {state} on {node} (last: {last:?})");
}

/// The server's `connected` flag for `node`.
pub fn node_connected(server: &Server, node: &str) -> bool {
    let list = server.lksctl_json(&["node", "list"]);
    list.as_array()
        .and_then(|a| {
            a.iter()
                .find(|n| n["name"] == node)
                .map(|n| n["connected"] == true)
        })
        .unwrap_or(false)
}

/// Event kinds the server recorded for `node`.
pub fn node_events(server: &Server, node: &str) -> Vec<(String, String)> {
    let v = server.lksctl_json(&["event", "list", "--node", node]);
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["kind"].as_str().unwrap_or_default().to_string(),
                        e["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A file of a bundle being authored.
pub struct BundleFile<'a> {
    pub path: &'a str,
    pub content: &'a [u8],
    pub mode: &'a str,
}

/// Writes a bundle directory (`bundle.toml` plus sources) under `parent`.
/// `extra` is appended to `bundle.toml` verbatim (steps, health, url files).
pub fn write_bundle(
    parent: &Path,
    name: &str,
    version: &str,
    files: &[BundleFile<'_>],
    extra: &str,
) -> PathBuf {
    let d = parent.join(format!("{name}-{version}"));
    std::fs::create_dir_all(&d).expect("create bundle dir");
    let mut toml = format!("name = \"{name}\"\nversion = \"{version}\"\n");
    for (i, f) in files.iter().enumerate() {
        std::fs::write(d.join(format!("f{i}")), f.content).expect("write source");
        toml.push_str(&format!(
            "\n[[file]]\npath = \"{}\"\nsource = \"f{i}\"\nmode = \"{}\"\n",
            f.path, f.mode
        ));
    }
    toml.push('\n');
    toml.push_str(extra);
    std::fs::write(d.join("bundle.toml"), toml).expect("write bundle.toml");
    d
}

/// Publishes and starts a rollout of `name@version` on `cluster`; returns
/// the rollout id.
pub fn publish_and_roll_out(server: &Server, cluster: &str, dir: &Path, sign_key: Option<&Path>) -> String {
    let mut args = vec!["bundle".to_string(), "publish".into(), dir.display().to_string()];
    if let Some(k) = sign_key {
        args.extend(["--sign-key".into(), k.display().to_string()]);
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = server.lksctl_ok(&a).trim().to_string();
    server
        .lksctl_ok(&["rollout", "start", "--cluster", cluster, "--bundle", &id])
        .trim()
        .to_string()
}

/// A tiny HTTP/1.1 mirror on loopback serving fixed bodies by path.
/// Stops when dropped.
pub struct Mirror {
    pub url: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    pub fn start(files: BTreeMap<String, Vec<u8>>) -> Mirror {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind mirror");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [0u8; 4096];
                        let n = s.read(&mut buf).unwrap_or(0);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                        let resp = match files.get(&path) {
                            Some(body) => {
                                let mut r = format!(
                                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                    body.len()
                                )
                                .into_bytes();
                                r.extend_from_slice(body);
                                r
                            }
                            None => {
                                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                                    .to_vec()
                            }
                        };
                        let _ = s.write_all(&resp);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Mirror {
            url,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
