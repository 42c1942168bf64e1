//! `lks-control-server migrate --blobs-from-etcd --store etcd … --blob-store
//! s3://…`: moves a running etcd installation's blobs out of etcd chunks
//! into an S3 bucket, in two steps the operator runs in order:
//!
//! 1. copy (replicas keep running on `--blob-store etcd`): every blob in
//!    etcd is fetched (verified) into a temp dir and put into the bucket
//!    (hashed again on the way), unless the bucket holds it; a record is
//!    made for the collector. Safe to repeat.
//! 2. after every replica was restarted with `--blob-store s3://…`, the
//!    same command with `--delete-from-etcd` deletes the chunks of every
//!    blob the bucket holds. Refused while a live replica still keeps its
//!    blobs in etcd (each replica names its blob store in `replicas/ID`).

use std::fmt;

use crate::store::{BlobRecord, BlobRecords, EtcdConfig, EtcdStore, StoreError};
use lks_blobs::{BlobError, BlobStore, EtcdChunks, LocalBlobs, S3Config, S3Store};

#[derive(Debug, thiserror::Error)]
pub enum BlobMigrateError {
    #[error("cannot reach etcd: {0}; check --etcd-endpoints and that etcd is up")]
    Etcd(StoreError),
    #[error("{0}")]
    Blob(#[from] BlobError),
    #[error(
        "replica {url} still keeps its blobs in etcd; restart every replica with --blob-store {to} \
         (and the same --s3-* flags) before --delete-from-etcd"
    )]
    ReplicaOnEtcd { url: String, to: String },
    #[error("temp dir: {0}")]
    Temp(std::io::Error),
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct BlobSummary {
    pub to: String,
    pub copied: usize,
    pub copied_bytes: u64,
    pub present: usize,
    pub deleted: Option<(usize, u64)>,
}

impl fmt::Display for BlobSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "copied {} blobs ({} bytes) from etcd to {}; {} were there already",
            self.copied, self.copied_bytes, self.to, self.present
        )?;
        match self.deleted {
            Some((n, bytes)) => write!(f, "deleted {n} blobs ({bytes} bytes) from etcd"),
            None => write!(
                f,
                "Next: restart every replica with --blob-store {} (and the same --s3-* flags and credentials), \
                 then run this again with --delete-from-etcd to free the space in etcd.",
                self.to
            ),
        }
    }
}

/// Copies every blob kept in etcd into the bucket, and with `delete`
/// removes them from etcd once no live replica keeps its blobs there.
pub async fn migrate_blobs(
    etcd: &EtcdConfig,
    s3: &S3Config,
    delete: bool,
    now_ms: i64,
) -> Result<BlobSummary, BlobMigrateError> {
    let bucket = S3Store::new(s3)?;
    bucket.check().await?;
    let store = EtcdStore::connect(etcd, "migrate-blobs")
        .await
        .map_err(BlobMigrateError::Etcd)?;
    // The chunks' size cap does not matter for reading them.
    let chunks = EtcdChunks::new(store.clone(), u64::MAX);
    let mut summary = BlobSummary {
        to: bucket.describe(),
        ..Default::default()
    };
    if delete {
        for (_, info) in store.replicas().list().await.map_err(BlobMigrateError::Etcd)? {
            if !info.blob_store.starts_with("s3://") {
                return Err(BlobMigrateError::ReplicaOnEtcd {
                    url: info.url,
                    to: summary.to,
                });
            }
        }
    }
    let tmp = tempfile::tempdir().map_err(BlobMigrateError::Temp)?;
    let local = LocalBlobs::open(tmp.path())?;
    let listed = chunks.list().await?;
    for b in &listed {
        if bucket.contains(&b.digest).await? {
            summary.present += 1;
        } else {
            if !chunks.fetch(&b.digest, &local).await? {
                // Deleted meanwhile (the collector): nothing to move.
                continue;
            }
            bucket.put(&b.digest, b.size, &local.path(&b.digest)).await?;
            local.remove(&b.digest).await?;
            summary.copied += 1;
            summary.copied_bytes += b.size;
        }
        if store
            .blob_record(&b.digest)
            .await
            .map_err(BlobMigrateError::Etcd)?
            .is_none()
        {
            let record = BlobRecord {
                size: b.size,
                claimed_at_ms: now_ms,
                deleting: false,
                owner: String::new(),
            };
            // Lost to a concurrent publish's record: that one stands.
            let _ = store
                .put_blob_record(&b.digest, &record, 0)
                .await
                .map_err(BlobMigrateError::Etcd)?;
        }
    }
    if delete {
        let (mut n, mut bytes) = (0, 0);
        for b in &listed {
            if bucket.contains(&b.digest).await? {
                chunks.delete(&b.digest).await?;
                n += 1;
                bytes += b.size;
            }
        }
        summary.deleted = Some((n, bytes));
    }
    Ok(summary)
}
