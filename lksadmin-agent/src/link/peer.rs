//! Peer sharing, the serving side: while the node's cluster has peer
//! sharing on (`DesiredState.peer_sharing`), the agent listens on the
//! cluster's peer port and serves the blobs of its own desired bundles to
//! other nodes of the same cluster.
//!
//! - mTLS with the certificates lksadmin issued: a caller must present a
//!   node certificate chaining to the node's pinned CA, and its identity
//!   (`lks://CLUSTER/NODE`) must name this node's cluster. Anything else is
//!   refused and counted.
//! - Only blobs of the bundles in this node's desired state are served
//!   (they are assigned to its cluster), whole ones from the cache and,
//!   while this node is fetching one itself, the pieces it has verified;
//!   and the binary-delta patches (issue [delta]) this node fetched that
//!   rebuild one of those blobs ([`Shared::add_patch`]), by the piece list
//!   the server gave with the offer (or as one piece).
//! - Each piece of a cached file is read and checked against its digest
//!   before a byte is sent, so a cache corrupted on disk is never passed on;
//!   a piece of a download in progress was checked as it arrived, moments
//!   before, and is not hashed again.
//! - At most `max_uploads` at once (more: `RESOURCE_EXHAUSTED`, the caller
//!   tries elsewhere at once), all together at most `upload_rate` bytes/s,
//!   and each upload ends after [`UPLOAD_DEADLINE`].
//! - Off: no listener, no port open.
//!
//! The listener's life (start, restart on a new certificate or setting,
//! stop) is [`PeerHost`], in `host`; this file is what it serves.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use lks_proto::chunks::Chunks;
use lks_proto::identity::{Identity, NodeIdentity};
use lks_proto::{Digest, pb};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

mod host;

pub use host::PeerHost;

/// Longest one upload may take.
pub const UPLOAD_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes per message of an upload.
const MESSAGE: usize = 256 << 10;
/// Longest a TLS handshake with a peer may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after this node's own download of a blob was verified (every
/// piece, as it arrived) its pieces are served without hashing them again:
/// a rollout's span, after which a cached file (which may rot over days) is
/// checked piece by piece again before a byte is sent.
const FRESH: Duration = Duration::from_secs(600);

/// What a blob of the desired bundles is: its size and pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobInfo {
    pub size: u64,
    /// `None`: one piece, the whole file.
    pub chunks: Option<Chunks>,
}

impl BlobInfo {
    /// Offset and length of each piece.
    pub fn pieces(&self) -> Vec<(u64, u64)> {
        match &self.chunks {
            Some(c) => (0..c.digests.len()).map(|i| c.range(i, self.size)).collect(),
            None => vec![(0, self.size)],
        }
    }

    /// The digest piece `i` must have (`whole`: the file's digest).
    pub fn piece_digest(&self, i: usize, whole: &Digest) -> Digest {
        match &self.chunks {
            Some(c) => c.digests[i],
            None => *whole,
        }
    }
}

/// A blob this node is fetching in pieces: where they land and which are
/// verified.
pub struct Partial {
    pub path: PathBuf,
    pub have: Mutex<Vec<bool>>,
}

/// What the fetching side and the serving side share.
pub struct Shared {
    served: Mutex<HashMap<Digest, BlobInfo>>,
    /// Patches this node fetches or holds: patch → (its size and pieces,
    /// the blob it rebuilds). Served while that blob is.
    patches: Mutex<HashMap<Digest, (BlobInfo, Digest)>>,
    partial: Mutex<HashMap<Digest, Arc<Partial>>>,
    /// Blobs this node's own downloads verified, and when.
    verified: Mutex<HashMap<Digest, Instant>>,
    /// Verified downloads staging moved beside their targets, open, served
    /// until the engine has cached them again.
    moved: Mutex<HashMap<Digest, Arc<std::fs::File>>>,
    /// Bumped whenever what this node holds may have changed (a piece
    /// verified, a download started or ended, the served set replaced):
    /// the `WatchPieces` streams look again then.
    changed: tokio::sync::watch::Sender<u64>,
    pub stats: Stats,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            served: Mutex::default(),
            patches: Mutex::default(),
            partial: Mutex::default(),
            verified: Mutex::default(),
            moved: Mutex::default(),
            changed: tokio::sync::watch::channel(0).0,
            stats: Stats::default(),
        }
    }
}

