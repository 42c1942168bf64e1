//! The local content-addressed blob cache (`cache/sha256/<hex>`), and the
//! verified downloads an apply moves into place (`cache/fetched/<hex>`).
//!
//! Downloads land in `cache/partial/<hex>` and resume from its length; every
//! byte passes a [`Verifier`] on the way in, so a blob is only ever renamed
//! into `sha256/` or `fetched/` after its size and digest matched.
//!
//! - An apply fetches into `fetched/` ([`Cache::fetch`]); staging *moves*
//!   that file beside its target (one write of the bytes, one hash, one
//!   fsync on the rollout's path). The cache entry is made after the commit,
//!   off the rollout's path, by [`Cache::copy_in`] from the switched-in
//!   target, hashed while copying and promoted only if it matches: a target
//!   that drifted meanwhile is not cached.
//! - Drift repair and self-update fetch straight into `sha256/`
//!   ([`Cache::ensure`]).
//!
//! Readers verify again while copying out, so a cache corrupted on disk is
//! caught too; except right after this process stored a blob itself: while
//! its inode is as it was then ([`Cache::open_checked`]), staging copies it
//! without hashing it a second time (the trust a heal pass gives a managed
//! file's inode). A `fetched/` file this process did not verify itself (one
//! left by an earlier process, or given back by a rollback) is hashed before
//! it is used ([`Cache::verified_fetched`]).

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use lks_proto::digest::{Verifier, VerifyError};
use lks_proto::fsutil::{self, FsError};
use lks_proto::{Digest, FileSpec};

use crate::apply::inode::{INODE_TRUST, InodeMeta};
use crate::apply::source::{self, BlobSource, PieceSource, SwarmError};
use crate::fault;

