//! The apply engine: converges the node root on the desired state, one
//! journalled transaction per bundle change, and heals drift.
//!
//! An apply: fetch missing blobs (verified while streaming, fsynced) into
//! `cache/fetched/` → stage a temp entry next to each target (the fetched
//! file moved there by rename, its mode set; a blob already cached is
//! copied, verified again, fsynced) → back up what is there into the state
//! dir → switch by rename (fsync the directory) → run the steps → health
//! check → commit → report; then, off the rollout's path, copy each new
//! blob from its target into the cache (hashed while copying, kept only if
//! it matches: [`Engine::fill_cache`]). A
//! failure after the switch restores the backups exactly, removes files the
//! new version added, re-runs the previous version's steps and reports
//! `rolled_back`. Every phase change goes through [`crate::apply::journal`] and is
//! durable before it takes effect; [`Engine::recover`] finishes or undoes an
//! interrupted transaction after a crash.
//!
//! The engine runs on one task and applies one bundle at a time; it does
//! plain blocking file I/O, so `run` gives it a thread of its own.
//!
//! This file holds the engine's state and how it reports; each concern has
//! a room of its own, all `impl Engine`: `plan` (from the desired state to
//! transactions, and what is refused before anything is written), `txn`
//! (run, commit, roll back, recover), `files` (stage, back up, switch,
//! restore), `identity` (certificates and kubeconfigs, their renewal),
//! `heal` (drift repair, garbage collection), `fetched` (a download written
//! once) and `handover` (self-update).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use lks_proto::arch::Arch;
use lks_proto::fsutil::{self, FsError};
use lks_proto::sign::PublisherKey;
use lks_proto::{BundlePath, BundleState, Digest, SignedBundle};
use tokio::sync::{mpsc, watch};

mod error;
mod fetched;
mod files;
mod handover;
mod heal;
mod identity;
mod plan;
mod txn;

pub use error::{ApplyError, StageError, WriteError};

use crate::apply::cache::Cache;
use crate::apply::inode::{INODE_TRUST, InodeMeta};
use crate::apply::journal::{IllegalTransition, Journal};
use crate::apply::report::{BundleStatus, NodeEvent, TrustReport};
use crate::apply::retired::Retired;
use crate::apply::root::{NodeRoot, RootError};
use crate::apply::runner::CommandRunner;
use crate::apply::source::BlobSource;
use crate::apply::state::{Activity, BundleRecord, LocalState, StatusRec};
use crate::apply::trust::Trust;
use crate::clock::Clock;
use crate::config::StateDir;
use crate::node::certs::{CertIssuer, NoIssuer};

/// An apply interrupted this many times in a row while its steps or health
/// check ran is given up (the crash-loop guard).
const MAX_INTERRUPTED: u32 = 3;
/// The first wait before a version given up on is tried again; it doubles
/// with each give-up, up to [`MAX_GIVE_UP_BACKOFF_MS`].
const GIVE_UP_BACKOFF_MS: i64 = 60_000;
const MAX_GIVE_UP_BACKOFF_MS: i64 = 3_600_000;
/// Wait before asking again for a certificate the server refused (the
/// operator may give the cluster a CA or an API server meanwhile).
const ISSUE_RETRY_MS: i64 = 60_000;
/// Wait before trying a failed certificate renewal again.
const RENEW_RETRY_MS: i64 = 60_000;

const MIB: f64 = (1u64 << 20) as f64;

/// How long to wait after the `n`th give-up (1-based).
pub fn give_up_backoff_ms(n: u32) -> i64 {
    let doublings = n.saturating_sub(1).min(16);
    GIVE_UP_BACKOFF_MS
        .saturating_mul(1 << doublings)
        .min(MAX_GIVE_UP_BACKOFF_MS)
}

/// Errors that stop the engine from making progress at all (the state dir
/// or the journal cannot be written). Failures of a bundle are not errors:
/// they become its `failed` / `rolled_back` state.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Root(#[from] RootError),
    #[error(transparent)]
    Transition(#[from] IllegalTransition),
    #[error("restore {path} during rollback: {error}")]
    Restore {
        path: BundlePath,
        error: Box<ApplyError>,
    },
    #[error("journal of {bundle} is in phase {phase}, which cannot be rolled back")]
    NotRollingBack { bundle: String, phase: &'static str },
}

/// What the node holds, as sent in status reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusSnapshot {
    pub generation: u64,
    pub bundles: Vec<BundleStatus>,
    /// The node's release trust (off unless `trust_threshold` is set).
    pub trust: TrustReport,
}

