//! The apply engine against real files in a temp root, with a fake blob
//! source and real processes (`sh -c` scripts) for steps and health checks.

use std::collections::HashMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lks_proto::manifest::{HealthCheck, Signature, Step};
use lks_proto::sign::SigningKey;
use lks_proto::{BundlePath, BundleState, Digest, FileSpec, Manifest, SignedBundle, pb};
use lksadmin_agent::clock::SystemClock;
use lksadmin_agent::config::StateDir;
use lksadmin_agent::engine::{Engine, EngineConfig, Reporter, StatusSnapshot};
use lksadmin_agent::runner::ProcessRunner;
use lksadmin_agent::source::{BlobSource, BlobStream, BoxFuture, SourceError};
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
            let rest = bytes[(offset as usize).min(bytes.len())..].to_vec();
            // Two chunks, to exercise streaming verification.
            let mid = rest.len() / 2;
            let chunks = vec![Ok(rest[..mid].to_vec()), Ok(rest[mid..].to_vec())];
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
    events: mpsc::Receiver<pb::NodeEvent>,
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
        self.engine.accept_desired(&d).await.unwrap();
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

#[tokio::test]
async fn apply_writes_exact_bytes_and_modes_and_runs_steps_with_env() {
    let mut f = fixture();
    let mut m = f.manifest(
        "kubelet",
        "1.0",
        &[
            ("/etc/kubernetes/kubelet.conf", b"conf-v1\n", 0o600),
            ("/usr/local/bin/kubelet", b"\x7fELF-bin", 0o755),
        ],
    );
    m.steps = vec![f.logging_step()];
    m.health = health("exit 0", 1);
    f.desire(vec![unsigned(m)]).await;

    assert_eq!(
        f.read("/etc/kubernetes/kubelet.conf"),
        Some((b"conf-v1\n".to_vec(), 0o600))
    );
    assert_eq!(
        f.read("/usr/local/bin/kubelet"),
        Some((b"\x7fELF-bin".to_vec(), 0o755))
    );
    assert_eq!(f.status("kubelet").1, BundleState::Applied);
    let root = std::path::absolute(&f.root).unwrap();
    assert_eq!(
        f.log_lines(),
        vec![format!("1.0 root={} bundle=kubelet node=node-1", root.display())]
    );
    assert!(f.event_kinds().contains(&"applied".to_string()));
    assert!(
        !f.tree().iter().any(|p| p.contains(".lks.")),
        "no temp entries left: {:?}",
        f.tree()
    );
    assert!(!f.state.join("journal.json").exists());

    // Same desired state again: nothing to do, steps do not run again.
    let again = f.engine.state().bundles["kubelet"].installed.clone().unwrap();
    f.desire(vec![unsigned(again)]).await;
    assert_eq!(f.log_lines().len(), 1);
}

