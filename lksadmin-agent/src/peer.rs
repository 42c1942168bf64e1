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
//!   while this node is fetching one itself, the pieces it has verified.
//! - Each piece is read and checked against its digest before a byte is
//!   sent, so a cache corrupted on disk is never passed on.
//! - At most `max_uploads` at once (more: `RESOURCE_EXHAUSTED`, the caller
//!   tries elsewhere at once), all together at most `upload_rate` bytes/s,
//!   and each upload ends after [`UPLOAD_DEADLINE`].
//! - Off: no listener, no port open.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use lks_proto::chunks::Chunks;
use lks_proto::identity::Identity;
use lks_proto::{Digest, pb};
use rustls::server::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::client::NodeCredentials;
use crate::config::StateDir;

/// Longest one upload may take.
pub const UPLOAD_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes per message of an upload.
const MESSAGE: usize = 256 << 10;
/// Longest a TLS handshake with a peer may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
#[derive(Default)]
pub struct Shared {
    served: Mutex<HashMap<Digest, BlobInfo>>,
    partial: Mutex<HashMap<Digest, Arc<Partial>>>,
    pub stats: Stats,
}

/// Counters, for logs and the node's status.
#[derive(Default)]
pub struct Stats {
    pub uploads: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub refused_identity: AtomicU64,
    pub refused_blob: AtomicU64,
    pub refused_busy: AtomicU64,
}