/// Counters, for logs and the node's status.
#[derive(Default)]
pub struct Stats {
    pub uploads: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub refused_identity: AtomicU64,
    pub refused_blob: AtomicU64,
    pub refused_busy: AtomicU64,
    /// `WatchPieces` streams opened.
    pub watches: AtomicU64,
}

impl Shared {
    /// The blobs of the desired bundles (the only ones served), with the
    /// chunk lists they came with.
    pub fn set_served(&self, desired: &pb::DesiredState) {
        let mut m = HashMap::new();
        for b in &desired.bundles {
            let Some(man) = &b.manifest else { continue };
            let mine = crate::node::facts::architecture().map(|a| a.as_str());
            for f in &man.files {
                let Ok(d) = f.digest.parse::<Digest>() else {
                    continue;
                };
                // Another architecture's file of a multi-arch bundle is
                // not this node's to hold, nor to pass on.
                if !f.url.is_empty() || (!f.arch.is_empty() && Some(f.arch.as_str()) != mine) {
                    continue;
                }
                let chunks = (f.chunk_size != 0).then(|| Chunks {
                    size: f.chunk_size,
                    digests: f
                        .chunk_digests
                        .iter()
                        .filter_map(|x| <[u8; 32]>::try_from(x.as_slice()).ok().map(Digest::from_bytes))
                        .collect(),
                });
                let info = BlobInfo { size: f.size, chunks };
                // A list that does not describe the file is dropped: pieces
                // then cannot be checked, so none is served by piece.
                let info = match &info.chunks {
                    Some(c) if c.validate(f.size, &d).is_err() => BlobInfo {
                        size: f.size,
                        chunks: None,
                    },
                    _ => info,
                };
                m.insert(d, info);
            }
        }
        lock(&self.patches).retain(|_, (_, target)| m.contains_key(target));
        *lock(&self.served) = m;
        self.bump();
    }

