//! `--blob-store etcd` (the default with `--store etcd`): blobs kept in etcd
//! itself, in chunks, for small installations that run no object store.
//! A replica that lacks a blob an agent asks for fetches it from etcd on the
//! first request, verifies it against its digest while writing it into its
//! local directory, and serves it from there ever after.
//!
//! Why it stays: a handful of replicas with certificates and configs need
//! nothing but etcd, which they already run. The cost is etcd space, kube0's
//! most precious store, so a blob kept in etcd is limited in size
//! (`--etcd-max-blob-size`, 32 MiB by default); kubelet-sized binaries
//! belong in an object store (`--blob-store s3://…`, [`super::S3Store`]),
//! and `migrate` moves an installation's blobs there.
//!
//! The keys (chunks of 1 MiB, below etcd's request limit, and a meta key
//! with the size and chunk count) are `lks-store-etcd`'s
//! ([`EtcdStore::blob_chunks`]). The meta key is written last and deleted
//! first, so a blob is complete in etcd exactly when its meta key exists.

use std::path::Path;

use lks_proto::Digest;
use tokio::io::AsyncReadExt;

use crate::{BlobError, BlobStore, LocalBlobs, StoredBlob};
use lks_store_etcd::EtcdStore;
use lks_store_etcd::{ChunkError, ChunkMeta};

/// Bytes per chunk value in etcd.
pub const CHUNK: usize = 1 << 20;
/// Default for `--etcd-max-blob-size`.
pub const DEFAULT_MAX_BLOB: u64 = 32 << 20;

/// Blobs in etcd, at most `max` bytes each.
#[derive(Clone)]
pub struct EtcdChunks {
    store: EtcdStore,
    max: u64,
}

impl EtcdChunks {
    pub fn new(store: EtcdStore, max: u64) -> Self {
        EtcdChunks { store, max }
    }

    async fn meta(&self, d: &Digest) -> Result<Option<ChunkMeta>, BlobError> {
        match self.store.blob_chunks().meta(d).await {
            Ok(meta) => Ok(meta),
            Err(ChunkError::Store(e)) => Err(e.into()),
            Err(e @ ChunkError::Corrupt(_)) => Err(BlobError::Corrupt {
                store: self.describe(),
                digest: *d,
                message: e.to_string(),
            }),
        }
    }
}

#[async_trait::async_trait]
impl BlobStore for EtcdChunks {
    fn describe(&self) -> String {
        "etcd".into()
    }

    fn max_blob_size(&self) -> Option<u64> {
        Some(self.max)
    }

    async fn check(&self) -> Result<(), BlobError> {
        // The store itself was checked when it was opened.
        Ok(())
    }

    async fn contains(&self, d: &Digest) -> Result<bool, BlobError> {
        Ok(self.store.blob_chunks().contains(d).await?)
    }

    async fn put(&self, d: &Digest, size: u64, from: &Path) -> Result<(), BlobError> {
        if size > self.max {
            return Err(BlobError::TooLarge {
                digest: *d,
                size,
                max: self.max,
            });
        }
        let local = |e: std::io::Error| BlobError::Io {
            path: from.to_path_buf(),
            source: e,
        };
        let mut file = tokio::fs::File::open(from).await.map_err(local)?;
        let mut verifier = lks_proto::digest::Verifier::new(*d, size);
        let mut i = 0u64;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let mut filled = 0;
            while filled < CHUNK {
                let n = file.read(&mut buf[filled..]).await.map_err(local)?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 && i > 0 {
                break;
            }
            verifier
                .update(&buf[..filled])
                .map_err(|source| BlobError::Verify { digest: *d, source })?;
            self.store
                .blob_chunks()
                .put_chunk(d, i, buf[..filled].to_vec())
                .await?;
            i += 1;
            if filled < CHUNK {
                break;
            }
        }
        // The chunks are in; the meta key makes the blob visible only if
        // they were the blob.
        verifier
            .finish()
            .map_err(|source| BlobError::Verify { digest: *d, source })?;
        self.store
            .blob_chunks()
            .put_meta(d, &ChunkMeta { size, chunks: i })
            .await?;
        Ok(())
    }

    async fn fetch(&self, d: &Digest, into: &LocalBlobs) -> Result<bool, BlobError> {
        let Some(meta) = self.meta(d).await? else {
            return Ok(false);
        };
        let mut w = into.writer(*d, meta.size).await?;
        for i in 0..meta.chunks {
            let Some(bytes) = self.store.blob_chunks().chunk(d, i).await? else {
                return Err(BlobError::Corrupt {
                    store: self.describe(),
                    digest: *d,
                    message: format!("chunk {i} of {} is missing in etcd", meta.chunks),
                });
            };
            w.write(&bytes).await?;
        }
        // Verifies digest and size before the blob gets its name.
        w.finish().await?;
        Ok(true)
    }

    async fn delete(&self, d: &Digest) -> Result<(), BlobError> {
        // The meta key first: the blob stops being complete before any
        // chunk goes.
        Ok(self.store.blob_chunks().delete(d).await?)
    }

    async fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        let digests = self.store.blob_chunks().digests().await?;
        let mut out = Vec::new();
        for d in digests {
            if let Some(m) = self.meta(&d).await? {
                out.push(StoredBlob {
                    digest: d,
                    size: m.size,
                });
            }
        }
        Ok(out)
    }
}
