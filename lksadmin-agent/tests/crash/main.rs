//! Crash safety: the real agent binary runs offline against a prepared state
//! dir, is aborted (`LKS_AGENT_FAULT`) at every named transition of an
//! apply, a rollback, a removal and the cache copy after a commit — and
//! killed with SIGKILL at random instants while it moves a 40-file, 40 MiB
//! bundle back and forth — and is restarted. The new version's blobs wait in
//! `cache/fetched/` as a download leaves them, so staging moves them into
//! place and the cache entries are copied from the targets after the
//! commit. Right after the crash every managed file is wholly old or wholly
//! new and every cache entry holds the bytes its name says; after the
//! restart the files are all old or all new, consistent with the recorded
//! state, the installed blobs are cached, and no journal, backup or temp
//! entry is left.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lks_proto::manifest::{HealthCheck, Step};
use lks_proto::{BundlePath, BundleState, Digest, FileSpec, Manifest, SignedBundle, pb};
use lksadmin_agent::apply::cache::Cache;
use lksadmin_agent::apply::desired::Desired;
use lksadmin_agent::apply::state::{LocalState, save_desired};
use lksadmin_agent::config::{AgentConfig, StateDir};
use lksadmin_agent::fault;

const AGENT: &str = env!("CARGO_BIN_EXE_lksadmin-agent");

/// (content, mode) per path; `None`: absent.
type Files = BTreeMap<&'static str, Option<(&'static [u8], u32)>>;

fn v1_files() -> Files {
    BTreeMap::from([
        (
            "/etc/app/a.conf",
            Some((&b"version one of a, long enough to matter\n"[..], 0o644)),
        ),
        ("/etc/app/b.conf", Some((&b"version one of b\n"[..], 0o600))),
        ("/usr/bin/c", None),
    ])
}

fn v2_files() -> Files {
    BTreeMap::from([
        ("/etc/app/a.conf", Some((&b"VERSION TWO OF A\n"[..], 0o640))),
        ("/etc/app/b.conf", None),
        ("/usr/bin/c", Some((&b"#!/bin/sh\necho c\n"[..], 0o755))),
    ])
}

fn nothing() -> Files {
    v1_files().keys().map(|k| (*k, None)).collect()
}

struct Node {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    root: PathBuf,
    log: PathBuf,
}

fn manifest(version: &str, files: &Files, fail_health: bool) -> Manifest {
    Manifest {
        name: "app".into(),
        version: version.into(),
        files: files
            .iter()
            .filter_map(|(p, c)| {
                c.map(|(bytes, mode)| FileSpec {
                    chunks: None,
                    arch: None,
                    path: BundlePath::new(p).unwrap(),
                    digest: Digest::of(bytes),
                    size: bytes.len() as u64,
                    mode,
                    url: None,
                })
            })
            .collect(),
        steps: vec![Step {
            name: "note".into(),
            run: vec![
                "sh".into(),
                "-c".into(),
                "echo \"$LKS_VERSION\" >> \"$LKS_ROOT/steps.log\"".into(),
            ],
            timeout: Duration::from_secs(10),
            on_heal: false,
        }],
        health: Some(HealthCheck {
            run: vec![
                "sh".into(),
                "-c".into(),
                if fail_health { "exit 1" } else { "exit 0" }.into(),
            ],
            timeout: Duration::from_secs(5),
            retries: 2,
            interval: Duration::from_millis(10),
        }),
        ..Default::default()
    }
}

