//! ed25519 publisher keys and bundle signatures.
//!
//! Keys are stored as standard PEM: PKCS#8 for the private key (`PREFIX.key`,
//! mode 0600) and SubjectPublicKeyInfo for the public key (`PREFIX.pub`), so
//! `openssl pkey` can read both. A signature covers the canonical manifest
//! encoding ([`crate::canonical`]), which in turn covers every file digest.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, Verifier};

use crate::canonical;
use crate::digest::Digest;
use crate::manifest::{Manifest, Signature, SignedBundle};

/// Why a key could not be used or a signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("read key {path}: {source}")]
    ReadKey { path: PathBuf, source: std::io::Error },
    #[error("{path}: not an ed25519 {kind} key in PEM form")]
    BadKey { path: PathBuf, kind: &'static str },
    #[error("write key {path}: {source}")]
    WriteKey { path: PathBuf, source: std::io::Error },
    #[error("bundle {bundle} is not signed, but this node trusts only signed bundles")]
    Unsigned { bundle: String },
    #[error("bundle {bundle} is signed by {signer}, which is not a trusted publisher key")]
    UntrustedSigner { bundle: String, signer: String },
    #[error("bundle {bundle}: the signature does not match its content")]
    BadSignature { bundle: String },
}

/// A publisher's public key, as trusted by agents (`--trust-key`).
#[derive(Clone, PartialEq, Eq)]
pub struct PublisherKey(ed25519_dalek::VerifyingKey);

impl PublisherKey {
    pub fn from_pem(pem: &str) -> Option<Self> {
        ed25519_dalek::VerifyingKey::from_public_key_pem(pem.trim())
            .ok()
            .map(PublisherKey)
    }

    pub fn from_file(path: &Path) -> Result<Self, SignError> {
        let pem = std::fs::read_to_string(path).map_err(|source| SignError::ReadKey {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_pem(&pem).ok_or_else(|| SignError::BadKey {
            path: path.to_path_buf(),
            kind: "public",
        })
    }

    pub fn from_bytes(bytes: &[u8; 32]) -> Option<Self> {
        ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .ok()
            .map(PublisherKey)
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    pub fn to_pem(&self) -> String {
        // Encoding a valid 32-byte key into SPKI cannot fail.
        self.0.to_public_key_pem(Default::default()).unwrap_or_default()
    }

    /// `ed25519:` + hex SHA-256 of the raw key, to name a key in messages.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.to_bytes())
    }
}

/// The raw key as 64 lowercase hex digits: how state files (the agent's
/// trust state, [`crate::release::TrustState`]) keep a key.
impl serde::Serialize for PublisherKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&hex::encode(self.to_bytes()))
    }
}

impl<'de> serde::Deserialize<'de> for PublisherKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let mut raw = [0u8; 32];
        hex::decode_to_slice(&s, &mut raw)
            .ok()
            .and_then(|()| PublisherKey::from_bytes(&raw))
            .ok_or_else(|| serde::de::Error::custom(format!("{s:?} is not an ed25519 public key in hex")))
    }
}

impl PublisherKey {
    /// Whether `signature` is this key's strict ed25519 signature of `msg`.
    pub(crate) fn verifies(&self, msg: &[u8], signature: &[u8; 64]) -> bool {
        self.0
            .verify_strict(msg, &ed25519_dalek::Signature::from_bytes(signature))
            .is_ok()
    }
}

impl fmt::Debug for PublisherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublisherKey({})", self.fingerprint())
    }
}

fn fingerprint(raw: &[u8; 32]) -> String {
    format!("ed25519:{}", &Digest::of(raw).hex()[..16])
}

/// A publisher's private key (`lksctl bundle publish --sign-key`).
pub struct SigningKey(ed25519_dalek::SigningKey);

