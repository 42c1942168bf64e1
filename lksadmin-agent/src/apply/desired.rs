//! The desired state in the agent's own terms: what the engine converges
//! on. A `pb::DesiredState` is converted once, where it enters the agent
//! (the connection, or `desired.pb` read at start), so the engine never
//! sees the wire form.
//!
//! The conversion refuses nothing as a whole: a bundle that fails its
//! rules becomes an [`DesiredBundle::Invalid`] entry the engine reports
//! failed (or, without a valid name to report it under, an
//! [`DesiredBundle::Unnamed`] one it only logs), while the others are
//! applied. A name listed twice keeps its first entry.
//!
//! A signed release and root rotations are converted the same way: each
//! one either converted or the reason it could not be, for the trust
//! checks to report ([`crate::apply::trust`]).
//!
//! The message is kept encoded beside its domain form: `desired.pb` stores
//! the received message encoded again, as it always has (prost drops
//! unknown fields when it decodes), so the file's format stays the wire's.

use std::collections::{BTreeMap, BTreeSet};

use lks_proto::manifest::ManifestError;
use lks_proto::release::{SignedRelease, SignedRoot, TrustError};
use lks_proto::{Digest, SignedBundle, pb};
use prost::Message;

/// The bundles this node should hold, and the operator's retry requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub generation: u64,
    /// One entry per bundle name, in the server's order (the first of a
    /// name listed twice).
    pub bundles: Vec<DesiredBundle>,
    /// Names listed again after their first entry (those entries dropped).
    pub duplicates: Vec<String>,
    /// Bundle name → retry request (`lksctl node retry`).
    pub retry: BTreeMap<String, u64>,
    /// The cluster's signed release, converted (or why it could not be):
    /// checked against the node's trust only when trust is on.
    pub release: Option<Result<SignedRelease, TrustError>>,
    /// The cluster's trust-root rotations, converted one by one.
    pub roots: Vec<Result<SignedRoot, TrustError>>,
    /// The message this came from, encoded: what `desired.pb` holds.
    encoded: Vec<u8>,
}

/// One bundle of a desired state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DesiredBundle {
    /// A bundle that passed the shared rules (its signature is checked
    /// when it is applied).
    Valid(Box<SignedBundle>),
    /// A bundle that broke a rule but has a valid name: reported failed
    /// under that name.
    Invalid(InvalidBundle),
    /// A bundle without a valid name to report it under: only logged.
    Unnamed {
        /// The name as sent (possibly empty).
        name: String,
        version: String,
        error: ManifestError,
    },
}

/// A bundle refused by the rules, with what the engine reports about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidBundle {
    pub name: String,
    pub version: String,
    /// Digest of the bundle's encoded message: the failure's key, so the
    /// same content is not reported again while a changed one is.
    pub key: Digest,
    pub error: ManifestError,
}

impl DesiredBundle {
    /// The bundle's name as sent.
    pub fn name(&self) -> &str {
        match self {
            DesiredBundle::Valid(sb) => &sb.manifest.name,
            DesiredBundle::Invalid(i) => &i.name,
            DesiredBundle::Unnamed { name, .. } => name,
        }
    }

    /// The bundle's version as sent.
    pub fn version(&self) -> &str {
        match self {
            DesiredBundle::Valid(sb) => &sb.manifest.version,
            DesiredBundle::Invalid(i) => &i.version,
            DesiredBundle::Unnamed { version, .. } => version,
        }
    }

    /// Converts one wire bundle; `Unnamed` when its name is not valid.
    fn from_pb(b: &pb::SignedBundle) -> Self {
        let (name, version) = b
            .manifest
            .as_ref()
            .map(|m| (m.name.clone(), m.version.clone()))
            .unwrap_or_default();
        match SignedBundle::try_from(b.clone()) {
            Ok(sb) => DesiredBundle::Valid(Box::new(sb)),
            Err(error) if lks_proto::names::validate_bundle_name(&name).is_ok() => {
                DesiredBundle::Invalid(InvalidBundle {
                    key: Digest::of(&b.encode_to_vec()),
                    name,
                    version,
                    error,
                })
            }
            Err(error) => DesiredBundle::Unnamed { name, version, error },
        }
    }
}

impl Desired {
    /// The encoded message, as stored in `desired.pb`.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The bundles that passed the rules.
    pub fn valid(&self) -> impl Iterator<Item = &SignedBundle> {
        self.bundles.iter().filter_map(|b| match b {
            DesiredBundle::Valid(sb) => Some(&**sb),
            _ => None,
        })
    }

    /// Every name listed, valid or not.
    pub fn names(&self) -> BTreeSet<&str> {
        self.bundles.iter().map(DesiredBundle::name).collect()
    }
}

