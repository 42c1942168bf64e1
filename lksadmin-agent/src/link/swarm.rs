//! Peer sharing, the fetching side: a file is fetched in pieces (its chunk
//! list, or one piece when it has none and is small) from the peers the
//! control server names (`FindPeers`), several at once, each piece checked
//! against its digest as it arrives; the server is a source too, when the
//! tracker says so or when no peer has given anything for [`STALL`].
//!
//! - A peer whose piece does not match is dropped for this fetch, reported
//!   to the server (`NodeEvent` kind `bad_peer`), and the piece fetched
//!   again elsewhere.
//! - A slow or dead peer costs a piece at most [`PIECE_DEADLINE`], then the
//!   next source; one that fails [`MAX_FAILURES`] times in a row, or says
//!   it does not serve the blob at all, is dropped; with every peer named
//!   dropped, the server is used at once.
//! - A peer is dialled over mTLS: it must present a node certificate of
//!   this node's CA naming the node the tracker named, of this cluster.
//!   One connection per peer serves every fetch running; they close
//!   [`conns::IDLE_CLOSE`] after the last fetch ended (and when sharing is
//!   turned off), so they do not pile up rollout after rollout.
//! - Pieces land at their offsets in `cache/partial/HEX.pieces`; the pieces
//!   verified so far are served to other peers meanwhile.
//! - Each byte is hashed once, as its piece arrives: a file whose every
//!   piece matched is the file of the manifest's digest, not hashed whole
//!   again (see [`Swarm::fetch`]; debug builds, and so every test, do hash
//!   it whole as well, to catch a piece written at the wrong place).
//! - A server without a tracker (older): [`SwarmError::Unsupported`], and
//!   the caller fetches from the server as before.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use lks_proto::{Digest, FileSpec, pb};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::apply::report::NodeEvent;
use crate::apply::source::{PieceSource, SwarmError};
use crate::config::StateDir;
use crate::link::client::NodeCredentials;

mod conns;
mod fetch;
mod plan;
#[cfg(test)]
mod tests;
mod tls;

use crate::link::channel::SharedChannel;
use crate::link::peer::{BlobInfo, Partial, Shared};
use conns::PeerConns;
use plan::Found;
pub use tls::{DialError, dial_peer};

/// Pieces in flight at once for one file.
const WINDOW: usize = 4;
/// Pieces in flight to one peer at once.
const PER_PEER: usize = 2;
/// Pieces in flight from the server at first: a seed's pieces complete one
/// after another rather than all at the end, so its peers can start; it
/// opens on a fast link ([`plan::ServerWindow`]).
const SERVER_WINDOW: usize = 2;
/// How long a request waits in line at a busy peer for an upload slot.
const QUEUE: Duration = Duration::from_millis(1000);
/// After a peer said it is busy even so, how long before asking it again
/// (doubled each time in a row, up to [`MAX_BUSY_BACKOFF`]).
const BUSY_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BUSY_BACKOFF: Duration = Duration::from_secs(3);
/// How often an older peer (no `WatchPieces`) is asked again blindly.
const BLIND_RETRY: Duration = Duration::from_millis(300);
/// Longest one piece may take from one source.
pub const PIECE_DEADLINE: Duration = Duration::from_secs(30);
/// Without a verified piece of this node's own, and without a watched peer
/// gaining one, for this long, the server is used whatever the tracker
/// said.
pub const STALL: Duration = Duration::from_secs(15);
/// Without a verified piece of this node's own for this long, the server is
/// used even while its peers make progress.
pub const STARVED: Duration = Duration::from_secs(30);
/// How often the tracker is asked again while fetching.
const ASK_EVERY: Duration = Duration::from_secs(3);
/// How soon it is asked again while this node has nobody to fetch from and
/// may not use the server (the seed is a node it has not been told of yet).
const ASK_SOON: Duration = Duration::from_millis(250);
/// How soon it is asked again while this node knows fewer peers than one
/// answer may name ([`FEW_PEERS`]): at the start of a batch the first
/// nodes to ask are told of the few that asked before them, and with
/// replicas of those the other replicas had published by then.
const ASK_FEW: Duration = Duration::from_secs(1);
/// Fewer live peers than this is "few" (the tracker names up to 8).
const FEW_PEERS: usize = 8;
/// The tracker's answer: whom to fetch from, and whether the server too.
type Answer = Result<(Vec<Found>, bool), AskError>;
/// Failures in a row after which a peer is dropped for this fetch.
const MAX_FAILURES: u32 = 3;
/// Largest file fetched as one piece when it has no chunk list.
pub const MAX_WHOLE_PIECE: u64 = 8 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the bytes of the last fetches came from.
#[derive(Default)]
pub struct FetchStats {
    pub from_server: AtomicU64,
    pub from_peers: AtomicU64,
    pub bad_peers: AtomicU64,
}

