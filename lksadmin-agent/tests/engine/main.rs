//! The apply engine against real files in a temp root, with a fake blob
//! source and real processes (`sh -c` scripts) for steps and health checks.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use lks_proto::manifest::{HealthCheck, Signature, Step};
use lks_proto::sign::SigningKey;
use lks_proto::{BundlePath, BundleState, Digest, FileSpec, Manifest, SignedBundle, pb};
use lksadmin_agent::apply::desired::Desired;
use lksadmin_agent::apply::engine::{Engine, EngineConfig, Reporter, StatusSnapshot};
use lksadmin_agent::apply::report::NodeEvent;
use lksadmin_agent::apply::runner::ProcessRunner;
use lksadmin_agent::apply::source::{BlobSource, BlobStream, SourceError};
use lksadmin_agent::clock::SystemClock;
use lksadmin_agent::config::StateDir;
use tokio::sync::{mpsc, watch};

/// Serves blobs from memory by digest, or by URL for mirror files.
#[derive(Default, Clone)]
struct FakeSource {
    by_digest: Arc<Mutex<HashMap<Digest, Vec<u8>>>>,
    by_url: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    offsets: Arc<Mutex<Vec<u64>>>,
}

impl FakeSource {
    fn add(&self, bytes: &[u8]) {
        self.by_digest
            .lock()
            .unwrap()
            .insert(Digest::of(bytes), bytes.to_vec());
    }
    fn clear(&self) {
        self.by_digest.lock().unwrap().clear();
        self.by_url.lock().unwrap().clear();
    }
}

impl BlobSource for FakeSource {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        Box::pin(async move {
            self.offsets.lock().unwrap().push(offset);
            let bytes = match &file.url {
                Some(u) => self.by_url.lock().unwrap().get(u).cloned(),
                None => self.by_digest.lock().unwrap().get(&file.digest).cloned(),
            }
            .ok_or_else(|| SourceError("offline".into()))?;
            let rest = prost::bytes::Bytes::copy_from_slice(&bytes[(offset as usize).min(bytes.len())..]);
            // Two chunks, to exercise streaming verification.
            let mid = rest.len() / 2;
            let chunks = vec![Ok(rest.slice(..mid)), Ok(rest.slice(mid..))];
            Ok(BlobStream {
                offset,
                chunks: futures::stream::iter(chunks).boxed(),
            })
        })
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
    log: PathBuf,
    source: FakeSource,
    events: mpsc::Receiver<NodeEvent>,
    engine: Engine,
    generation: u64,
    _status: watch::Receiver<StatusSnapshot>,
}

fn fixture_with_keys(trusted: Vec<lks_proto::sign::PublisherKey>) -> Fixture {
    fixture_full(trusted, Arc::new(SystemClock))
}

/// A clock the test moves.
struct TestClock(std::sync::atomic::AtomicI64);

impl lksadmin_agent::clock::Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn fixture_full(
    trusted: Vec<lks_proto::sign::PublisherKey>,
    clock: Arc<dyn lksadmin_agent::clock::Clock>,
) -> Fixture {
    fixture_trust(trusted, clock, None)
}

/// A fixture whose engine requires signed releases of cluster `c1` by a
/// threshold of `trust` (keys, threshold) when given.
fn fixture_trust(
    trusted: Vec<lks_proto::sign::PublisherKey>,
    clock: Arc<dyn lksadmin_agent::clock::Clock>,
    trust: Option<(Vec<lks_proto::sign::PublisherKey>, u32)>,
) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&root).unwrap();
    let log = tmp.path().join("steps.log");
    let source = FakeSource::default();
    let (stx, srx) = watch::channel(StatusSnapshot::default());
    let (etx, erx) = mpsc::channel(64);
    let engine = Engine::open(
        EngineConfig {
            state_dir: StateDir::new(&state),
            root: root.clone(),
            node: "node-1".into(),
            trusted,
            arch: lks_proto::arch::Arch::parse("amd64").ok(),
        },
        Arc::new(source.clone()),
        Arc::new(ProcessRunner),
        clock,
        Reporter::new(stx, etx),
    )
    .unwrap();
    let engine = match trust {
        Some((keys, threshold)) => {
            let path = StateDir::new(&state).trust();
            engine.with_trust(lksadmin_agent::apply::trust::Trust::open(
                &path, "c1", keys, threshold,
            ))
        }
        None => engine,
    };
    Fixture {
        _tmp: tmp,
        root,
        state,
        log,
        source,
        events: erx,
        engine,
        generation: 0,
        _status: srx,
    }
}