/// Where the engine announces state changes and events.
#[derive(Default)]
pub struct Reporter {
    pub status: Option<watch::Sender<StatusSnapshot>>,
    pub events: Option<mpsc::Sender<NodeEvent>>,
    dropped: u64,
}

impl Reporter {
    pub fn new(status: watch::Sender<StatusSnapshot>, events: mpsc::Sender<NodeEvent>) -> Self {
        Reporter {
            status: Some(status),
            events: Some(events),
            dropped: 0,
        }
    }
}

/// Static facts the engine needs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub state_dir: StateDir,
    /// The node root (`/` in production).
    pub root: PathBuf,
    pub node: String,
    pub trusted: Vec<PublisherKey>,
    /// Whose files of a multi-arch bundle this node installs
    /// ([`crate::node::facts::architecture`]); `None`: an architecture without a
    /// Debian name, which installs arch-neutral bundles only.
    pub arch: Option<Arch>,
}

/// Result of one self-heal pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealReport {
    /// `path (why)` for every file restored.
    pub repaired: Vec<String>,
    /// Files that drifted and could not be restored.
    pub failed: Vec<String>,
    /// Files whose bytes were read and hashed (the others were proved
    /// unchanged by their metadata).
    pub hashed: usize,
}

/// How often a heal pass hashes every managed file whatever its metadata
/// says (bit rot, a change made behind the file system's back).
const FULL_REHASH_MS: i64 = INODE_TRUST.as_millis() as i64;

pub struct Engine {
    dirs: StateDir,
    root_path: PathBuf,
    root: NodeRoot,
    node: String,
    trusted: Vec<PublisherKey>,
    arch: Option<Arch>,
    source: Arc<dyn BlobSource>,
    issuer: Arc<dyn CertIssuer>,
    runner: Arc<dyn CommandRunner>,
    clock: Arc<dyn Clock>,
    cache: Cache,
    journal: Journal,
    state: LocalState,
    reporter: Reporter,
    /// Set once a self-update is staged: the agent exits for the guard to
    /// switch binaries ([`crate::apply::selfupdate`]).
    handover: bool,
    /// This process is a new agent on trial: it commits its self-update
    /// once it has reconnected and reported.
    on_trial: Option<crate::apply::selfupdate::Pending>,
    /// Managed path → its inode's metadata and digest when last hashed and
    /// found intact (in memory: the first pass after a start hashes all).
    verified: BTreeMap<BundlePath, (InodeMeta, Digest)>,
    /// When a heal pass last hashed every file, or the engine started
    /// (Unix ms): at a start `verified` is empty, so the first pass hashes
    /// every file but those this process has written since.
    last_full_heal_ms: i64,
    /// Old files read and hashed to back them up (the others were proved
    /// unchanged since the engine wrote or last hashed them by their inode).
    backups_read: u64,
    /// Files staged from bytes this process had just verified, not hashed
    /// again: downloads moved into place, known-good cache copies (tests).
    stages_unhashed: std::sync::atomic::AtomicU64,
    /// Stale transaction backups were looked for (once per process).
    backups_checked: bool,
    /// Managed path → its inode when a copy of it into the cache did not
    /// match its blob ([`Engine::fill_cache`]): not tried again until the
    /// file changes.
    uncacheable: BTreeMap<BundlePath, InodeMeta>,
    /// Files copied (or tried) into the cache from their targets (tests).
    cache_copies: u64,
    /// Signed release records ([`crate::apply::trust`]); off by default.
    trust: Trust,
    /// The large files the transactions since the last report replaced,
    /// held open so that freeing them happens after the report
    /// ([`crate::apply::retired`]).
    retired: Retired,
    /// Where an applied `reboot = "required"` version is recorded; none in
    /// engines without a reboot state (tests).
    reboots: Option<Arc<crate::node::reboot::Reboots>>,
}