/// Marks a swarm fetch that cannot be done in pieces (fetched the old way).
const UNSUPPORTED: &str = "unsupported: ";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The source could not deliver now; try again later.
    #[error("{path}: fetch from {origin}: {reason}")]
    Unavailable {
        path: String,
        origin: String,
        reason: String,
    },
    /// The bytes were not what the manifest promised.
    #[error("{path} from {origin}: {source}")]
    Verify {
        path: String,
        origin: String,
        source: VerifyError,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// Why a delta was not used (the file is then fetched whole).
#[derive(Debug, thiserror::Error)]
enum DeltaFailure {
    #[error("fetch the patch: {0}")]
    Source(#[source] source::SourceError),
    #[error("the patch is not what was offered: {0}")]
    Patch(#[source] VerifyError),
    #[error("the rebuild task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Rebuild(#[from] crate::apply::rebuild::RebuildError),
    #[error(transparent)]
    Fs(FsError),
}

/// Bytes one fetch took from the control server and from peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    pub from_server: u64,
    pub from_peers: u64,
    /// Of `from_server`, the bytes of a binary-delta patch.
    pub as_delta: u64,
}

#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
    /// Blobs this process fetched, verified and stored, by digest.
    stored: Arc<Mutex<HashMap<Digest, (InodeMeta, Instant)>>>,
    /// Patches (binary deltas) cached by this process: patch → the blob it
    /// rebuilds. Kept while that blob is, for peers to fetch.
    patches: Arc<Mutex<HashMap<Digest, Digest>>>,
}

impl Cache {
    pub fn new(dir: PathBuf) -> Self {
        Cache {
            dir,
            stored: Arc::default(),
            patches: Arc::default(),
        }
    }

    fn patches(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Digest>> {
        self.patches.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, (InodeMeta, Instant)>> {
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn blobs(&self) -> PathBuf {
        self.dir.join("sha256")
    }

    fn partials(&self) -> PathBuf {
        self.dir.join("partial")
    }

    fn fetched_dir(&self) -> PathBuf {
        self.dir.join("fetched")
    }

    /// Where a verified download waits to be moved beside its target.
    pub fn fetched_path(&self, d: &Digest) -> PathBuf {
        self.fetched_dir().join(d.hex())
    }

    /// Makes sure `fetched/` exists (a rollback gives downloads back there).
    pub fn create_fetched_dir(&self) -> Result<PathBuf, FsError> {
        let dir = self.fetched_dir();
        fsutil::create_dir(&dir, 0o700)?;
        Ok(dir)
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.blobs().join(d.hex())
    }

    pub fn contains(&self, d: &Digest) -> bool {
        self.blob_path(d).is_file()
    }

    /// Opens a cached blob; `Ok(None)` if it is not cached.
    pub fn open(&self, d: &Digest) -> Result<Option<File>, FsError> {
        let p = self.blob_path(d);
        match File::open(&p) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FsError::new("open cached blob", &p, e)),
        }
    }

    /// Opens a cached blob for copying out, and says whether its bytes are
    /// known good without hashing them again: true only while its inode is
    /// as it was when this process verified and stored it, for at most an
    /// hour. `Ok(None)` if it is not cached.
    pub fn open_checked(&self, d: &Digest) -> Result<Option<(File, bool)>, FsError> {
        let Some(f) = self.open(d)? else { return Ok(None) };
        let p = self.blob_path(d);
        let now = InodeMeta::of_metadata(
            &f.metadata()
                .map_err(|e| FsError::new("stat cached blob", &p, e))?,
        );
        let known = self
            .stored()
            .get(d)
            .is_some_and(|(was, at)| *was == now && at.elapsed() < INODE_TRUST);
        Ok(Some((f, known)))
    }

    /// Drops a blob (found corrupt).
    pub fn remove(&self, d: &Digest) -> Result<(), FsError> {
        self.stored().remove(d);
        fsutil::remove_file_durable(&self.blob_path(d))
    }

    /// Stores bytes already in memory (tests, originals).
    pub fn insert(&self, bytes: &[u8]) -> Result<Digest, FsError> {
        let d = Digest::of(bytes);
        fsutil::create_dir(&self.blobs(), 0o700)?;
        fsutil::write_atomic(&self.blob_path(&d), bytes, 0o600)?;
        Ok(d)
    }

    /// Makes sure `file`'s blob is cached, fetching (and resuming) it from
    /// `src` and verifying size and digest while it streams. Says what it
    /// fetched from where.
    pub async fn ensure(&self, file: &FileSpec, src: &dyn BlobSource) -> Result<Fetched, FetchError> {
        if self.contains(&file.digest) {
            return Ok(Fetched::default());
        }
        self.download(file, src, &self.blobs(), None).await
    }

    /// Makes sure `file`'s bytes are on this node, verified: in the cache,
    /// or fetched (and resumed) into `fetched/`, from where staging moves
    /// them beside the target instead of copying them.
    pub async fn fetch(&self, file: &FileSpec, src: &dyn BlobSource) -> Result<Fetched, FetchError> {
        self.fetch_with_base(file, src, None).await
    }

    /// [`Cache::fetch`], with one more base a binary delta may apply to:
    /// the file installed at the same path (`installed`: its manifest
    /// digest and the open target), hashed whole before it is used.
    pub async fn fetch_with_base(
        &self,
        file: &FileSpec,
        src: &dyn BlobSource,
        installed: Option<(Digest, File)>,
    ) -> Result<Fetched, FetchError> {
        if self.contains(&file.digest) || self.verified_fetched(&file.digest, file.size)?.is_some() {
            return Ok(Fetched::default());
        }
        self.download(file, src, &self.fetched_dir(), installed).await
    }

    /// Downloads `file` into `dest` (`sha256/` or `fetched/`), verified.
    async fn download(
        &self,
        file: &FileSpec,
        src: &dyn BlobSource,
        dest: &Path,
        installed: Option<(Digest, File)>,
    ) -> Result<Fetched, FetchError> {
        fsutil::create_dir(dest, 0o700)?;
        fsutil::create_dir(&self.partials(), 0o700)?;
        if let Some(got) = self.rebuild_from_delta(file, src, dest, installed).await {
            return Ok(got);
        }
        self.download_whole(file, src, dest).await
    }

    /// Downloads `file`'s own bytes into `dest`: in pieces through peer
    /// sharing while it is on, else streamed (and resumed) from its source.
    async fn download_whole(
        &self,
        file: &FileSpec,
        src: &dyn BlobSource,
        dest: &Path,
    ) -> Result<Fetched, FetchError> {
        if file.url.is_none()
            && let Some(swarm) = src.swarm()
        {
            match self.ensure_from_peers(file, swarm, dest).await {
                Err(FetchError::Unavailable { reason, .. }) if reason.starts_with(UNSUPPORTED) => {}
                r => return r,
            }
        }
        let part = self.partials().join(file.digest.hex());
        let (mut verifier, mut have) = resume_partial(&part, file)?;
        let path = file.path.to_string();
        let origin = source::origin(file);
        let unavailable = |reason: String| FetchError::Unavailable {
            path: path.clone(),
            origin: origin.clone(),
            reason,
        };
        let started = std::time::Instant::now();
        let mut stream = src.open(file, have).await.map_err(|e| unavailable(e.0))?;
        if stream.offset != have {
            if stream.offset != 0 {
                return Err(unavailable(format!(
                    "asked to resume at byte {have}, got a stream from byte {}",
                    stream.offset
                )));
            }
            verifier = Verifier::new(file.digest, file.size);
            have = 0;
        }
        if have > 0 {
            tracing::info!(path = %path, offset = have, size = file.size, "resuming download at byte {have}");
        }
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(have == 0)
            .append(have > 0)
            // Moved beside a target later: not readable by others there
            // before its mode is set.
            .mode(0o600)
            .open(&part)
            .map_err(|e| FsError::new("open", &part, e))?;
        let verify_failed = |source: VerifyError| {
            let _ = fs::remove_file(&part);
            FetchError::Verify {
                path: path.clone(),
                origin: origin.clone(),
                source,
            }
        };
        while let Some(chunk) = stream.chunks.next().await {
            let chunk = chunk.map_err(|e| unavailable(e.0))?;
            verifier.update(&chunk).map_err(verify_failed)?;
            out.write_all(&chunk)
                .map_err(|e| FsError::new("write", &part, e))?;
        }
        verifier.finish().map_err(verify_failed)?;
        let streamed = started.elapsed();
        // One fsync at the end: flushing as the bytes arrive (FlushingWriter)
        // measured slower here, the disk competing with the download.
        out.sync_all().map_err(|e| FsError::new("fsync", &part, e))?;
        drop(out);
        self.store_verified(&part, &file.digest, dest)?;
        // The figure behind BENCHMARKS.md "Blob download and verify":
        // stream_ms is request to last byte verified and written, ms adds
        // the fsync and the rename into the cache.
        tracing::info!(
            path = %path,
            digest = %file.digest,
            bytes = file.size - have,
            stream_ms = streamed.as_millis() as u64,
            ms = started.elapsed().as_millis() as u64,
            "blob fetched and verified"
        );
        Ok(Fetched {
            // A mirror is neither.
            from_server: if file.url.is_none() { file.size - have } else { 0 },
            from_peers: 0,
            as_delta: 0,
        })
    }

    /// Rebuilds `file` into `dest` from a patch the source offers and a
    /// base this cache holds, or the `installed` file (issue [delta]): the
    /// patch fetched and
    /// verified like any blob, the file written once and verified against
    /// the manifest. `None` when no offer fits, or on any failure (one
    /// line), and the caller fetches the file whole.
    async fn rebuild_from_delta(
        &self,
        file: &FileSpec,
        src: &dyn BlobSource,
        dest: &Path,
        installed: Option<(Digest, File)>,
    ) -> Option<Fetched> {
        if file.url.is_some() || file.size < lks_proto::delta::MIN_FILE_SIZE {
            return None;
        }
        let offers = match src.deltas(file).await {
            Ok(o) => o,
            Err(e) => {
                tracing::debug!(path = %file.path, "no deltas asked: {e}");
                return None;
            }
        };
        let installed_base = installed.as_ref().map(|(d, _)| *d);
        let offer = offers.into_iter().find(|o| {
            lks_proto::delta::ALGORITHMS.contains(&o.algorithm.as_str())
                && o.patch_size.saturating_mul(2) <= file.size
                && (self.contains(&o.base) || installed_base == Some(o.base))
        })?;
        // The cached blob first; the installed target is read only if the
        // cache lacks those bytes.
        let base = match self.open(&offer.base) {
            Ok(Some(f)) => f,
            _ => installed.filter(|(d, _)| *d == offer.base).map(|(_, f)| f)?,
        };
        let started = Instant::now();
        match self.rebuild(file, src, &offer, base, dest).await {
            Ok(got) => {
                tracing::info!(
                    path = %file.path,
                    digest = %file.digest,
                    base = %offer.base,
                    bytes = offer.patch_size,
                    from_server = got.from_server,
                    from_peers = got.from_peers,
                    size = file.size,
                    ms = started.elapsed().as_millis() as u64,
                    "blob rebuilt from a delta and verified"
                );
                Some(got)
            }
            Err(e) => {
                tracing::warn!(path = %file.path, base = %offer.base, "delta not used, fetching the whole file: {e}");
                None
            }
        }
    }

    /// Fetches the patch of `offer` into the cache (a blob like any other:
    /// resumed, verified, through peer sharing while it is on, and kept
    /// there for peers while `file` is), then rebuilds `file` into `dest`.
    /// Says what the patch cost: all of it `as_delta` when it came from
    /// the server.
    async fn rebuild(
        &self,
        file: &FileSpec,
        src: &dyn BlobSource,
        offer: &source::DeltaOffer,
        base_file: File,
        dest: &Path,
    ) -> Result<Fetched, DeltaFailure> {
        let spec = offer.patch_spec(file);
        self.patches().insert(offer.patch, file.digest);
        src.holding_patch(offer, &file.digest);
        let mut got = Fetched::default();
        if !self.contains(&offer.patch) {
            got = match self.download_whole(&spec, src, &self.blobs()).await {
                Ok(got) => got,
                Err(FetchError::Unavailable { reason, .. }) => {
                    return Err(DeltaFailure::Source(source::SourceError(reason)));
                }
                Err(FetchError::Verify { source, .. }) => return Err(DeltaFailure::Patch(source)),
                Err(FetchError::Fs(e)) => return Err(DeltaFailure::Fs(e)),
            };
            got.as_delta = got.from_server;
        }
        let blob = self.blob_path(&offer.patch);
        let patch = fs::read(&blob).map_err(|e| DeltaFailure::Fs(FsError::new("read patch", &blob, e)))?;
        // Checked again as read: the cache may have been damaged since.
        let mut verifier = Verifier::new(offer.patch, offer.patch_size);
        if let Err(e) = verifier.update(&patch).and_then(|()| verifier.finish()) {
            let _ = self.remove(&offer.patch);
            return Err(DeltaFailure::Patch(e));
        }
        let part = self.partials().join(format!("{}.delta", file.digest.hex()));
        let (f, base, alg, p) = (file.clone(), offer.base, offer.algorithm.clone(), part.clone());
        tokio::task::spawn_blocking(move || {
            crate::apply::rebuild::rebuild(&f, base_file, base, &alg, &patch, &p)
        })
        .await
        .map_err(DeltaFailure::Task)??;
        self.store_verified(&part, &file.digest, dest).map_err(|e| {
            let _ = fs::remove_file(&part);
            DeltaFailure::Fs(e)
        })?;
        Ok(got)
    }

    /// [`Cache::ensure`] through peer sharing: pieces from peers and the
    /// server, each checked, the file checked whole, then stored.
    async fn ensure_from_peers(
        &self,
        file: &FileSpec,
        swarm: &dyn PieceSource,
        dest: &Path,
    ) -> Result<Fetched, FetchError> {
        let part = self.partials().join(format!("{}.pieces", file.digest.hex()));
        let path = file.path.to_string();
        let started = Instant::now();
        let (from_server, from_peers) = match swarm.fetch(file, &part).await {
            Ok(v) => v,
            Err(SwarmError::Unsupported(why)) => {
                return Err(FetchError::Unavailable {
                    path,
                    origin: "peers".into(),
                    reason: format!("{UNSUPPORTED}{why}"),
                });
            }
            Err(SwarmError::Unavailable(reason)) => {
                return Err(FetchError::Unavailable {
                    path,
                    origin: "peers and the control server".into(),
                    reason,
                });
            }
            Err(SwarmError::Corrupt(source)) => {
                let _ = fs::remove_file(&part);
                return Err(FetchError::Verify {
                    path,
                    origin: "the control server".into(),
                    source,
                });
            }
        };
        self.store_verified(&part, &file.digest, dest)?;
        tracing::info!(
            path = %path,
            digest = %file.digest,
            bytes = file.size,
            from_server,
            from_peers,
            ms = started.elapsed().as_millis() as u64,
            "blob fetched and verified"
        );
        Ok(Fetched {
            from_server,
            from_peers,
            as_delta: 0,
        })
    }

    /// Moves a verified, fsynced download into `dest` (`sha256/` or
    /// `fetched/`) under its digest and remembers its inode, so staging
    /// need not hash it again.
    fn store_verified(&self, part: &Path, digest: &Digest, dest: &Path) -> Result<(), FsError> {
        let blob = dest.join(digest.hex());
        fs::rename(part, &blob).map_err(|e| FsError::new("rename into cache", &blob, e))?;
        fsutil::sync_dir(dest)?;
        self.remember(digest, &blob);
        Ok(())
    }

    /// Records the inode of a file just verified; after any rename, which
    /// changes ctime. A file it cannot stat is simply hashed again.
    fn remember(&self, digest: &Digest, path: &Path) {
        if let Ok(m) = fs::metadata(path) {
            self.stored()
                .insert(*digest, (InodeMeta::of_metadata(&m), Instant::now()));
        }
    }

    /// Whether `path` is the very inode this process verified as `digest`.
    fn known(&self, digest: &Digest, path: &Path) -> bool {
        let Ok(m) = fs::symlink_metadata(path) else {
            return false;
        };
        let now = InodeMeta::of_metadata(&m);
        self.stored()
            .get(digest)
            .is_some_and(|(was, at)| *was == now && at.elapsed() < INODE_TRUST)
    }

    /// The path of `digest`'s verified download in `fetched/`, if there is
    /// one: known good when this process verified that very inode, else
    /// hashed now (a file an earlier process left, or a rollback gave back)
    /// and dropped if it does not match. Staging moves it beside a target.
    pub fn verified_fetched(&self, digest: &Digest, size: u64) -> Result<Option<PathBuf>, FsError> {
        let p = self.fetched_path(digest);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                let _ = fs::remove_file(&p);
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FsError::new("stat fetched blob", &p, e)),
        }
        if self.known(digest, &p) {
            return Ok(Some(p));
        }
        match Digest::of_file(&p) {
            Ok(got) if got == (*digest, size) => {
                self.remember(digest, &p);
                Ok(Some(p))
            }
            Ok(_) => {
                tracing::warn!(%digest, path = %p.display(), "a fetched blob does not match its digest; dropped");
                fsutil::remove_file_durable(&p)?;
                Ok(None)
            }
            Err(e) => Err(FsError::new("read fetched blob", &p, e)),
        }
    }

    /// Promotes `digest`'s verified download from `fetched/` into the
    /// cache (a rename in the state dir); false if there is none.
    pub fn promote_fetched(&self, digest: &Digest, size: u64) -> Result<bool, FsError> {
        let Some(p) = self.verified_fetched(digest, size)? else {
            return Ok(false);
        };
        fsutil::create_dir(&self.blobs(), 0o700)?;
        let blob = self.blob_path(digest);
        fs::rename(&p, &blob).map_err(|e| FsError::new("rename into cache", &blob, e))?;
        fsutil::sync_dir(&self.blobs())?;
        self.remember(digest, &blob);
        Ok(true)
    }

    /// Makes the cache entry of `digest` from `src` (a target the engine
    /// switched in from verified bytes), off the rollout's path: copied
    /// into `partial/<hex>.copy`, fsynced, and renamed into `sha256/`.
    /// `known`: `src` is the very inode whose bytes this process verified
    /// (its metadata unchanged since), so the kernel copies it
    /// (`copy_file_range`: no pass through this process, no hash) and only
    /// its length is checked. Else it is hashed while copying and cached
    /// only if size and digest match: a source that changed since it was
    /// verified (a drifted target) is not cached, `Ok(false)`, nothing left
    /// behind. The copy runs at the lowest CPU priority
    /// ([`crate::node::priority`]): it is bookkeeping after the apply, and
    /// yields to the node's workloads and to transfers still going on.
    pub fn copy_in(&self, src: File, digest: &Digest, size: u64, known: bool) -> Result<bool, FsError> {
        fsutil::create_dir(&self.blobs(), 0o700)?;
        fsutil::create_dir(&self.partials(), 0o700)?;
        let part = self.partials().join(format!("{}.copy", digest.hex()));
        let copy = || -> io::Result<bool> {
            let mut out = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .open(&part)?;
            let copied = if known {
                copy_known(&src, &mut out, size)?
            } else {
                copy_hashed(&src, &mut out, digest, size)?
            };
            if copied {
                out.sync_all()?;
            }
            Ok(copied)
        };
        match crate::node::priority::in_background(copy).and_then(|r| r) {
            Ok(true) => {}
            Ok(false) => {
                let _ = fs::remove_file(&part);
                return Ok(false);
            }
            Err(e) => {
                let _ = fs::remove_file(&part);
                return Err(FsError::new("copy into cache", &part, e));
            }
        }
        fault::point("cache-promoting");
        self.store_verified(&part, digest, &self.blobs())?;
        Ok(true)
    }

    /// Removes every cached blob not in `keep`, and stale partial
    /// downloads; a patch this process fetched stays while the blob it
    /// rebuilds is kept (peers may still need it).
    pub fn gc(&self, keep: &BTreeSet<Digest>) -> Result<usize, FsError> {
        let mut keep = keep.clone();
        {
            let mut patches = self.patches();
            patches.retain(|_, target| keep.contains(target));
            keep.extend(patches.keys().copied());
        }
        self.stored().retain(|d, _| keep.contains(d));
        let mut removed = 0;
        for dir in [self.blobs(), self.fetched_dir(), self.partials()] {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.filter_map(Result::ok) {
                let name = e.file_name().to_string_lossy().into_owned();
                let keep_it = Digest::from_hex(&name).is_ok_and(|d| keep.contains(&d));
                if !keep_it {
                    let _ = fs::remove_file(e.path());
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

/// Picks up a partial download: its verifier and length, or a fresh start
/// if it is missing, too long or unreadable.
fn resume_partial(part: &Path, file: &FileSpec) -> Result<(Verifier, u64), FsError> {
    let fresh = (Verifier::new(file.digest, file.size), 0);
    let len = match fs::metadata(part) {
        Ok(m) => m.len(),
        Err(_) => return Ok(fresh),
    };
    if len == 0 || len > file.size {
        let _ = fs::remove_file(part);
        return Ok(fresh);
    }
    let f = File::open(part).map_err(|e| FsError::new("open", part, e))?;
    match Verifier::resume(file.digest, file.size, f) {
        Ok(v) => Ok((v, len)),
        Err(_) => {
            let _ = fs::remove_file(part);
            Ok(fresh)
        }
    }
}

/// What [`Cache::copy_in`] copies at a time, and after the first of which
/// the fault point `cache-copy-partial` fires: small enough that the
/// buffer of a hashed copy stays in the CPU's cache between the read, the
/// hash and the write.
const COPY_CHUNK: u64 = 256 << 10;

/// Copies a source of known bytes by the kernel; false if it is not
/// `size` bytes long.
fn copy_known(src: &File, out: &mut File, size: u64) -> io::Result<bool> {
    // `io::copy` between two files is `copy_file_range` on Linux (a plain
    // read and write elsewhere).
    let mut n = io::copy(&mut src.take(COPY_CHUNK), out)?;
    fault::point("cache-copy-partial");
    n += io::copy(&mut src.take(size.saturating_sub(n) + 1), out)?;
    Ok(n == size)
}

/// Copies while hashing; false if the bytes are not `digest`'s.
fn copy_hashed(mut src: &File, out: &mut File, digest: &Digest, size: u64) -> io::Result<bool> {
    let mut v = Verifier::new(*digest, size);
    let mut buf = vec![0u8; COPY_CHUNK as usize];
    let mut first = true;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if v.update(&buf[..n]).is_err() {
            return Ok(false);
        }
        out.write_all(&buf[..n])?;
        if first {
            first = false;
            fault::point("cache-copy-partial");
        }
    }
    Ok(v.finish().is_ok())
}

#[cfg(test)]
mod tests;
