//! Conversions between the signed records and their protobuf transport
//! forms (`lks.v1.SignedRelease`, `lks.v1.SignedRoot`).
//!
//! Protobuf → domain is `TryFrom`: it refuses a message over
//! [`MAX_RELEASE_BYTES`] / [`MAX_ROOT_BYTES`] (measured on the message, so
//! before anything is copied out of it), more than [`MAX_SIGNATURES`]
//! signatures, a field of the wrong length, a bundle named twice and a
//! malformed digest, then checks the record's own rules
//! ([`Release::validate`], [`TrustRoot::validate`]). Signatures are not
//! checked here: that is [`super::TrustState`]'s job, against the node's
//! root. Domain → protobuf is `From` and cannot fail.

use std::collections::BTreeMap;

use lks_wire::pb;
use prost::Message;

use crate::digest::Digest;
use crate::limits::{MAX_RELEASE_BYTES, MAX_ROOT_BYTES, MAX_SIGNATURES};
use crate::sign::PublisherKey;

use super::{KeySignature, Release, ReleasedBundle, SignedRelease, SignedRoot, TrustError, TrustRoot};

/// A name from the message as an error may show it: as it is when it is
/// short and printable, else quoted with escapes and cut at 64 characters
/// (the message is not yet checked, and an error is one line).
fn shown(name: &str) -> String {
    if !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_graphic()) {
        return name.to_string();
    }
    let cut: String = name.chars().take(64).collect();
    if cut.len() < name.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

fn malformed(what: impl Into<String>, why: impl Into<String>) -> TrustError {
    TrustError::Malformed {
        what: what.into(),
        why: why.into(),
    }
}

fn signatures(what: &str, sigs: Vec<pb::KeySignature>) -> Result<Vec<KeySignature>, TrustError> {
    if sigs.len() > MAX_SIGNATURES {
        return Err(TrustError::TooManySignatures {
            what: what.into(),
            count: sigs.len(),
        });
    }
    sigs.into_iter()
        .enumerate()
        .map(|(i, s)| {
            let public_key = <[u8; 32]>::try_from(s.public_key.as_slice()).map_err(|_| {
                malformed(
                    format!("{what}: signatures[{i}].public_key"),
                    format!("expected 32 bytes, got {}", s.public_key.len()),
                )
            })?;
            let signature = <[u8; 64]>::try_from(s.signature.as_slice()).map_err(|_| {
                malformed(
                    format!("{what}: signatures[{i}].signature"),
                    format!("expected 64 bytes, got {}", s.signature.len()),
                )
            })?;
            Ok(KeySignature {
                public_key,
                signature,
            })
        })
        .collect()
}

fn pb_signatures(sigs: &[KeySignature]) -> Vec<pb::KeySignature> {
    sigs.iter()
        .map(|s| pb::KeySignature {
            public_key: s.public_key.to_vec(),
            signature: s.signature.to_vec(),
        })
        .collect()
}

impl TryFrom<pb::SignedRelease> for SignedRelease {
    type Error = TrustError;

    fn try_from(m: pb::SignedRelease) -> Result<Self, Self::Error> {
        let size = m.encoded_len();
        if size > MAX_RELEASE_BYTES {
            return Err(TrustError::TooLarge {
                what: "a signed release",
                size,
                limit: MAX_RELEASE_BYTES,
            });
        }
        let r = m
            .release
            .ok_or_else(|| malformed("signed release", "no release"))?;
        let what = format!("release {} of {}", r.version, shown(&r.channel));
        let signatures = signatures(&what, m.signatures)?;
        let mut bundles = BTreeMap::new();
        for (i, b) in r.bundles.into_iter().enumerate() {
            let manifest_digest = b
                .manifest_digest
                .parse::<Digest>()
                .map_err(|e| malformed(format!("{what}: bundles[{i}].manifest_digest"), e.to_string()))?;
            if bundles.contains_key(&b.name) {
                return Err(malformed(
                    what,
                    format!("bundle {} is listed twice", shown(&b.name)),
                ));
            }
            bundles.insert(
                b.name,
                ReleasedBundle {
                    version: b.version,
                    manifest_digest,
                },
            );
        }
        let release = Release {
            channel: r.channel,
            version: r.version,
            expires_at_ms: r.expires_at_ms,
            bundles,
        };
        release.validate()?;
        Ok(SignedRelease { release, signatures })
    }
}

