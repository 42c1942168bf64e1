//! Signed release records and trust-root rotations, per cluster (issue
//! [trust]): what the server stores and hands to the cluster's nodes, which
//! verify them against their own roots. The server cannot check the
//! signatures; it checks the records' own rules and these orders:
//!
//! - releases: a version above every stored release of the cluster; a
//!   stored record again changes nothing; another record under a stored
//!   version is `AlreadyExists`, any other version not above the highest
//!   `Conflict`;
//! - roots: exactly the highest stored version + 1 (2 for the first: 1 is
//!   the root each node builds from its own keys); the identical root again
//!   changes nothing.
//!
//! Both are settled atomically by the backend (one SQLite transaction; an
//! etcd transaction comparing revisions), so two replicas can never both
//! store version N. Records cross this boundary typed ([`StoredRelease`],
//! [`StoredRoot`]: decoded and checked once, when the backend reads them);
//! what is persisted is the encoded protobuf as agents receive it.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lks_proto::release::{SignedRelease, SignedRoot};
use lks_proto::{Digest, pb};
use prost::Message as _;

use super::{Kind, Result, StoreError};

/// A signed release as stored: the encoded `lks.v1.SignedRelease` and the
/// record it decodes to. Cloning shares both.
#[derive(Clone)]
pub struct StoredRelease(Arc<EncodedRelease>);

struct EncodedRelease {
    bytes: Vec<u8>,
    wire: pb::SignedRelease,
    signed: SignedRelease,
    digest: Digest,
}

impl StoredRelease {
    /// A checked record to store, encoded once.
    pub fn new(signed: SignedRelease) -> Self {
        let wire = pb::SignedRelease::from(&signed);
        let bytes = wire.encode_to_vec();
        let digest = signed.release.digest();
        StoredRelease(Arc::new(EncodedRelease {
            bytes,
            wire,
            signed,
            digest,
        }))
    }

    /// The record a backend read as release `version` of `cluster`:
    /// decoded, checked against the record rules and the key it is under.
    pub fn decode(cluster: &str, version: u64, bytes: Vec<u8>) -> Result<Self> {
        let corrupt = |why: String| StoreError::Corrupt {
            kind: Kind::Release,
            name: format!("{version} of {cluster}"),
            why: super::Unreadable::Record(why),
        };
        let wire = pb::SignedRelease::decode(bytes.as_slice()).map_err(|e| corrupt(e.to_string()))?;
        let signed = SignedRelease::try_from(wire.clone()).map_err(|e| corrupt(e.to_string()))?;
        let r = &signed.release;
        if r.channel != cluster || r.version != version {
            return Err(corrupt(format!("it holds {}", r.id())));
        }
        let digest = r.digest();
        Ok(StoredRelease(Arc::new(EncodedRelease {
            bytes,
            wire,
            signed,
            digest,
        })))
    }

    /// The encoded `SignedRelease`, as persisted.
    pub fn encoded(&self) -> &[u8] {
        &self.0.bytes
    }

    /// The wire message, as agents are sent it.
    pub fn wire(&self) -> &pb::SignedRelease {
        &self.0.wire
    }

    pub fn signed(&self) -> &SignedRelease {
        &self.0.signed
    }

    pub fn version(&self) -> u64 {
        self.0.signed.release.version
    }

    pub fn cluster(&self) -> &str {
        &self.0.signed.release.channel
    }

    /// [`lks_proto::release::Release::digest`]: the record's identity.
    pub fn digest(&self) -> Digest {
        self.0.digest
    }
}

impl PartialEq for StoredRelease {
    fn eq(&self, other: &Self) -> bool {
        self.0.bytes == other.0.bytes
    }
}

impl Eq for StoredRelease {}

impl fmt::Debug for StoredRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StoredRelease({}, {})",
            self.0.signed.release.id(),
            self.0.digest
        )
    }
}

/// A signed trust root as stored, like [`StoredRelease`].
#[derive(Clone)]
pub struct StoredRoot(Arc<EncodedRoot>);