fn fixture() -> Fixture {
    fixture_with_keys(vec![])
}

fn sh(name: &str, script: &str) -> Step {
    Step {
        name: name.into(),
        run: vec!["sh".into(), "-c".into(), script.into()],
        timeout: Duration::from_secs(10),
        on_heal: false,
    }
}

fn health(script: &str, retries: u32) -> Option<HealthCheck> {
    Some(HealthCheck {
        run: vec!["sh".into(), "-c".into(), script.into()],
        timeout: Duration::from_secs(5),
        retries,
        interval: Duration::from_millis(10),
    })
}

impl Fixture {
    fn manifest(&self, name: &str, version: &str, files: &[(&str, &[u8], u32)]) -> Manifest {
        for (_, bytes, _) in files {
            self.source.add(bytes);
        }
        Manifest {
            name: name.into(),
            version: version.into(),
            files: files
                .iter()
                .map(|(p, b, mode)| FileSpec {
                    chunks: None,
                    arch: None,
                    path: BundlePath::new(p).unwrap(),
                    digest: Digest::of(b),
                    size: b.len() as u64,
                    mode: *mode,
                    url: None,
                })
                .collect(),
            steps: vec![],
            health: None,
            ..Default::default()
        }
    }

    /// A step that appends "<version> <env>" to the step log.
    fn logging_step(&self) -> Step {
        sh(
            "log",
            &format!(
                "echo \"$LKS_VERSION root=$LKS_ROOT bundle=$LKS_BUNDLE node=$LKS_NODE\" >> {}",
                self.log.display()
            ),
        )
    }

    fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    async fn desire(&mut self, bundles: Vec<SignedBundle>) {
        self.generation += 1;
        let d = pb::DesiredState {
            generation: self.generation,
            bundles: bundles.iter().map(pb::SignedBundle::from).collect(),
            ..Default::default()
        };
        self.engine.accept_desired(&Desired::from(&d)).await.unwrap();
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn read(&self, p: &str) -> Option<(Vec<u8>, u32)> {
        let path = self.path(p);
        let bytes = std::fs::read(&path).ok()?;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        Some((bytes, mode))
    }

    fn status(&self, name: &str) -> (String, BundleState, String) {
        let r = &self.engine.state().bundles[name];
        (r.status.version.clone(), r.status.state, r.status.message.clone())
    }

    fn event_kinds(&mut self) -> Vec<String> {
        let mut out = vec![];
        while let Ok(e) = self.events.try_recv() {
            out.push(e.kind);
        }
        out
    }

    /// Every entry under the root, relative, sorted (to catch stray temps).
    fn tree(&self) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                out.push(p.strip_prefix(base).unwrap().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    walk(base, &p, out);
                }
            }
        }
        let mut out = vec![];
        walk(&self.root, &self.root, &mut out);
        out.sort();
        out
    }
}

fn unsigned(m: Manifest) -> SignedBundle {
    SignedBundle {
        chunks_signature: None,
        manifest: m,
        signature: None,
    }
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The stored desired state message (`desired.pb`).
fn state_of(f: &Fixture) -> pb::DesiredState {
    let path = f.state.join("desired.pb");
    lksadmin_agent::apply::state::parse_desired(&path, &std::fs::read(&path).unwrap()).unwrap()
}

mod apply;
mod arch;
mod desired;
mod fetched;
mod heal;
mod heal_steps;
mod reboot;
mod trust;
