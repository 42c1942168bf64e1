//! Published bundle versions, and the desired state each node is sent
//! (the bundles it should hold, and which blobs it may fetch).
//!
//! A bundle row crosses this boundary typed: its digests as [`Digest`]s and
//! the bundle as a [`StoredBundle`], decoded and validated once when the
//! backend reads it. A row that does not read back is a
//! [`StoreError::Corrupt`]. What is persisted is unchanged: digests as
//! their `sha256:<hex>` text, the bundle as the encoded protobuf sent to
//! agents.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lks_proto::digest::DigestError;
use lks_proto::manifest::ManifestError;
use lks_proto::{Digest, Manifest, SignedBundle, canonical, pb};
use prost::Message as _;

use super::{Kind, Result, StoreError};

/// A published bundle as stored: the encoded protobuf `SignedBundle`,
/// exactly as it is sent to agents, and the validated bundle it decodes
/// to. Cloning shares both.
#[derive(Clone)]
pub struct StoredBundle(Arc<Encoded>);

struct Encoded {
    bytes: Vec<u8>,
    bundle: SignedBundle,
}

impl StoredBundle {
    /// A validated bundle to store, encoded once.
    pub fn new(bundle: SignedBundle) -> Self {
        let bytes = pb::SignedBundle::from(&bundle).encode_to_vec();
        StoredBundle(Arc::new(Encoded { bytes, bundle }))
    }

    /// The bundle a backend read for `name@version`: decoded, checked
    /// against the bundle rules, and against the version it is stored as.
    pub fn decode(name: &str, version: &str, bytes: Vec<u8>) -> Result<Self> {
        let corrupt = |why: Unreadable| StoreError::Corrupt {
            kind: Kind::Bundle,
            name: format!("{name}@{version}"),
            why,
        };
        let pb = pb::SignedBundle::decode(bytes.as_slice()).map_err(|e| corrupt(e.into()))?;
        let bundle = SignedBundle::try_from(pb).map_err(|e| corrupt(e.into()))?;
        let m = &bundle.manifest;
        if m.name != name || m.version != version {
            return Err(corrupt(Unreadable::OtherVersion(m.id())));
        }
        Ok(StoredBundle(Arc::new(Encoded { bytes, bundle })))
    }

    /// The encoded `SignedBundle`, as agents are sent it.
    pub fn encoded(&self) -> &[u8] {
        &self.0.bytes
    }

    pub fn signed(&self) -> &SignedBundle {
        &self.0.bundle
    }

    pub fn manifest(&self) -> &Manifest {
        &self.0.bundle.manifest
    }
}

impl PartialEq for StoredBundle {
    fn eq(&self, other: &Self) -> bool {
        self.0.bytes == other.0.bytes
    }
}

impl Eq for StoredBundle {}

impl fmt::Debug for StoredBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StoredBundle({}, {} bytes)",
            self.manifest().id(),
            self.0.bytes.len()
        )
    }
}

/// Why a stored record does not read back as what was stored.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("not an encoded signed bundle: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("it breaks the bundle rules: {0}")]
    Invalid(#[from] ManifestError),
    #[error("it holds bundle {0}")]
    OtherVersion(String),
    #[error("{0}")]
    Digest(#[from] DigestError),
    #[error("not hex: {0}")]
    Hex(#[from] hex::FromHexError),
    /// A release or trust-root record that does not decode or breaks its
    /// rules.
    #[error("{0}")]
    Record(String),
}

/// A bundle version to store; [`NewBundle::new`] derives every field but
/// the time from the bundle.
#[derive(Clone, Debug)]
pub struct NewBundle {
    pub name: String,
    pub version: String,
    pub bundle: StoredBundle,
    /// Of the canonical manifest.
    pub manifest_digest: Digest,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    /// Digests served by the control server (files without a mirror URL).
    pub blob_digests: Vec<Digest>,
    pub now_ms: i64,
}

impl NewBundle {
    /// `bundle`, validated, to be published at `now_ms`, the server holding
    /// `blob_digests`.
    pub fn new(bundle: SignedBundle, blob_digests: Vec<Digest>, now_ms: i64) -> Self {
        let m = &bundle.manifest;
        NewBundle {
            name: m.name.clone(),
            version: m.version.clone(),
            manifest_digest: canonical::manifest_digest(m),
            signed: bundle.signature.is_some(),
            files: m.files.len() as u32,
            total_size: m.total_size(),
            blob_digests,
            now_ms,
            bundle: StoredBundle::new(bundle),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleRow {
    pub name: String,
    pub version: String,
    pub bundle: StoredBundle,
    pub manifest_digest: Digest,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    pub published_at_ms: i64,
}

/// A bundle row as a backend persists it: the digest as its text, the
/// bundle as its encoded bytes. [`RawBundleRow::typed`] is the one
/// conversion both backends read through.
pub struct RawBundleRow {
    pub name: String,
    pub version: String,
    pub signed_bundle: Vec<u8>,
    pub manifest_digest: String,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    pub published_at_ms: i64,
}

impl RawBundleRow {
    pub fn typed(self) -> Result<BundleRow> {
        let manifest_digest = stored_digest(&self.name, &self.version, &self.manifest_digest)?;
        Ok(BundleRow {
            bundle: StoredBundle::decode(&self.name, &self.version, self.signed_bundle)?,
            name: self.name,
            version: self.version,
            manifest_digest,
            signed: self.signed,
            files: self.files,
            total_size: self.total_size,
            published_at_ms: self.published_at_ms,
        })
    }
}

/// A digest stored for `name@version` as its text.
pub fn stored_digest(name: &str, version: &str, text: &str) -> Result<Digest> {
    text.parse().map_err(|e: DigestError| StoreError::Corrupt {
        kind: Kind::Bundle,
        name: format!("{name}@{version}"),
        why: e.into(),
    })
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
    /// Encoded `SignedBundle`s as stored (see [`StoredBundle::encoded`]),
    /// ordered by bundle name. Bytes, not decoded bundles: a desired state
    /// is read for every agent stream (tens of thousands on etcd, from one
    /// shared copy of each bundle), and each is only re-encoded on the wire,
    /// so decoding and validating it per read would spend per agent what
    /// the publish checked once.
    pub bundles: Vec<Vec<u8>>,
    /// Bundle name → the generation of the operator's last retry request
    /// (`lksctl node retry`); absent: none.
    pub retry: BTreeMap<String, u64>,
    /// The node's last reboot request (`lksctl node reboot`); 0: none.
    pub reboot: u64,
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
    /// `sent` (`None`: nothing yet; at a Hello, the generation below the
    /// one the agent says it has, so that what it gets is not older). A
    /// store may answer from a copy of its own when that copy holds a
    /// generation newer than `sent` (as good as a read a moment earlier:
    /// the newer one, if any, follows with its change); otherwise, and by
    /// default, [`Store::desired_state`].
    async fn desired_state_after(&self, node: &str, sent: Option<u64>) -> Result<DesiredState> {
        let _ = sent;
        self.desired_state(node).await
    }
    /// True if `digest` belongs to a bundle version desired for `node`, or
    /// reported held by it after a rollout of its cluster assigned it.
    async fn blob_allowed(&self, node: &str, digest: &Digest) -> Result<bool> {
        Ok(!self.blob_grants(node, digest).await?.is_empty())
    }
    /// The bundle versions through which `node` may have `digest` (the
    /// rule of [`Store::blob_allowed`]); the caller checks that the file is
    /// for the node's architecture in one of them.
    async fn blob_grants(&self, node: &str, digest: &Digest) -> Result<Vec<(String, String)>>;
}
