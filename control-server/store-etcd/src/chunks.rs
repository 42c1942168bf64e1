//! Blob bytes kept in etcd itself (`--blob-store etcd`, the server's
//! `blobs::EtcdChunks`): `blobs/sha256:HEX/c/NNNNNNNN` holds the chunks,
//! `blobs/sha256:HEX/meta` the size and chunk count ([`ChunkMeta`]). The
//! server writes the meta key last and this deletes it first, so a blob is
//! complete in etcd exactly when its meta key exists. Both are
//! content-addressed: writes need no compare.

use etcd_client::{DeleteOptions, GetOptions};
use lks_proto::Digest;
use serde::{Deserialize, Serialize};

use lks_store::{Result, StoreError};

use crate::{EtcdStore, json};

/// As the server's `blobs::EtcdChunks` has always reported a failed
/// delete or list: etcd unavailable, whatever it said.
fn unavailable(e: etcd_client::Error) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

const BLOBS: &str = "blobs/";

/// A blob's meta key: its size and how many chunks hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMeta {
    pub size: u64,
    pub chunks: u64,
}

/// A meta key that is there but does not read.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The meta key's document, with why it does not read.
    #[error("stored chunk list: {0}")]
    Corrupt(String),
}

/// Blob chunks in etcd, over the store's connection.
pub struct BlobChunks<'a> {
    store: &'a EtcdStore,
}

fn meta_key(d: &Digest) -> String {
    format!("{BLOBS}{d}/meta")
}

fn chunk_key(d: &Digest, i: u64) -> String {
    format!("{BLOBS}{d}/c/{i:08}")
}

impl EtcdStore {
    /// Blob bytes in etcd (`blobs/`).
    pub fn blob_chunks(&self) -> BlobChunks<'_> {
        BlobChunks { store: self }
    }
}

impl BlobChunks<'_> {
    /// The meta key of `d`; `None` while the blob is not complete in etcd.
    pub async fn meta(&self, d: &Digest) -> std::result::Result<Option<ChunkMeta>, ChunkError> {
        let Some((meta, _)) = self.store.get_bytes(&meta_key(d)).await? else {
            return Ok(None);
        };
        let meta = serde_json::from_slice(&meta).map_err(|e| ChunkError::Corrupt(e.to_string()))?;
        Ok(Some(meta))
    }

    /// Whether `d` is complete in etcd (its meta key exists; not read).
    pub async fn contains(&self, d: &Digest) -> Result<bool> {
        Ok(self.store.get_bytes(&meta_key(d)).await?.is_some())
    }

    /// Writes chunk `i` of `d`.
    pub async fn put_chunk(&self, d: &Digest, i: u64, bytes: Vec<u8>) -> Result<()> {
        self.store.put_bytes(&chunk_key(d, i), bytes).await
    }

    /// Writes the meta key of `d`: after its chunks, it makes the blob
    /// complete.
    pub async fn put_meta(&self, d: &Digest, meta: &ChunkMeta) -> Result<()> {
        self.store.put_bytes(&meta_key(d), json(meta)?).await
    }

    /// Chunk `i` of `d`, if it is there.
    pub async fn chunk(&self, d: &Digest, i: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.store.get_bytes(&chunk_key(d, i)).await?.map(|(b, _)| b))
    }

    /// Deletes `d`: the meta key first, so the blob stops being complete
    /// before any chunk goes, then every chunk.
    pub async fn delete(&self, d: &Digest) -> Result<()> {
        let mut kv = crate::kv_of(&self.store.client);
        kv.delete(self.store.key(&meta_key(d)), None)
            .await
            .map_err(unavailable)?;
        kv.delete(
            self.store.key(&format!("{BLOBS}{d}/c/")),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// The blobs whose meta key exists, read as keys only: the values
    /// under `blobs/` are every blob's bytes.
    pub async fn digests(&self) -> Result<Vec<Digest>> {
        let mut kv = crate::kv_of(&self.store.client);
        let prefix = self.store.key(BLOBS);
        let resp = kv
            .get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(unavailable)?;
        Ok(resp
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
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;

    #[tokio::test]
    async fn chunks_and_meta_under_the_blob_keys() {
        let etcd = TestEtcd::start_with(|| lks_e2e::free_addr().port());
        let s = etcd.store("r1").await;
        let d = Digest::of(b"hello");
        let c = s.blob_chunks();
        assert!(c.meta(&d).await.unwrap().is_none());
        c.put_chunk(&d, 0, b"hel".to_vec()).await.unwrap();
        assert!(!c.contains(&d).await.unwrap(), "incomplete without its meta key");
        assert!(c.digests().await.unwrap().is_empty());
        c.put_chunk(&d, 1, b"lo".to_vec()).await.unwrap();
        let meta = ChunkMeta { size: 5, chunks: 2 };
        c.put_meta(&d, &meta).await.unwrap();
        assert_eq!(c.meta(&d).await.unwrap(), Some(meta));
        assert_eq!(c.digests().await.unwrap(), vec![d]);
        assert_eq!(c.chunk(&d, 1).await.unwrap().unwrap(), b"lo");
        // The layout as it was before these keys were written here.
        assert!(
            s.get_bytes(&format!("blobs/{d}/c/00000000"))
                .await
                .unwrap()
                .is_some()
        );
        let (raw, _) = s.get_bytes(&format!("blobs/{d}/meta")).await.unwrap().unwrap();
        assert_eq!(raw, br#"{"size":5,"chunks":2}"#);

        s.put_bytes(&format!("blobs/{d}/meta"), b"not json".to_vec())
            .await
            .unwrap();
        assert!(matches!(c.meta(&d).await, Err(ChunkError::Corrupt(_))));
        c.delete(&d).await.unwrap();
        assert!(c.chunk(&d, 0).await.unwrap().is_none());
        assert!(!c.contains(&d).await.unwrap());
    }
}
