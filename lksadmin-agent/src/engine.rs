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
//! `rolled_back`. Every phase change goes through [`crate::journal`] and is
//! durable before it takes effect; [`Engine::recover`] finishes or undoes an
//! interrupted transaction after a crash.
//!
//! The engine runs on one task and applies one bundle at a time; it does
//! plain blocking file I/O, so `run` gives it a thread of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lks_proto::arch::Arch;
use lks_proto::digest::{Hasher, Verifier};
use lks_proto::root::{NodeRoot, ParentDir, RootError};
use lks_proto::sign::{self, PublisherKey};
use lks_proto::{BundlePath, BundleState, Digest, FileSpec, Manifest, SignedBundle, pb};
use prost::Message;
use tokio::sync::{mpsc, watch};

mod fetched;
mod handover;

use crate::cache::{Cache, FetchError};
use crate::certs::{self, CertIssuer, IssueError, Issued, NoIssuer};
use crate::clock::Clock;
use crate::config::StateDir;
use crate::fault;
use crate::flushwriter::FlushingWriter;
use crate::fsutil::{self, FsError, InodeMeta};
use crate::journal::{Event, IllegalTransition, Journal, Next, PathPlan, Phase, Txn, Want};
use crate::runner::{CommandRunner, CommandSpec, Outcome};
use crate::source::BlobSource;
use crate::state::{Activity, BundleRecord, Content, LocalState, OriginalRec, StatusRec};

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

/// How long to wait after the `n`th give-up (1-based).
const MIB: f64 = (1u64 << 20) as f64;

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
    #[error("restore {path} during rollback: {reason}")]
    Restore { path: String, reason: String },
    #[error("journal of {bundle} is in phase {phase}, which cannot be rolled back")]
    NotRollingBack { bundle: String, phase: &'static str },
}

/// What the node holds, as sent in status reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusSnapshot {
    pub generation: u64,
    pub bundles: Vec<pb::BundleStatus>,
}

/// Where the engine announces state changes and events.
#[derive(Default)]
pub struct Reporter {
    pub status: Option<watch::Sender<StatusSnapshot>>,
    pub events: Option<mpsc::Sender<pb::NodeEvent>>,
    dropped: u64,
}

