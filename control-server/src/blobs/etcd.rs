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
//! Layout: `blobs/sha256:HEX/c/NNNNNNNN` holds the chunks (1 MiB, below
//! etcd's request limit), `blobs/sha256:HEX/meta` the size and chunk count.
//! The meta key is written last and deleted first, so a blob is complete in
//! etcd exactly when its meta key exists. Both are content-addressed: writes
//! need no compare.

use std::path::Path;

use etcd_client::{DeleteOptions, GetOptions};
use lks_proto::Digest;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::{BlobError, BlobStore, LocalBlobs, StoredBlob};
use crate::store::{EtcdStore, StoreError};

/// Bytes per chunk value in etcd.
pub const CHUNK: usize = 1 << 20;
/// Default for `--etcd-max-blob-size`.
pub const DEFAULT_MAX_BLOB: u64 = 32 << 20;

#[derive(Serialize, Deserialize)]
struct Meta {
    size: u64,
    chunks: u64,
}

fn meta_key(d: &Digest) -> String {
    format!("blobs/{d}/meta")
}

fn chunk_key(d: &Digest, i: u64) -> String {
    format!("blobs/{d}/c/{i:08}")
}

fn unavailable(e: etcd_client::Error) -> BlobError {
    BlobError::Meta(StoreError::Unavailable(e.to_string()))
}

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

    async fn meta(&self, d: &Digest) -> Result<Option<Meta>, BlobError> {
        let Some((meta, _)) = self.store.get_bytes(&meta_key(d)).await? else {
            return Ok(None);
        };
        let meta = serde_json::from_slice(&meta).map_err(|e| BlobError::Corrupt {
            store: self.describe(),
            digest: *d,
            message: format!("stored chunk list: {e}"),
        })?;
        Ok(Some(meta))
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
        Ok(self.store.get_bytes(&meta_key(d)).await?.is_some())
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
                .put_bytes(&chunk_key(d, i), buf[..filled].to_vec())
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
        let meta = serde_json::to_vec(&Meta { size, chunks: i }).map_err(|e| BlobError::Corrupt {
            store: self.describe(),
            digest: *d,
            message: e.to_string(),
        })?;
        self.store.put_bytes(&meta_key(d), meta).await?;
        Ok(())
    }

    async fn fetch(&self, d: &Digest, into: &LocalBlobs) -> Result<bool, BlobError> {
        let Some(meta) = self.meta(d).await? else {
            return Ok(false);
        };
        let mut w = into.writer(*d, meta.size).await?;
        for i in 0..meta.chunks {
            let Some((bytes, _)) = self.store.get_bytes(&chunk_key(d, i)).await? else {
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
        let mut kv = crate::store::etcd::kv_of(&self.store.client());
        // The meta key first: the blob stops being complete before any
        // chunk goes.
        kv.delete(self.store.key(&meta_key(d)), None)
            .await
            .map_err(unavailable)?;
        kv.delete(
            self.store.key(&format!("blobs/{d}/c/")),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        // Keys only: the values under `blobs/` are every blob's bytes.
        let mut kv = crate::store::etcd::kv_of(&self.store.client());
        let prefix = self.store.key("blobs/");
        let resp = kv
            .get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(unavailable)?;
        let digests: Vec<Digest> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                kv.key_str()
                    .ok()?
                    .strip_prefix(&prefix)?
                    .strip_suffix("/meta")?
                    .parse()
                    .ok()
            })
            .collect();
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
