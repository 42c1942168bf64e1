//! The agent API's blob side: `FindPeers` (which peers may serve a piece
//! of a blob, when the cluster shares between nodes) and `FetchBlob`
//! (the bytes from this replica's copy, streamed in bounded messages),
//! and `FindDeltas` (the patches that rebuild a blob, issue [delta]).
//! A node gets only blobs of bundles assigned to it, and the patches that
//! rebuild them (`ops::blob` decides; here the requests are decoded and
//! the bytes streamed).

use std::sync::Arc;

use lks_proto::Digest;
use lks_proto::pb;
use lks_tracker::Tracker;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::BoxStream;
use crate::authz::require_node;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::ops::blob;
use crate::peers::PeerCache;
use crate::store::Store;
use lks_blobs::Blobs;

crate::context::shared_view! {
    /// What the blob handlers use: the store (who may have what), the blobs,
    /// the peer tracker and settings, and the tasks that stream a fetch.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        blobs: Arc<Blobs>,
        tracker: Arc<Tracker>,
        peers: Arc<PeerCache>,
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
        cancel: tokio_util::sync::CancellationToken,
        tasks: tokio_util::task::TaskTracker,
    }
}

impl Deps {
    /// What the blob operations use, borrowed.
    fn ops(&self) -> blob::Deps<'_> {
        blob::Deps {
            store: &*self.store,
            tracker: &self.tracker,
            blobs: &self.blobs,
            peers: &self.peers,
            hub: &self.hub,
        }
    }
}

/// Bytes per `FetchBlob` message. 256 KiB measured faster than 64 KiB
/// (fewer messages to frame, encode and decode); a fetch holds at most six
/// of them (the read, four queued, one being encoded).
const BLOB_CHUNK: usize = 256 * 1024;

/// The blob a request names (`sha256:<hex>`); one line when it is not one.
fn request_digest(text: &str) -> Result<Digest, Status> {
    text.parse()
        .map_err(|e| Status::invalid_argument(format!("digest: {e}")))
}

/// `FindPeers`: the peers that may serve a blob to the caller, and whether the server does.
pub(super) async fn find_peers(
    s: &Deps,
    req: Request<pb::FindPeersRequest>,
) -> Result<Response<pb::FindPeersResponse>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    let digest = request_digest(&req.into_inner().digest)?;
    let a = blob::peers(&s.ops(), &caller.id, digest).await?;
    Ok(Response::new(pb::FindPeersResponse {
        peers: a
            .peers
            .into_iter()
            .map(|p| pb::PeerSource {
                node: p.node,
                address: p.address.to_string(),
            })
            .collect(),
        server: a.server,
    }))
}

/// `FindDeltas`: the patches held that rebuild a blob the caller may
/// fetch, one per base (the smallest), smallest first.
pub(super) async fn find_deltas(
    s: &Deps,
    req: Request<pb::FindDeltasRequest>,
) -> Result<Response<pb::FindDeltasResponse>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    let digest = request_digest(&req.into_inner().digest)?;
    let offers = blob::deltas(&s.ops(), &caller.id, digest).await?;
    Ok(Response::new(pb::FindDeltasResponse {
        offers: offers.into_iter().map(offer_pb).collect(),
    }))
}

/// A patch offered, its piece list absent (0, empty) when it has none.
fn offer_pb(o: blob::Offer) -> pb::DeltaOffer {
    let (chunk_size, chunk_digests) = match o.pieces {
        Some(c) => (c.size, c.digests.iter().map(|d| d.as_bytes().to_vec()).collect()),
        None => (0, Vec::new()),
    };
    pb::DeltaOffer {
        base_digest: o.base.to_string(),
        patch_digest: o.patch.to_string(),
        patch_size: o.patch_size,
        algorithm: o.algorithm,
        chunk_size,
        chunk_digests,
    }
}

/// `FetchBlob`: the blob from `offset`, `length` bytes (0: to the end),
/// once `ops::blob::open` found the caller may have it.
pub(super) async fn fetch(
    s: &Deps,
    req: Request<pb::FetchBlobRequest>,
) -> Result<Response<BoxStream<pb::BlobChunk>>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    let r = req.into_inner();
    let digest = request_digest(&r.digest)?;
    let range = blob::Range {
        offset: r.offset,
        length: r.length,
    };
    let blob::Opened {
        mut file,
        size,
        length,
        spared,
    } = blob::open(&s.ops(), &caller.id, digest, range).await?;
    let (tx, rx) = mpsc::channel(4);
    let metrics = s.metrics.clone();
    let cancel = s.cancel.clone();
    s.tasks.spawn(async move {
        let mut remaining = length;
        if remaining == 0 {
            let _ = tx
                .send(Ok(pb::BlobChunk {
                    data: Default::default(),
                    total_size: size,
                }))
                .await;
            return;
        }
        while remaining > 0 {
            // Read straight into the message's buffer: no copy.
            let mut buf = vec![0u8; BLOB_CHUNK.min(remaining as usize)];
            let n = match file.read(&mut buf).await {
                Ok(0) => {
                    let _ = tx
                        .send(Err(Status::internal(format!(
                            "blob {digest} is shorter than expected"
                        ))))
                        .await;
                    return;
                }
                Ok(n) => n.min(remaining as usize),
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::internal(format!("read blob {digest}: {e}"))))
                        .await;
                    return;
                }
            };
            remaining -= n as u64;
            buf.truncate(n);
            let chunk = pb::BlobChunk {
                data: buf.into(),
                total_size: size,
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = tx.send(Ok(chunk)) => if r.is_err() { return },
            }
            metrics.blob_bytes_served(n as u64);
            if let Some(spared) = spared {
                // Spared once, with the patch's last byte.
                metrics.delta_bytes_served(n as u64, if remaining == 0 { spared } else { 0 });
            }
        }
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
}
