//! The agent API's blob side: `FindPeers` (which peers may serve a piece
//! of a blob, when the cluster shares between nodes) and `FetchBlob`
//! (the bytes from this replica's copy, streamed in bounded messages),
//! and `FindDeltas` (the patches that rebuild a blob, issue [delta]).
//! A node gets only blobs of bundles assigned to it, and the patches that
//! rebuild them.

use std::sync::Arc;

use lks_proto::Digest;
use lks_proto::pb;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::BoxStream;
use crate::authz::{blob_status, require_node, store_status};
use crate::blobs::Blobs;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::peers::PeerCache;
use crate::store::{PeerSettings, Store};
use crate::tracker::Tracker;

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
    /// The peer-sharing settings of `cluster`, read through the cache.
    async fn peer_settings(&self, cluster: &str) -> crate::store::Result<PeerSettings> {
        self.peers.get(&*self.store, &self.hub, cluster).await
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
    let settings = s.peer_settings(&caller.id.cluster).await.map_err(store_status)?;
    // Sharing off, or a blob the caller may not have: nobody is named
    // (FetchBlob then answers for the blob as it always did). A patch is
    // shared like the blob it rebuilds.
    let mut allowed = settings.enabled
        && s.tracker
            .blob_allowed(&*s.store, &caller.id.cluster, &caller.id.node, &digest)
            .await
            .map_err(store_status)?;
    let patch = settings.enabled && !allowed && patch_for(s, &caller.id, &digest).await?.is_some();
    allowed |= patch;
    if !allowed {
        return Ok(Response::new(pb::FindPeersResponse {
            peers: Vec::new(),
            server: true,
        }));
    }
    let a = s
        .tracker
        .find(
            &*s.store,
            &caller.id.cluster,
            &caller.id.node,
            digest,
            settings.port,
            patch,
        )
        .await
        .map_err(store_status)?;
    tracing::debug!(%digest, peers = a.peers.len(), server = a.server, "peers named");
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
    let allowed = s
        .tracker
        .blob_allowed(&*s.store, &caller.id.cluster, &caller.id.node, &digest)
        .await
        .map_err(store_status)?;
    if !allowed {
        return Ok(Response::new(pb::FindDeltasResponse::default()));
    }
    let mut best: std::collections::BTreeMap<Digest, crate::store::DeltaRow> = Default::default();
    for row in s.store.deltas_to(&digest).await.map_err(store_status)? {
        if best.get(&row.base).is_none_or(|b| row.patch_size < b.patch_size) {
            best.insert(row.base, row);
        }
    }
    let mut offers: Vec<pb::DeltaOffer> = Vec::new();
    for r in best.into_values() {
        let Some(patch) = r.patch else { continue };
        // A patch of more than one piece gets its piece list, so peers can
        // pass it on in checked pieces; without one (a blob this replica
        // cannot read now) it is offered as one piece all the same.
        let mut chunk_size = 0;
        let mut chunk_digests = Vec::new();
        if r.patch_size > u64::from(lks_proto::chunks::DEFAULT_CHUNK_SIZE) {
            match s.blobs.pieces_of(&patch).await {
                Ok(Some(c)) => {
                    chunk_size = c.size;
                    chunk_digests = c.digests.iter().map(|d| d.as_bytes().to_vec()).collect();
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(%patch, error = %e, "no piece list for a patch"),
            }
        }
        offers.push(pb::DeltaOffer {
            base_digest: r.base.to_string(),
            patch_digest: patch.to_string(),
            patch_size: r.patch_size,
            algorithm: r.algorithm,
            chunk_size,
            chunk_digests,
        });
    }
    offers.sort_by_key(|o| o.patch_size);
    Ok(Response::new(pb::FindDeltasResponse { offers }))
}

/// The patch record that lets `node` have the patch `digest`: one that
/// rebuilds a blob the node may fetch. `None`: not a patch, or none of the
/// node's.
async fn patch_for(
    s: &Deps,
    node: &lks_proto::identity::NodeIdentity,
    digest: &Digest,
) -> Result<Option<crate::store::DeltaRow>, Status> {
    for row in s.store.deltas_by_patch(digest).await.map_err(store_status)? {
        if s.tracker
            .blob_allowed(&*s.store, &node.cluster, &node.node, &row.target)
            .await
            .map_err(store_status)?
        {
            return Ok(Some(row));
        }
    }
    Ok(None)
}

/// `FetchBlob`: the blob from `offset`, `length` bytes (0: to the end).
pub(super) async fn fetch(
    s: &Deps,
    req: Request<pb::FetchBlobRequest>,
) -> Result<Response<BoxStream<pb::BlobChunk>>, Status> {
    let caller = require_node(&req, &*s.store).await?;
    let r = req.into_inner();
    let digest = request_digest(&r.digest)?;
    let allowed = s
        .tracker
        .blob_allowed(&*s.store, &caller.id.cluster, &caller.id.node, &digest)
        .await
        .map_err(store_status)?;
    // A patch (binary delta) is served wherever the file it rebuilds is;
    // `spared` is that file's size less the patch's, for the metrics.
    let mut spared = None;
    if !allowed {
        spared = patch_for(s, &caller.id, &digest)
            .await?
            .map(|row| row.size.saturating_sub(row.patch_size));
    }
    if !allowed && spared.is_none() {
        return Err(Status::permission_denied(format!(
            "blob {digest} is not part of any bundle assigned to node {} (for its architecture)",
            caller.id.node
        )));
    }
    // Published through another replica: fetched once from the blob
    // store, verified, then served from this replica's own copy.
    s.blobs
        .ensure_local(&digest)
        .await
        .map_err(|e| blob_status("", e))?;
    let path = s.blobs.local.path(&digest);
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Status::not_found(format!(
                "blob {digest} is not in the control server's blob store (its bundle lists a mirror URL)"
            )));
        }
        Err(e) => return Err(Status::internal(format!("open blob {digest}: {e}"))),
    };
    let size = file
        .metadata()
        .await
        .map_err(|e| Status::internal(format!("stat blob {digest}: {e}")))?
        .len();
    if r.offset > size {
        return Err(Status::out_of_range(format!(
            "offset {} is past the end of blob {digest} ({size} bytes)",
            r.offset
        )));
    }
    file.seek(std::io::SeekFrom::Start(r.offset))
        .await
        .map_err(|e| Status::internal(format!("seek blob {digest}: {e}")))?;
    let (tx, rx) = mpsc::channel(4);
    let metrics = s.metrics.clone();
    let cancel = s.cancel.clone();
    s.tasks.spawn(async move {
        // `length` 0: to the end (and what a client from before the
        // field asks for).
        let mut remaining = match r.length {
            0 => size - r.offset,
            n => n.min(size - r.offset),
        };
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