#[tokio::test]
async fn failing_step_rolls_back_to_exact_previous_bytes_and_modes() {
    let mut f = fixture();
    write_file(&f.path("/etc/app/keep.conf"), b"pre-existing", 0o640);
    let mut v1 = f.manifest(
        "app",
        "1",
        &[
            ("/etc/app/keep.conf", b"v1 keep", 0o600),
            ("/etc/app/old.conf", b"v1 old", 0o644),
        ],
    );
    v1.steps = vec![f.logging_step()];
    f.desire(vec![unsigned(v1)]).await;
    assert_eq!(f.status("app").1, BundleState::Applied);
    // Someone changed the mode since: the rollback restores what was there.
    std::fs::set_permissions(
        f.path("/etc/app/old.conf"),
        std::fs::Permissions::from_mode(0o604),
    )
    .unwrap();

    let mut v2 = f.manifest(
        "app",
        "2",
        &[
            ("/etc/app/keep.conf", b"v2 keep", 0o644),
            ("/etc/app/new.conf", b"v2 new", 0o600),
        ],
    );
    v2.steps = vec![
        f.logging_step(),
        sh(
            "restart app",
            "echo first >&2; echo 'app failed to start' >&2; exit 3",
        ),
    ];
    f.desire(vec![unsigned(v2)]).await;

    assert_eq!(f.read("/etc/app/keep.conf"), Some((b"v1 keep".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/app/old.conf"), Some((b"v1 old".to_vec(), 0o604)));
    assert_eq!(f.read("/etc/app/new.conf"), None, "file added by v2 removed");
    let (version, state, message) = f.status("app");
    assert_eq!((version.as_str(), state), ("2", BundleState::RolledBack));
    assert!(message.contains("\"restart app\""), "{message}");
    assert!(message.contains("status 3"), "{message}");
    assert!(message.contains("app failed to start"), "{message}");
    // v1's step ran on install and again after the rollback; v2's log step ran once.
    let versions: Vec<String> = f
        .log_lines()
        .iter()
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(versions, ["1", "2", "1"]);
    assert_eq!(f.engine.installed()["app"], "1");
    assert!(f.event_kinds().contains(&"rolled_back".to_string()));
    assert!(!f.tree().iter().any(|p| p.contains(".lks.")), "{:?}", f.tree());

    // The failed version is not retried for the same desired state ...
    let before = f.log_lines().len();
    f.engine.reconcile(&state_of(&f)).await.unwrap();
    assert_eq!(f.log_lines().len(), before);
}

fn state_of(f: &Fixture) -> pb::DesiredState {
    lksadmin_agent::state::load_desired(&f.state.join("desired.pb"))
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn failing_health_check_rolls_back_first_install_to_nothing() {
    let mut f = fixture();
    write_file(&f.path("/etc/pre"), b"was here", 0o600);
    let mut m = f.manifest(
        "svc",
        "1",
        &[("/etc/pre", b"new", 0o644), ("/etc/added", b"added", 0o644)],
    );
    m.health = health("echo not healthy >&2; exit 1", 3);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.read("/etc/pre"), Some((b"was here".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/added"), None);
    let (_, state, message) = f.status("svc");
    assert_eq!(state, BundleState::RolledBack);
    assert!(message.contains("health check failed 3 time(s)"), "{message}");
    assert!(message.contains("not healthy"), "{message}");
}

#[tokio::test]
async fn removal_restores_the_file_that_existed_before() {
    let mut f = fixture();
    write_file(&f.path("/etc/motd"), b"original motd", 0o640);
    let v1 = f.manifest(
        "motd",
        "1",
        &[
            ("/etc/motd", b"managed v1", 0o644),
            ("/etc/motd.d/extra", b"x", 0o644),
        ],
    );
    f.desire(vec![unsigned(v1)]).await;
    // An upgrade keeps the original for the bundle's lifetime.
    let v2 = f.manifest("motd", "2", &[("/etc/motd", b"managed v2", 0o644)]);
    f.desire(vec![unsigned(v2)]).await;
    assert_eq!(f.read("/etc/motd"), Some((b"managed v2".to_vec(), 0o644)));
    assert_eq!(f.read("/etc/motd.d/extra"), None, "file dropped by v2 removed");
    f.desire(vec![]).await;
    assert_eq!(f.read("/etc/motd"), Some((b"original motd".to_vec(), 0o640)));
    assert!(f.engine.state().bundles.is_empty());
    assert!(f.event_kinds().contains(&"removed".to_string()));
    // Originals are dropped with the bundle.
    let left = std::fs::read_dir(f.state.join("originals"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn several_bundles_and_a_path_conflict_refuses_the_newcomer() {
    let mut f = fixture();
    let a = f.manifest("a", "1", &[("/etc/shared/conf", b"a", 0o644)]);
    let b = f.manifest("b", "1", &[("/etc/b", b"b", 0o644)]);
    f.desire(vec![unsigned(a.clone()), unsigned(b.clone())]).await;
    assert_eq!(f.status("a").1, BundleState::Applied);
    assert_eq!(f.status("b").1, BundleState::Applied);

    let same = f.manifest("c", "1", &[("/etc/shared/conf", b"c", 0o600)]);
    let nested = f.manifest("d", "1", &[("/etc/shared/conf/inner", b"d", 0o600)]);
    f.desire(vec![
        unsigned(a.clone()),
        unsigned(b.clone()),
        unsigned(same),
        unsigned(nested),
    ])
    .await;
    let (_, state, message) = f.status("c");
    assert_eq!(state, BundleState::Failed);
    assert!(
        message.contains("/etc/shared/conf") && message.contains("bundle a@1"),
        "{message}"
    );
    assert_eq!(f.status("d").1, BundleState::Failed);
    assert_eq!(f.read("/etc/shared/conf"), Some((b"a".to_vec(), 0o644)));
}

#[tokio::test]
async fn unsigned_or_foreign_signed_bundles_are_refused_when_a_key_is_trusted() {
    let key = SigningKey::generate();
    let other = SigningKey::generate();
    let mut f = fixture_with_keys(vec![key.public()]);
    let m = f.manifest("sec", "1", &[("/etc/sec", b"secret", 0o600)]);
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("sec");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("not signed"), "{message}");
    assert!(f.tree().is_empty(), "nothing written: {:?}", f.tree());

    let foreign = SignedBundle {
        chunks_signature: None,
        signature: Some(other.sign(&m)),
        manifest: m.clone(),
    };
    f.desire(vec![foreign]).await;
    let (_, state, message) = f.status("sec");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("not a trusted publisher key"), "{message}");
    assert!(f.tree().is_empty());

    let mut tampered_sig: Signature = key.sign(&m);
    tampered_sig.signature[0] ^= 1;
    f.desire(vec![SignedBundle {
        chunks_signature: None,
        signature: Some(tampered_sig),
        manifest: m.clone(),
    }])
    .await;
    assert_eq!(f.status("sec").1, BundleState::Failed);
    assert!(f.tree().is_empty());

    let mut m2 = m.clone();
    m2.version = "2".into();
    f.desire(vec![SignedBundle {
        chunks_signature: None,
        signature: Some(key.sign(&m2)),
        manifest: m2,
    }])
    .await;
    assert_eq!(f.status("sec").1, BundleState::Applied);
    assert_eq!(f.read("/etc/sec"), Some((b"secret".to_vec(), 0o600)));
}

#[tokio::test]
async fn symlink_planted_in_root_pointing_outside_fails_and_writes_nothing_outside() {
    let mut f = fixture();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(f.path("/etc")).unwrap();
    symlink(outside.path(), f.path("/etc/kubernetes")).unwrap();
    let m = f.manifest(
        "kube",
        "1",
        &[
            ("/etc/ok.conf", b"fine", 0o644),
            ("/etc/kubernetes/pki/ca.crt", b"ca", 0o644),
        ],
    );
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("kube");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("leave the node root"), "{message}");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing written outside"
    );
    assert_eq!(f.read("/etc/ok.conf"), None, "nothing written inside either");
}

#[tokio::test]
async fn a_parent_swapped_for_an_outside_symlink_before_rollback_does_not_wedge_the_engine() {
    let mut f = fixture();
    let outside = tempfile::tempdir().unwrap();
    let moved = tempfile::tempdir().unwrap();
    let mut m = f.manifest(
        "sw",
        "1",
        &[("/etc/ok.conf", b"fine", 0o644), ("/etc/sw/x", b"x", 0o644)],
    );
    // Between the switch and the rollback the directory of a switched file
    // becomes a symlink to a directory outside the root.
    m.steps = vec![sh(
        "swap and fail",
        &format!(
            "mv \"$LKS_ROOT/etc/sw\" {moved}/sw && ln -s {outside} \"$LKS_ROOT/etc/sw\" && exit 1",
            moved = moved.path().display(),
            outside = outside.path().display()
        ),
    )];
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("sw");
    assert_eq!(state, BundleState::RolledBack, "{message}");
    assert!(
        message.contains("not restored, left as found: /etc/sw/x") && message.contains("leave the node root"),
        "{message}"
    );
    assert_eq!(f.read("/etc/ok.conf"), None, "the reachable file is rolled back");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing removed or written outside"
    );

    // The journal is closed: the next bundle applies.
    let other = f.manifest("other", "1", &[("/etc/other.conf", b"other", 0o644)]);
    f.desire(vec![unsigned(other)]).await;
    assert_eq!(f.status("other").1, BundleState::Applied);
    assert_eq!(f.read("/etc/other.conf"), Some((b"other".to_vec(), 0o644)));
}

#[tokio::test]
async fn checksum_mismatch_from_a_mirror_fails_naming_file_and_url() {
    let mut f = fixture();
    let good = b"the real binary";
    let mut m = f.manifest("bin", "1", &[]);
    m.files.push(FileSpec {
        chunks: None,
        arch: None,
        path: BundlePath::new("/usr/bin/tool").unwrap(),
        digest: Digest::of(good),
        size: good.len() as u64,
        mode: 0o755,
        url: Some("http://mirror.test/tool".into()),
    });
    f.source
        .by_url
        .lock()
        .unwrap()
        .insert("http://mirror.test/tool".into(), b"the evil binary".to_vec());
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("bin");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("/usr/bin/tool"), "{message}");
    assert!(message.contains("http://mirror.test/tool"), "{message}");
    assert!(message.contains("checksum mismatch"), "{message}");
    assert!(f.tree().is_empty(), "{:?}", f.tree());
    assert!(!f.engine.cache().contains(&Digest::of(good)));

    // A longer body is cut off as soon as it passes the declared size.
    let mut m2 = m.clone();
    m2.version = "2".into();
    f.source.by_url.lock().unwrap().insert(
        "http://mirror.test/tool".into(),
        b"the real binary plus more".to_vec(),
    );
    f.desire(vec![unsigned(m2)]).await;
    let (_, state, message) = f.status("bin");
    assert_eq!(state, BundleState::Failed);
    assert!(message.contains("more than the declared"), "{message}");
}

#[tokio::test]
async fn a_cached_blob_corrupted_on_disk_never_reaches_the_target() {
    let mut f = fixture();
    let good = b"kubelet, the real one".to_vec();
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    // Verified once, then changed on disk (same size): staging hashes it
    // again while its writer thread writes the staged copy.
    let d = Digest::of(&good);
    let cache = f.state.join("cache/sha256");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join(d.hex()), b"kubelet, the evil one").unwrap();
    f.desire(vec![unsigned(m.clone())]).await;
    let (_, state, message) = f.status("k");
    assert_ne!(state, BundleState::Applied, "{message}");
    assert!(message.contains("/usr/bin/kubelet"), "{message}");
    assert!(
        !f.tree()
            .iter()
            .any(|p| p.ends_with("kubelet") || p.contains(".lks.")),
        "nothing written beside the target: {:?}",
        f.tree()
    );
    assert!(!f.engine.cache().contains(&d), "the corrupt entry is dropped");

    // The next version with the same bytes fetches them again and applies.
    let mut m2 = m;
    m2.version = "2".into();
    f.desire(vec![unsigned(m2)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good, 0o755)));
}

#[tokio::test]
async fn blob_source_offline_leaves_bundle_pending_then_applies() {
    let mut f = fixture();
    let m = f.manifest("late", "1", &[("/etc/late", b"late bytes", 0o644)]);
    f.source.clear();
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("late");
    assert_eq!(state, BundleState::Pending);
    assert!(message.contains("offline"), "{message}");
    assert!(f.tree().is_empty());
    f.source.add(b"late bytes");
    f.engine.reconcile(&state_of(&f)).await.unwrap();
    assert_eq!(f.status("late").1, BundleState::Applied);
}

#[tokio::test]
async fn partial_download_resumes_at_its_offset() {
    let f = fixture();
    let bytes = b"0123456789abcdef".to_vec();
    f.source.add(&bytes);
    let d = Digest::of(&bytes);
    let partial = f.state.join("cache/partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join(d.hex()), &bytes[..6]).unwrap();
    let spec = FileSpec {
        chunks: None,
        arch: None,
        path: BundlePath::new("/x").unwrap(),
        digest: d,
        size: bytes.len() as u64,
        mode: 0o644,
        url: None,
    };
    f.engine.cache().ensure(&spec, &f.source).await.unwrap();
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![6]);
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        bytes
    );
}