impl From<&pb::DesiredState> for Desired {
    fn from(d: &pb::DesiredState) -> Self {
        let mut bundles = Vec::with_capacity(d.bundles.len());
        let mut duplicates = Vec::new();
        let mut seen = BTreeSet::new();
        for b in &d.bundles {
            let name = b.manifest.as_ref().map(|m| m.name.as_str()).unwrap_or_default();
            if !seen.insert(name) {
                duplicates.push(name.to_string());
                continue;
            }
            bundles.push(DesiredBundle::from_pb(b));
        }
        Desired {
            generation: d.generation,
            bundles,
            duplicates,
            retry: d.retry.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            release: d.release.clone().map(SignedRelease::try_from),
            roots: d.roots.iter().cloned().map(SignedRoot::try_from).collect(),
            encoded: d.encode_to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use lks_proto::{BundlePath, FileSpec, Manifest};

    use super::*;

    fn manifest(name: &str, version: &str) -> Manifest {
        Manifest {
            name: name.into(),
            version: version.into(),
            files: vec![FileSpec {
                path: BundlePath::new("/etc/app.conf").unwrap(),
                digest: Digest::of(b"x"),
                size: 1,
                mode: 0o644,
                url: None,
                chunks: None,
                arch: None,
            }],
            ..Default::default()
        }
    }

    fn wire(m: Manifest) -> pb::SignedBundle {
        pb::SignedBundle::from(&SignedBundle {
            manifest: m,
            signature: None,
            chunks_signature: None,
        })
    }

    fn state(bundles: Vec<pb::SignedBundle>) -> pb::DesiredState {
        pb::DesiredState {
            generation: 7,
            bundles,
            retry: [("app".to_string(), 3)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_bundle_converts_and_the_message_is_kept_encoded() {
        let d = state(vec![wire(manifest("app", "1"))]);
        let got = Desired::from(&d);
        assert_eq!(got.generation, 7);
        assert_eq!(got.retry, BTreeMap::from([("app".to_string(), 3)]));
        assert!(got.duplicates.is_empty());
        let [DesiredBundle::Valid(sb)] = got.bundles.as_slice() else {
            panic!("{:?}", got.bundles)
        };
        assert_eq!(sb.manifest, manifest("app", "1"));
        assert_eq!(got.encoded(), d.encode_to_vec());
        assert_eq!(pb::DesiredState::decode(got.encoded()).unwrap(), d);
    }

    #[test]
    fn an_invalid_bundle_with_a_valid_name_is_kept_to_be_reported() {
        let mut b = wire(manifest("app", "2"));
        b.signature = vec![1; 3];
        let got = Desired::from(&state(vec![b.clone(), wire(manifest("other", "1"))]));
        let DesiredBundle::Invalid(i) = &got.bundles[0] else {
            panic!("{:?}", got.bundles)
        };
        assert_eq!((i.name.as_str(), i.version.as_str()), ("app", "2"));
        assert_eq!(i.key, Digest::of(&b.encode_to_vec()));
        assert_eq!(i.error.field, "signature");
        assert!(matches!(&got.bundles[1], DesiredBundle::Valid(sb) if sb.manifest.name == "other"));
        assert_eq!(got.valid().count(), 1);
        assert_eq!(got.names(), BTreeSet::from(["app", "other"]));
    }

    #[test]
    fn a_bundle_without_a_valid_name_is_only_kept_to_be_logged() {
        let mut bad = wire(manifest("app", "1"));
        if let Some(m) = bad.manifest.as_mut() {
            m.name = "Not A Name".into();
        }
        let missing = pb::SignedBundle::default();
        let got = Desired::from(&state(vec![bad, missing]));
        match got.bundles.as_slice() {
            [
                DesiredBundle::Unnamed { name: a, .. },
                DesiredBundle::Unnamed { name: b, error, .. },
            ] => {
                assert_eq!((a.as_str(), b.as_str()), ("Not A Name", ""));
                assert_eq!(error.field, "manifest");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(got.valid().count(), 0);
    }

    #[test]
    fn a_name_listed_twice_keeps_its_first_entry() {
        let mut broken = wire(manifest("app", "2"));
        broken.signature = vec![1; 3];
        let d = state(vec![
            wire(manifest("app", "1")),
            broken,
            wire(manifest("b", "1")),
            wire(manifest("app", "3")),
        ]);
        let got = Desired::from(&d);
        assert_eq!(got.duplicates, ["app", "app"]);
        let versions: Vec<_> = got
            .valid()
            .map(|sb| (sb.manifest.name.as_str(), sb.manifest.version.as_str()))
            .collect();
        assert_eq!(versions, [("app", "1"), ("b", "1")]);
        assert_eq!(got.bundles.len(), 2);
        assert_eq!(
            got.encoded(),
            d.encode_to_vec(),
            "the stored form keeps every entry"
        );
    }
}