impl SigningKey {
    /// A fresh key from the operating system's CSPRNG.
    pub fn generate() -> Self {
        SigningKey(ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng))
    }

    pub fn from_file(path: &Path) -> Result<Self, SignError> {
        let pem = std::fs::read_to_string(path).map_err(|source| SignError::ReadKey {
            path: path.to_path_buf(),
            source,
        })?;
        ed25519_dalek::SigningKey::from_pkcs8_pem(pem.trim())
            .map(SigningKey)
            .map_err(|_| SignError::BadKey {
                path: path.to_path_buf(),
                kind: "private",
            })
    }

    pub fn public(&self) -> PublisherKey {
        PublisherKey(self.0.verifying_key())
    }

    /// Writes `PREFIX.key` (0600) and `PREFIX.pub`. Refuses to overwrite
    /// either file, and removes the private key again if the public one
    /// cannot be written, so nothing half-made is left.
    pub fn write_pair(&self, prefix: &Path) -> Result<(PathBuf, PathBuf), SignError> {
        let key_path = with_suffix(prefix, "key");
        let pub_path = with_suffix(prefix, "pub");
        let key_pem = self
            .0
            .to_pkcs8_pem(Default::default())
            .map_err(|e| SignError::WriteKey {
                path: key_path.clone(),
                source: std::io::Error::other(e),
            })?;
        if pub_path.exists() {
            return Err(SignError::WriteKey {
                path: pub_path,
                source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "file exists"),
            });
        }
        write_new(&key_path, key_pem.as_bytes(), 0o600)?;
        if let Err(e) = write_new(&pub_path, self.public().to_pem().as_bytes(), 0o644) {
            let _ = std::fs::remove_file(&key_path);
            return Err(e);
        }
        Ok((key_path, pub_path))
    }

    /// Signs `msg` as it is: for callers that built a canonical encoding
    /// with its own domain separator ([`crate::release`]).
    pub(crate) fn sign_raw(&self, msg: &[u8]) -> [u8; 64] {
        self.0.sign(msg).to_bytes()
    }

    /// Signs the canonical encoding of `m`.
    pub fn sign(&self, m: &Manifest) -> Signature {
        Signature {
            public_key: self.0.verifying_key().to_bytes(),
            signature: self.0.sign(&canonical::encode(m)).to_bytes(),
        }
    }

    /// Signs `m` whole: the manifest and, if a file has a chunk list, the
    /// chunk lists too.
    pub fn sign_bundle(&self, m: Manifest) -> SignedBundle {
        let chunks_signature =
            canonical::has_chunks(&m).then(|| self.0.sign(&canonical::encode_chunks(&m)).to_bytes());
        SignedBundle {
            signature: Some(self.sign(&m)),
            chunks_signature,
            manifest: m,
        }
    }
}