impl Node {
    /// A joined-looking state dir (unreachable server, placeholder
    /// credentials) with every blob already cached.
    fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let dirs = StateDir::new(&state);
        std::fs::create_dir_all(dirs.pki()).unwrap();
        for p in [dirs.node_key(), dirs.node_cert(), dirs.ca_cert()] {
            std::fs::write(p, "placeholder").unwrap();
        }
        let cfg = AgentConfig {
            servers: vec!["https://127.0.0.1:1".into()],
            node_name: "crash-node".into(),
            cluster: "c1".into(),
            root: root.clone(),
            ca_cert_hash: Digest::of(b"").to_string(),
            labels: Default::default(),
            trust_threshold: 0,
        };
        std::fs::write(dirs.config(), cfg.to_toml()).unwrap();
        let log = tmp.path().join("agent.log");
        Node {
            _tmp: tmp,
            state,
            root,
            log,
        }
    }

    /// A copy of this node's directories, to start every case from the
    /// same applied baseline.
    fn clone_dirs(&self) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let root = tmp.path().join("root");
        copy_tree(&self.state, &state);
        copy_tree(&self.root, &root);
        // join.toml names the root: point it at the copy.
        let dirs = StateDir::new(&state);
        let mut cfg = dirs.load_config().unwrap();
        cfg.root = root.clone();
        std::fs::write(dirs.config(), cfg.to_toml()).unwrap();
        let log = tmp.path().join("agent.log");
        Node {
            _tmp: tmp,
            state,
            root,
            log,
        }
    }

    /// Stores a desired state as `run` would have, with its blobs already
    /// downloaded (the agent runs offline here): in the cache, or else in
    /// `cache/fetched/`, verified, as a download leaves them.
    fn desire(&self, generation: u64, bundles: Vec<Manifest>) {
        for files in [v1_files(), v2_files()] {
            for (bytes, _) in files.values().flatten() {
                put_fetched(&self.state, bytes);
            }
        }
        let d = pb::DesiredState {
            generation,
            bundles: bundles
                .into_iter()
                .map(|m| {
                    pb::SignedBundle::from(&SignedBundle {
                        chunks_signature: None,
                        manifest: m,
                        signature: None,
                    })
                })
                .collect(),
            ..Default::default()
        };
        save_desired(&StateDir::new(&self.state).desired(), &Desired::from(&d)).unwrap();
    }

    fn spawn(&self, fault_point: Option<&str>) -> Child {
        self.spawn_env(fault_point, &[])
    }

    fn spawn_env(&self, fault_point: Option<&str>, env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(AGENT);
        cmd.args(["run", "--state-dir"])
            .arg(&self.state)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env("RUST_LOG", "info")
            .env("LKS_LOG_STDERR", "1")
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID")
            .env_remove("NOTIFY_SOCKET")
            .env_remove(fault::ENV);
        if let Some(p) = fault_point {
            cmd.env(fault::ENV, p);
        }
        cmd.envs(env.iter().copied());
        cmd.spawn().unwrap()
    }

    fn local_state(&self) -> LocalState {
        LocalState::load(&StateDir::new(&self.state).state()).unwrap()
    }

    fn bundle_state(&self) -> Option<(String, BundleState)> {
        self.local_state()
            .bundles
            .get("app")
            .map(|r| (r.status.version.clone(), r.status.state))
    }

    fn settled(&self) -> bool {
        !StateDir::new(&self.state).journal().exists()
    }

    /// Runs the agent until `done` holds, then stops it with SIGTERM.
    fn run_until(&self, what: &str, done: impl Fn(&Node) -> bool) {
        let mut child = self.spawn(None);
        let start = Instant::now();
        while !(self.settled() && done(self)) {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("timed out waiting for {what}; log:\n{}", self.log_text());
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "agent exited ({st}) while waiting for {what}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        terminate(&mut child);
    }

    /// Runs the agent armed with `point` and waits for it to abort there.
    fn crash_at(&self, point: &str) {
        let mut child = self.spawn(Some(point));
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(
                    st.signal(),
                    Some(6),
                    "agent should abort at {point}: {st}\n{}",
                    self.log_text()
                );
                return;
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!(
                    "agent never reached fault point {point}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn read(&self, p: &str) -> Option<(Vec<u8>, u32)> {
        let path = self.root.join(p.trim_start_matches('/'));
        let bytes = std::fs::read(&path).ok()?;
        Some((
            bytes,
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        ))
    }

    fn matches(&self, files: &Files) -> bool {
        files
            .iter()
            .all(|(p, want)| self.read(p) == want.map(|(b, m)| (b.to_vec(), m)))
    }

    /// Every managed file is exactly one of the two versions.
    fn assert_each_file_old_or_new(&self, old: &Files, new: &Files, point: &str) {
        for (p, o) in old {
            let got = self.read(p);
            let o = o.map(|(b, m)| (b.to_vec(), m));
            let n = new[p].map(|(b, m)| (b.to_vec(), m));
            assert!(
                got == o || got == n,
                "{point}: {p} is neither old nor new: {got:?}"
            );
        }
    }

    /// Whether every blob of `files` is in the cache.
    fn cached(&self, files: &Files) -> bool {
        let cache = Cache::new(StateDir::new(&self.state).cache());
        files
            .values()
            .flatten()
            .all(|(bytes, _)| cache.contains(&Digest::of(bytes)))
    }

    /// Every cache entry holds exactly the bytes its name says: nothing
    /// unverified is ever there for drift repair to restore. Returns how
    /// many entries there are.
    fn assert_cache_verified(&self, ctx: &str) -> usize {
        let dir = StateDir::new(&self.state).cache().join("sha256");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let (got, _) = Digest::of_file(&e.path()).unwrap();
            assert_eq!(got.hex(), name, "{ctx}: cache entry {name} holds other bytes");
            n += 1;
        }
        n
    }

    /// No temp entries under the root, no backups, no journal.
    fn assert_clean(&self, point: &str) {
        let mut stray = vec![];
        walk(&self.root, &mut |p| {
            if p.file_name().unwrap().to_string_lossy().starts_with(".lks.") {
                stray.push(p.to_path_buf());
            }
        });
        assert!(stray.is_empty(), "{point}: temp entries left: {stray:?}");
        let txn = self.state.join("txn");
        let left = std::fs::read_dir(&txn).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0, "{point}: backups left in {}", txn.display());
        assert!(self.settled(), "{point}: journal left");
    }
}

