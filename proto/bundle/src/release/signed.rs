//! Signed records, the signing helpers, and threshold counting.

use std::collections::BTreeSet;

use crate::limits::MAX_SIGNATURES;
use crate::sign::{PublisherKey, SigningKey};

use super::{Release, TrustError, TrustRoot};

/// One key's ed25519 signature over a record's canonical encoding. The key
/// is carried as raw bytes: a key the root does not list is ignored, so it
/// need not even be a valid curve point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySignature {
    pub public_key: [u8; 32],
    pub signature: [u8; 64],
}

/// A [`Release`] with its signatures, as the control server hands it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedRelease {
    pub release: Release,
    pub signatures: Vec<KeySignature>,
}

/// A [`TrustRoot`] with its signatures: a key rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedRoot {
    pub root: TrustRoot,
    pub signatures: Vec<KeySignature>,
}

impl SigningKey {
    /// Signs the canonical encoding of `r`.
    pub fn sign_release(&self, r: &Release) -> KeySignature {
        self.sign_record(&r.encode())
    }

    /// Signs the canonical encoding of `r`.
    pub fn sign_root(&self, r: &TrustRoot) -> KeySignature {
        self.sign_record(&r.encode())
    }

    fn sign_record(&self, encoded: &[u8]) -> KeySignature {
        KeySignature {
            public_key: self.public().to_bytes(),
            signature: self.sign_raw(encoded),
        }
    }
}

impl SignedRelease {
    /// `release` signed by each of `keys`.
    pub fn sign(release: Release, keys: &[&SigningKey]) -> Self {
        let signatures = keys.iter().map(|k| k.sign_release(&release)).collect();
        SignedRelease { release, signatures }
    }
}

impl SignedRoot {
    /// `root` signed by each of `keys`.
    pub fn sign(root: TrustRoot, keys: &[&SigningKey]) -> Self {
        let signatures = keys.iter().map(|k| k.sign_root(&root)).collect();
        SignedRoot { root, signatures }
    }
}

/// Refuses a record with more than [`MAX_SIGNATURES`] signatures, before
/// any is checked.
pub(super) fn check_count(what: impl FnOnce() -> String, sigs: &[KeySignature]) -> Result<(), TrustError> {
    if sigs.len() > MAX_SIGNATURES {
        return Err(TrustError::TooManySignatures {
            what: what(),
            count: sigs.len(),
        });
    }
    Ok(())
}

/// Checks that a threshold of `signers`' keys signed `encoded`: each
/// distinct listed key counts once, unlisted keys are ignored, and a listed
/// key whose signature fails does not count and is named in the error.
pub(super) fn check_threshold(
    encoded: &[u8],
    sigs: &[KeySignature],
    signers: &TrustRoot,
    what: impl FnOnce() -> String,
    whose: impl FnOnce() -> String,
) -> Result<(), TrustError> {
    let mut valid = BTreeSet::new();
    let mut bad: Vec<&PublisherKey> = Vec::new();
    for s in sigs {
        let Some(key) = signers.lists(&s.public_key) else {
            continue;
        };
        if valid.contains(&s.public_key) {
            continue;
        }
        if key.verifies(encoded, &s.signature) {
            valid.insert(s.public_key);
        } else {
            if !bad.contains(&key) {
                bad.push(key);
            }
        }
    }
    if valid.len() >= signers.threshold as usize {
        return Ok(());
    }
    // A key with one bad and one good signature did count: do not blame it.
    bad.retain(|k| !valid.contains(&k.to_bytes()));
    Err(TrustError::Threshold {
        what: what(),
        signers: whose(),
        valid: valid.len(),
        threshold: signers.threshold,
        bad: bad.iter().map(|k| k.fingerprint()).collect(),
    })
}