/// How an attempt ended, before it is written into the bundle's record.
struct Verdict {
    state: BundleState,
    message: String,
    sticky: Option<String>,
}

impl Engine {
    /// Opens the node root and loads the local state. Does not touch any
    /// managed file: call [`Engine::recover`] next.
    pub fn open(
        cfg: EngineConfig,
        source: Arc<dyn BlobSource>,
        runner: Arc<dyn CommandRunner>,
        clock: Arc<dyn Clock>,
        reporter: Reporter,
    ) -> Result<Self, EngineError> {
        let root_path = std::path::absolute(&cfg.root).map_err(|e| FsError::new("resolve", &cfg.root, e))?;
        let root = NodeRoot::open(&root_path)?;
        let dirs = cfg.state_dir;
        fsutil::create_dir(dirs.path(), 0o700)?;
        let state = LocalState::load(&dirs.state())?;
        let started_ms = clock.now_ms();
        Ok(Engine {
            cache: Cache::new(dirs.cache()),
            journal: Journal::new(dirs.journal()),
            root_path,
            root,
            node: cfg.node,
            trusted: cfg.trusted,
            arch: cfg.arch,
            source,
            issuer: Arc::new(NoIssuer),
            runner,
            clock,
            state,
            reporter,
            dirs,
            handover: false,
            on_trial: None,
            verified: BTreeMap::new(),
            last_full_heal_ms: started_ms,
            backups_read: 0,
            stages_unhashed: Default::default(),
            backups_checked: false,
            uncacheable: BTreeMap::new(),
            cache_copies: 0,
            retired: Retired::default(),
            trust: Trust::off(),
            reboots: None,
        })
    }

    /// Replaced files held open through a transaction and released after
    /// its report ([`crate::apply::retired`]), so far (tests).
    pub fn files_retired(&self) -> u64 {
        self.retired.released()
    }

    /// How many old files this engine read and hashed to back them up
    /// before replacing them; a file it wrote itself, or hashed in a heal
    /// pass, whose inode is unchanged since is not read again.
    pub fn backups_read(&self) -> u64 {
        self.backups_read
    }

    /// How many files were staged from bytes this process had just fetched
    /// and verified without hashing them again: downloads moved into place,
    /// and cached blobs copied while their inode was unchanged.
    pub fn stages_unhashed(&self) -> u64 {
        self.stages_unhashed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many files were copied (or tried) from their targets into the
    /// cache after a commit ([`Engine::fill_cache`]).
    pub fn cache_copies(&self) -> u64 {
        self.cache_copies
    }

    /// Where certificates of `[[certificate]]` entries come from.
    pub fn with_issuer(mut self, issuer: Arc<dyn CertIssuer>) -> Self {
        self.issuer = issuer;
        self
    }

    /// Signed release records: the node applies only what its accepted
    /// release names ([`Trust::open`] reads the journal).
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }

    /// Records applied versions that need a reboot there.
    pub fn with_reboots(mut self, reboots: Arc<crate::node::reboot::Reboots>) -> Self {
        self.reboots = Some(reboots);
        self
    }

    pub fn state(&self) -> &LocalState {
        &self.state
    }

    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The clock the trust checks read: the engine's, moved by
    /// `LKS_AGENT_CLOCK_OFFSET_MS` in fault-injection builds.
    fn trust_now(&self) -> i64 {
        self.clock
            .now_ms()
            .saturating_add(crate::fault::clock_offset_ms())
    }

    /// Looks at the release's expiry and the clock again and announces
    /// the trust condition if it changed (the expiry timer).
    pub fn refresh_trust(&mut self) {
        let now = self.trust_now();
        self.trust.refresh(now);
        let report = self.trust.report(now);
        let published = self.reporter.status.as_ref().map(|tx| tx.borrow().trust.clone());
        if published.as_ref() != Some(&report) {
            if published.is_none_or(|p| p.state != report.state) && report.state != "ok" {
                tracing::warn!(state = %report.state, "release trust: {}", report.message);
            }
            self.publish();
        }
    }