fn with_suffix(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), SignError> {
    let err = |source| SignError::WriteKey {
        path: path.to_path_buf(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(err)
}

/// Checks that `b`'s signature is valid (if present) and, when `trusted` is
/// not empty, that it was made by one of the trusted keys. A node with no
/// trusted key accepts unsigned bundles but still refuses a broken signature.
pub fn verify(b: &SignedBundle, trusted: &[PublisherKey]) -> Result<(), SignError> {
    let bundle = b.manifest.id();
    let Some(sig) = &b.signature else {
        return if trusted.is_empty() {
            Ok(())
        } else {
            Err(SignError::Unsigned { bundle })
        };
    };
    let key =
        ed25519_dalek::VerifyingKey::from_bytes(&sig.public_key).map_err(|_| SignError::BadSignature {
            bundle: bundle.clone(),
        })?;
    if !trusted.is_empty() && !trusted.iter().any(|t| t.0 == key) {
        return Err(SignError::UntrustedSigner {
            bundle,
            signer: fingerprint(&sig.public_key),
        });
    }
    let signature = ed25519_dalek::Signature::from_bytes(&sig.signature);
    key.verify(&canonical::encode(&b.manifest), &signature)
        .map_err(|_| SignError::BadSignature {
            bundle: bundle.clone(),
        })?;
    if let Some(cs) = &b.chunks_signature {
        key.verify(
            &canonical::encode_chunks(&b.manifest),
            &ed25519_dalek::Signature::from_bytes(cs),
        )
        .map_err(|_| SignError::BadSignature { bundle })?;
    }
    Ok(())
}

/// Whether the chunk lists of `b` (which passed [`verify`]) may be used:
/// always for an unsigned bundle (they are as good as the channel it came
/// over), and for a signed one only when its signer signed them too. A
/// signed bundle whose lists are not signed is fetched whole from the
/// control server, as before chunk lists.
pub fn chunks_usable(b: &SignedBundle) -> bool {
    b.signature.is_none() || b.chunks_signature.is_some() || !canonical::has_chunks(&b.manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::sample;

    fn signed(key: &SigningKey) -> SignedBundle {
        let m = sample();
        SignedBundle {
            chunks_signature: None,
            signature: Some(key.sign(&m)),
            manifest: m,
        }
    }

    #[test]
    fn good_signature_verifies() {
        let key = SigningKey::generate();
        verify(&signed(&key), &[key.public()]).unwrap();
        verify(&signed(&key), &[]).unwrap();
    }

    #[test]
    fn unsigned_and_foreign_keys_are_refused_when_a_key_is_trusted() {
        let key = SigningKey::generate();
        let other = SigningKey::generate();
        let unsigned = SignedBundle {
            chunks_signature: None,
            manifest: sample(),
            signature: None,
        };
        verify(&unsigned, &[]).unwrap();
        assert!(matches!(
            verify(&unsigned, &[key.public()]),
            Err(SignError::Unsigned { .. })
        ));
        assert!(matches!(
            verify(&signed(&other), &[key.public()]),
            Err(SignError::UntrustedSigner { .. })
        ));
    }

    fn chunked(key: &SigningKey) -> SignedBundle {
        let mut m = sample();
        let bytes = vec![3u8; 3 * crate::chunks::MIN_CHUNK_SIZE as usize];
        let (d, n, c) = crate::chunks::Chunks::of_reader(&bytes[..], crate::chunks::MIN_CHUNK_SIZE).unwrap();
        (m.files[0].digest, m.files[0].size, m.files[0].chunks) = (d, n, Some(c));
        key.sign_bundle(m)
    }

    #[test]
    fn chunk_lists_are_signed_apart_and_any_change_is_caught() {
        let key = SigningKey::generate();
        let trusted = [key.public()];
        let b = chunked(&key);
        verify(&b, &trusted).unwrap();
        assert!(chunks_usable(&b));
        // What an agent from before chunk lists sees (it drops the unknown
        // fields) still verifies: the manifest signature leaves them out.
        let mut old = b.clone();
        old.chunks_signature = None;
        old.manifest.files[0].chunks = None;
        verify(&old, &trusted).unwrap();
        // A changed chunk digest or size breaks the chunk signature.
        let mut bad = b.clone();
        let c = bad.manifest.files[0].chunks.as_mut().unwrap();
        c.digests.swap(0, 1);
        c.digests[0] = Digest::of(b"other");
        assert!(matches!(
            verify(&bad, &trusted),
            Err(SignError::BadSignature { .. })
        ));
        // Lists stripped of their signature verify but are not used.
        let mut stripped = b.clone();
        stripped.chunks_signature = None;
        verify(&stripped, &trusted).unwrap();
        assert!(!chunks_usable(&stripped));
        // Unsigned bundles' lists are as good as the channel.
        let mut unsigned = b;
        (unsigned.signature, unsigned.chunks_signature) = (None, None);
        assert!(chunks_usable(&unsigned));
        // No chunks: nothing extra to sign.
        assert!(key.sign_bundle(sample()).chunks_signature.is_none());
    }

    #[test]
    fn any_changed_byte_breaks_the_signature() {
        let key = SigningKey::generate();
        let trusted = [key.public()];
        let mutations: Vec<fn(&mut Manifest)> = vec![
            |m| m.name = "kubelex".into(),
            |m| m.version.push('1'),
            |m| m.files[0].mode ^= 1,
            |m| m.files[0].size += 1,
            |m| m.steps[0].run[2] = "kubelez".into(),
            |m| m.health = None,
        ];
        for (i, f) in mutations.into_iter().enumerate() {
            let mut b = signed(&key);
            f(&mut b.manifest);
            assert!(
                matches!(verify(&b, &trusted), Err(SignError::BadSignature { .. })),
                "mutation {i}"
            );
        }
        // Every bit of every file digest is covered.
        for file in 0..2 {
            for byte in 0..32 {
                let mut b = signed(&key);
                let mut raw = *b.manifest.files[file].digest.as_bytes();
                raw[byte] ^= 0x01;
                b.manifest.files[file].digest = Digest::from_bytes(raw);
                assert!(verify(&b, &trusted).is_err(), "file {file} digest byte {byte}");
            }
        }
        // And every bit of the signature itself.
        for byte in 0..64 {
            let mut b = signed(&key);
            b.signature.as_mut().unwrap().signature[byte] ^= 0x80;
            assert!(verify(&b, &trusted).is_err(), "signature byte {byte}");
        }
    }

    #[test]
    fn key_files_round_trip_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("publisher");
        let key = SigningKey::generate();
        let (k, p) = key.write_pair(&prefix).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&k).unwrap().permissions().mode() & 0o777, 0o600);
        let loaded = SigningKey::from_file(&k).unwrap();
        assert_eq!(loaded.public(), PublisherKey::from_file(&p).unwrap());
        assert!(SigningKey::generate().write_pair(&prefix).is_err());
        assert!(matches!(
            PublisherKey::from_file(&k),
            Err(SignError::BadKey { .. })
        ));
    }
}