impl Reporter {
    pub fn new(status: watch::Sender<StatusSnapshot>, events: mpsc::Sender<pb::NodeEvent>) -> Self {
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
    /// ([`crate::facts::architecture`]); `None`: an architecture without a
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
const FULL_REHASH_MS: i64 = fsutil::INODE_TRUST.as_millis() as i64;

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
    /// switch binaries ([`crate::selfupdate`]).
    handover: bool,
    /// This process is a new agent on trial: it commits its self-update
    /// once it has reconnected and reported.
    on_trial: Option<crate::selfupdate::Pending>,
    /// Managed path → its inode's metadata and digest when last hashed and
    /// found intact (in memory: the first pass after a start hashes all).
    verified: BTreeMap<BundlePath, (InodeMeta, Digest)>,
    /// When a heal pass last hashed every file (Unix ms; 0: never).
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
            last_full_heal_ms: 0,
            backups_read: 0,
            stages_unhashed: Default::default(),
            backups_checked: false,
            uncacheable: BTreeMap::new(),
            cache_copies: 0,
        })
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

    pub fn state(&self) -> &LocalState {
        &self.state
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
        let ev = pb::NodeEvent {
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

    // ---- recovery -------------------------------------------------------

    /// Finishes (after the commit record) or undoes (before it) a
    /// transaction a crash interrupted.
    pub async fn recover(&mut self) -> Result<(), EngineError> {
        let Some(mut txn) = self.journal.load()? else {
            // Only a kill leaves stale backups, so the first recovery of a
            // process finds them all; later ones (every reconcile, heal
            // and renewal tick) need not look again.
            if !self.backups_checked {
                self.backups_checked = true;
                self.remove_stale_backups();
            }
            return Ok(());
        };
        tracing::warn!(bundle = %txn.bundle, phase = %txn.phase, "finishing a transaction interrupted by a restart");
        match txn.phase.clone() {
            Phase::Committed => self.finish_commit(txn).await,
            Phase::RollingBack { .. } => self.finish_rollback(txn).await,
            p => {
                let reason = format!("the agent stopped during {} of {}", p.name(), txn.describe());
                self.advance(&mut txn, Event::Failed { reason, retry: true })?;
                self.finish_rollback(txn).await
            }
        }
    }

    /// Removes the backup dirs of transactions that are over. A kill
    /// between closing the journal and deleting a transaction's backups
    /// leaves them behind (up to a copy of every file it replaced); with no
    /// journal open, no backup is needed any more.
    fn remove_stale_backups(&self) {
        let Ok(entries) = fs::read_dir(self.dirs.path().join("txn")) else {
            return;
        };
        for e in entries.flatten() {
            match fsutil::remove_dir_all(&e.path()) {
                Ok(()) => {
                    tracing::info!(dir = %e.path().display(), "removed the backups of a finished transaction")
                }
                Err(err) => tracing::warn!("remove stale backups: {err}"),
            }
        }
    }

    // ---- reconcile ------------------------------------------------------

    /// Stores `desired` durably, then converges on it.
    pub async fn accept_desired(&mut self, desired: &pb::DesiredState) -> Result<(), EngineError> {
        crate::state::save_desired(&self.dirs.desired(), desired)?;
        self.reconcile(desired).await
    }

    /// Converges the node on `desired`: removes bundles no longer listed,
    /// applies new versions, one bundle at a time.
    pub async fn reconcile(&mut self, desired: &pb::DesiredState) -> Result<(), EngineError> {
        self.recover().await?;
        if desired.generation < self.state.generation {
            tracing::warn!(
                got = desired.generation,
                had = self.state.generation,
                "desired state generation went backwards; following the server"
            );
        }
        self.state.generation = desired.generation;
        let mut wanted: Vec<SignedBundle> = Vec::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        for b in &desired.bundles {
            let (name, version) = b
                .manifest
                .as_ref()
                .map(|m| (m.name.clone(), m.version.clone()))
                .unwrap_or_default();
            if !names.insert(name.clone()) {
                tracing::warn!(bundle = %name, "bundle listed twice in the desired state; using the first");
                continue;
            }
            if let Some(&seq) = desired.retry.get(&name)
                && let Some(r) = self.state.bundles.get_mut(&name)
                && seq > r.retry_seen
            {
                // The operator asked for another try (`lksctl node retry`).
                r.retry_seen = seq;
                if r.sticky.is_some() || r.interrupted > 0 || r.retry_at_ms > 0 {
                    r.clear_failures();
                    r.gave_up = 0;
                    tracing::info!(bundle = %name, version = %version, "retrying at the operator's request");
                    self.event("retry", &name, &version, "retry requested by the operator");
                }
                self.save_state()?;
            }
            match SignedBundle::try_from(b.clone()) {
                Ok(sb) => wanted.push(sb),
                Err(e) if lks_proto::names::validate_bundle_name(&name).is_ok() => {
                    let message = format!("invalid bundle {name}@{version}: {e}");
                    let key = Digest::of(&b.encode_to_vec()).to_string();
                    self.fail_once(&name, &version, message, Some(key))?;
                }
                Err(e) => tracing::warn!("ignoring an invalid bundle in the desired state: {e}"),
            }
        }
        let gone: Vec<String> = self
            .state
            .bundles
            .keys()
            .filter(|n| !names.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove_bundle(&name).await?;
        }
        for sb in &wanted {
            self.converge(sb).await?;
            if self.handover {
                // The process exits for the new agent: nothing more now.
                return Ok(());
            }
        }
        self.save_state()?;
        self.publish();
        self.fill_cache();
        self.gc();
        Ok(())
    }

    /// Sets a failure state and emits an event only when it is news.
    fn fail_once(
        &mut self,
        bundle: &str,
        version: &str,
        message: String,
        sticky: Option<String>,
    ) -> Result<(), EngineError> {
        let news = self.state.bundles.get(bundle).is_none_or(|r| {
            r.status.version != version
                || r.status.state != BundleState::Failed
                || r.status.message != message
        });
        self.set_status(
            bundle,
            version,
            Verdict {
                state: BundleState::Failed,
                message: message.clone(),
                sticky,
            },
        )?;
        if news {
            tracing::warn!(bundle, version, "{message}");
            self.record_apply(bundle, version, "failed", &message);
            self.save_state()?;
            self.event("failed", bundle, version, &message);
        }
        Ok(())
    }

    async fn converge(&mut self, sb: &SignedBundle) -> Result<(), EngineError> {
        let published = &sb.manifest;
        if self
            .on_trial
            .as_ref()
            .is_some_and(|p| p.get("BUNDLE") == published.name)
        {
            // This process is that self-update; it commits once reported.
            return Ok(());
        }
        let key = bundle_key(sb);
        // A multi-arch bundle: this node installs its architecture's files
        // and the neutral ones, never another architecture's, whatever the
        // server sent (the signature below covers every variant).
        let selected = match published.for_arch(self.arch) {
            Ok(s) => s,
            Err(why) => {
                let why = format!("refused: {why}");
                return self.fail_once(&published.name, &published.version, why, Some(key));
            }
        };
        let m = &selected;
        let want = m.clone();
        let rec = self.state.bundles.get(&m.name).cloned();
        if let Some(r) = &rec {
            if r.installed.as_ref().is_some_and(|i| i.same_request(&want)) {
                if r.status.version != m.version || r.status.state != BundleState::Applied {
                    self.set_status(
                        &m.name,
                        &m.version,
                        Verdict {
                            state: BundleState::Applied,
                            message: String::new(),
                            sticky: None,
                        },
                    )?;
                }
                return Ok(());
            }
            if r.sticky.as_deref() == Some(key.as_str())
                && r.status.version == m.version
                && matches!(r.status.state, BundleState::Failed | BundleState::RolledBack)
            {
                if r.retry_at_ms == 0 || self.clock.now_ms() < r.retry_at_ms {
                    return Ok(());
                }
                // The crash-loop guard's wait is over: try once more.
                tracing::info!(bundle = %m.name, version = %m.version, "trying again after giving up");
                if let Some(r) = self.state.bundles.get_mut(&m.name) {
                    r.clear_failures();
                }
            }
        }
        if let Err(e) = sign::verify(sb, &self.trusted) {
            return self.fail_once(&m.name, &m.version, e.to_string(), Some(key));
        }
        if let Some(reason) = self.conflict(m) {
            return self.fail_once(&m.name, &m.version, reason, None);
        }
        if !sign::chunks_usable(sb) {
            // Chunk lists its signer did not sign are not used: its files
            // come from the control server whole, as before chunk lists.
            let mut bare = m.clone();
            bare.files.iter_mut().for_each(|f| f.chunks = None);
            return self.apply(&bare, rec, key, false).await;
        }
        self.apply(m, rec, key, false).await
    }

    /// A reason if `m` would own a path (or a parent/child of one) that
    /// another bundle on this node owns.
    fn conflict(&self, m: &Manifest) -> Option<String> {
        for (other, r) in &self.state.bundles {
            if *other == m.name {
                continue;
            }
            let Some(inst) = &r.installed else { continue };
            for f in m.owned_paths() {
                for g in inst.owned_paths() {
                    let pair = [f, g];
                    if lks_proto::manifest::check_paths_disjoint(pair.into_iter()).is_err() {
                        return Some(format!(
                            "bundle {}@{} refused: its file {} collides with {} of bundle {}@{} on this node",
                            m.name, m.version, f, g, other, inst.version
                        ));
                    }
                }
            }
        }
        None
    }

    /// Installs `m` (a published manifest). A `renewal` installs the same
    /// version again with newly issued certificates; it keeps the bundle
    /// `applied` whatever happens, and a failure keeps the current pair.
    async fn apply(
        &mut self,
        m: &Manifest,
        rec: Option<BundleRecord>,
        key: String,
        renewal: bool,
    ) -> Result<(), EngineError> {
        let (name, version) = (m.name.as_str(), m.version.as_str());
        if !renewal {
            self.set_status(
                name,
                version,
                Verdict {
                    state: BundleState::Applying,
                    message: String::new(),
                    sticky: None,
                },
            )?;
            tracing::info!(bundle = name, version, "applying");
        }
        for f in &m.files {
            // A self-update is staged from the cache (`hand_over`); every
            // other file's download is moved beside its target.
            let got = if m.self_update {
                self.cache.ensure(f, &*self.source).await
            } else {
                self.cache_from_installed(&f.digest);
                self.cache.fetch(f, &*self.source).await
            };
            match got {
                Ok(got) => {
                    if (got.from_server, got.from_peers) != (0, 0)
                        && let Some(r) = self.state.bundles.get_mut(name)
                    {
                        r.add_fetched(version, got.from_server, got.from_peers);
                    }
                }
                Err(e @ FetchError::Unavailable { .. }) => {
                    return self.wait_for(name, version, format!("waiting for blobs: {e}"));
                }
                Err(e @ FetchError::Verify { .. }) => {
                    return self.fail_once(name, version, e.to_string(), Some(key));
                }
                Err(FetchError::Fs(e)) => {
                    return self.fail_once(name, version, format!("cache: {e}"), None);
                }
            }
        }
        if let Err(why) = self.check_arch_elf(m) {
            return self.fail_once(name, version, why, Some(key));
        }
        if m.self_update {
            return self.hand_over(m, key).await;
        }
        let made = match self.make_identity_files(m).await {
            Ok(made) => made,
            Err(e) if renewal => return self.renewal_failed(name, version, &e.to_string()),
            Err(IssueError::Unavailable(e)) => {
                return self.wait_for(name, version, format!("waiting for a certificate: {e}"));
            }
            Err(IssueError::Refused(e)) => {
                // Asked again after a while: the operator may fix the cause
                // (a cluster CA, an API server) without a new bundle.
                let retry_at = self.clock.now_ms().saturating_add(ISSUE_RETRY_MS);
                self.fail_once(
                    name,
                    version,
                    format!("certificate refused: {e}; asking again at {}", rfc3339(retry_at)),
                    Some(key),
                )?;
                if let Some(r) = self.state.bundles.get_mut(name) {
                    r.retry_at_ms = retry_at;
                }
                return self.save_state();
            }
        };
        let m = &made;
        if let Err(reason) = self.precheck(m) {
            if renewal {
                return self.renewal_failed(name, version, &reason);
            }
            return self.fail_once(name, version, reason, None);
        }
        let from = rec.as_ref().and_then(|r| r.installed.clone());
        let originals = rec.map(|r| r.originals).unwrap_or_default();
        let mut txn = self.plan(name, from, Some(m.clone()), &originals)?;
        txn.key = key;
        txn.renewal = renewal;
        self.run_txn(txn).await
    }

    /// In a multi-arch bundle, every fetched file that is an ELF
    /// executable must be one for this node: publish checks the files it
    /// uploads, but not those behind a mirror URL, and a server is not
    /// trusted with this.
    fn check_arch_elf(&self, m: &Manifest) -> Result<(), String> {
        let Some(arch) = self.arch.filter(|_| m.is_multi_arch()) else {
            return Ok(());
        };
        for f in &m.files {
            let path = [
                self.cache.fetched_path(&f.digest),
                self.cache.blob_path(&f.digest),
            ]
            .into_iter()
            .find(|p| p.exists());
            let Some(path) = path else { continue };
            let mut head = Vec::with_capacity(64);
            let read = File::open(&path).and_then(|file| file.take(64).read_to_end(&mut head));
            if read.is_err() {
                continue;
            }
            arch.check_elf(&head)
                .map_err(|e| format!("refused: {} is {e}, and this node is {arch}", f.path))?;
        }
        Ok(())
    }

    /// `pending` for something the node cannot have now (a blob, a
    /// certificate): tried again on the next reconcile.
    fn wait_for(&mut self, name: &str, version: &str, message: String) -> Result<(), EngineError> {
        tracing::warn!(bundle = name, version, "{message}");
        self.set_status(
            name,
            version,
            Verdict {
                state: BundleState::Pending,
                message,
                sticky: None,
            },
        )
    }

    /// Makes the node's own files for `m`'s `[[certificate]]` and
    /// `[[kubeconfig]]` entries — a fresh key each, a certificate the
    /// cluster CA signs for it, the CA, the kubeconfigs — into the cache,
    /// and returns `m` with them as `issued`. The keys stay in the state
    /// dir (mode 0600) and the node root; nothing but CSRs leaves the node.
    async fn make_identity_files(&self, m: &Manifest) -> Result<Manifest, IssueError> {
        let mut out = m.requested();
        if m.certificates.is_empty() {
            return Ok(out);
        }
        let now = self.clock.now_ms();
        let mut answers: BTreeMap<BundlePath, (pb::IssueCertificateResponse, String)> = BTreeMap::new();
        for c in &m.certificates {
            let names = certs::names_for(c, &self.node)
                .map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            let k =
                certs::key_and_csr(&names).map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            let resp = self
                .issuer
                .issue(pb::IssueCertificateRequest {
                    bundle: m.name.clone(),
                    version: m.version.clone(),
                    path: c.path.to_string(),
                    csr_pem: k.csr_pem,
                })
                .await?;
            let issued = certs::check_issued(&resp.certificate_pem, &k.spki, now)
                .map_err(|e| IssueError::Refused(format!("{}: {e}", c.path)))?;
            if lks_proto::identity::pem_certs(&resp.ca_pem).is_err() {
                return Err(IssueError::Refused(format!(
                    "{}: the server sent no cluster CA",
                    c.path
                )));
            }
            self.put_made(&mut out, &c.path, resp.certificate_pem.as_bytes(), 0o644)?;
            self.put_made(&mut out, &c.key_path, k.key_pem.as_bytes(), 0o600)?;
            if let Some(ca) = &c.ca_path
                && !out.issued.iter().any(|f| &f.path == ca)
            {
                self.put_made(&mut out, ca, resp.ca_pem.as_bytes(), 0o644)?;
            }
            tracing::info!(
                bundle = %m.name,
                path = %c.path,
                serial = %issued.serial,
                not_after = %rfc3339(issued.not_after_ms),
                "certificate issued by cluster {}", resp.cluster
            );
            answers.insert(c.path.clone(), (resp, names.common_name));
        }
        for k in &m.kubeconfigs {
            let (Some(c), Some((resp, user))) = (m.certificate(&k.certificate), answers.get(&k.certificate))
            else {
                return Err(IssueError::Refused(format!(
                    "{}: no certificate {}",
                    k.path, k.certificate
                )));
            };
            if resp.api_server.is_empty() {
                return Err(IssueError::Refused(format!(
                    "{}: cluster {} has no API server address; set one with `lksctl cluster set {} --api-server URL`",
                    k.path, resp.cluster, resp.cluster
                )));
            }
            let text = certs::kubeconfig(
                &resp.cluster,
                &resp.api_server,
                &resp.ca_pem,
                user,
                c.path.as_str(),
                c.key_path.as_str(),
            );
            self.put_made(&mut out, &k.path, text.as_bytes(), 0o600)?;
        }
        out.validate()
            .map_err(|e| IssueError::Refused(format!("the files made for {}: {e}", m.id())))?;
        Ok(out)
    }

    fn put_made(
        &self,
        m: &mut Manifest,
        path: &BundlePath,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), IssueError> {
        let digest = self
            .cache
            .insert(bytes)
            .map_err(|e| IssueError::Unavailable(format!("cache: {e}")))?;
        m.issued.push(FileSpec {
            chunks: None,
            arch: None,
            path: path.clone(),
            digest,
            size: bytes.len() as u64,
            mode,
            url: None,
        });
        Ok(())
    }

    /// A renewal that could not even start: the bundle stays applied with
    /// its current certificates; tried again after [`RENEW_RETRY_MS`].
    fn renewal_failed(&mut self, name: &str, version: &str, why: &str) -> Result<(), EngineError> {
        let retry_at = self.clock.now_ms().saturating_add(RENEW_RETRY_MS);
        let message = format!(
            "certificate renewal failed: {why}; keeping the current certificates, trying again at {}",
            rfc3339(retry_at)
        );
        tracing::warn!(bundle = name, version, "{message}");
        self.set_status(
            name,
            version,
            Verdict {
                state: BundleState::Applied,
                message: message.clone(),
                sticky: None,
            },
        )?;
        if let Some(r) = self.state.bundles.get_mut(name) {
            r.renew_retry_at_ms = retry_at;
        }
        self.save_state()?;
        self.event("renewal_failed", name, version, &message);
        Ok(())
    }

    /// Validity of each installed certificate of `m`, read from the cache,
    /// with the `ttl` its entry asked for.
    pub fn certificate_validity(&self, m: &Manifest) -> Vec<(BundlePath, std::time::Duration, Issued)> {
        m.certificates
            .iter()
            .filter_map(|c| {
                let f = m.issued.iter().find(|f| f.path == c.path)?;
                let bytes = fs::read(self.cache.blob_path(&f.digest)).ok()?;
                Some((c.path.clone(), c.ttl, certs::validity(&bytes)?))
            })
            .collect()
    }

    /// Renews the certificates of every applied bundle one of whose
    /// certificates has passed its renewal point: a transaction like any
    /// apply (steps, health check), that keeps the current pair if it fails.
    pub async fn renew_due(&mut self) -> Result<(), EngineError> {
        self.recover().await?;
        let now = self.clock.now_ms();
        let mut due = Vec::new();
        for (name, r) in &self.state.bundles {
            let Some(inst) = &r.installed else { continue };
            if inst.certificates.is_empty()
                || r.status.state != BundleState::Applied
                || r.status.version != inst.version
                || now < r.renew_retry_at_ms
            {
                continue;
            }
            let validity = self.certificate_validity(inst);
            let missing = validity.len() < inst.certificates.len();
            if missing
                || validity
                    .iter()
                    .any(|(_, ttl, c)| now >= certs::renew_at_ms(&self.node, c, *ttl))
            {
                due.push(name.clone());
            }
        }
        for name in due {
            let Some(rec) = self.state.bundles.get(&name).cloned() else {
                continue;
            };
            let Some(inst) = rec.installed.clone() else {
                continue;
            };
            tracing::info!(bundle = %name, version = %inst.version, "renewing certificates");
            self.apply(&inst.requested(), Some(rec), String::new(), true)
                .await?;
        }
        Ok(())
    }

    /// Checks, before anything is written, that every target can be reached
    /// beneath the root and is a regular file (or absent).
    fn precheck(&self, m: &Manifest) -> Result<(), String> {
        for f in m.all_files() {
            match self.root.parent(&f.path, false) {
                Ok(parent) => match parent.stat_target() {
                    Ok(Some(st)) if !is_regular(&st) => {
                        return Err(format!(
                            "{}: the target exists and is not a regular file; refusing to replace it",
                            f.path
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                },
                Err(RootError::MissingParent { .. }) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    async fn remove_bundle(&mut self, name: &str) -> Result<(), EngineError> {
        let Some(rec) = self.state.bundles.get(name).cloned() else {
            return Ok(());
        };
        let Some(from) = rec.installed.clone().filter(|m| !m.self_update) else {
            // Never delete the agent's own binary: a self-update leaves the
            // desired state by being forgotten (roll out another to move).
            self.state.bundles.remove(name);
            self.save_state()?;
            self.publish();
            return Ok(());
        };
        tracing::info!(bundle = name, version = %from.version, "removing");
        let txn = self.plan(name, Some(from), None, &rec.originals)?;
        self.run_txn(txn).await
    }

    /// Builds the per-path plan of a transaction from `from` to `to`.
    fn plan(
        &mut self,
        bundle: &str,
        from: Option<Manifest>,
        to: Option<Manifest>,
        originals: &[OriginalRec],
    ) -> Result<Txn, EngineError> {
        self.state.txn_seq += 1;
        let seq = self.state.txn_seq;
        self.save_state()?;
        let old: BTreeSet<&BundlePath> = from.iter().flat_map(|m| m.all_files().map(|f| &f.path)).collect();
        let new: BTreeSet<&BundlePath> = to.iter().flat_map(|m| m.all_files().map(|f| &f.path)).collect();
        let mut plans = Vec::new();
        for f in to.iter().flat_map(|m| m.all_files()) {
            plans.push(PathPlan {
                path: f.path.clone(),
                temp: String::new(),
                want: Want::Blob {
                    digest: f.digest,
                    size: f.size,
                    mode: f.mode,
                },
                backup: None,
                newly_owned: !old.contains(&f.path),
            });
        }
        for f in from.iter().flat_map(|m| m.all_files()) {
            if new.contains(&f.path) {
                continue;
            }
            let want = match originals.iter().find(|o| o.path == f.path).map(|o| &o.content) {
                Some(Content::File {
                    digest,
                    size,
                    mode,
                    stored,
                }) => Want::Original {
                    digest: *digest,
                    size: *size,
                    mode: *mode,
                    stored: stored.clone(),
                },
                _ => Want::Absent,
            };
            plans.push(PathPlan {
                path: f.path.clone(),
                temp: String::new(),
                want,
                backup: None,
                newly_owned: false,
            });
        }
        for (i, p) in plans.iter_mut().enumerate() {
            p.temp = format!(".lks.{seq}.{i}.tmp");
        }
        let kept_originals = originals
            .iter()
            .filter(|o| new.contains(&o.path))
            .cloned()
            .collect();
        Ok(Txn {
            seq,
            bundle: bundle.to_string(),
            from,
            to,
            plans,
            kept_originals,
            key: String::new(),
            renewal: false,
            phase: Phase::Staging,
        })
    }

    /// Moves `txn` to its next phase: in memory, then one durable journal
    /// write, then the fault point of the new phase.
    fn advance(&self, txn: &mut Txn, event: Event) -> Result<(), EngineError> {
        match txn.phase.next(event)? {
            Next::Phase(p) => {
                txn.phase = p;
                self.journal.write(txn)?;
                fault::point(txn.phase.name());
            }
            Next::Done => self.journal.clear()?,
        }
        Ok(())
    }

    async fn run_txn(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        self.journal.write(&txn)?;
        fault::point("staging");

        for (i, plan) in txn.plans.iter().enumerate() {
            if let Err(reason) = self.stage(plan, &txn.plans[..i]) {
                return self.fail_txn(txn, reason).await;
            }
            if i == 0 {
                fault::point("staged-partial");
            }
        }
        self.advance(&mut txn, Event::Staged)?;

        let backup_dir = self.dirs.txn(txn.seq);
        if let Err(e) = fsutil::create_dir(&backup_dir, 0o700) {
            return self.fail_txn(txn, e.to_string()).await;
        }
        for i in 0..txn.plans.len() {
            let from = txn.from.as_ref();
            match self.backup(&backup_dir, i, &txn.plans[i], from) {
                Ok(content) => txn.plans[i].backup = Some(content),
                Err(reason) => return self.fail_txn(txn, reason).await,
            }
        }
        if let Err(e) = fsutil::sync_dir(&backup_dir) {
            return self.fail_txn(txn, e.to_string()).await;
        }
        self.advance(&mut txn, Event::BackedUp)?;

        for (i, plan) in txn.plans.iter().enumerate() {
            if let Err(reason) = self.switch(plan) {
                return self.fail_txn(txn, reason).await;
            }
            if i == 0 {
                fault::point("switch-partial");
            }
        }
        self.advance(&mut txn, Event::Switched)?;
        self.remember_written(&txn);

        if let Some(to) = txn.to.clone() {
            if let Err(reason) = self.run_steps(&to).await {
                return self.fail_txn(txn, reason).await;
            }
            self.advance(&mut txn, Event::StepsPassed)?;
            if let Err(reason) = self.health_check(&to).await {
                return self.fail_txn(txn, reason).await;
            }
        } else {
            self.advance(&mut txn, Event::StepsPassed)?;
        }
        self.advance(&mut txn, Event::Healthy)?;
        self.finish_commit(txn).await
    }

    async fn fail_txn(&mut self, mut txn: Txn, reason: String) -> Result<(), EngineError> {
        tracing::warn!(bundle = %txn.bundle, "{}: {reason}", txn.describe());
        self.advance(&mut txn, Event::Failed { reason, retry: false })?;
        self.finish_rollback(txn).await
    }

    /// Restores every backed-up target, removes staged temps, re-runs the
    /// previous version's steps if targets were touched, records the
    /// outcome and closes the journal. Idempotent: recovery calls it again
    /// after a crash in the middle.
    async fn finish_rollback(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        let Phase::RollingBack {
            reason,
            touched,
            retry,
            guarded,
        } = txn.phase.clone()
        else {
            return Err(EngineError::NotRollingBack {
                bundle: txn.bundle.clone(),
                phase: txn.phase.name(),
            });
        };
        // A bundle without steps or health check runs no code of its own:
        // a crash in those phases was the agent's, not the bundle's.
        let guarded = guarded
            && txn
                .to
                .as_ref()
                .is_some_and(|m| !m.steps.is_empty() || m.health.is_some());
        let backup_dir = self.dirs.txn(txn.seq);
        self.give_back(&txn, touched);
        let mut unrestorable = Vec::new();
        if touched {
            let mut first = true;
            for plan in &txn.plans {
                let Some(content) = &plan.backup else { continue };
                // A parent swapped since the switch for a symlink out of the
                // root (or for a file) can never be restored through: writing
                // there would leave the root, and failing here would keep the
                // journal open and wedge every later apply, heal and renewal.
                if let Some(why) = self.unreachable(&plan.path) {
                    tracing::warn!(path = %plan.path, "not restored during rollback: {why}");
                    unrestorable.push(why);
                    continue;
                }
                self.restore(&backup_dir, plan, content)
                    .map_err(|reason| EngineError::Restore {
                        path: plan.path.to_string(),
                        reason,
                    })?;
                if first {
                    fault::point("rollback-partial");
                    first = false;
                }
            }
        }
        self.remove_temps(&txn);
        let mut message = reason;
        if !unrestorable.is_empty() {
            message = format!(
                "{message}; not restored, left as found: {}",
                unrestorable.join("; ")
            );
        }
        if touched && let Some(from) = &txn.from {
            if let Err(e) = self.run_steps(from).await {
                message = format!(
                    "{message}; re-running the steps of {}@{} also failed: {e}",
                    from.name, from.version
                );
            }
        }
        let mut retry_at_ms = 0;
        let renewal_retry = txn
            .renewal
            .then(|| self.clock.now_ms().saturating_add(RENEW_RETRY_MS));
        let (version, verdict, kind) = match (&txn.to, &txn.from) {
            // A renewal that failed leaves the version applied, with the
            // pair it had: tried again later.
            (Some(to), _) if txn.renewal => (
                to.version.clone(),
                Verdict {
                    state: BundleState::Applied,
                    message: format!(
                        "certificate renewal rolled back: {message}; keeping the current certificates, \
                         trying again at {}",
                        rfc3339(renewal_retry.unwrap_or_default())
                    ),
                    sticky: None,
                },
                "renewal_failed",
            ),
            // A crash in the agent's own phases says nothing about the
            // bundle: try again, however often it happens.
            (Some(to), _) if retry && !guarded => (
                to.version.clone(),
                Verdict {
                    state: BundleState::Pending,
                    message: format!("{message}; rolled back, will retry"),
                    sticky: None,
                },
                "interrupted",
            ),
            (Some(to), _) if retry => {
                // Finishing this rollback again after a crash must not count
                // its interruption twice.
                let rec = self.state.bundles.get(&txn.bundle);
                let fresh = u32::from(rec.is_none_or(|r| r.counted_txn != Some(txn.seq)));
                let n = rec.map_or(0, |r| r.interrupted) + fresh;
                let v = if n >= MAX_INTERRUPTED {
                    let gave_up = rec.map_or(0, |r| r.gave_up) + fresh;
                    retry_at_ms = match rec.map_or(0, |r| r.retry_at_ms) {
                        at if fresh == 0 && at > 0 => at,
                        _ => self
                            .clock
                            .now_ms()
                            .saturating_add(give_up_backoff_ms(gave_up.max(1))),
                    };
                    if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
                        r.gave_up = gave_up;
                    }
                    Verdict {
                        state: BundleState::Failed,
                        message: format!(
                            "gave up after {n} interrupted attempts: {message}; trying again at {} \
                             (or now with `lksctl node retry {}`)",
                            rfc3339(retry_at_ms),
                            self.node
                        ),
                        sticky: Some(txn.key.clone()),
                    }
                } else {
                    Verdict {
                        state: BundleState::Pending,
                        message: format!("{message}; rolled back, will retry"),
                        sticky: None,
                    }
                };
                if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
                    r.interrupted = n;
                    r.counted_txn = Some(txn.seq);
                }
                (to.version.clone(), v, "interrupted")
            }
            (Some(to), _) if touched => (
                to.version.clone(),
                Verdict {
                    state: BundleState::RolledBack,
                    message,
                    sticky: Some(txn.key.clone()),
                },
                "rolled_back",
            ),
            (Some(to), _) => (
                to.version.clone(),
                Verdict {
                    state: BundleState::Failed,
                    message,
                    sticky: None,
                },
                "failed",
            ),
            (None, Some(from)) => (
                from.version.clone(),
                Verdict {
                    state: BundleState::Failed,
                    message: format!("removal failed: {message}"),
                    sticky: None,
                },
                "failed",
            ),
            (None, None) => (
                String::new(),
                Verdict {
                    state: BundleState::Failed,
                    message,
                    sticky: None,
                },
                "failed",
            ),
        };
        let message = verdict.message.clone();
        let interrupted = self.state.bundles.get(&txn.bundle).map_or(0, |r| r.interrupted);
        self.set_status(&txn.bundle, &version, verdict)?;
        if let Some(r) = self.state.bundles.get_mut(&txn.bundle) {
            r.interrupted = if kind == "interrupted" { interrupted } else { 0 };
            r.retry_at_ms = retry_at_ms;
            if let Some(at) = renewal_retry {
                r.renew_retry_at_ms = at;
            }
        }
        self.record_apply(&txn.bundle, &version, kind, &message);
        self.save_state()?;
        fault::point("state-saved");
        self.advance(&mut txn, Event::Finished)?;
        let _ = fsutil::remove_dir_all(&backup_dir);
        self.event(kind, &txn.bundle.clone(), &version, &message);
        self.publish();
        Ok(())
    }

    /// Records the new version (and the originals it took over), closes the
    /// journal and drops the backups. Idempotent, like `finish_rollback`.
    async fn finish_commit(&mut self, mut txn: Txn) -> Result<(), EngineError> {
        let backup_dir = self.dirs.txn(txn.seq);
        self.remove_temps(&txn);
        let now = self.clock.now_ms();
        let (kind, version) = match &txn.to {
            Some(to) => {
                let mut originals = txn.kept_originals.clone();
                for plan in txn.plans.iter().filter(|p| p.newly_owned) {
                    let content = match &plan.backup {
                        Some(Content::File {
                            digest,
                            size,
                            mode,
                            stored,
                        }) => {
                            let keep = self.keep_original(&backup_dir.join(stored), digest)?;
                            Content::File {
                                digest: *digest,
                                size: *size,
                                mode: *mode,
                                stored: keep,
                            }
                        }
                        _ => Content::Absent,
                    };
                    originals.push(OriginalRec {
                        path: plan.path.clone(),
                        content,
                    });
                }
                let rec = self.state.bundles.entry(txn.bundle.clone()).or_insert_with(|| {
                    BundleRecord::new(StatusRec {
                        version: to.version.clone(),
                        state: BundleState::Applied,
                        message: String::new(),
                        updated_at_ms: now,
                    })
                });
                rec.installed = Some(to.clone());
                rec.originals = originals;
                rec.status = StatusRec {
                    version: to.version.clone(),
                    state: BundleState::Applied,
                    message: String::new(),
                    updated_at_ms: now,
                };
                rec.clear_failures();
                rec.gave_up = 0;
                rec.renew_retry_at_ms = 0;
                (
                    if txn.renewal { "renewed" } else { "applied" },
                    to.version.clone(),
                )
            }
            None => {
                self.state.bundles.remove(&txn.bundle);
                (
                    "removed",
                    txn.from.as_ref().map(|f| f.version.clone()).unwrap_or_default(),
                )
            }
        };
        self.record_apply(&txn.bundle, &version, kind, "");
        self.save_state()?;
        fault::point("state-saved");
        self.advance(&mut txn, Event::Finished)?;
        let _ = fsutil::remove_dir_all(&backup_dir);
        let bundle = txn.bundle.clone();
        let fetched = self
            .state
            .bundles
            .get(&bundle)
            .map_or((0, 0), |r| r.fetched_for(&version));
        let message = match fetched {
            (0, 0) => format!("{kind} {bundle}@{version}"),
            (s, p) => format!(
                "{kind} {bundle}@{version}; fetched {:.1} MiB: {:.1} MiB from the control server, {:.1} MiB from peers",
                (s + p) as f64 / MIB,
                s as f64 / MIB,
                p as f64 / MIB
            ),
        };
        self.event_with(kind, &bundle, &version, &message, fetched);
        self.publish();
        Ok(())
    }

    /// Copies a backup into the originals store (content-addressed).
    fn keep_original(&self, backup: &Path, digest: &Digest) -> Result<String, EngineError> {
        let dir = self.dirs.originals();
        fsutil::create_dir(&dir, 0o700)?;
        let name = digest.hex();
        let dst = dir.join(&name);
        if dst.is_file() {
            return Ok(name);
        }
        let bytes = fs::read(backup).map_err(|e| FsError::new("read backup", backup, e))?;
        fsutil::write_atomic(&dst, &bytes, 0o600)?;
        Ok(name)
    }

    // ---- the file operations of a transaction ---------------------------

    /// Puts the wanted bytes into the plan's temp entry, verified, with its
    /// mode, durable: a verified download is moved there; other bytes are
    /// copied (from the cache, the originals store, or the temp entry of an
    /// `earlier` plan of the same blob) and verified while copied.
    fn stage(&self, plan: &PathPlan, earlier: &[PathPlan]) -> Result<(), String> {
        let Some((digest, size, mode)) = plan.want.digest_mode() else {
            return Ok(());
        };
        if matches!(plan.want, Want::Blob { .. }) && self.stage_fetched(plan, digest, size, mode)? {
            return Ok(());
        }
        // A blob this process has just verified is not hashed again while
        // its inode is unchanged (`Cache::open_checked`); the rest is.
        let (src, known_good) = match &plan.want {
            Want::Original { stored, .. } => {
                let p = self.dirs.originals().join(stored);
                let f = File::open(&p)
                    .map_err(|e| format!("{}: open original copy {}: {e}", plan.path, p.display()))?;
                (f, false)
            }
            _ => match self.cache.open_checked(&digest).map_err(|e| e.to_string())? {
                Some(found) => found,
                None => (
                    self.staged_earlier(earlier, &digest)?
                        .ok_or_else(|| format!("{}: blob {digest} is not in the cache", plan.path))?,
                    false,
                ),
            },
        };
        if known_good {
            self.stages_unhashed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let parent = self.root.parent(&plan.path, true).map_err(|e| e.to_string())?;
        let res = write_entry(&parent, &plan.temp, src, digest, size, mode, known_good);
        if res.is_err() {
            let _ = parent.remove_entry(&plan.temp.clone().into());
            if matches!(plan.want, Want::Blob { .. }) {
                // A corrupt cache entry is fetched again next time.
                let _ = self.cache.remove(&digest);
            }
        }
        res.map_err(|e| format!("{}: stage: {e}", plan.path))
    }

    /// Copies what the target holds now into the backup directory.
    fn backup(
        &mut self,
        dir: &Path,
        i: usize,
        plan: &PathPlan,
        from: Option<&Manifest>,
    ) -> Result<Content, String> {
        let parent = match self.root.parent(&plan.path, false) {
            Ok(p) => p,
            Err(RootError::MissingParent { .. }) => return Ok(Content::Absent),
            Err(e) => return Err(e.to_string()),
        };
        let Some(st) = parent.stat_target().map_err(|e| e.to_string())? else {
            return Ok(Content::Absent);
        };
        if !is_regular(&st) {
            return Err(format!(
                "{}: not a regular file; refusing to replace it",
                plan.path
            ));
        }
        // A file the installed version manages usually still holds that
        // version's blob, which the cache keeps (verified): then reading it
        // once to prove it is enough — no copy, no fsync of a second
        // 256 MiB — and a rollback restores the bytes from the cache. A
        // file that drifted is copied like any other, so a rollback still
        // puts back exactly what was there.
        if !plan.newly_owned
            && let Some(f) = from.and_then(|m| m.all_files().find(|f| f.path == plan.path))
            && f.size == st.st_size as u64
            && self.cache.contains(&f.digest)
        {
            // Not even read when its inode is as it was when the engine
            // wrote it or a heal pass last hashed it (the trust a heal pass
            // gives it; see `InodeMeta`).
            if self.unchanged_since_verified(&plan.path, &st, &f.digest) {
                return Ok(Content::Cached {
                    digest: f.digest,
                    size: f.size,
                    mode: st.st_mode & 0o7777,
                });
            }
            self.backups_read += 1;
            let mut src = parent
                .open_target()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{}: vanished while backing it up", plan.path))?;
            let (digest, size) =
                hash_reader(&mut src).map_err(|e| format!("{}: read to back it up: {e}", plan.path))?;
            if digest == f.digest && size == f.size {
                return Ok(Content::Cached {
                    digest,
                    size,
                    mode: st.st_mode & 0o7777,
                });
            }
        }
        let mut src = parent
            .open_target()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: vanished while backing it up", plan.path))?;
        let stored = i.to_string();
        let dst_path = dir.join(&stored);
        let mut copy = || -> io::Result<(Digest, u64)> {
            let mut dst = File::create(&dst_path)?;
            let mut h = Hasher::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = src.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                dst.write_all(&buf[..n])?;
            }
            dst.sync_all()?;
            Ok(h.finish())
        };
        let (digest, size) =
            copy().map_err(|e| format!("{}: back up to {}: {e}", plan.path, dst_path.display()))?;
        Ok(Content::File {
            digest,
            size,
            mode: st.st_mode & 0o7777,
            stored,
        })
    }

    /// Records the inode of every file just switched in from a verified
    /// blob, as a heal pass does after hashing it: the bytes were verified
    /// as they were staged, and an unchanged inode means unchanged bytes.
    /// A path it cannot stat is simply read by the next heal or backup.
    fn remember_written(&mut self, txn: &Txn) {
        for plan in &txn.plans {
            let Want::Blob { digest, size, .. } = plan.want else {
                self.verified.remove(&plan.path);
                continue;
            };
            let st = match self.root.parent(&plan.path, false) {
                Ok(parent) => parent.stat_target().ok().flatten(),
                Err(_) => None,
            };
            match st {
                Some(st) if is_regular(&st) && st.st_size as u64 == size => {
                    self.verified
                        .insert(plan.path.clone(), (InodeMeta::of(&st), digest));
                }
                _ => {
                    self.verified.remove(&plan.path);
                }
            }
        }
    }

    /// Puts the staged entry in place (or removes the target), durably.
    fn switch(&self, plan: &PathPlan) -> Result<(), String> {
        let parent = match self.root.parent(&plan.path, false) {
            Ok(p) => p,
            Err(RootError::MissingParent { .. }) if plan.want == Want::Absent => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        let name = parent.name().clone();
        match plan.want {
            Want::Absent => parent.remove_entry(&name),
            _ => parent.rename_entry(&plan.temp.clone().into(), &name),
        }
        .and_then(|()| parent.sync())
        .map_err(|e| e.to_string())
    }

    /// Why `path` can no longer be reached inside the root, if its parent
    /// chain now leaves it or holds a non-directory.
    fn unreachable(&self, path: &BundlePath) -> Option<String> {
        match self.root.parent(path, false) {
            Err(e @ (RootError::Escape { .. } | RootError::NotADirectory { .. })) => Some(e.to_string()),
            _ => None,
        }
    }

    /// Puts a backed-up content back at the plan's path.
    fn restore(&self, dir: &Path, plan: &PathPlan, content: &Content) -> Result<(), String> {
        match content {
            Content::Absent => {
                let parent = match self.root.parent(&plan.path, false) {
                    Ok(p) => p,
                    Err(RootError::MissingParent { .. }) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                };
                let name = parent.name().clone();
                parent
                    .remove_entry(&name)
                    .and_then(|()| parent.sync())
                    .map_err(|e| e.to_string())
            }
            Content::File { .. } | Content::Cached { .. } => {
                let (src, digest, size, mode) = match content {
                    Content::File {
                        digest,
                        size,
                        mode,
                        stored,
                    } => {
                        let src_path = dir.join(stored);
                        let src = File::open(&src_path)
                            .map_err(|e| format!("open backup {}: {e}", src_path.display()))?;
                        (src, digest, size, mode)
                    }
                    Content::Cached { digest, size, mode } => {
                        let src = self
                            .cache
                            .open(digest)
                            .map_err(|e| format!("open cached blob {digest}: {e}"))?
                            .ok_or_else(|| format!("blob {digest} left the cache; cannot restore it"))?;
                        (src, digest, size, mode)
                    }
                    Content::Absent => return Ok(()),
                };
                let parent = self.root.parent(&plan.path, true).map_err(|e| e.to_string())?;
                let temp: std::ffi::OsString = format!("{}.restore", plan.temp).into();
                write_entry(
                    &parent,
                    &format!("{}.restore", plan.temp),
                    src,
                    *digest,
                    *size,
                    *mode,
                    false,
                )
                .map_err(|e| format!("stage backup: {e}"))?;
                let name = parent.name().clone();
                parent
                    .rename_entry(&temp, &name)
                    .and_then(|()| parent.sync())
                    .map_err(|e| e.to_string())
            }
        }
    }

    fn remove_temps(&self, txn: &Txn) {
        for plan in &txn.plans {
            if let Ok(parent) = self.root.parent(&plan.path, false) {
                let _ = parent.remove_entry(&plan.temp.clone().into());
                let _ = parent.remove_entry(&format!("{}.restore", plan.temp).into());
            }
        }
    }

    // ---- steps and health -----------------------------------------------

    fn env(&self, m: &Manifest) -> Vec<(String, String)> {
        vec![
            ("LKS_ROOT".into(), self.root_path.to_string_lossy().into_owned()),
            ("LKS_BUNDLE".into(), m.name.clone()),
            ("LKS_VERSION".into(), m.version.clone()),
            ("LKS_NODE".into(), self.node.clone()),
        ]
    }

    async fn run_steps(&self, m: &Manifest) -> Result<(), String> {
        for s in &m.steps {
            let out = self
                .runner
                .run(&CommandSpec {
                    argv: s.run.clone(),
                    env: self.env(m),
                    timeout: s.timeout,
                })
                .await;
            if !out.success() {
                return Err(format!("step {:?} {}", s.name, out.describe()));
            }
        }
        Ok(())
    }

    async fn health_check(&self, m: &Manifest) -> Result<(), String> {
        let Some(h) = &m.health else { return Ok(()) };
        let spec = CommandSpec {
            argv: h.run.clone(),
            env: self.env(m),
            timeout: h.timeout,
        };
        let tries = h.retries.max(1);
        let mut last = Outcome::SpawnFailed {
            reason: "not run".into(),
        };
        for attempt in 1..=tries {
            last = self.runner.run(&spec).await;
            if last.success() {
                return Ok(());
            }
            if attempt < tries {
                tokio::time::sleep(h.interval).await;
            }
        }
        Err(format!(
            "health check failed {tries} time(s); last try {}",
            last.describe()
        ))
    }

    // ---- self-heal ------------------------------------------------------

    /// Re-verifies every managed file by size, mode and hash; restores the
    /// drifted ones from the cache (fetching again if needed), re-runs the
    /// health check of each bundle that needed repair, and reports. A file
    /// whose inode is unchanged since its bytes last matched is not read
    /// again, except once every [`FULL_REHASH_MS`]: an idle node's pass
    /// costs a `stat` per file, not a read of every byte it manages.
    pub async fn heal(&mut self) -> Result<HealReport, EngineError> {
        self.recover().await?;
        // A kill between a commit and its cache copy left blobs uncached.
        self.fill_cache();
        let mut report = HealReport::default();
        let now = self.clock.now_ms();
        let full =
            now.saturating_sub(self.last_full_heal_ms) >= FULL_REHASH_MS || now < self.last_full_heal_ms;
        if full {
            self.last_full_heal_ms = now;
        }
        let bundles: Vec<(String, Manifest)> = self
            .state
            .bundles
            .iter()
            .filter_map(|(n, r)| r.installed.clone().map(|m| (n.clone(), m)))
            // The agent's own binary is the package manager's as much as
            // ours: a self-update is never "repaired" back.
            .filter(|(_, m)| !m.self_update)
            .collect();
        for (name, m) in bundles {
            let mut repaired = Vec::new();
            let mut failed = Vec::new();
            for f in m.all_files() {
                match self.check_file(f, full, &mut report.hashed) {
                    Ok(None) => {}
                    Ok(Some(why)) => match self.repair_file(f).await {
                        Ok(()) => repaired.push(format!("{} ({why})", f.path)),
                        Err(e) => failed.push(format!("{} ({why}): {e}", f.path)),
                    },
                    Err(e) => failed.push(format!("{}: {e}", f.path)),
                }
            }
            if repaired.is_empty() && failed.is_empty() {
                continue;
            }
            let mut message = String::new();
            if !repaired.is_empty() {
                message = format!("restored {}", repaired.join(", "));
                match self.health_check(&m).await {
                    Ok(()) if m.health.is_some() => message.push_str("; health check passed"),
                    Ok(()) => {}
                    Err(e) => message.push_str(&format!("; {e}")),
                }
                self.event("repaired", &name, &m.version, &message);
            }
            if !failed.is_empty() {
                let f = format!("could not restore {}", failed.join(", "));
                self.event("repair_failed", &name, &m.version, &f);
                message = if message.is_empty() {
                    f
                } else {
                    format!("{message}; {f}")
                };
            }
            self.state.last_repair = Some(Activity {
                at_ms: self.clock.now_ms(),
                bundle: name.clone(),
                version: m.version.clone(),
                outcome: if failed.is_empty() {
                    "repaired"
                } else {
                    "repair_failed"
                }
                .into(),
                message,
            });
            self.save_state()?;
            report.repaired.extend(repaired);
            report.failed.extend(failed);
        }
        Ok(report)
    }

    /// Whether `path`'s inode is as it was when its bytes were last found
    /// (or written) to be `digest`: then they still are (see [`InodeMeta`]).
    fn unchanged_since_verified(
        &self,
        path: &BundlePath,
        st: &nix::sys::stat::FileStat,
        digest: &Digest,
    ) -> bool {
        self.verified
            .get(path)
            .is_some_and(|(meta, d)| *meta == InodeMeta::of(st) && d == digest)
    }

    /// Why a managed file differs from its manifest entry, if it does.
    /// Unless `full`, a file whose inode is as it was when its bytes last
    /// matched is not read again; `hashed` counts the files that were.
    fn check_file(
        &mut self,
        f: &FileSpec,
        full: bool,
        hashed: &mut usize,
    ) -> Result<Option<&'static str>, String> {
        let parent = match self.root.parent(&f.path, false) {
            Ok(p) => p,
            Err(RootError::MissingParent { .. }) => return Ok(Some("missing")),
            Err(e) => return Err(e.to_string()),
        };
        let Some(st) = parent.stat_target().map_err(|e| e.to_string())? else {
            return Ok(Some("missing"));
        };
        if !is_regular(&st) {
            return Ok(Some("replaced by something that is not a regular file"));
        }
        if st.st_size as u64 != f.size {
            self.verified.remove(&f.path);
            return Ok(Some("content changed"));
        }
        if st.st_mode & 0o7777 != f.mode {
            self.verified.remove(&f.path);
            return Ok(Some("mode changed"));
        }
        if !full && self.unchanged_since_verified(&f.path, &st, &f.digest) {
            return Ok(None);
        }
        let Some(file) = parent.open_target().map_err(|e| e.to_string())? else {
            return Ok(Some("missing"));
        };
        // The metadata of the very inode that is read: if the path is
        // replaced meanwhile, the next pass sees another inode.
        let st = nix::sys::stat::fstat(&file).map_err(|e| format!("stat: {e}"))?;
        *hashed += 1;
        let (digest, _) = Digest::of_reader(file).map_err(|e| format!("read: {e}"))?;
        if digest != f.digest {
            self.verified.remove(&f.path);
            return Ok(Some("content changed"));
        }
        if st.st_mode & 0o7777 != f.mode {
            self.verified.remove(&f.path);
            return Ok(Some("mode changed"));
        }
        self.verified.insert(f.path.clone(), (InodeMeta::of(&st), digest));
        Ok(None)
    }

    async fn repair_file(&self, f: &FileSpec) -> Result<(), String> {
        let spec = FileSpec {
            chunks: None,
            arch: None,
            path: f.path.clone(),
            digest: f.digest,
            size: f.size,
            mode: f.mode,
            url: f.url.clone(),
        };
        // A download a rollback gave back is as good as a fetch, once it
        // is verified.
        self.cache
            .promote_fetched(&f.digest, f.size)
            .map_err(|e| e.to_string())?;
        self.cache
            .ensure(&spec, &*self.source)
            .await
            .map_err(|e| e.to_string())?;
        let src = self
            .cache
            .open(&f.digest)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "blob not in the cache".to_string())?;
        let parent = self.root.parent(&f.path, true).map_err(|e| e.to_string())?;
        let temp = ".lks.heal.tmp";
        if let Err(e) = write_entry(&parent, temp, src, f.digest, f.size, f.mode, false) {
            let _ = parent.remove_entry(&temp.into());
            let _ = self.cache.remove(&f.digest);
            return Err(e);
        }
        let name = parent.name().clone();
        parent
            .rename_entry(&temp.into(), &name)
            .and_then(|()| parent.sync())
            .map_err(|e| e.to_string())
    }

    // ---- housekeeping ---------------------------------------------------
    /// Drops cached blobs and originals nothing refers to any more.
    fn gc(&self) {
        let mut keep = BTreeSet::new();
        let mut originals = BTreeSet::new();
        for r in self.state.bundles.values() {
            for f in r
                .installed
                .iter()
                .filter(|m| !m.self_update)
                .flat_map(|m| m.all_files())
            {
                keep.insert(f.digest);
            }
            for o in &r.originals {
                if let Content::File { stored, .. } = &o.content {
                    originals.insert(stored.clone());
                }
            }
        }
        if let Ok(Some(d)) = crate::state::load_desired(&self.dirs.desired()) {
            for b in d.bundles {
                for f in b.manifest.into_iter().flat_map(|m| m.files) {
                    if let Ok(dg) = f.digest.parse() {
                        keep.insert(dg);
                    }
                }
            }
        }
        if let Err(e) = self.cache.gc(&keep) {
            tracing::warn!("clean the blob cache: {e}");
        }
        if let Ok(rd) = fs::read_dir(self.dirs.originals()) {
            for e in rd.filter_map(Result::ok) {
                if !originals.contains(&e.file_name().to_string_lossy().into_owned()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
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

fn is_regular(st: &nix::sys::stat::FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
}

/// Copies `src` into a new entry `name` of `parent` with `mode`, fsynced,
/// verifying its size and digest as it reads; `known_good` (a blob this
/// process just verified, its inode unchanged: [`Cache::open_checked`])
/// checks only the size.
#[allow(clippy::too_many_arguments)]
fn write_entry(
    parent: &ParentDir,
    name: &str,
    mut src: File,
    digest: Digest,
    size: u64,
    mode: u32,
    known_good: bool,
) -> Result<(), String> {
    const CHUNK: usize = 1 << 20;
    let dst = parent.create_entry(&name.into()).map_err(|e| e.to_string())?;
    // Hashing here overlaps with the disk write on the writer's thread.
    let mut dst = FlushingWriter::new(dst, CHUNK).map_err(|e| format!("write: {e}"))?;
    let mut v = (!known_good).then(|| Verifier::new(digest, size));
    let mut copied = 0u64;
    loop {
        let mut buf = Vec::with_capacity(CHUNK);
        let n = (&mut src)
            .take(CHUNK as u64)
            .read_to_end(&mut buf)
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        copied += n as u64;
        if let Some(v) = v.as_mut() {
            v.update(&buf).map_err(|e| e.to_string())?;
        } else if copied > size {
            return Err(format!("read more than the blob's {size} bytes"));
        }
        dst.write(buf).map_err(|e| format!("write: {e}"))?;
    }
    match v {
        Some(v) => v.finish().map_err(|e| e.to_string())?,
        None if copied != size => return Err(format!("read {copied} of the blob's {size} bytes")),
        None => {}
    }
    dst.finish(Some(fs::Permissions::from_mode(mode)))
        .map(drop)
        .map_err(|e| format!("write, set mode and fsync: {e}"))
}

fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// SHA-256 and length of everything `r` yields.
fn hash_reader(r: &mut impl Read) -> io::Result<(Digest, u64)> {
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.update(&buf[..n]);
    }
}
