//! Blobs any replica can serve: with `--store etcd`, every blob the server
//! serves itself (files without a mirror URL) is also kept in etcd, in
//! chunks, before `publish` answers. A replica that lacks a blob an agent
//! asks for fetches it from etcd on the first request, verifies it against
//! its digest while writing it into its local content-addressed store, and
//! serves it from there ever after.
//!
//! Why etcd and not the replicas' disks: a bundle must be durable once
//! `publish` prints `NAME@VERSION`, even if the replica it went through dies
//! a second later. etcd already is the replicated, durable record; copying
//! to peers would need peer discovery, a peer API and its own quorum rule.
//! The cost is etcd space, so a blob kept in etcd is limited in size
//! (`--etcd-max-blob-size`, 32 MiB by default); larger files (kubelet,
//! containerd) belong on a mirror URL, which bundles already support and
//! agents verify the same way.
//!
//! Layout: `blobs/sha256:HEX/c/NNNNNNNN` holds the chunks (1 MiB, below
//! etcd's request limit), `blobs/sha256:HEX/meta` the size and chunk count.
//! The meta key is written last, so a blob is complete in etcd exactly when
//! its meta key exists. Both are content-addressed: writes need no compare.

use lks_proto::Digest;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::blobs::BlobStore;
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

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(
        "{digest} is {size} bytes, more than the {max} bytes a control server on etcd keeps per file \
         (--etcd-max-blob-size); serve it from a mirror (`url` and `sha256` in bundle.toml)"
    )]
    TooLarge { digest: Digest, size: u64, max: u64 },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("blob {digest}: {message}")]
    Local { digest: Digest, message: String },
}

fn meta_key(d: &Digest) -> String {
    format!("blobs/{d}/meta")
}

fn chunk_key(d: &Digest, i: u64) -> String {
    format!("blobs/{d}/c/{i:08}")
}

/// True if etcd holds the whole blob.
pub async fn in_etcd(store: &EtcdStore, d: &Digest) -> Result<bool, SyncError> {
    Ok(store.get_bytes(&meta_key(d)).await?.is_some())
}

/// Copies the local blob `d` into etcd unless it is there already.
pub async fn upload(store: &EtcdStore, blobs: &BlobStore, d: &Digest, max: u64) -> Result<(), SyncError> {
    if in_etcd(store, d).await? {
        return Ok(());
    }
    let path = blobs.path(d);
    let local = |e: std::io::Error| SyncError::Local {
        digest: *d,
        message: format!("{}: {e}", path.display()),
    };
    let mut file = tokio::fs::File::open(&path).await.map_err(local)?;
    let size = file.metadata().await.map_err(local)?.len();
    if size > max {
        return Err(SyncError::TooLarge {
            digest: *d,
            size,
            max,
        });
    }
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
        store.put_bytes(&chunk_key(d, i), buf[..filled].to_vec()).await?;
        i += 1;
        if filled < CHUNK {
            break;
        }
    }
    let meta = serde_json::to_vec(&Meta { size, chunks: i }).map_err(|e| SyncError::Local {
        digest: *d,
        message: e.to_string(),
    })?;
    store.put_bytes(&meta_key(d), meta).await?;
    Ok(())
}

/// Fetches `d` from etcd into the local store, verifying it on the way.
/// False if etcd does not hold it.
pub async fn fetch(store: &EtcdStore, blobs: &BlobStore, d: &Digest) -> Result<bool, SyncError> {
    let Some((meta, _)) = store.get_bytes(&meta_key(d)).await? else {
        return Ok(false);
    };
    let meta: Meta = serde_json::from_slice(&meta).map_err(|e| SyncError::Local {
        digest: *d,
        message: format!("stored chunk list: {e}"),
    })?;
    let local = |e: crate::blobs::BlobError| SyncError::Local {
        digest: *d,
        message: e.to_string(),
    };
    let mut w = blobs.writer(*d, meta.size).await.map_err(local)?;
    for i in 0..meta.chunks {
        let Some((bytes, _)) = store.get_bytes(&chunk_key(d, i)).await? else {
            return Err(SyncError::Local {
                digest: *d,
                message: format!("chunk {i} of {} is missing in etcd", meta.chunks),
            });
        };
        w.write(&bytes).await.map_err(local)?;
    }
    // Verifies digest and size before the blob gets its name.
    w.finish().await.map_err(local)?;
    Ok(true)
}