struct EncodedRoot {
    bytes: Vec<u8>,
    wire: pb::SignedRoot,
    signed: SignedRoot,
}

impl StoredRoot {
    pub fn new(signed: SignedRoot) -> Self {
        let wire = pb::SignedRoot::from(&signed);
        let bytes = wire.encode_to_vec();
        StoredRoot(Arc::new(EncodedRoot { bytes, wire, signed }))
    }

    /// The root a backend read as `version` of `cluster`.
    pub fn decode(cluster: &str, version: u64, bytes: Vec<u8>) -> Result<Self> {
        let corrupt = |why: String| StoreError::Corrupt {
            kind: Kind::Root,
            name: format!("{version} of {cluster}"),
            why: super::Unreadable::Record(why),
        };
        let wire = pb::SignedRoot::decode(bytes.as_slice()).map_err(|e| corrupt(e.to_string()))?;
        let signed = SignedRoot::try_from(wire.clone()).map_err(|e| corrupt(e.to_string()))?;
        if signed.root.version != version {
            return Err(corrupt(format!("it holds {}", signed.root.id())));
        }
        Ok(StoredRoot(Arc::new(EncodedRoot { bytes, wire, signed })))
    }

    pub fn encoded(&self) -> &[u8] {
        &self.0.bytes
    }

    pub fn wire(&self) -> &pb::SignedRoot {
        &self.0.wire
    }

    pub fn signed(&self) -> &SignedRoot {
        &self.0.signed
    }

    pub fn version(&self) -> u64 {
        self.0.signed.root.version
    }
}

impl PartialEq for StoredRoot {
    fn eq(&self, other: &Self) -> bool {
        self.0.bytes == other.0.bytes
    }
}

impl Eq for StoredRoot {}

impl fmt::Debug for StoredRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoredRoot({})", self.0.signed.root.id())
    }
}

/// A stored release of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseRow {
    pub cluster: String,
    pub release: StoredRelease,
    pub published_at_ms: i64,
}

/// A stored trust-root rotation of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootRow {
    pub cluster: String,
    pub root: StoredRoot,
    pub published_at_ms: i64,
}

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Created,
    /// The identical record was already stored.
    Unchanged,
}

/// A stored release record's digest, from the text a backend keeps:
/// `Corrupt` (naming `VERSION of CLUSTER`) if it does not parse.
pub fn release_digest(cluster: &str, version: u64, text: &str) -> Result<Digest> {
    text.parse()
        .map_err(|e: lks_proto::digest::DigestError| StoreError::Corrupt {
            kind: Kind::Release,
            name: format!("{version} of {cluster}"),
            why: e.into(),
        })
}

/// Settles a release put against the highest stored release of its
/// cluster (`(version, digest)`) and the digest stored under the new
/// release's version, if any: the one rule both backends apply. `None`:
/// store it.
pub fn release_order(
    new: &StoredRelease,
    highest: Option<(u64, Digest)>,
    same: Option<Digest>,
) -> Result<Option<Stored>> {
    let id = new.signed().release.id();
    if let Some(d) = same {
        return if d == new.digest() {
            Ok(Some(Stored::Unchanged))
        } else {
            Err(StoreError::AlreadyExists(format!(
                "{id} is already stored with other content ({d}); publish a new version"
            )))
        };
    }
    match highest {
        Some((have, _)) if new.version() <= have => Err(StoreError::Conflict(format!(
            "{id} is older than the stored release {have}; publish version {} or higher",
            have + 1
        ))),
        _ => Ok(None),
    }
}

/// Settles a root put against the highest stored root of the cluster
/// (`None`: none, so 1, the nodes' own) and the stored root of the same
/// version if any.
pub fn root_order(
    cluster: &str,
    new: &StoredRoot,
    highest: u64,
    same: Option<&StoredRoot>,
) -> Result<Option<Stored>> {
    let v = new.version();
    if let Some(s) = same {
        return if s == new {
            Ok(Some(Stored::Unchanged))
        } else {
            Err(StoreError::AlreadyExists(format!(
                "trust root {v} of {cluster} is already stored with other content; rotate to version {}",
                highest + 1
            )))
        };
    }
    if v != highest + 1 {
        return Err(StoreError::Conflict(format!(
            "trust root {v} of {cluster} does not follow the stored root {highest}; the next rotation is version {}",
            highest + 1
        )));
    }
    Ok(None)
}

