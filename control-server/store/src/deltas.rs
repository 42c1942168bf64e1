//! Binary deltas (issue [delta]) the server holds: per file of a bundle
//! version, the patch that rebuilds it from the file at the same path (and
//! architecture) of an earlier version, or the note that it was tried and
//! skipped (too large, a patch not worth it), so it is not tried again.
//!
//! A row lives as long as its bundle version: deleting the version drops
//! its rows, and the blob collector keeps a patch while a row names it
//! ([`crate::BlobRecords::referenced_blobs`]). A patch is transport
//! only (the agent checks the rebuilt file against the manifest), so a row
//! needs no signature.

use async_trait::async_trait;
use lks_proto::Digest;

use super::Result;

/// One file's patch from one earlier version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaRow {
    /// The bundle version whose file the patch rebuilds.
    pub name: String,
    pub version: String,
    pub path: String,
    /// "" for a neutral file.
    pub arch: String,
    /// The earlier version and its file's bytes, the patch's base.
    pub from_version: String,
    pub base: Digest,
    /// The file the patch rebuilds, and its size.
    pub target: Digest,
    pub size: u64,
    /// The patch blob; `None`: skipped (`note` says why).
    pub patch: Option<Digest>,
    pub patch_size: u64,
    pub algorithm: String,
    pub note: String,
    pub made_at_ms: i64,
}

/// The deltas of bundle versions, on SQLite and etcd alike (one
/// conformance suite, `store::conformance::deltas`).
#[async_trait]
pub trait DeltaStore: Send + Sync {
    /// Records a patch (or a skip) for its file and base; a row already
    /// there for them is kept as it is. Refused (`NotFound`) if the bundle
    /// version is gone.
    async fn put_delta(&self, row: &DeltaRow) -> Result<()>;
    /// Every row of NAME@VERSION, made and skipped.
    async fn deltas_of(&self, name: &str, version: &str) -> Result<Vec<DeltaRow>>;
    /// The patches that rebuild `target` (made ones only), from any bundle
    /// version holding it.
    async fn deltas_to(&self, target: &Digest) -> Result<Vec<DeltaRow>>;
    /// The rows whose patch is `patch`.
    async fn deltas_by_patch(&self, patch: &Digest) -> Result<Vec<DeltaRow>>;
}