    /// How long until the trust condition may change on its own (the
    /// current release expires), if it may.
    pub fn trust_wakeup(&self) -> Option<std::time::Duration> {
        self.trust
            .wakeup_ms(self.trust_now())
            .map(|ms| std::time::Duration::from_millis(ms as u64 + 1))
    }

    /// Where every installed managed file is, seen from this process (the
    /// node root joined with the bundle path): what drift watching covers.
    pub fn managed_files(&self) -> Vec<PathBuf> {
        self.installed_files()
            .map(|f| self.root_path.join(f.path.relative()))
            .collect()
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        StatusSnapshot {
            generation: self.state.generation,
            bundles: self.state.statuses(),
            trust: self.trust.report(self.trust_now()),
        }
    }

    /// Events that could not be queued because the queue was full.
    pub fn dropped_events(&self) -> u64 {
        self.reporter.dropped
    }

    /// Announces the current state even if nothing changed (at start-up).
    pub fn publish_now(&self) {
        self.publish();
    }

    fn publish(&self) {
        if let Some(tx) = &self.reporter.status {
            tx.send_replace(self.snapshot());
        }
    }

    fn event(&mut self, kind: &str, bundle: &str, version: &str, message: &str) {
        self.event_with(kind, bundle, version, message, (0, 0));
    }

    /// An event with the bytes fetched for the version (server, peers).
    fn event_with(&mut self, kind: &str, bundle: &str, version: &str, message: &str, fetched: (u64, u64)) {
        tracing::info!(kind, bundle, version, "{message}");
        let ev = NodeEvent {
            peer: String::new(),
            fetched_from_server: fetched.0,
            fetched_from_peers: fetched.1,
            kind: kind.into(),
            bundle: bundle.into(),
            version: version.into(),
            message: message.into(),
            at_ms: self.clock.now_ms(),
        };
        if let Some(tx) = &self.reporter.events
            && tx.try_send(ev).is_err()
        {
            // Status reports carry the state anyway; an event lost to a full
            // queue (long offline) is counted, never waited for.
            self.reporter.dropped += 1;
        }
    }

    fn save_state(&self) -> Result<(), EngineError> {
        self.state.save(&self.dirs.state())?;
        Ok(())
    }

    fn set_status(&mut self, bundle: &str, version: &str, v: Verdict) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        let rec = self.state.bundles.entry(bundle.to_string()).or_insert_with(|| {
            BundleRecord::new(StatusRec {
                version: version.to_string(),
                state: v.state,
                message: String::new(),
                updated_at_ms: now,
            })
        });
        let changed =
            rec.status.version != version || rec.status.state != v.state || rec.status.message != v.message;
        if rec.status.version != version {
            rec.interrupted = 0;
            rec.gave_up = 0;
            rec.retry_at_ms = 0;
        }
        if changed {
            rec.status = StatusRec {
                version: version.to_string(),
                state: v.state,
                message: v.message,
                updated_at_ms: now,
            };
        }
        rec.sticky = v.sticky;
        self.save_state()?;
        if changed {
            self.publish();
        }
        Ok(())
    }

    fn record_apply(&mut self, bundle: &str, version: &str, outcome: &str, message: &str) {
        self.state.last_apply = Some(Activity {
            at_ms: self.clock.now_ms(),
            bundle: bundle.into(),
            version: version.into(),
            outcome: outcome.into(),
            message: message.into(),
        });
    }

    /// Bundle name → installed version, for tests and `status`.
    pub fn installed(&self) -> BTreeMap<String, String> {
        self.state
            .bundles
            .iter()
            .filter_map(|(n, r)| r.installed.as_ref().map(|m| (n.clone(), m.version.clone())))
            .collect()
    }
}

/// Identifies one bundle content: canonical manifest digest plus signature,
/// so a re-signed or changed bundle of the same version is tried again.
pub fn bundle_key(sb: &SignedBundle) -> String {
    let mut key = lks_proto::canonical::manifest_digest(&sb.manifest).to_string();
    if let Some(sig) = &sb.signature {
        key.push(':');
        key.push_str(&hex::encode(sig.signature));
    }
    key
}

pub(crate) fn is_regular(st: &nix::sys::stat::FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
}
