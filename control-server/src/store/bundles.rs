//! Published bundle versions, and the desired state each node is sent
//! (the bundles it should hold, and which blobs it may fetch).

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::Result;

/// A bundle version to store. `signed_bundle` is the encoded protobuf
/// `SignedBundle` exactly as it will be sent to agents.
#[derive(Clone, Debug)]
pub struct NewBundle {
    pub name: String,
    pub version: String,
    pub signed_bundle: Vec<u8>,
    /// `sha256:<hex>` of the canonical manifest.
    pub manifest_digest: String,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    /// Digests served by the control server (files without a mirror URL).
    pub blob_digests: Vec<String>,
    pub now_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleRow {
    pub name: String,
    pub version: String,
    pub signed_bundle: Vec<u8>,
    pub manifest_digest: String,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    pub published_at_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// The same name@version was already stored with identical content.
    Unchanged,
}

/// The desired state of one node: generation and the stored bundles.
#[derive(Clone, Debug, Default)]
pub struct DesiredState {
    pub generation: u64,
    /// Encoded `SignedBundle`s, ordered by bundle name.
    pub bundles: Vec<Vec<u8>>,
    /// Bundle name → the generation of the operator's last retry request
    /// (`lksctl node retry`); absent: none.
    pub retry: BTreeMap<String, u64>,
}

/// Published bundle versions (signed, write-once).
#[async_trait]
pub trait BundleStore: Send + Sync {
    async fn put_bundle(&self, bundle: NewBundle) -> Result<PutOutcome>;
    async fn get_bundle(&self, name: &str, version: &str) -> Result<Option<BundleRow>>;
    async fn list_bundles(&self, name: Option<&str>) -> Result<Vec<BundleRow>>;
}

/// What each node should hold.
#[async_trait]
pub trait DesiredStore: Send + Sync {
    async fn desired_state(&self, node: &str) -> Result<DesiredState>;
    /// The node's desired state for a stream that last sent generation
    /// `sent` (`None`: nothing yet). A store may answer from a copy of its
    /// own when that copy holds a generation newer than `sent` (as good as
    /// a read a moment earlier: the newer one, if any, follows with its
    /// change); otherwise, and by default, [`Store::desired_state`].
    async fn desired_state_after(&self, node: &str, sent: Option<u64>) -> Result<DesiredState> {
        let _ = sent;
        self.desired_state(node).await
    }
    /// True if `digest` belongs to a bundle version desired for `node`, or
    /// reported held by it after a rollout of its cluster assigned it.
    async fn blob_allowed(&self, node: &str, digest: &str) -> Result<bool> {
        Ok(!self.blob_grants(node, digest).await?.is_empty())
    }
    /// The bundle versions through which `node` may have `digest` (the
    /// rule of [`Store::blob_allowed`]); the caller checks that the file is
    /// for the node's architecture in one of them.
    async fn blob_grants(&self, node: &str, digest: &str) -> Result<Vec<(String, String)>>;
}
