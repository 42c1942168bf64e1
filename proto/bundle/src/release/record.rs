//! The two records that are signed — a [`Release`] and a [`TrustRoot`] —
//! their rules and their canonical encodings.

use std::collections::BTreeMap;

use crate::canonical::{put_str, put_u32};
use crate::digest::Digest;
use crate::limits::{MAX_RELEASE_BUNDLES, MAX_ROOT_KEYS};
use crate::names;
use crate::sign::PublisherKey;

use super::TrustError;

/// Domain separator of [`Release::encode`]; bump it if the encoding changes.
pub const RELEASE_DOMAIN: &[u8] = b"lks.release.v1\0";
/// Domain separator of [`TrustRoot::encode`]; bump it if the encoding changes.
pub const ROOT_DOMAIN: &[u8] = b"lks.root.v1\0";

/// The bundle versions released together on one channel.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Release {
    /// The tenant cluster's name.
    pub channel: String,
    /// Strictly increasing per channel; 0 is never a release.
    pub version: u64,
    /// Milliseconds since the Unix epoch; not accepted at or after it.
    pub expires_at_ms: i64,
    /// Bundle name → the version released.
    pub bundles: BTreeMap<String, ReleasedBundle>,
}

/// One bundle of a [`Release`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReleasedBundle {
    pub version: String,
    /// [`crate::canonical::manifest_digest`] of the released manifest.
    pub manifest_digest: Digest,
}

impl Release {
    /// "release 7 of tenant-a", as errors name it.
    pub fn id(&self) -> String {
        format!("release {} of {}", self.version, self.channel)
    }

    /// Checks the record's own rules (module doc, "Records").
    pub fn validate(&self) -> Result<(), TrustError> {
        let invalid = |what: String| move |source| TrustError::InvalidName { what, source };
        names::validate_cluster_name(&self.channel).map_err(invalid(format!("release {}", self.version)))?;
        if self.version == 0 {
            return Err(TrustError::ZeroVersion { what: self.id() });
        }
        if self.bundles.len() > MAX_RELEASE_BUNDLES {
            return Err(TrustError::TooManyBundles {
                channel: self.channel.clone(),
                version: self.version,
                count: self.bundles.len(),
            });
        }
        for (name, b) in &self.bundles {
            names::validate_bundle_name(name).map_err(invalid(self.id()))?;
            names::validate_version(&b.version).map_err(invalid(format!("{}, bundle {name}", self.id())))?;
        }
        Ok(())
    }

    /// The canonical encoding, what is signed: [`RELEASE_DOMAIN`], the
    /// channel (u32 length + bytes), the version (u64), the expiry (i64),
    /// the number of bundles (u32), then per bundle in name order its name
    /// and version (each u32 length + bytes) and the 32 digest bytes. All
    /// integers big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.bundles.len() * 128);
        out.extend_from_slice(RELEASE_DOMAIN);
        put_str(&mut out, &self.channel);
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        put_u32(&mut out, self.bundles.len() as u32);
        // A BTreeMap iterates in name order: the canonical order.
        for (name, b) in &self.bundles {
            put_str(&mut out, name);
            put_str(&mut out, &b.version);
            out.extend_from_slice(b.manifest_digest.as_bytes());
        }
        out
    }

    /// SHA-256 of [`Release::encode`]: the record's identity.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.encode())
    }

    /// Whether this release lets a node apply bundle `name` at `version`
    /// with this canonical manifest digest (the mix-and-match defence).
    pub fn admits(&self, name: &str, version: &str, manifest_digest: &Digest) -> Result<(), TrustError> {
        let released = self.bundles.get(name);
        match released {
            Some(b) if b.version == version => {
                if b.manifest_digest == *manifest_digest {
                    Ok(())
                } else {
                    Err(TrustError::DigestMismatch {
                        channel: self.channel.clone(),
                        release: self.version,
                        bundle: format!("{name}@{version}"),
                        expected: b.manifest_digest,
                        got: *manifest_digest,
                    })
                }
            }
            _ => Err(TrustError::NotReleased {
                channel: self.channel.clone(),
                release: self.version,
                name: name.into(),
                version: version.into(),
                released: released.map(|b| b.version.clone()),
            }),
        }
    }

    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms <= now_ms
    }
}

/// The keys a node trusts and how many of them must sign (TUF's root role).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustRoot {
    /// 1 for the root built from the node's configuration; +1 per rotation.
    pub version: u64,
    /// Distinct keys; their order carries no meaning.
    pub keys: Vec<PublisherKey>,
    /// How many distinct keys must sign, 1..=`keys.len()`.
    pub threshold: u32,
    /// Milliseconds since the Unix epoch, or [`TrustRoot::NEVER_EXPIRES`].
    pub expires_at_ms: i64,
}

impl TrustRoot {
    /// The `expires_at_ms` of a root without an expiry.
    pub const NEVER_EXPIRES: i64 = 0;

    /// Version 1, from the node's configured keys (repeats dropped), with no
    /// expiry.
    pub fn initial(keys: impl IntoIterator<Item = PublisherKey>, threshold: u32) -> Result<Self, TrustError> {
        let mut distinct: Vec<PublisherKey> = Vec::new();
        for k in keys {
            if !distinct.contains(&k) {
                distinct.push(k);
            }
        }
        let root = TrustRoot {
            version: 1,
            keys: distinct,
            threshold,
            expires_at_ms: Self::NEVER_EXPIRES,
        };
        root.validate()?;
        Ok(root)
    }

    /// "trust root 2", as errors name it.
    pub fn id(&self) -> String {
        format!("trust root {}", self.version)
    }

    /// Checks the record's own rules (module doc, "Records").
    pub fn validate(&self) -> Result<(), TrustError> {
        let version = self.version;
        if version == 0 {
            return Err(TrustError::ZeroVersion { what: self.id() });
        }
        if self.keys.is_empty() {
            return Err(TrustError::NoKeys { version });
        }
        if self.keys.len() > MAX_ROOT_KEYS {
            return Err(TrustError::TooManyKeys {
                version,
                count: self.keys.len(),
            });
        }
        for (i, k) in self.keys.iter().enumerate() {
            if self.keys[..i].contains(k) {
                return Err(TrustError::DuplicateKey {
                    version,
                    key: k.fingerprint(),
                });
            }
        }
        if self.threshold == 0 || self.threshold as usize > self.keys.len() {
            return Err(TrustError::BadThreshold {
                version,
                threshold: self.threshold,
                keys: self.keys.len(),
            });
        }
        Ok(())
    }

    /// Whether `raw` is one of this root's keys.
    pub fn lists(&self, raw: &[u8; 32]) -> Option<&PublisherKey> {
        self.keys.iter().find(|k| &k.to_bytes() == raw)
    }

    /// The canonical encoding, what is signed: [`ROOT_DOMAIN`], the version
    /// (u64), the expiry (i64), the threshold (u32), the number of keys
    /// (u32), then the 32 bytes of each key in byte order. All integers
    /// big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.keys.len() * 32);
        out.extend_from_slice(ROOT_DOMAIN);
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        put_u32(&mut out, self.threshold);
        let mut keys: Vec<[u8; 32]> = self.keys.iter().map(PublisherKey::to_bytes).collect();
        keys.sort_unstable();
        put_u32(&mut out, keys.len() as u32);
        for k in &keys {
            out.extend_from_slice(k);
        }
        out
    }

    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms != Self::NEVER_EXPIRES && self.expires_at_ms <= now_ms
    }
}