impl Shared {
    /// The blobs of the desired bundles (the only ones served), with the
    /// chunk lists they came with.
    pub fn set_served(&self, desired: &pb::DesiredState) {
        let mut m = HashMap::new();
        for b in &desired.bundles {
            let Some(man) = &b.manifest else { continue };
            let mine = crate::facts::architecture().map(|a| a.as_str());
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
        *lock(&self.served) = m;
    }

    pub fn served(&self, d: &Digest) -> Option<BlobInfo> {
        lock(&self.served).get(d).cloned()
    }

    pub fn start_partial(&self, d: Digest, p: Arc<Partial>) {
        lock(&self.partial).insert(d, p);
    }

    pub fn end_partial(&self, d: &Digest) {
        lock(&self.partial).remove(d);
    }

    fn partial(&self, d: &Digest) -> Option<Arc<Partial>> {
        lock(&self.partial).get(d).cloned()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The settings a listener runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Running {
    listen: SocketAddr,
    upload_rate: u64,
    max_uploads: u32,
    /// The node certificate it serves with: a renewed one restarts it.
    cert_pem: String,
}

/// Starts, changes and stops the peer listener as the cluster's settings
/// come and go.
pub struct PeerHost {
    dirs: StateDir,
    cluster: String,
    cache: PathBuf,
    shared: Arc<Shared>,
    /// `--peer-listen`: where to listen instead of all addresses on the
    /// cluster's port.
    listen_override: Option<SocketAddr>,
    running: Option<(Running, CancellationToken)>,
}

impl PeerHost {
    pub fn new(
        dirs: StateDir,
        cluster: String,
        shared: Arc<Shared>,
        listen_override: Option<SocketAddr>,
    ) -> Self {
        PeerHost {
            cache: dirs.cache(),
            dirs,
            cluster,
            shared,
            listen_override,
            running: None,
        }
    }

    /// Follows one desired state: what is served, and whether and how the
    /// listener runs.
    pub async fn apply(&mut self, desired: &pb::DesiredState) {
        self.shared.set_served(desired);
        let cert_pem = std::fs::read_to_string(self.dirs.node_cert()).unwrap_or_default();
        let want = desired.peer_sharing.as_ref().map(|p| Running {
            cert_pem,
            listen: self
                .listen_override
                .unwrap_or_else(|| SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), p.port as u16)),
            upload_rate: p.upload_rate,
            max_uploads: p.max_uploads.clamp(1, 64),
        });
        if self.running.as_ref().map(|r| &r.0) == want.as_ref() {
            return;
        }
        self.stop();
        let Some(want) = want else { return };
        match self.start(&want).await {
            Ok(cancel) => {
                tracing::info!(
                    listen = %want.listen,
                    max_uploads = want.max_uploads,
                    upload_rate = want.upload_rate,
                    "peer sharing on: serving this node's blobs to its cluster"
                );
                self.running = Some((want, cancel));
            }
            Err(e) => tracing::warn!(listen = %want.listen, "peer sharing: cannot listen: {e}"),
        }
    }

    pub fn stop(&mut self) {
        if let Some((r, cancel)) = self.running.take() {
            cancel.cancel();
            tracing::info!(listen = %r.listen, "peer sharing off: listener closed");
        }
    }

    async fn start(&self, r: &Running) -> Result<CancellationToken, String> {
        let creds = NodeCredentials::load(&self.dirs).map_err(|e| e.to_string())?;
        let tls = server_config(&creds)?;
        let listener = match TcpListener::bind(r.listen).await {
            Ok(l) => l,
            // A host without IPv6: all IPv4 addresses instead.
            Err(_) if r.listen.ip() == std::net::Ipv6Addr::UNSPECIFIED => TcpListener::bind(SocketAddr::new(
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                r.listen.port(),
            ))
            .await
            .map_err(|e| format!("bind {}: {e}", r.listen))?,
            Err(e) => return Err(format!("bind {}: {e}", r.listen)),
        };
        let cancel = CancellationToken::new();
        let svc = PeerApi {
            cluster: self.cluster.clone(),
            cache: self.cache.clone(),
            shared: self.shared.clone(),
            uploads: Arc::new(Semaphore::new(r.max_uploads as usize)),
            rate: Arc::new(RateLimit::new(r.upload_rate)),
        };
        let incoming = incoming(listener, TlsAcceptor::from(tls), cancel.clone());
        let c = cancel.clone();
        tokio::spawn(async move {
            // The control server's transport limits, and invalid_argument
            // for a request that does not decode (lks_proto::wire).
            let res = tonic::transport::Server::builder()
                .http2_max_header_list_size(lks_proto::wire::MAX_HEADER_LIST)
                .layer(lks_proto::wire::MalformedRequestLayer)
                .add_service(
                    pb::peer_service_server::PeerServiceServer::new(svc)
                        .max_decoding_message_size(lks_proto::wire::MAX_MESSAGE),
                )
                .serve_with_incoming_shutdown(incoming, c.cancelled_owned())
                .await;
            if let Err(e) = res {
                tracing::warn!("peer listener ended: {e}");
            }
        });
        Ok(cancel)
    }
}

impl Drop for PeerHost {
    fn drop(&mut self) {
        self.stop();
    }
}

/// TLS for the listener: the node certificate, client certificates
/// required and checked against the node's CA, ALPN h2.
fn server_config(creds: &NodeCredentials) -> Result<Arc<ServerConfig>, String> {
    lks_proto::tls::server_config(
        &creds.cert_pem,
        &creds.key_pem,
        &creds.ca_pem,
        lks_proto::tls::ClientCerts::Required,
    )
}

/// Accepted connections, each handshaken in its own task (a peer that
/// stalls its handshake holds up nobody).
fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cancel: CancellationToken,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (tcp, addr) = tokio::select! {
                _ = cancel.cancelled() => return,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!("peer accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::info!(peer = %addr, "peer refused at TLS: {e}"),
                    Err(_) => tracing::info!(peer = %addr, "peer TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

struct PeerApi {
    cluster: String,
    cache: PathBuf,
    shared: Arc<Shared>,
    uploads: Arc<Semaphore>,
    rate: Arc<RateLimit>,
}

type ChunkStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::peer_service_server::PeerService for PeerApi {
    type FetchChunkStream = ChunkStream;

    async fn fetch_chunk(
        &self,
        req: Request<pb::FetchChunkRequest>,
    ) -> Result<Response<Self::FetchChunkStream>, Status> {
        let stats = &self.shared.stats;
        let caller = req
            .peer_certs()
            .and_then(|c| c.first().map(|c| Identity::from_cert_der(c.as_ref())));
        let caller = match caller {
            Some(Ok(Identity::Node(id))) if id.cluster == self.cluster => id,
            other => {
                stats.refused_identity.fetch_add(1, Ordering::Relaxed);
                let who = match other {
                    Some(Ok(Identity::Node(id))) => format!("node {} of cluster {}", id.node, id.cluster),
                    Some(Ok(Identity::Admin { name })) => format!("admin {name}"),
                    _ => "a caller without a node certificate".into(),
                };
                tracing::warn!(
                    "peer sharing: refused {who}: not a node of cluster {}",
                    self.cluster
                );
                return Err(Status::permission_denied(format!(
                    "{who} is not a node of cluster {}",
                    self.cluster
                )));
            }
        };
        let r = req.into_inner();
        let digest: Digest = r
            .digest
            .parse()
            .map_err(|e| Status::invalid_argument(format!("digest: {e}")))?;
        let Some(info) = self.shared.served(&digest) else {
            stats.refused_blob.fetch_add(1, Ordering::Relaxed);
            tracing::info!(peer = %caller.node, %digest, "peer sharing: refused a blob this node does not serve");
            return Err(Status::not_found(format!(
                "{digest} is not a blob of this node's bundles"
            )));
        };
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
        let Ok(permit) = self.uploads.clone().try_acquire_owned() else {
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
}

/// Reads piece `i` of `digest` from the cache or `fetched/` (whole blob) or
/// from this node's own download in progress, and checks it.
fn read_piece(
    cache: &std::path::Path,
    shared: &Shared,
    digest: &Digest,
    i: usize,
    offset: u64,
    len: u64,
    want: &Digest,
) -> Result<Vec<u8>, Status> {
    // A whole blob: in the cache, or a verified download an apply has not
    // moved beside its target yet.
    let whole = cache.join("sha256").join(digest.hex());
    let fetched = cache.join("fetched").join(digest.hex());
    let path = if whole.is_file() {
        whole
    } else if fetched.is_file() {
        fetched
    } else {
        match shared.partial(digest) {
            Some(p) if lock(&p.have).get(i).copied().unwrap_or(false) => p.path.clone(),
            _ => {
                return Err(Status::not_found(format!(
                    "this node does not hold piece {i} of {digest} yet"
                )));
            }
        }
    };
    let f = std::fs::File::open(&path).map_err(|e| Status::not_found(format!("{digest}: {e}")))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset)
        .map_err(|e| Status::not_found(format!("{digest}: read piece {i}: {e}")))?;
    if Digest::of(&buf) != *want {
        tracing::warn!(%digest, piece = i, "peer sharing: a cached piece does not match its digest; not served");
        return Err(Status::data_loss(format!(
            "piece {i} of {digest} is damaged on this node"
        )));
    }
    Ok(buf)
}

fn async_stream_chunks(
    bytes: Vec<u8>,
    corrupt: bool,
    rate: Arc<RateLimit>,
    deadline: tokio::time::Instant,
    total: u64,
    permit: tokio::sync::OwnedSemaphorePermit,
    shared: Arc<Shared>,
) -> ChunkStream {
    let bytes = Arc::new(bytes);
    let n = bytes.len();
    let starts: Vec<usize> = (0..n.max(1)).step_by(MESSAGE).collect();
    futures::stream::iter(starts)
        .then(move |start| {
            let (bytes, rate, shared) = (bytes.clone(), rate.clone(), shared.clone());
            let _hold = &permit;
            async move {
                let end = (start + MESSAGE).min(bytes.len());
                let mut data = bytes[start..end].to_vec();
                if corrupt && start == 0 && !data.is_empty() {
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
                    data,
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
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_paces_bytes() {
        let r = RateLimit::new(1_000_000);
        let t0 = tokio::time::Instant::now();
        for _ in 0..10 {
            r.take(250_000).await;
        }
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(2_400), "2.5 MB at 1 MB/s: {took:?}");
        assert!(took <= Duration::from_millis(2_600), "{took:?}");
        let free = RateLimit::new(0);
        let t1 = tokio::time::Instant::now();
        free.take(u64::MAX).await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }

    #[test]
    fn pieces_without_a_list_are_the_whole_file() {
        let i = BlobInfo {
            size: 10,
            chunks: None,
        };
        assert_eq!(i.pieces(), vec![(0, 10)]);
        let d = Digest::of(b"x");
        assert_eq!(i.piece_digest(0, &d), d);
    }
}
