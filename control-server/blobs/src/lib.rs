//! Blobs: the bytes of the bundle files the server serves itself (files
//! without a mirror URL), named by their SHA-256.
//!
//! Two layers, joined by [`Blobs`]:
//! - [`LocalBlobs`], verified files in the data dir (`DATA_DIR/blobs`):
//!   what this replica serves agents from;
//! - a [`BlobStore`], where a blob is durable once `publish` answers and
//!   where every replica finds it: the data dir itself ([`LocalDirStore`],
//!   one server on SQLite), etcd in chunks ([`EtcdChunks`], small
//!   installations on etcd), or an S3-compatible bucket ([`S3Store`]).
//!
//! Publish writes a blob into the local dir (verified while it streams in),
//! then puts it into the store (its SHA-256 computed again on the way), and
//! only then records the bundle. A replica asked for a blob it lacks fetches
//! it from the store once, verifying it before it gets its local name.
//! Handlers see only [`Blobs`]; none branches on the backend.
//!
//! Beside them, what works on the blobs alone: the collector and the claim
//! a publish makes ([`gc`]) and the binary-delta maker ([`delta`]). The
//! crate links the store's rows and traits (`lks-store`) and its etcd
//! backend for the chunks' handle (`lks-store-etcd`), never the server or
//! tonic: the server (`lks-control-server`) opens a [`Blobs`] from its
//! flags, serves it and runs the collector and the maker as its tasks.

#![forbid(unsafe_code)]

pub mod delta;
mod etcd;
pub mod gc;
mod local;
pub mod s3;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lks_proto::Digest;
use lks_proto::digest::VerifyError;

pub use etcd::{DEFAULT_MAX_BLOB, EtcdChunks};
pub use local::{BlobWriter, LocalBlobs, LocalDirStore, StagedBlob};
pub use s3::{S3Config, S3Store};

use lks_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob {digest}: {source}")]
    Verify { digest: Digest, source: VerifyError },
    #[error("blob store {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "{digest} is {size} bytes, more than the {max} bytes a control server on etcd keeps per file \
         (--etcd-max-blob-size); keep blobs in an object store (--blob-store s3://BUCKET/PREFIX) \
         or serve the file from a mirror (`url` and `sha256` in bundle.toml)"
    )]
    TooLarge { digest: Digest, size: u64, max: u64 },
    /// etcd, holding the chunks, failed.
    #[error("{0}")]
    Meta(#[from] StoreError),
    /// The object store cannot be reached or failed in a way a retry may
    /// mend (connection refused, timeout, 5xx).
    #[error("blob store {store} is unavailable: {message}")]
    Unavailable { store: String, message: String },
    /// The object store refused (credentials, permissions, no bucket).
    #[error("blob store {store}: {message}")]
    Refused { store: String, message: String },
    /// What the store holds under a blob's name is not that blob.
    #[error("blob store {store}: {digest}: {message}")]
    Corrupt {
        store: String,
        digest: Digest,
        message: String,
    },
}

impl BlobError {
    /// True if retrying later may succeed (the store or etcd is down).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            BlobError::Unavailable { .. } | BlobError::Meta(StoreError::Unavailable(_))
        )
    }
}

/// `--blob-store`: where blobs are durable.
#[derive(Clone, Debug, Default)]
pub enum BlobChoice {
    /// `local` with `--store sqlite`, `etcd` with `--store etcd`.
    #[default]
    Default,
    /// The data dir (one server).
    Local,
    /// etcd, in chunks, capped by `--etcd-max-blob-size`.
    Etcd,
    /// An S3-compatible bucket.
    S3(S3Config),
}

/// A blob as a store lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlob {
    pub digest: Digest,
    pub size: u64,
}

/// Where blobs are durable and shared by every replica. One conformance
/// suite ([`conformance`]) runs on every implementation.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync {
    /// How the operator named it (`local`, `etcd`, `s3://bucket/prefix`).
    fn describe(&self) -> String;
    /// Largest blob the store takes, if it has a limit.
    fn max_blob_size(&self) -> Option<u64> {
        None
    }
    /// Proves at start that the store is reachable, the credentials work
    /// and the bucket exists and is writable: one clear error otherwise.
    async fn check(&self) -> Result<(), BlobError>;
    /// True if the store holds the whole blob.
    async fn contains(&self, d: &Digest) -> Result<bool, BlobError>;
    /// Copies the local file `from` (the blob `d`, `size` bytes) into the
    /// store. Its SHA-256 is computed again while it is read; nothing is
    /// visible under the blob's name unless the whole blob matched.
    async fn put(&self, d: &Digest, size: u64, from: &Path) -> Result<(), BlobError>;
    /// Streams the blob into `into`, where it gets its name only if its
    /// digest and size match. False if the store does not hold it.
    async fn fetch(&self, d: &Digest, into: &LocalBlobs) -> Result<bool, BlobError>;
    /// Starts putting a blob while its bytes still stream in (a publish):
    /// the bytes go to [`Upload::write`] as they arrive, and nothing is
    /// visible until [`Upload::finish`], which the caller calls only once
    /// the whole blob was verified. `None`: this store does not stream (or
    /// holds the blob already); [`Self::put`] follows from the file.
    async fn start_upload(&self, _d: &Digest, _size: u64) -> Result<Option<Box<dyn Upload>>, BlobError> {
        Ok(None)
    }
    /// Removes the blob; removing an absent blob is not an error.
    async fn delete(&self, d: &Digest) -> Result<(), BlobError>;
    /// Every blob the store holds.
    async fn list(&self) -> Result<Vec<StoredBlob>, BlobError>;
}

