//! What the metadata store keeps for blob garbage collection: one record
//! per blob in the blob store, and the deletion of a bundle version.
//!
//! The record is how a publish and the collector agree without racing
//! (`lks_blobs::gc` holds the protocol): a publish *claims* a blob by
//! rewriting its record (a new revision) before it relies on the blob, and
//! the collector marks a record `deleting` only if it is still at the
//! revision the collector read and no bundle version was recorded since.
//! Either the collector's mark wins (the publish then waits and uploads
//! again) or the claim does (the mark is refused): never both.

use std::collections::HashSet;

use async_trait::async_trait;
use lks_proto::Digest;
use serde::{Deserialize, Serialize};

use super::{Result, RolloutRow};

/// A blob in the blob store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRecord {
    pub size: u64,
    /// When a publish last relied on the blob (Unix ms); the collector
    /// leaves alone a blob claimed within its grace period.
    pub claimed_at_ms: i64,
    /// The collector is removing its bytes: nobody may rely on it.
    #[serde(default)]
    pub deleting: bool,
    /// The replica whose collector marked it `deleting` ("" on SQLite).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

/// A record and the revision it was read at; a write naming an older
/// revision is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordAt {
    pub digest: Digest,
    pub record: BlobRecord,
    pub rev: i64,
}

/// What still uses a bundle version; deleting it is refused while any is
/// non-empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BundleUsers {
    /// Nodes whose desired state holds it.
    pub nodes: Vec<String>,
    /// Clusters whose target it is (nodes that join get it).
    pub clusters: Vec<String>,
    /// Rollouts that may still assign it (as target or as the version a
    /// rollback returns to).
    pub rollouts: Vec<String>,
}

impl BundleUsers {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.clusters.is_empty() && self.rollouts.is_empty()
    }

    /// The refusal, naming who uses `id` (at most a few of each).
    pub fn refusal(&self, id: &str) -> String {
        fn some(what: &str, v: &[String]) -> Option<String> {
            if v.is_empty() {
                return None;
            }
            let shown: Vec<&str> = v.iter().take(5).map(String::as_str).collect();
            let more = if v.len() > 5 {
                format!(" and {} more", v.len() - 5)
            } else {
                String::new()
            };
            Some(format!("{what} {}{more}", shown.join(", ")))
        }
        let parts: Vec<String> = [
            some("rollout", &self.rollouts),
            some("the desired state of node", &self.nodes),
            some("the target of cluster", &self.clusters),
        ]
        .into_iter()
        .flatten()
        .collect();
        format!(
            "bundle {id} is in use by {}; roll those nodes to another version (and let its rollouts finish) first",
            parts.join("; ")
        )
    }
}

impl RolloutRow {
    /// The rollout may still give `version` of its bundle to a node: it is
    /// active or still catching up, and `version` is its target or the
    /// version an abort or rollback returns a node to.
    pub fn may_assign(&self, version: &str) -> bool {
        self.needs_driving()
            && (self.version == version || self.nodes.iter().any(|n| n.previous_version == version))
    }
}

/// Blob records and bundle deletion, on SQLite and etcd alike (one
/// conformance suite, `store::conformance::blob_records_*`).
#[async_trait]
pub trait BlobRecords: Send + Sync {
    async fn blob_record(&self, d: &Digest) -> Result<Option<RecordAt>>;
    /// Writes the record if it is still at `rev` (0: only if there is
    /// none); the new revision, or `None` if it changed meanwhile.
    async fn put_blob_record(&self, d: &Digest, record: &BlobRecord, rev: i64) -> Result<Option<i64>>;
    /// Removes the record if it is still at `rev`.
    async fn delete_blob_record(&self, d: &Digest, rev: i64) -> Result<bool>;
    async fn blob_records(&self) -> Result<Vec<RecordAt>>;
    /// Every digest a stored bundle version references, and a revision
    /// such that [`Self::mark_blob_deleting`] fails if any bundle version
    /// was recorded after it.
    async fn referenced_blobs(&self) -> Result<(HashSet<Digest>, i64)>;
    /// Writes `mark` (a record with `deleting` set) if the record is still
    /// at `rev` (0: only if there is none, for a blob the store holds
    /// without a record) and no bundle version was recorded after
    /// `bundles_rev`. The caller passes only a digest no bundle referenced
    /// at `bundles_rev` (SQLite checks that in the same transaction; etcd
    /// cannot, and relies on the compare). On etcd the mark lives under
    /// the replica's lease. The new revision, or `None` if refused.
    async fn mark_blob_deleting(
        &self,
        d: &Digest,
        mark: &BlobRecord,
        rev: i64,
        bundles_rev: i64,
    ) -> Result<Option<i64>>;
    /// Deletes NAME@VERSION. `NotFound` if there is none; `Conflict`
    /// naming who uses it ([`BundleUsers::refusal`]) if anything does.
    async fn delete_bundle(&self, name: &str, version: &str) -> Result<()>;
}