pub struct Swarm {
    shared: Arc<Shared>,
    server: SharedChannel,
    dirs: StateDir,
    cluster: String,
    /// Peer sharing is on for this node's cluster.
    on: AtomicBool,
    events: mpsc::Sender<NodeEvent>,
    conns: Arc<PeerConns>,
    pub stats: FetchStats,
}

/// Peer sharing is the apply layer's way to fetch a blob in pieces.
impl PieceSource for Swarm {
    fn fetch<'a>(
        &'a self,
        file: &'a FileSpec,
        part: &'a Path,
    ) -> futures::future::BoxFuture<'a, Result<(u64, u64), SwarmError>> {
        Box::pin(Swarm::fetch(self, file, part))
    }
}

impl Swarm {
    pub fn new(
        shared: Arc<Shared>,
        server: SharedChannel,
        dirs: StateDir,
        cluster: String,
        events: mpsc::Sender<NodeEvent>,
    ) -> Self {
        Swarm {
            shared,
            server,
            dirs,
            cluster,
            on: AtomicBool::new(false),
            events,
            conns: Arc::default(),
            stats: FetchStats::default(),
        }
    }

    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        if !on {
            self.conns.close_all();
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Fetches `file` into `part` (created or resumed there), verified.
    /// Returns the bytes that came from the server and from peers.
    ///
    /// Verified means every piece matched its digest as it arrived, one
    /// SHA-256 pass per byte as a download from the server has (DESIGN §5,
    /// "one durable write, one hash"). That is the whole file verified: the
    /// pieces cover it exactly (the list has one digest per piece of
    /// `file.size`, checked here and when the manifest was), and the list
    /// is bound to the file's digest — the server recomputed it from the
    /// very bytes it hashed to that digest at publish and refuses a publish
    /// whose list differs, and a signed bundle's lists are used only under
    /// `chunks_signature`, by the key that signed the digest. Without a
    /// list the one piece's digest is the file's own.
    pub async fn fetch(&self, file: &FileSpec, part: &Path) -> Result<(u64, u64), SwarmError> {
        let info = BlobInfo {
            size: file.size,
            chunks: file.chunks.clone(),
        };
        match &info.chunks {
            None if file.size > MAX_WHOLE_PIECE => {
                return Err(SwarmError::Unsupported("no chunk list".into()));
            }
            Some(c) => c
                .validate(file.size, &file.digest)
                .map_err(|e| SwarmError::Unsupported(format!("chunk list: {e}")))?,
            None => {}
        }
        let _fetching = self.conns.fetching();
        let digest = file.digest;
        let pieces = info.pieces();
        let partial = Arc::new(Partial {
            path: part.to_path_buf(),
            have: Mutex::new(resume(part, file.size, &info, &digest)),
        });
        self.shared.start_partial(digest, partial.clone());
        let res = self.fetch_pieces(file, &info, &pieces, &partial).await;
        let res = match res {
            // Its pieces stay served while it is checked: peers told it
            // holds them would otherwise be refused meanwhile.
            Ok(got) => check_complete(part, &partial, &digest, file.size)
                .await
                .map(|()| {
                    self.shared.download_verified(digest);
                    got
                }),
            Err(e) => Err(e),
        };
        self.shared.end_partial(&digest);
        if let Err(SwarmError::Unsupported(_) | SwarmError::Corrupt(_)) = &res {
            // Fetched the old way instead, or bad: no pieces file left.
            let _ = std::fs::remove_file(part);
        }
        res
    }

    /// Tells the server a peer sent a piece that does not match.
    fn report_bad_peer(&self, peer: &str, digest: &Digest, i: usize, got: &Digest) {
        self.stats.bad_peers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = %peer, %digest, piece = i, "peer sharing: a piece does not match its digest; peer dropped and reported");
        let _ = self.events.try_send(NodeEvent {
            fetched_from_server: 0,
            fetched_from_peers: 0,
            kind: "bad_peer".into(),
            bundle: String::new(),
            version: String::new(),
            message: format!("piece {i} of {digest} from node {peer} does not match its digest (got {got})"),
            at_ms: crate::clock::now_ms(),
            peer: peer.to_string(),
        });
    }