fn terminate(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("agent did not stop on SIGTERM");
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        f(&p);
        if e.file_type().unwrap().is_dir() {
            walk(&p, f);
        }
    }
}

/// Puts `bytes` into `state`'s `cache/fetched/` as a verified download
/// would (temp, fsync, rename), unless they are cached or there already.
fn put_fetched(state: &Path, bytes: &[u8]) {
    let cache = Cache::new(StateDir::new(state).cache());
    let d = Digest::of(bytes);
    let dst = cache.fetched_path(&d);
    if cache.contains(&d) || dst.exists() {
        return;
    }
    let dir = cache.create_fetched_dir().unwrap();
    let tmp = dir.join(format!(".{}.tmp", d.hex()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::File::open(&tmp).unwrap().sync_all().unwrap();
    std::fs::rename(&tmp, &dst).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// v1 applied (over a pre-existing /etc/app/a.conf), agent stopped.
fn baseline() -> Node {
    let n = Node::new();
    std::fs::create_dir_all(n.root.join("etc/app")).unwrap();
    std::fs::write(n.root.join("etc/app/a.conf"), b"pre-existing a").unwrap();
    n.desire(1, vec![manifest("1", &v1_files(), false)]);
    n.run_until("v1 applied and cached", |n| {
        n.bundle_state() == Some(("1".into(), BundleState::Applied)) && n.cached(&v1_files())
    });
    assert!(n.matches(&v1_files()));
    n.assert_cache_verified("baseline");
    n
}

/// The cache copy after a commit, off the rollout's path.
const CACHE_POINTS: &[&str] = &["cache-copy", "cache-copy-partial", "cache-promoting"];

const APPLY_POINTS: &[&str] = &[
    "staging",
    "staged-partial",
    "backing-up",
    "switching",
    "switch-partial",
    "activating",
    "checking",
];

fn now_ms() -> i64 {
    lksadmin_agent::clock::now_ms()
}

mod kill9;
mod offline;
mod points;
mod trust;