    /// This node fetches (and then holds) `patch`, which rebuilds the blob
    /// `target`: served like a blob of the desired bundles (by the pieces
    /// of `info`, each checked against its digest) while `target` is.
    pub fn add_patch(&self, patch: Digest, info: BlobInfo, target: Digest) {
        let info = match &info.chunks {
            Some(c) if c.validate(info.size, &patch).is_err() => BlobInfo {
                size: info.size,
                chunks: None,
            },
            _ => info,
        };
        lock(&self.patches).insert(patch, (info, target));
        self.bump();
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Piece `i` of `p` is written and verified: served from now on, and
    /// the nodes watching this blob are told.
    pub fn verified(&self, p: &Partial, i: usize) {
        if let Some(h) = lock(&p.have).get_mut(i) {
            *h = true;
        }
        self.bump();
    }

    pub fn served(&self, d: &Digest) -> Option<BlobInfo> {
        let served = lock(&self.served);
        if let Some(info) = served.get(d) {
            return Some(info.clone());
        }
        let (info, target) = lock(&self.patches).get(d).cloned()?;
        served.contains_key(&target).then_some(info)
    }

    pub fn start_partial(&self, d: Digest, p: Arc<Partial>) {
        lock(&self.partial).insert(d, p);
        self.bump();
    }

    pub fn end_partial(&self, d: &Digest) {
        lock(&self.partial).remove(d);
        self.bump();
    }

    fn partial(&self, d: &Digest) -> Option<Arc<Partial>> {
        lock(&self.partial).get(d).cloned()
    }

    /// This node's download of `d` was just verified: for [`FRESH`]
    /// its pieces are served from the file without hashing them again.
    pub fn download_verified(&self, d: Digest) {
        let mut v = lock(&self.verified);
        v.retain(|_, at| at.elapsed() < FRESH);
        v.insert(d, Instant::now());
    }

    /// Serves `file`, the verified download of `d` that staging is about
    /// to move out of `fetched/`, until [`Shared::release_moved`].
    pub fn keep_moved(&self, d: Digest, file: std::fs::File) {
        lock(&self.moved).insert(d, Arc::new(file));
    }

    /// Stops serving from moved downloads (the engine cached them, or will
    /// not): their pieces come from the cache again.
    pub fn release_moved(&self) {
        lock(&self.moved).clear();
    }

    fn moved(&self, d: &Digest) -> Option<Arc<std::fs::File>> {
        lock(&self.moved).get(d).cloned()
    }

    fn fresh(&self, d: &Digest) -> bool {
        lock(&self.verified).get(d).is_some_and(|at| at.elapsed() < FRESH)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `WatchPieces` streams open at once on one node (a fleet of 64 watching
/// one blob opens at most 8 each).
const MAX_WATCHES: usize = 256;
/// Longest one `WatchPieces` stream stays open.
const WATCH_LIFETIME: Duration = Duration::from_secs(300);
/// How often a `WatchPieces` stream looks again without being told (a
/// download renamed into `fetched/` after its partial ended).
const WATCH_RECHECK: Duration = Duration::from_secs(1);
/// Longest a caller may wait in line for an upload slot (`queue_ms`).
const MAX_QUEUE: Duration = Duration::from_secs(5);

struct PeerApi {
    cluster: String,
    cache: PathBuf,
    shared: Arc<Shared>,
    uploads: Arc<Semaphore>,
    watches: Arc<Semaphore>,
    rate: Arc<RateLimit>,
    /// Cancelled when the listener stops: open watches end with it.
    cancel: CancellationToken,
}

type ChunkStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;
type PiecesStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::PiecesHeld, Status>> + Send>>;

impl PeerApi {
    /// The calling node, if it is a node of this node's cluster; anything
    /// else is refused and counted.
    fn caller<T>(&self, req: &Request<T>) -> Result<NodeIdentity, Status> {
        let caller = req
            .peer_certs()
            .and_then(|c| c.first().map(|c| Identity::from_cert_der(c.as_ref())));
        match caller {
            Some(Ok(Identity::Node(id))) if id.cluster == self.cluster => Ok(id),
            other => {
                self.shared.stats.refused_identity.fetch_add(1, Ordering::Relaxed);
                let who = match other {
                    Some(Ok(Identity::Node(id))) => format!("node {} of cluster {}", id.node, id.cluster),
                    Some(Ok(Identity::Admin { name })) => format!("admin {name}"),
                    _ => "a caller without a node certificate".into(),
                };
                tracing::warn!(
                    "peer sharing: refused {who}: not a node of cluster {}",
                    self.cluster
                );
                Err(Status::permission_denied(format!(
                    "{who} is not a node of cluster {}",
                    self.cluster
                )))
            }
        }
    }

    /// The blob `digest` names, if it is one this node serves.
    fn served(&self, caller: &NodeIdentity, digest: &str) -> Result<(Digest, BlobInfo), Status> {
        let digest: Digest = digest
            .parse()
            .map_err(|e| Status::invalid_argument(format!("digest: {e}")))?;
        match self.shared.served(&digest) {
            Some(info) => Ok((digest, info)),
            None => {
                self.shared.stats.refused_blob.fetch_add(1, Ordering::Relaxed);
                tracing::info!(peer = %caller.node, %digest, "peer sharing: refused a blob this node does not serve");
                Err(Status::not_found(format!(
                    "{digest} is not a blob of this node's bundles"
                )))
            }
        }
    }
}

#[tonic::async_trait]
impl pb::peer_service_server::PeerService for PeerApi {
    type FetchChunkStream = ChunkStream;
    type WatchPiecesStream = PiecesStream;

    async fn fetch_chunk(
        &self,
        req: Request<pb::FetchChunkRequest>,
    ) -> Result<Response<Self::FetchChunkStream>, Status> {
        let stats = &self.shared.stats;
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let (digest, info) = self.served(&caller, &r.digest)?;
        let length = if r.length == 0 {
            info.size.saturating_sub(r.offset)
        } else {
            r.length
        };
        let Some(piece) = info.pieces().iter().position(|&p| p == (r.offset, length)) else {
            return Err(Status::invalid_argument(format!(
                "bytes {}+{length} of {digest} are not one of its pieces",
                r.offset
            )));
        };
        // A caller that will wait in line does, up to what it said (and
        // MAX_QUEUE); the piece must be here before it queues.
        if !held(&self.cache, &self.shared, &digest, piece) {
            return Err(Status::not_found(format!(
                "this node does not hold piece {piece} of {digest} yet"
            )));
        }
        let queue = Duration::from_millis(r.queue_ms.into()).min(MAX_QUEUE);
        let permit = match self.uploads.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) if !queue.is_zero() => tokio::time::timeout(queue, self.uploads.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        let Some(permit) = permit else {
            stats.refused_busy.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(
                "this node is uploading to as many peers as it may",
            ));
        };
        // Read and check the piece before anything is sent.
        let (cache, shared) = (self.cache.clone(), self.shared.clone());
        let want = info.piece_digest(piece, &digest);
        let (offset, len) = (r.offset, length);
        let bytes = tokio::task::spawn_blocking(move || {
            read_piece(&cache, &shared, &digest, piece, offset, len, &want)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let fault = crate::fault::peer_corrupt();
        let rate = self.rate.clone();
        let shared = self.shared.clone();
        let deadline = tokio::time::Instant::now() + UPLOAD_DEADLINE;
        let total = info.size;
        let stream = async_stream_chunks(bytes, fault, rate, deadline, total, permit, shared);
        stats.uploads.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %caller.node, %digest, piece, "serving a piece to a peer");
        Ok(Response::new(stream))
    }

    async fn watch_pieces(
        &self,
        req: Request<pb::WatchPiecesRequest>,
    ) -> Result<Response<Self::WatchPiecesStream>, Status> {
        let caller = self.caller(&req)?;
        let (digest, info) = self.served(&caller, &req.get_ref().digest)?;
        let Ok(permit) = self.watches.clone().try_acquire_owned() else {
            self.shared.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(
                "this node has as many piece watches open as it may",
            ));
        };
        self.shared.stats.watches.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(4);
        let (cache, shared, cancel) = (self.cache.clone(), self.shared.clone(), self.cancel.clone());
        let pieces = info.pieces().len();
        tokio::spawn(async move {
            let _hold = permit;
            let mut changed = shared.changed.subscribe();
            let end = tokio::time::Instant::now() + WATCH_LIFETIME;
            let mut sent: Option<pb::PiecesHeld> = None;
            loop {
                if shared.served(&digest).is_none() {
                    let _ = tx
                        .send(Err(Status::not_found(format!(
                            "{digest} is no longer a blob of this node's bundles"
                        ))))
                        .await;
                    return;
                }
                changed.mark_unchanged();
                let now = holding(&cache, &shared, &digest, pieces);
                // What a node holds only grows while it is watched: a
                // download that just ended (its pieces no longer listed,
                // the file not yet renamed) is not a loss to report.
                let grew = sent.as_ref().is_none_or(|s| {
                    now.whole || (now.have != s.have && bits(&now.have, pieces) > bits(&s.have, pieces))
                });
                if grew {
                    let whole = now.whole;
                    if tx.send(Ok(now.clone())).await.is_err() || whole {
                        return;
                    }
                    sent = Some(now);
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep_until(end) => return,
                    _ = changed.changed() => {}
                    _ = tokio::time::sleep(WATCH_RECHECK) => {}
                }
            }
        });
        Ok(Response::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).boxed(),
        ))
    }
}

/// Pieces set in a `PiecesHeld` bitmap of `pieces` pieces.
fn bits(have: &[u8], pieces: usize) -> usize {
    (0..pieces).filter(|&i| bit(have, i)).count()
}

/// Bit `i` of a `PiecesHeld` bitmap.
pub fn bit(have: &[u8], i: usize) -> bool {
    have.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// What this node holds of `digest` now, as a `PiecesHeld`.
fn holding(cache: &std::path::Path, shared: &Shared, digest: &Digest, pieces: usize) -> pb::PiecesHeld {
    let whole_here = whole(cache, shared, digest).is_some();
    let mut have = vec![0u8; pieces.div_ceil(8)];
    let partial = shared.partial(digest);
    for i in 0..pieces {
        let h = whole_here
            || partial
                .as_ref()
                .is_some_and(|p| lock(&p.have).get(i).copied().unwrap_or(false));
        if h {
            have[i / 8] |= 1 << (i % 8);
        }
    }
    pb::PiecesHeld {
        have,
        pieces: pieces as u32,
        whole: whole_here,
    }
}

/// Whether piece `i` of `digest` is here (whole, or verified in a download).
fn held(cache: &std::path::Path, shared: &Shared, digest: &Digest, i: usize) -> bool {
    whole(cache, shared, digest).is_some()
        || shared
            .partial(digest)
            .is_some_and(|p| lock(&p.have).get(i).copied().unwrap_or(false))
}

/// Where this node holds the whole blob `digest`.
enum Whole {
    /// In the cache, or a verified download an apply has not moved beside
    /// its target yet.
    Path(PathBuf),
    /// A verified download staging moved beside its target, open
    /// ([`Shared::keep_moved`]).
    Moved(Arc<std::fs::File>),
}

fn whole(cache: &std::path::Path, shared: &Shared, digest: &Digest) -> Option<Whole> {
    let whole = cache.join("sha256").join(digest.hex());
    let fetched = cache.join("fetched").join(digest.hex());
    [whole, fetched]
        .into_iter()
        .find(|p| p.is_file())
        .map(Whole::Path)
        .or_else(|| shared.moved(digest).map(Whole::Moved))
}

/// The bytes of one piece, as an upload sends them.
#[derive(Debug)]
enum PieceBytes {
    /// Read whole and checked against the piece's digest before a byte is
    /// sent.
    Checked(Vec<Vec<u8>>),
    /// Bytes this node verified moments ago: read a message at a time as
    /// the upload goes, so that it holds one message, not the piece.
    Verified {
        file: Arc<std::fs::File>,
        offset: u64,
        len: u64,
    },
}

/// Reads piece `i` of `digest` from the cache, `fetched/` or a moved
/// download (whole blob), checked against its digest (a file kept for days may rot) unless this
/// node's own download verified it less than [`FRESH`] ago, or from
/// this node's own download in progress, where it was checked in memory as
/// it arrived, moments before it was written. Not hashed a second time in
/// those two cases, and read as it is sent: the receiver checks every
/// piece anyway.
fn read_piece(
    cache: &std::path::Path,
    shared: &Shared,
    digest: &Digest,
    i: usize,
    offset: u64,
    len: u64,
    want: &Digest,
) -> Result<PieceBytes, Status> {
    let open = |path: &std::path::Path| {
        std::fs::File::open(path)
            .map(Arc::new)
            .map_err(|e| Status::not_found(format!("{digest}: {e}")))
    };
    let (f, check) = match whole(cache, shared, digest) {
        Some(Whole::Path(p)) => (open(&p)?, !shared.fresh(digest)),
        Some(Whole::Moved(f)) => (f, !shared.fresh(digest)),
        None => match shared.partial(digest) {
            Some(p) if lock(&p.have).get(i).copied().unwrap_or(false) => (open(&p.path)?, false),
            _ => {
                return Err(Status::not_found(format!(
                    "this node does not hold piece {i} of {digest} yet"
                )));
            }
        },
    };
    if !check {
        let size = f
            .metadata()
            .map_err(|e| Status::not_found(format!("{digest}: {e}")))?
            .len();
        if size < offset + len {
            return Err(Status::not_found(format!(
                "{digest}: piece {i} ends at byte {}, the file at {size}",
                offset + len
            )));
        }
        return Ok(PieceBytes::Verified { file: f, offset, len });
    }
    let mut hasher = lks_proto::digest::Hasher::new();
    let mut messages = Vec::with_capacity(len.div_ceil(MESSAGE as u64).max(1) as usize);
    let mut at = 0u64;
    loop {
        let n = (len - at).min(MESSAGE as u64) as usize;
        let buf = read_message(&f, offset + at, n)
            .map_err(|e| Status::not_found(format!("{digest}: read piece {i}: {e}")))?;
        hasher.update(&buf);
        messages.push(buf);
        at += n as u64;
        if at >= len {
            break;
        }
    }
    if hasher.finish().0 != *want {
        tracing::warn!(%digest, piece = i, "peer sharing: a cached piece does not match its digest; not served");
        return Err(Status::data_loss(format!(
            "piece {i} of {digest} is damaged on this node"
        )));
    }
    Ok(PieceBytes::Checked(messages))
}

/// `n` bytes of `file` at `at`, read straight into the buffer a message
/// is sent in (no copy of the piece into messages).
fn read_message(file: &std::fs::File, at: u64, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    file.read_exact_at(&mut buf, at)?;
    Ok(buf)
}

/// The messages of a piece, in order: those read and checked already, or
/// each read when the upload is ready for it.
fn piece_messages(bytes: PieceBytes) -> futures::stream::BoxStream<'static, Result<Vec<u8>, Status>> {
    match bytes {
        PieceBytes::Checked(messages) => futures::stream::iter(messages.into_iter().map(Ok)).boxed(),
        PieceBytes::Verified { file, offset, len } => futures::stream::unfold(0u64, move |at| {
            let file = file.clone();
            async move {
                if at >= len {
                    return None;
                }
                let n = (len - at).min(MESSAGE as u64) as usize;
                let read = tokio::task::spawn_blocking(move || read_message(&file, offset + at, n)).await;
                let msg = match read {
                    Ok(Ok(buf)) => Ok(buf),
                    Ok(Err(e)) => Err(Status::data_loss(format!("read at byte {}: {e}", offset + at))),
                    Err(e) => Err(Status::internal(e.to_string())),
                };
                // After an error the stream ends with it.
                let next = if msg.is_ok() { at + n as u64 } else { len };
                Some((msg, next))
            }
        })
        .boxed(),
    }
}

/// The messages of one piece, each sent as it is once the node's upload
/// rate allows.
fn async_stream_chunks(
    bytes: PieceBytes,
    corrupt: bool,
    rate: Arc<RateLimit>,
    deadline: tokio::time::Instant,
    total: u64,
    permit: tokio::sync::OwnedSemaphorePermit,
    shared: Arc<Shared>,
) -> ChunkStream {
    piece_messages(bytes)
        .enumerate()
        .then(move |(k, data)| {
            let (rate, shared) = (rate.clone(), shared.clone());
            let _hold = &permit;
            async move {
                let mut data = data?;
                if corrupt && k == 0 && !data.is_empty() {
                    data[0] ^= 0x01;
                }
                if tokio::time::timeout_at(deadline, rate.take(data.len() as u64))
                    .await
                    .is_err()
                {
                    return Err(Status::deadline_exceeded("upload took too long"));
                }
                shared
                    .stats
                    .uploaded_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(pb::BlobChunk {
                    data: data.into(),
                    total_size: total,
                })
            }
        })
        .boxed()
}

/// One token bucket for all uploads of the node; 0: no cap.
pub struct RateLimit {
    rate: u64,
    state: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl RateLimit {
    pub fn new(rate: u64) -> Self {
        RateLimit {
            rate,
            state: tokio::sync::Mutex::new((0.0, tokio::time::Instant::now())),
        }
    }

    /// Waits until `n` bytes may go out.
    pub async fn take(&self, n: u64) {
        if self.rate == 0 {
            return;
        }
        let rate = self.rate as f64;
        let wait = {
            let mut s = self.state.lock().await;
            let now = tokio::time::Instant::now();
            // Up to a quarter second of burst.
            let tokens = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate / 4.0);
            let left = tokens - n as f64;
            *s = (left, now);
            if left >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-left / rate)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests;