    /// What `node` holds of `digest`, as it changes (`WatchPieces`).
    fn watch(&self, node: String, address: SocketAddr, digest: Digest) -> NewsStream<'_> {
        let name = node.clone();
        futures::stream::once(async move {
            let ch = match self.peer_channel(&node, address).await {
                Ok(ch) => ch,
                Err(e) => return futures::stream::iter([News::Ended(Some(e.to_string()))]).boxed(),
            };
            let mut c = pb::peer_service_client::PeerServiceClient::new(ch);
            let r = tokio::time::timeout(
                CONNECT_TIMEOUT,
                c.watch_pieces(pb::WatchPiecesRequest {
                    digest: digest.to_string(),
                }),
            )
            .await;
            match r {
                Ok(Ok(r)) => r
                    .into_inner()
                    .map(|m| match m {
                        Ok(h) => News::Held(h),
                        Err(s) => News::Ended(Some(s.message().to_string())),
                    })
                    .chain(futures::stream::iter([News::Ended(None)]))
                    .boxed(),
                Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                    futures::stream::iter([News::Unsupported]).boxed()
                }
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                    futures::stream::iter([News::NotServed(format!("node {node}: {}", s.message()))]).boxed()
                }
                Ok(Err(s)) => {
                    if !matches!(s.code(), tonic::Code::NotFound | tonic::Code::ResourceExhausted) {
                        self.conns.forget(&(node.clone(), address));
                    }
                    futures::stream::iter([News::Ended(Some(format!("node {node}: {}", s.message())))])
                        .boxed()
                }
                Err(_) => {
                    futures::stream::iter([News::Ended(Some(format!("node {node}: WatchPieces timed out")))])
                        .boxed()
                }
            }
        })
        .flatten()
        .map(move |n| (name.clone(), n))
        .boxed()
    }

    /// Asks the tracker.
    async fn ask(&self, digest: Digest) -> Answer {
        let ch = self
            .server
            .get()
            .ok_or_else(|| AskError::Failed("not connected to the control server".into()))?;
        let mut c = pb::agent_service_client::AgentServiceClient::new(ch);
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            c.find_peers(pb::FindPeersRequest {
                digest: digest.to_string(),
            }),
        )
        .await
        .map_err(|_| AskError::Failed("FindPeers timed out".into()))?;
        let r = match r {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                return Err(AskError::Unsupported("the control server has no tracker".into()));
            }
            Err(s) => return Err(AskError::Failed(s.message().to_string())),
        };
        let found = r
            .peers
            .into_iter()
            .filter_map(|p| {
                Some(Found {
                    address: p.address.parse().ok()?,
                    node: p.node,
                })
            })
            .collect();
        Ok((found, r.server))
    }

    /// Fetches one piece from one source into its place in `out`, hashed
    /// as it arrives, and checks it. Its bytes land before they are known
    /// good: the piece counts as held (served, skipped on a resume) only
    /// once its digest matched, and a piece is in flight from one source at
    /// a time, so a bad or short one is simply written over by the next
    /// try. Each message is written and hashed while it is in the CPU's
    /// cache, with no buffer of the whole piece.
    fn piece(&self, source: Source, job: PieceJob, out: Arc<std::fs::File>) -> PieceFuture<'_> {
        Box::pin(async move {
            let PieceJob {
                digest,
                i,
                offset,
                len,
                want,
            } = job;
            let started = Instant::now();
            let got = tokio::time::timeout(
                PIECE_DEADLINE,
                self.piece_into(&source, digest, offset, len, &out),
            )
            .await;
            let got = match got {
                Err(_) => Err(PieceError::Failed(format!(
                    "piece {i} took longer than {}s",
                    PIECE_DEADLINE.as_secs()
                ))),
                Ok(Err(e)) => Err(e),
                Ok(Ok((n, _))) if n != len => Err(PieceError::Failed(format!(
                    "piece {i}: {n} bytes, expected {len}"
                ))),
                Ok(Ok((_, got))) if got != want => Err(PieceError::Bad(want, got)),
                Ok(Ok((n, _))) => Ok(n),
            };
            (source, i, got, started.elapsed())
        })
    }

    /// Streams `len` bytes at `offset` of `digest` from `source` into
    /// `out` at the same offset; says how many came and their digest.
    async fn piece_into(
        &self,
        source: &Source,
        digest: Digest,
        offset: u64,
        len: u64,
        out: &std::fs::File,
    ) -> Result<(u64, Digest), PieceError> {
        let mut stream = self.piece_stream(source, digest, offset, len).await?;
        let mut hasher = lks_proto::digest::Hasher::new();
        let mut got = 0u64;
        while let Some(m) = stream.next().await {
            let m = m.map_err(|s| PieceError::Failed(s.message().to_string()))?;
            // A server from before `length` sends to the end.
            let take = m.data.len().min((len - got) as usize);
            let data = &m.data[..take];
            out.write_all_at(data, offset + got).map_err(PieceError::Write)?;
            hasher.update(data);
            got += take as u64;
            if got >= len {
                break;
            }
        }
        Ok((got, hasher.finish().0))
    }

    /// Opens the stream of one piece from the server or a peer.
    async fn piece_stream(
        &self,
        source: &Source,
        digest: Digest,
        offset: u64,
        len: u64,
    ) -> Result<tonic::Streaming<pb::BlobChunk>, PieceError> {
        Ok(match source {
            Source::Server => {
                let ch = self
                    .server
                    .get()
                    .ok_or_else(|| PieceError::Failed("not connected to the control server".into()))?;
                let mut c = pb::agent_service_client::AgentServiceClient::new(ch);
                c.fetch_blob(pb::FetchBlobRequest {
                    digest: digest.to_string(),
                    offset,
                    length: len,
                })
                .await
                .map_err(|s| PieceError::Failed(format!("FetchBlob: {}", s.message())))?
                .into_inner()
            }
            Source::Peer(node, addr) => {
                let ch = self
                    .peer_channel(node, *addr)
                    .await
                    .map_err(|e| PieceError::Failed(e.to_string()))?;
                let mut c = pb::peer_service_client::PeerServiceClient::new(ch);
                match c
                    .fetch_chunk(pb::FetchChunkRequest {
                        digest: digest.to_string(),
                        offset,
                        length: len,
                        queue_ms: QUEUE.as_millis() as u32,
                    })
                    .await
                {
                    Ok(r) => r.into_inner(),
                    Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                        return Err(PieceError::Busy(s.message().to_string()));
                    }
                    Err(s) if s.code() == tonic::Code::NotFound => {
                        return Err(PieceError::NotYet(s.message().to_string()));
                    }
                    Err(s) => {
                        self.conns.forget(&(node.clone(), *addr));
                        return Err(PieceError::Failed(format!("node {node}: {}", s.message())));
                    }
                }
            }
        })
    }

    async fn peer_channel(&self, node: &str, addr: SocketAddr) -> Result<Channel, DialError> {
        let key = (node.to_string(), addr);
        if let Some(c) = self.conns.get(&key) {
            return Ok(c);
        }
        let creds = NodeCredentials::load(&self.dirs).map_err(DialError::Credentials)?;
        let ch = dial_peer(&creds, &self.cluster, node, addr).await?;
        tracing::debug!(peer = %node, %addr, "peer sharing: connected to a peer");
        self.conns.insert(key, ch.clone());
        Ok(ch)
    }
}