impl From<&SignedRelease> for pb::SignedRelease {
    fn from(s: &SignedRelease) -> Self {
        let r = &s.release;
        pb::SignedRelease {
            release: Some(pb::Release {
                channel: r.channel.clone(),
                version: r.version,
                expires_at_ms: r.expires_at_ms,
                bundles: r
                    .bundles
                    .iter()
                    .map(|(name, b)| pb::ReleasedBundle {
                        name: name.clone(),
                        version: b.version.clone(),
                        manifest_digest: b.manifest_digest.to_string(),
                    })
                    .collect(),
            }),
            signatures: pb_signatures(&s.signatures),
        }
    }
}

impl TryFrom<pb::SignedRoot> for SignedRoot {
    type Error = TrustError;

    fn try_from(m: pb::SignedRoot) -> Result<Self, Self::Error> {
        let size = m.encoded_len();
        if size > MAX_ROOT_BYTES {
            return Err(TrustError::TooLarge {
                what: "a signed trust root",
                size,
                limit: MAX_ROOT_BYTES,
            });
        }
        let r = m.root.ok_or_else(|| malformed("signed trust root", "no root"))?;
        let what = format!("trust root {}", r.version);
        let signatures = signatures(&what, m.signatures)?;
        let keys = r
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                <[u8; 32]>::try_from(k.as_slice())
                    .ok()
                    .and_then(|raw| PublisherKey::from_bytes(&raw))
                    .ok_or_else(|| {
                        malformed(format!("{what}: keys[{i}]"), "not a 32-byte ed25519 public key")
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let root = TrustRoot {
            version: r.version,
            keys,
            threshold: r.threshold,
            expires_at_ms: r.expires_at_ms,
        };
        root.validate()?;
        Ok(SignedRoot { root, signatures })
    }
}

impl From<&SignedRoot> for pb::SignedRoot {
    fn from(s: &SignedRoot) -> Self {
        let r = &s.root;
        pb::SignedRoot {
            root: Some(pb::TrustRoot {
                version: r.version,
                keys: r.keys.iter().map(|k| k.to_bytes().to_vec()).collect(),
                threshold: r.threshold,
                expires_at_ms: r.expires_at_ms,
            }),
            signatures: pb_signatures(&s.signatures),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::SigningKey;

    fn release() -> Release {
        let mut bundles = BTreeMap::new();
        bundles.insert(
            "kubelet".to_string(),
            ReleasedBundle {
                version: "1.31.2".into(),
                manifest_digest: Digest::of(b"manifest"),
            },
        );
        Release {
            channel: "tenant-a".into(),
            version: 7,
            expires_at_ms: 1_900_000_000_000,
            bundles,
        }
    }

    #[test]
    fn a_signed_release_round_trips_through_protobuf_bytes() {
        let k = SigningKey::generate();
        let signed = SignedRelease::sign(release(), &[&k]);
        let bytes = pb::SignedRelease::from(&signed).encode_to_vec();
        let back = SignedRelease::try_from(pb::SignedRelease::decode(bytes.as_slice()).unwrap()).unwrap();
        assert_eq!(back, signed);
    }

    #[test]
    fn a_signed_root_round_trips_through_protobuf_bytes() {
        let (a, b) = (SigningKey::generate(), SigningKey::generate());
        let root = TrustRoot {
            version: 2,
            keys: vec![a.public(), b.public()],
            threshold: 2,
            expires_at_ms: 0,
        };
        let signed = SignedRoot::sign(root, &[&a, &b]);
        let bytes = pb::SignedRoot::from(&signed).encode_to_vec();
        let back = SignedRoot::try_from(pb::SignedRoot::decode(bytes.as_slice()).unwrap()).unwrap();
        assert_eq!(back, signed);
    }

    #[test]
    fn malformed_messages_are_refused_naming_the_field() {
        let k = SigningKey::generate();
        let good = pb::SignedRelease::from(&SignedRelease::sign(release(), &[&k]));

        let mut m = good.clone();
        let r = m.release.as_mut().unwrap();
        r.bundles.push(r.bundles[0].clone());
        let e = SignedRelease::try_from(m).unwrap_err().to_string();
        assert_eq!(e, "release 7 of tenant-a: bundle kubelet is listed twice");

        let mut m = good.clone();
        m.release.as_mut().unwrap().bundles[0].manifest_digest = "md5:00".into();
        let e = SignedRelease::try_from(m).unwrap_err().to_string();
        assert!(
            e.starts_with("release 7 of tenant-a: bundles[0].manifest_digest: "),
            "{e}"
        );

        let mut m = good.clone();
        m.signatures[0].signature.pop();
        let e = SignedRelease::try_from(m).unwrap_err().to_string();
        assert_eq!(
            e,
            "release 7 of tenant-a: signatures[0].signature: expected 64 bytes, got 63"
        );

        let mut m = good.clone();
        m.release = None;
        assert_eq!(
            SignedRelease::try_from(m).unwrap_err().to_string(),
            "signed release: no release"
        );

        let mut m = good.clone();
        m.release.as_mut().unwrap().version = 0;
        assert!(matches!(
            SignedRelease::try_from(m),
            Err(TrustError::ZeroVersion { .. })
        ));

        let mut m = good;
        m.signatures = vec![m.signatures[0].clone(); MAX_SIGNATURES + 1];
        assert!(matches!(
            SignedRelease::try_from(m),
            Err(TrustError::TooManySignatures { count, .. }) if count == MAX_SIGNATURES + 1
        ));

        let root = pb::SignedRoot {
            root: Some(pb::TrustRoot {
                version: 2,
                keys: vec![vec![0u8; 31]],
                threshold: 1,
                expires_at_ms: 0,
            }),
            signatures: vec![],
        };
        assert_eq!(
            SignedRoot::try_from(root).unwrap_err().to_string(),
            "trust root 2: keys[0]: not a 32-byte ed25519 public key"
        );
    }

    #[test]
    fn names_from_the_message_are_shown_on_one_line() {
        let mut m = pb::SignedRelease::from(&SignedRelease::sign(release(), &[]));
        m.release.as_mut().unwrap().channel = " r\n".into();
        m.signatures = vec![pb::KeySignature::default()];
        let e = SignedRelease::try_from(m).unwrap_err().to_string();
        assert_eq!(
            e,
            "release 7 of \" r\\n\": signatures[0].public_key: expected 32 bytes, got 0"
        );
        assert_eq!(shown(&"x".repeat(100)), format!("{:?}…", "x".repeat(64)));
        assert_eq!(shown("tenant-a"), "tenant-a");
    }

    /// Writes seeds for the `pb_release` fuzz target into
    /// `$LKS_FUZZ_SEEDS/pb_release/` (`bash scripts/fuzz.sh --seed`): a
    /// kind byte (0 release, 1 root) and the encoded record, signed.
    #[test]
    #[ignore = "writes fuzz seeds; run by scripts/fuzz.sh --seed"]
    fn write_fuzz_seeds() {
        let dir = std::path::PathBuf::from(std::env::var("LKS_FUZZ_SEEDS").expect("LKS_FUZZ_SEEDS"))
            .join("pb_release");
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (SigningKey::generate(), SigningKey::generate());
        let mut two = release();
        two.bundles.insert(
            "containerd".into(),
            ReleasedBundle {
                version: "1.7.22".into(),
                manifest_digest: Digest::of(b"containerd"),
            },
        );
        let root = TrustRoot {
            version: 2,
            keys: vec![a.public(), b.public()],
            threshold: 2,
            expires_at_ms: 1_900_000_000_000,
        };
        let seeds: Vec<(&str, u8, Vec<u8>)> = vec![
            (
                "release-1-key",
                0,
                pb::SignedRelease::from(&SignedRelease::sign(release(), &[&a])).encode_to_vec(),
            ),
            (
                "release-2-keys",
                0,
                pb::SignedRelease::from(&SignedRelease::sign(two, &[&a, &b])).encode_to_vec(),
            ),
            (
                "root-2-keys",
                1,
                pb::SignedRoot::from(&SignedRoot::sign(root, &[&a, &b])).encode_to_vec(),
            ),
        ];
        for (name, kind, bytes) in seeds {
            let mut data = vec![kind];
            data.extend_from_slice(&bytes);
            std::fs::write(dir.join(name), data).unwrap();
        }
    }

    #[test]
    fn oversized_records_are_refused_before_they_are_read() {
        let mut m = pb::SignedRelease::from(&SignedRelease::sign(release(), &[]));
        m.release.as_mut().unwrap().channel = "x".repeat(MAX_RELEASE_BYTES);
        assert!(matches!(
            SignedRelease::try_from(m),
            Err(TrustError::TooLarge {
                limit: MAX_RELEASE_BYTES,
                ..
            })
        ));
        let m = pb::SignedRoot {
            root: Some(pb::TrustRoot {
                version: 2,
                keys: vec![vec![7u8; 32]; MAX_ROOT_BYTES / 32 + 1],
                threshold: 1,
                expires_at_ms: 0,
            }),
            signatures: vec![],
        };
        assert!(matches!(
            SignedRoot::try_from(m),
            Err(TrustError::TooLarge {
                limit: MAX_ROOT_BYTES,
                ..
            })
        ));
    }
}
