//! Where blob bytes come from: the control server (`FetchBlob` over the
//! node's mTLS channel) or, for files with a `url`, a mirror over HTTP(S).
//! [`NetSource`] implements the apply layer's [`BlobSource`] port, and hands
//! it peer sharing's [`Swarm`] as its [`PieceSource`] while that is on.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use lks_proto::chunks::Chunks;
use lks_proto::{Digest, FileSpec, pb};

use crate::apply::source::{BlobSource, BlobStream, DeltaOffer, PieceSource, SourceError};
use crate::link::channel::{SharedChannel, error_chain};
use crate::link::peer::BlobInfo;
use crate::link::swarm::Swarm;

/// The real source: mirror URLs with reqwest, everything else from the server.
#[derive(Clone)]
pub struct NetSource {
    http: reqwest::Client,
    server: SharedChannel,
    swarm: Option<Arc<Swarm>>,
}

impl NetSource {
    pub fn new(server: SharedChannel) -> Result<Self, SourceError> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(20))
            .read_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| SourceError(format!("build HTTP client: {}", error_chain(&e))))?;
        Ok(NetSource {
            http,
            server,
            swarm: None,
        })
    }

    /// Fetches through peers while peer sharing is on.
    pub fn with_swarm(mut self, swarm: Arc<Swarm>) -> Self {
        self.swarm = Some(swarm);
        self
    }

    async fn open_url(&self, url: &str, offset: u64) -> Result<BlobStream, SourceError> {
        let mut req = self.http.get(url);
        if offset > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={offset}-"));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| SourceError(format!("GET {url}: {}", error_chain(&e))))?;
        let status = resp.status();
        let start = if status == reqwest::StatusCode::PARTIAL_CONTENT {
            offset
        } else if status.is_success() {
            0
        } else {
            return Err(SourceError(format!("GET {url}: HTTP {status}")));
        };
        let url = url.to_string();
        let chunks = resp
            .bytes_stream()
            .map(move |r| r.map_err(|e| SourceError(format!("GET {url}: {}", error_chain(&e)))))
            .boxed();
        Ok(BlobStream {
            offset: start,
            chunks,
        })
    }

    async fn open_server(&self, file: &FileSpec, offset: u64) -> Result<BlobStream, SourceError> {
        let channel = self
            .server
            .get()
            .ok_or_else(|| SourceError("not connected to the control server".into()))?;
        let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
        let digest = file.digest.to_string();
        let resp = client
            .fetch_blob(pb::FetchBlobRequest {
                length: 0,
                digest: digest.clone(),
                offset,
            })
            .await
            .map_err(|s| SourceError(format!("FetchBlob {digest}: {}", s.message())))?;
        let size = file.size;
        let chunks = resp
            .into_inner()
            .map(move |r| match r {
                Ok(c) if c.total_size != 0 && c.total_size != size => Err(SourceError(format!(
                    "FetchBlob {digest}: server announces {} bytes, the manifest {size}",
                    c.total_size
                ))),
                Ok(c) => Ok(c.data),
                Err(s) => Err(SourceError(format!("FetchBlob {digest}: {}", s.message()))),
            })
            .boxed();
        Ok(BlobStream { offset, chunks })
    }
}

impl BlobSource for NetSource {
    fn open<'a>(&'a self, file: &'a FileSpec, offset: u64) -> BoxFuture<'a, Result<BlobStream, SourceError>> {
        Box::pin(async move {
            match &file.url {
                Some(url) => self.open_url(url, offset).await,
                None => self.open_server(file, offset).await,
            }
        })
    }

    fn deltas<'a>(&'a self, file: &'a FileSpec) -> BoxFuture<'a, Result<Vec<DeltaOffer>, SourceError>> {
        Box::pin(async move {
            let channel = self
                .server
                .get()
                .ok_or_else(|| SourceError("not connected to the control server".into()))?;
            let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
            let digest = file.digest.to_string();
            let resp = match client
                .find_deltas(pb::FindDeltasRequest {
                    digest: digest.clone(),
                })
                .await
            {
                Ok(r) => r.into_inner(),
                // A server from before deltas.
                Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(Vec::new()),
                Err(s) => return Err(SourceError(format!("FindDeltas {digest}: {}", s.message()))),
            };
            // Transport only: an offer that does not parse is skipped, a
            // wrong one fails the rebuild's checks.
            Ok(resp
                .offers
                .into_iter()
                .filter_map(|o| {
                    let patch: Digest = o.patch_digest.parse().ok()?;
                    // A piece list that does not describe the patch is
                    // dropped: the patch then moves as one piece.
                    let chunks = (o.chunk_size != 0)
                        .then(|| Chunks {
                            size: o.chunk_size,
                            digests: o
                                .chunk_digests
                                .iter()
                                .filter_map(|x| {
                                    <[u8; 32]>::try_from(x.as_slice()).ok().map(Digest::from_bytes)
                                })
                                .collect(),
                        })
                        .filter(|c| c.validate(o.patch_size, &patch).is_ok());
                    Some(DeltaOffer {
                        base: o.base_digest.parse().ok()?,
                        patch,
                        patch_size: o.patch_size,
                        algorithm: o.algorithm,
                        chunks,
                    })
                })
                .collect())
        })
    }

    fn holding_patch(&self, offer: &DeltaOffer, target: &Digest) {
        if let Some(s) = &self.swarm {
            s.shared().add_patch(
                offer.patch,
                BlobInfo {
                    size: offer.patch_size,
                    chunks: offer.chunks.clone(),
                },
                *target,
            );
        }
    }

    fn keep_serving_moved(&self, digest: Digest, path: &std::path::Path) {
        if let Some(s) = self.swarm.as_deref().filter(|s| s.is_on())
            && let Ok(file) = std::fs::File::open(path)
        {
            s.shared().keep_moved(digest, file);
        }
    }

    fn release_moved(&self) {
        if let Some(s) = &self.swarm {
            s.shared().release_moved();
        }
    }

    fn swarm(&self) -> Option<&dyn PieceSource> {
        self.swarm
            .as_deref()
            .filter(|s| s.is_on())
            .map(|s| s as &dyn PieceSource)
    }
}