/// Every piece is held (each checked as it arrived) and the file is as
/// long as the manifest says. Debug builds hash it whole as well: an
/// assertion of the pieces' placement wherever tests run, which a release
/// build leaves to the per-piece checks (see [`Swarm::fetch`]).
async fn check_complete(
    part: &Path,
    partial: &Partial,
    digest: &Digest,
    size: u64,
) -> Result<(), SwarmError> {
    if let Some(i) = lock(&partial.have).iter().position(|&held| !held) {
        return Err(SwarmError::Unavailable(format!(
            "piece {i} of {digest} is missing"
        )));
    }
    let len = std::fs::metadata(part)
        .map_err(|e| SwarmError::Unavailable(format!("stat {}: {e}", part.display())))?
        .len();
    if len != size {
        return Err(SwarmError::Corrupt(
            lks_proto::digest::VerifyError::SizeMismatch {
                expected: size,
                got: len,
            },
        ));
    }
    if cfg!(debug_assertions) {
        check_whole(part, digest, size).await?;
    }
    Ok(())
}

/// The file hashed whole against its digest.
async fn check_whole(part: &Path, digest: &Digest, size: u64) -> Result<(), SwarmError> {
    let p = part.to_path_buf();
    let whole = tokio::task::spawn_blocking(move || Digest::of_file(&p))
        .await
        .map_err(|e| SwarmError::Unavailable(e.to_string()))?
        .map_err(|e| SwarmError::Unavailable(format!("read {}: {e}", part.display())))?;
    if whole != (*digest, size) {
        return Err(SwarmError::Corrupt(
            lks_proto::digest::VerifyError::DigestMismatch {
                expected: *digest,
                got: whole.0,
            },
        ));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which pieces of a partial file are already good (after a restart).
fn resume(part: &Path, size: u64, info: &BlobInfo, whole: &Digest) -> Vec<bool> {
    let pieces = info.pieces();
    let Ok(f) = std::fs::File::open(part) else {
        return vec![false; pieces.len()];
    };
    if f.metadata().map(|m| m.len()).unwrap_or(0) != size {
        return vec![false; pieces.len()];
    }
    pieces
        .iter()
        .enumerate()
        .map(|(i, &(off, len))| {
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, off).is_ok() && Digest::of(&buf) == info.piece_digest(i, whole)
        })
        .collect()
}

/// News from one watched peer.
enum News {
    Held(pb::PiecesHeld),
    /// It has no `WatchPieces` (an older agent).
    Unsupported,
    /// It does not serve the blob at all (`NOT_FOUND`): not one of its
    /// bundles' (any more), or a patch it does not hold.
    NotServed(String),
    /// The watch ended: normally (`None`) or why.
    Ended(Option<String>),
}

type NewsStream<'a> = BoxStream<'a, (String, News)>;

/// One piece to fetch: of which blob, its index, where it is in the blob,
/// and the digest it must have.
struct PieceJob {
    digest: Digest,
    i: usize,
    offset: u64,
    len: u64,
    want: Digest,
}

/// One piece being fetched: its source, its index, how many bytes it
/// wrote (all of it, verified) or why not, and how long it took.
type PieceFuture<'a> =
    Pin<Box<dyn Future<Output = (Source, usize, Result<u64, PieceError>, Duration)> + Send + 'a>>;

#[derive(Clone, Debug)]
enum Source {
    Server,
    Peer(String, SocketAddr),
}

enum PieceError {
    /// The peer has not got it (yet): another source.
    NotYet(String),
    /// The peer is at its upload limit: another source, or it again soon.
    Busy(String),
    Failed(String),
    /// Bytes that do not match: the digest wanted, the one got.
    Bad(Digest, Digest),
    /// This node could not write the piece (its disk): the fetch fails.
    Write(std::io::Error),
}

enum AskError {
    Unsupported(String),
    Failed(String),
}