#[tokio::test]
async fn heal_restores_drifted_and_deleted_files_offline_and_reports() {
    let mut f = fixture();
    let mut m = f.manifest(
        "h",
        "1",
        &[
            ("/etc/h/a", b"alpha", 0o600),
            ("/etc/h/b", b"beta", 0o755),
            ("/etc/h/c", b"gamma", 0o644),
        ],
    );
    m.health = health(&format!("echo healthy >> {}", f.log.display()), 1);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("h").1, BundleState::Applied);
    f.event_kinds();
    assert_eq!(
        f.engine.heal().await.unwrap().repaired.len(),
        0,
        "nothing drifted yet"
    );

    f.source.clear(); // offline: the cache is enough
    std::fs::write(f.path("/etc/h/a"), b"edited").unwrap();
    std::fs::set_permissions(f.path("/etc/h/b"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::remove_file(f.path("/etc/h/c")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 3, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(f.read("/etc/h/a"), Some((b"alpha".to_vec(), 0o600)));
    assert_eq!(f.read("/etc/h/b"), Some((b"beta".to_vec(), 0o755)));
    assert_eq!(f.read("/etc/h/c"), Some((b"gamma".to_vec(), 0o644)));
    assert_eq!(f.event_kinds(), vec!["repaired"]);
    let last = f.engine.state().last_repair.clone().unwrap();
    assert!(
        last.message.contains("/etc/h/a (content changed)"),
        "{}",
        last.message
    );
    assert!(
        last.message.contains("/etc/h/b (mode changed)"),
        "{}",
        last.message
    );
    assert!(last.message.contains("/etc/h/c (missing)"), "{}", last.message);
    assert!(last.message.contains("health check passed"), "{}", last.message);
    assert_eq!(
        f.log_lines().len(),
        2,
        "health check ran on apply and after the repair"
    );
}

/// An idle heal pass proves unchanged files by their inode (a stat), reads
/// only what changed, and hashes everything once an hour regardless.
#[tokio::test]
async fn heal_reads_only_what_changed_and_everything_hourly() {
    let clock = Arc::new(TestClock(std::sync::atomic::AtomicI64::new(1_000_000)));
    let mut f = fixture_full(vec![], clock.clone());
    let m = f.manifest(
        "h",
        "1",
        &[
            ("/etc/h/a", b"alpha", 0o644),
            ("/etc/h/b", b"bravo", 0o644),
            ("/etc/h/c", b"charl", 0o644),
        ],
    );
    f.desire(vec![unsigned(m)]).await;
    // The engine wrote them, verified: nothing to read until they change.
    let first = f.engine.heal().await.unwrap();
    assert_eq!((first.hashed, first.repaired.len()), (0, 0), "{first:?}");

    // Same size, other bytes: the inode changed, so it is read and repaired.
    std::fs::write(f.path("/etc/h/a"), b"ALPHA").unwrap();
    let r = f.engine.heal().await.unwrap();
    assert_eq!(r.repaired, vec!["/etc/h/a (content changed)".to_string()]);
    assert_eq!(f.read("/etc/h/a"), Some((b"alpha".to_vec(), 0o644)));
    // The same bytes written again: read once, nothing to repair.
    std::fs::write(f.path("/etc/h/b"), b"bravo").unwrap();
    let r = f.engine.heal().await.unwrap();
    assert!(r.repaired.is_empty(), "{r:?}");
    assert!(
        r.hashed >= 1 && r.hashed <= 2,
        "b (and the repaired a) read: {r:?}"
    );
    assert_eq!(f.engine.heal().await.unwrap().hashed, 0);

    // An hour later every file is read again.
    clock.0.fetch_add(3_600_000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(f.engine.heal().await.unwrap().hashed, 3);
    assert_eq!(f.engine.heal().await.unwrap().hashed, 0);
}

#[tokio::test]
async fn an_upgrade_reads_the_old_file_only_when_its_inode_changed() {
    let mut f = fixture();
    let v = |f: &Fixture, version: &str, bytes: &'static [u8]| {
        f.manifest("big", version, &[("/usr/bin/big", bytes, 0o755)])
    };
    f.desire(vec![unsigned(v(&f, "1", b"version one"))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);

    // The file v1 left, as the engine wrote it: proved by its inode.
    f.desire(vec![unsigned(v(&f, "2", b"version two"))]).await;
    assert_eq!(f.status("big").1, BundleState::Applied);
    assert_eq!(f.engine.backups_read(), 0);

    // The same bytes written again (a new ctime): read once, and it is
    // still backed up by the cached blob.
    std::fs::write(f.path("/usr/bin/big"), b"version two").unwrap();
    let mut v3 = v(&f, "3", b"version 333");
    v3.steps = vec![sh("fail", "exit 1")];
    f.desire(vec![unsigned(v3)]).await;
    assert_eq!(f.engine.backups_read(), 1);
    assert_eq!(f.status("big").1, BundleState::RolledBack);
    assert_eq!(f.read("/usr/bin/big"), Some((b"version two".to_vec(), 0o755)));

    // Drifted bytes of the same size are read, found different and copied:
    // the rollback puts back exactly what was there, not the cached blob.
    std::fs::write(f.path("/usr/bin/big"), b"VERSION TWO").unwrap();
    let mut v4 = v(&f, "4", b"version 444");
    v4.steps = vec![sh("fail", "exit 1")];
    f.desire(vec![unsigned(v4)]).await;
    assert_eq!(f.engine.backups_read(), 2);
    assert_eq!(f.status("big").1, BundleState::RolledBack);
    assert_eq!(f.read("/usr/bin/big"), Some((b"VERSION TWO".to_vec(), 0o755)));
}

/// A kill after the journal closed but before the backups were deleted
/// leaves them; the next reconcile removes them.
#[tokio::test]
async fn backups_of_a_finished_transaction_left_by_a_kill_are_removed() {
    let mut f = fixture();
    let stale = f.state.join("txn/41");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("0"), b"a copy of a replaced file").unwrap();
    let m = f.manifest("s", "1", &[("/etc/s", b"s", 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("s").1, BundleState::Applied);
    assert!(!stale.exists(), "stale backups still there");
}

#[tokio::test]
async fn state_survives_reopening_the_engine() {
    let mut f = fixture();
    let m = f.manifest("p", "1", &[("/etc/p", b"persist", 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    let reopened = Engine::open(
        EngineConfig {
            state_dir: StateDir::new(&f.state),
            root: f.root.clone(),
            node: "node-1".into(),
            trusted: vec![],
            arch: lks_proto::arch::Arch::host(),
        },
        Arc::new(FakeSource::default()),
        Arc::new(ProcessRunner),
        Arc::new(SystemClock),
        Reporter::default(),
    )
    .unwrap();
    assert_eq!(reopened.installed()["p"], "1");
    assert_eq!(reopened.snapshot().generation, 1);
}

#[tokio::test]
async fn a_blob_just_fetched_is_staged_without_hashing_it_again_unless_its_inode_changed() {
    let mut f = fixture();
    let good = b"kubelet, fetched and verified".to_vec();
    let d = Digest::of(&good);
    // Fetched (verified as it streamed), stored, then staged: the staging
    // copy does not hash it a second time.
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good.clone(), 0o755)));
    assert_eq!(f.engine.stages_unhashed(), 1);

    // The cached blob changed on disk after that (same size, new ctime):
    // another bundle wanting the same bytes stages it hashing it, and the
    // corruption is caught before anything reaches its target.
    let blob = f.state.join("cache/sha256").join(d.hex());
    std::fs::write(&blob, b"kubelet, changed on the disk!").unwrap();
    assert_eq!(std::fs::metadata(&blob).unwrap().len(), good.len() as u64);
    let m2 = f.manifest("k2", "1", &[("/opt/k2/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m.clone()), unsigned(m2)]).await;
    let (_, state, message) = f.status("k2");
    assert_ne!(state, BundleState::Applied, "{message}");
    assert!(message.contains("/opt/k2/kubelet"), "{message}");
    assert_eq!(f.engine.stages_unhashed(), 1);
    assert!(f.read("/opt/k2/kubelet").is_none());
    // The corrupt entry was dropped; the end of the reconcile copied the
    // blob into the cache again from k's intact target, verified.
    assert_eq!(
        std::fs::read(&blob).unwrap(),
        good,
        "the corrupt entry is dropped"
    );
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Issue [write-once]: the download is moved into place (no staged copy),
/// and the cache entry is made after the commit from the target, verified.
#[tokio::test]
async fn a_fresh_install_moves_the_download_into_place_and_caches_it_after_the_commit() {
    let mut f = fixture();
    let good = b"kubelet bytes, written once on the rollout's path".to_vec();
    let d = Digest::of(&good);
    let m = f.manifest("k", "1", &[("/usr/bin/kubelet", &good, 0o755)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good.clone(), 0o755)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched once");
    assert_eq!(f.engine.stages_unhashed(), 1, "moved, not copied");
    assert!(
        dir_names(&f.state.join("cache/fetched")).is_empty(),
        "the download was moved"
    );
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        good
    );
    assert!(dir_names(&f.state.join("cache/partial")).is_empty());
    assert_eq!(f.tree(), vec!["usr", "usr/bin", "usr/bin/kubelet"]);

    // The cache entry is its own inode: editing the target in place does
    // not touch it, and an offline heal restores from it.
    f.source.clear();
    std::fs::write(f.path("/usr/bin/kubelet"), b"edited in place").unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/usr/bin/kubelet"), Some((good, 0o755)));
}

/// A target that drifted between its switch and its cache copy is never
/// cached: the copy is hashed and dropped; offline, repair says it failed
/// rather than restore anything unverified; online, it fetches.
#[tokio::test]
async fn a_target_that_drifted_before_its_cache_copy_is_not_cached() {
    let mut f = fixture();
    let good = b"the bytes the manifest names".to_vec();
    let d = Digest::of(&good);
    let m = f.manifest("k", "1", &[("/etc/k.conf", &good, 0o644)]);
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("k").1, BundleState::Applied);
    // As if the agent was killed before the copy, and the file was edited
    // (same size) before it ran again.
    std::fs::remove_file(f.state.join("cache/sha256").join(d.hex())).unwrap();
    std::fs::write(f.path("/etc/k.conf"), b"THE BYTES THE MANIFEST NAMES").unwrap();
    assert_eq!(f.engine.cache_copies(), 1, "the copy after the commit");
    f.engine.fill_cache();
    assert_eq!(f.engine.cache_copies(), 2);
    assert!(!f.engine.cache().contains(&d), "drifted bytes were cached");
    assert!(
        dir_names(&f.state.join("cache/partial")).is_empty(),
        "copy left behind"
    );

    f.source.clear();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 0, "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(!f.engine.cache().contains(&d));
    assert_eq!(
        f.engine.cache_copies(),
        2,
        "a file whose copy did not match is not read again while unchanged"
    );
    assert_eq!(
        f.read("/etc/k.conf"),
        Some((b"THE BYTES THE MANIFEST NAMES".to_vec(), 0o644)),
        "nothing unverified restored"
    );

    f.source.add(&good);
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/etc/k.conf"), Some((good.clone(), 0o644)));
    assert_eq!(
        std::fs::read(f.state.join("cache/sha256").join(d.hex())).unwrap(),
        good
    );
}

/// Two files of one bundle with the same bytes: the download goes to the
/// first, the second is copied from the first's staged entry, verified.
#[tokio::test]
async fn two_files_with_the_same_bytes_are_both_installed_from_one_download() {
    let mut f = fixture();
    let same = b"one blob, two paths".to_vec();
    let m = f.manifest(
        "twin",
        "1",
        &[("/etc/a/one", &same, 0o644), ("/etc/b/two", &same, 0o600)],
    );
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("twin").1, BundleState::Applied, "{}", f.status("twin").2);
    assert_eq!(f.read("/etc/a/one"), Some((same.clone(), 0o644)));
    assert_eq!(f.read("/etc/b/two"), Some((same.clone(), 0o600)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched once");
    assert!(!f.tree().iter().any(|p| p.contains(".lks.")), "{:?}", f.tree());

    // The first path drifted before the cache copy: the copy comes from
    // the second, intact one.
    let d = Digest::of(&same);
    let blob = f.state.join("cache/sha256").join(d.hex());
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(f.path("/etc/a/one"), b"ONE BLOB, TWO PATHS").unwrap();
    f.engine.fill_cache();
    assert_eq!(std::fs::read(&blob).unwrap(), same);
}

/// A rolled-back version's bytes are given back to `fetched/`: trying it
/// again (`lksctl node retry`) needs no download, and they are hashed
/// before they are used again.
#[tokio::test]
async fn a_rolled_back_version_is_tried_again_without_a_new_download() {
    let mut f = fixture();
    let v1 = f.manifest("svc", "1", &[("/etc/svc.conf", b"one", 0o644)]);
    f.desire(vec![unsigned(v1)]).await;
    let flag = f.root.join("healthy");
    let mut v2 = f.manifest(
        "svc",
        "2",
        &[
            ("/etc/svc.conf", b"two, and longer", 0o644),
            ("/etc/svc.d/new", b"new file", 0o644),
        ],
    );
    v2.health = health(&format!("test -e {}", flag.display()), 1);
    f.desire(vec![unsigned(v2.clone())]).await;
    assert_eq!(f.status("svc").1, BundleState::RolledBack);
    assert_eq!(f.read("/etc/svc.conf"), Some((b"one".to_vec(), 0o644)));
    assert_eq!(f.read("/etc/svc.d/new"), None);
    let fetched = dir_names(&f.state.join("cache/fetched"));
    assert_eq!(fetched.len(), 2, "{fetched:?}");

    f.source.clear();
    std::fs::write(&flag, b"").unwrap();
    let mut d = state_of(&f);
    d.generation += 1;
    d.retry.insert("svc".into(), d.generation);
    f.engine.accept_desired(&d).await.unwrap();
    assert_eq!(f.status("svc").1, BundleState::Applied, "{}", f.status("svc").2);
    assert_eq!(
        f.read("/etc/svc.conf"),
        Some((b"two, and longer".to_vec(), 0o644))
    );
    assert_eq!(f.read("/etc/svc.d/new"), Some((b"new file".to_vec(), 0o644)));
    assert!(dir_names(&f.state.join("cache/fetched")).is_empty());
}

/// A download left in `fetched/` that does not match (damaged on disk, or
/// left by an earlier process) is hashed before use, dropped, fetched again.
#[tokio::test]
async fn a_damaged_fetched_blob_is_dropped_and_fetched_again() {
    let mut f = fixture();
    let good = b"the real thing".to_vec();
    let d = Digest::of(&good);
    let dir = f.state.join("cache/fetched");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(d.hex()), b"the fake thing").unwrap();
    let m = f.manifest("r", "1", &[("/etc/r", &good, 0o644)]);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(f.status("r").1, BundleState::Applied, "{}", f.status("r").2);
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "fetched again");
    assert_eq!(f.read("/etc/r"), Some((good, 0o644)));
}

/// Two bundles applied in one reconcile with the same bytes: the second
/// copies them from the first's target (verified) instead of downloading
/// them again, though the first's cache copy comes only after the reconcile.
#[tokio::test]
async fn a_second_bundle_with_the_same_bytes_takes_them_from_the_first_not_the_network() {
    let mut f = fixture();
    let same = b"bytes shared by two bundles".to_vec();
    let a = f.manifest("a", "1", &[("/opt/a/bin", &same, 0o755)]);
    let b = f.manifest("b", "1", &[("/opt/b/bin", &same, 0o755)]);
    f.desire(vec![unsigned(a), unsigned(b)]).await;
    assert_eq!(f.status("a").1, BundleState::Applied);
    assert_eq!(f.status("b").1, BundleState::Applied, "{}", f.status("b").2);
    assert_eq!(f.read("/opt/b/bin"), Some((same.clone(), 0o755)));
    assert_eq!(*f.source.offsets.lock().unwrap(), vec![0], "downloaded once");
    assert_eq!(f.engine.cache_copies(), 1, "copied once, from a's target");
}

fn elf_for(machine: u16) -> Vec<u8> {
    let mut h = lks_proto::elf::fixture_header(machine, 2);
    h.resize(128, 0);
    h
}

/// `m` with the file at `path` in a second variant: the one given for
/// amd64, `arm` for arm64.
fn with_arm_variant(f: &Fixture, mut m: Manifest, path: &str, arm: &[u8]) -> Manifest {
    use lks_proto::arch::Arch;
    f.source.add(arm);
    let i = m.files.iter().position(|x| x.path.as_str() == path).unwrap();
    let mut v = m.files[i].clone();
    m.files[i].arch = Some(Arch::parse("amd64").unwrap());
    v.arch = Some(Arch::parse("arm64").unwrap());
    v.digest = Digest::of(arm);
    v.size = arm.len() as u64;
    m.files.push(v);
    m.validate().unwrap();
    m
}

#[tokio::test]
async fn a_multi_arch_bundle_installs_this_nodes_variant_only() {
    let mut f = fixture();
    let amd = elf_for(62);
    let arm = elf_for(183);
    let m = f.manifest(
        "kubelet",
        "1",
        &[
            ("/usr/bin/kubelet", &amd, 0o755),
            ("/etc/kubelet.conf", b"conf", 0o644),
        ],
    );
    let m = with_arm_variant(&f, m, "/usr/bin/kubelet", &arm);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(
        f.status("kubelet").1,
        BundleState::Applied,
        "{:?}",
        f.status("kubelet")
    );
    assert_eq!(f.read("/usr/bin/kubelet").unwrap(), (amd.clone(), 0o755));
    assert_eq!(f.read("/etc/kubelet.conf").unwrap().0, b"conf");
    // What the node records is its own variant: drift repair and rollback
    // know only those files.
    let installed = f.engine.state().bundles["kubelet"].installed.clone().unwrap();
    assert_eq!(installed.files.len(), 2);
    assert!(installed.files.iter().all(|x| x.digest != Digest::of(&arm)));
    std::fs::remove_file(f.path("/usr/bin/kubelet")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/usr/bin/kubelet").unwrap().0, amd);
    // The same desired state again changes nothing.
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("kubelet").1, BundleState::Applied);
}

#[tokio::test]
async fn a_bundle_without_this_nodes_architecture_is_refused_and_nothing_written() {
    let mut f = fixture();
    let mut m = f.manifest("kubelet", "2", &[("/usr/bin/kubelet", &elf_for(183), 0o755)]);
    m.files[0].arch = Some(lks_proto::arch::Arch::parse("arm64").unwrap());
    f.desire(vec![unsigned(m)]).await;
    let (v, state, message) = f.status("kubelet");
    assert_eq!((v.as_str(), state), ("2", BundleState::Failed));
    assert_eq!(
        message,
        "refused: kubelet@2 has no files for architecture amd64 (it is for arm64)"
    );
    assert!(f.tree().is_empty(), "{:?}", f.tree());
}

#[tokio::test]
async fn an_executable_labelled_for_this_node_but_built_for_another_is_refused() {
    let mut f = fixture();
    // The amd64 variant holds an arm64 executable (a mirror URL publish
    // could not check): the node reads the header before staging.
    let m = f.manifest("kubelet", "3", &[("/usr/bin/kubelet", &elf_for(183), 0o755)]);
    let m = with_arm_variant(&f, m, "/usr/bin/kubelet", &elf_for(183));
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("kubelet");
    assert_eq!(state, BundleState::Failed);
    assert_eq!(
        message,
        "refused: /usr/bin/kubelet is an executable for aarch64 (arm64), and this node is amd64"
    );
    assert!(f.tree().is_empty(), "{:?}", f.tree());
}