/// The highest root version a cluster has with `stored` roots on top of
/// the nodes' own version 1.
pub fn highest_root(stored: Option<u64>) -> u64 {
    stored.unwrap_or(1)
}

/// Releases and trust roots per cluster.
#[async_trait]
pub trait ReleaseStore: Send + Sync {
    /// Stores a release of its channel (cluster), by the rules of
    /// [`release_order`], atomically.
    async fn put_release(&self, release: StoredRelease, now_ms: i64) -> Result<Stored>;
    /// The cluster's releases, newest first; at most `limit` (0: all).
    async fn list_releases(&self, cluster: &str, limit: u32) -> Result<Vec<ReleaseRow>>;
    /// Stores a root rotation of `cluster`, by the rules of [`root_order`],
    /// atomically.
    async fn put_root(&self, cluster: &str, root: StoredRoot, now_ms: i64) -> Result<Stored>;
    /// The cluster's stored roots, in version order.
    async fn list_roots(&self, cluster: &str) -> Result<Vec<RootRow>>;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lks_proto::release::{Release, TrustRoot};
    use lks_proto::sign::SigningKey;

    use super::*;

    fn release(v: u64, expires: i64) -> StoredRelease {
        StoredRelease::new(SignedRelease::sign(
            Release {
                channel: "a".into(),
                version: v,
                expires_at_ms: expires,
                bundles: BTreeMap::new(),
            },
            &[],
        ))
    }

    #[test]
    fn release_versions_only_rise_and_one_version_is_one_record() {
        let r5 = release(5, 1);
        let head = Some((5, r5.digest()));
        assert_eq!(release_order(&r5, None, None).unwrap(), None);
        assert_eq!(
            release_order(&r5, Some((4, release(4, 1).digest())), None).unwrap(),
            None
        );
        assert_eq!(
            release_order(&r5, head, Some(r5.digest())).unwrap(),
            Some(Stored::Unchanged)
        );
        let e = release_order(&release(5, 2), head, Some(r5.digest())).unwrap_err();
        assert!(matches!(e, StoreError::AlreadyExists(_)), "{e}");
        let r3 = release(3, 1);
        assert_eq!(
            release_order(&r3, head, Some(r3.digest())).unwrap(),
            Some(Stored::Unchanged),
            "an older stored record again changes nothing either"
        );
        let e = release_order(&r3, head, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "release 3 of a is older than the stored release 5; publish version 6 or higher"
        );
    }

    #[test]
    fn roots_follow_one_another() {
        let k = SigningKey::generate();
        let root = |v| {
            StoredRoot::new(SignedRoot::sign(
                TrustRoot {
                    version: v,
                    keys: vec![k.public()],
                    threshold: 1,
                    expires_at_ms: 0,
                },
                &[&k],
            ))
        };
        assert_eq!(root_order("a", &root(2), highest_root(None), None).unwrap(), None);
        let e = root_order("a", &root(3), highest_root(None), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "trust root 3 of a does not follow the stored root 1; the next rotation is version 2"
        );
        let r2 = root(2);
        assert_eq!(
            root_order("a", &r2, 2, Some(&r2)).unwrap(),
            Some(Stored::Unchanged)
        );
    }

    #[test]
    fn a_stored_record_under_the_wrong_key_is_corrupt() {
        let r = release(5, 1);
        assert!(StoredRelease::decode("a", 5, r.encoded().to_vec()).is_ok());
        assert!(matches!(
            StoredRelease::decode("b", 5, r.encoded().to_vec()),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            StoredRelease::decode("a", 5, vec![0xff, 0xff]),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