/// A blob being put while it streams in ([`BlobStore::start_upload`]).
#[async_trait::async_trait]
pub trait Upload: Send {
    async fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError>;
    /// Makes the blob visible under its name; only for a verified blob.
    async fn finish(self: Box<Self>) -> Result<(), BlobError>;
    /// Drops what was sent; nothing becomes visible.
    async fn abort(self: Box<Self>);
}

/// The blobs of this server: its local, verified copies and the store
/// that makes them durable and shared.
pub struct Blobs {
    pub local: LocalBlobs,
    store: Arc<dyn BlobStore>,
    /// One fetch from the store per digest at a time; other digests go on.
    fetching: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    /// Piece lists worked out for blobs that have none in a manifest
    /// (binary-delta patches), by digest; at most [`MAX_PIECE_LISTS`].
    pieces: Mutex<HashMap<Digest, Arc<lks_proto::chunks::Chunks>>>,
}

/// Piece lists kept in memory (a few hundred bytes each per 100 MiB).
const MAX_PIECE_LISTS: usize = 4096;

impl Blobs {
    pub fn new(local: LocalBlobs, store: Arc<dyn BlobStore>) -> Self {
        Blobs {
            local,
            store,
            fetching: Mutex::new(HashMap::new()),
            pieces: Mutex::new(HashMap::new()),
        }
    }

    /// The SHA-256 of each 4 MiB piece of blob `d`, worked out once per
    /// replica from its local copy (fetched from the store if need be) and
    /// checked against `d` on the way; `None` if no store holds it.
    pub async fn pieces_of(&self, d: &Digest) -> Result<Option<Arc<lks_proto::chunks::Chunks>>, BlobError> {
        if let Some(c) = self.pieces.lock().unwrap_or_else(|p| p.into_inner()).get(d) {
            return Ok(Some(c.clone()));
        }
        if !self.ensure_local(d).await? {
            return Ok(None);
        }
        let path = self.local.path(d);
        let p = path.clone();
        let io = |source| BlobError::Io {
            path: path.clone(),
            source,
        };
        let (got, _, chunks) = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&p)
                .and_then(|f| lks_proto::chunks::Chunks::of_reader(f, lks_proto::chunks::DEFAULT_CHUNK_SIZE))
        })
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
        .map_err(io)?;
        if got != *d {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the local copy of {d} hashes to {got}"),
            )));
        }
        let chunks = Arc::new(chunks);
        let mut map = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_PIECE_LISTS {
            map.clear();
        }
        map.insert(*d, chunks.clone());
        Ok(Some(chunks))
    }

    pub fn store(&self) -> &dyn BlobStore {
        &*self.store
    }

    /// Makes the local blob `d` durable in the store, unless it is there;
    /// true if it was uploaded.
    pub async fn persist(&self, d: &Digest, size: u64) -> Result<bool, BlobError> {
        if let Some(max) = self.store.max_blob_size()
            && size > max
        {
            return Err(BlobError::TooLarge {
                digest: *d,
                size,
                max,
            });
        }
        if self.store.contains(d).await? {
            return Ok(false);
        }
        self.store.put(d, size, &self.local.path(d)).await?;
        Ok(true)
    }

    /// Makes sure this replica holds `d` locally, fetching it from the
    /// store if another replica published it. False if neither has it.
    pub async fn ensure_local(&self, d: &Digest) -> Result<bool, BlobError> {
        if self.local.contains(d) {
            return Ok(true);
        }
        let gate = {
            let mut map = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(*d).or_default().clone()
        };
        let result = async {
            let _one = gate.lock().await;
            if self.local.contains(d) {
                return Ok(true);
            }
            if !self.store.fetch(d, &self.local).await? {
                return Ok(false);
            }
            tracing::info!(digest = %d, store = %self.store.describe(), "blob fetched from the blob store");
            Ok(true)
        }
        .await;
        let mut map = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&gate) <= 2 {
            map.remove(d);
        }
        result
    }
}

#[cfg(test)]
pub mod conformance;
