//! The files `lksctl release` and `lksctl root` write and read: a signed
//! record as JSON, so a release can be drafted on one machine, signed on
//! others (where the keys are) and published from a third.
//!
//! ```json
//! {
//!   "format": "lks-release/v1",
//!   "release": {
//!     "channel": "tenant-a",
//!     "version": 3,
//!     "expires_at_ms": 1798000000000,
//!     "bundles": { "kubelet": { "version": "1.31.2", "manifest_digest": "sha256:…" } }
//!   },
//!   "signatures": [ { "key": "ed25519:…", "public_key": "<64 hex>", "signature": "<128 hex>" } ]
//! }
//! ```
//!
//! A root file is the same with `"format": "lks-root/v1"`, the cluster it
//! is published to as `"cluster"`, and `"root"` (`version`, `keys` as 64
//! hex digits each, `threshold`, `expires_at_ms`, 0 for never). What is
//! signed is the record's canonical encoding ([`Release::encode`],
//! [`TrustRoot::encode`]), never this JSON: re-indenting the file changes
//! nothing. `key` is informational (the fingerprint `lksctl` and agents
//! name keys by); it is written, not read.

use std::path::Path;

use anyhow::{Context, anyhow, bail};
use lks_proto::limits::{MAX_RELEASE_BYTES, MAX_ROOT_BYTES};
use lks_proto::release::{KeySignature, Release, SignedRelease, SignedRoot, TrustRoot};
use lks_proto::sign::SigningKey;
use serde::{Deserialize, Serialize};

pub const RELEASE_FORMAT: &str = "lks-release/v1";
pub const ROOT_FORMAT: &str = "lks-root/v1";

/// A signature as the files hold it.
#[derive(Serialize, Deserialize)]
struct FileSignature {
    #[serde(default, skip_deserializing)]
    key: String,
    public_key: String,
    signature: String,
}

#[derive(Serialize, Deserialize)]
struct ReleaseFile {
    format: String,
    release: Release,
    #[serde(default)]
    signatures: Vec<FileSignature>,
}

#[derive(Serialize, Deserialize)]
struct RootFile {
    format: String,
    cluster: String,
    root: TrustRoot,
    #[serde(default)]
    signatures: Vec<FileSignature>,
}

fn to_file(sigs: &[KeySignature]) -> Vec<FileSignature> {
    sigs.iter()
        .map(|s| FileSignature {
            key: crate::output::key_fingerprint(&s.public_key).unwrap_or_default(),
            public_key: hex::encode(s.public_key),
            signature: hex::encode(s.signature),
        })
        .collect()
}

fn from_file(sigs: Vec<FileSignature>) -> anyhow::Result<Vec<KeySignature>> {
    sigs.into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut public_key = [0u8; 32];
            hex::decode_to_slice(&s.public_key, &mut public_key)
                .map_err(|_| anyhow!("signatures[{i}].public_key: expected 64 hex digits"))?;
            let mut signature = [0u8; 64];
            hex::decode_to_slice(&s.signature, &mut signature)
                .map_err(|_| anyhow!("signatures[{i}].signature: expected 128 hex digits"))?;
            Ok(KeySignature {
                public_key,
                signature,
            })
        })
        .collect()
}

/// Reads `path`, refusing one over `limit` bytes (a JSON file holds each
/// byte of the record as two hex digits at most, hence the factor).
fn read_bounded(path: &Path, limit: usize) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("read {}", path.display()))?;
    if meta.len() > (limit * 4) as u64 {
        bail!(
            "{}: {} bytes is too large for a signed record (at most {})",
            path.display(),
            meta.len(),
            limit * 4
        );
    }
    std::fs::read(path).with_context(|| format!("read {}", path.display()))
}

fn check_format(path: &Path, got: &str, want: &str) -> anyhow::Result<()> {
    if got != want {
        bail!("{}: format {got:?} is not {want:?}", path.display());
    }
    Ok(())
}

pub fn read_release(path: &Path) -> anyhow::Result<SignedRelease> {
    let bytes = read_bounded(path, MAX_RELEASE_BYTES)?;
    let f: ReleaseFile = serde_json::from_slice(&bytes).with_context(|| path.display().to_string())?;
    check_format(path, &f.format, RELEASE_FORMAT)?;
    f.release.validate().with_context(|| path.display().to_string())?;
    let signatures = from_file(f.signatures).with_context(|| path.display().to_string())?;
    Ok(SignedRelease {
        release: f.release,
        signatures,
    })
}

pub fn release_json(s: &SignedRelease) -> String {
    let f = ReleaseFile {
        format: RELEASE_FORMAT.into(),
        release: s.release.clone(),
        signatures: to_file(&s.signatures),
    };
    // Plain strings, numbers and maps: serialising cannot fail.
    serde_json::to_string_pretty(&f).unwrap_or_default() + "\n"
}

pub fn read_root(path: &Path) -> anyhow::Result<(String, SignedRoot)> {
    let bytes = read_bounded(path, MAX_ROOT_BYTES)?;
    let f: RootFile = serde_json::from_slice(&bytes).with_context(|| path.display().to_string())?;
    check_format(path, &f.format, ROOT_FORMAT)?;
    f.root.validate().with_context(|| path.display().to_string())?;
    let signatures = from_file(f.signatures).with_context(|| path.display().to_string())?;
    Ok((
        f.cluster,
        SignedRoot {
            root: f.root,
            signatures,
        },
    ))
}

pub fn root_json(cluster: &str, s: &SignedRoot) -> String {
    let f = RootFile {
        format: ROOT_FORMAT.into(),
        cluster: cluster.into(),
        root: s.root.clone(),
        signatures: to_file(&s.signatures),
    };
    serde_json::to_string_pretty(&f).unwrap_or_default() + "\n"
}

/// Adds each key's signature over `encoded` by `sign`, replacing an earlier
/// one by the same key; returns the fingerprints that signed.
pub fn add_signatures(
    sigs: &mut Vec<KeySignature>,
    keys: &[SigningKey],
    sign: impl Fn(&SigningKey) -> KeySignature,
) -> Vec<String> {
    let mut who = Vec::new();
    for k in keys {
        let s = sign(k);
        sigs.retain(|old| old.public_key != s.public_key);
        sigs.push(s);
        who.push(k.public().fingerprint());
    }
    who
}

/// Writes `text` to `path` atomically (temp file, fsync, rename), mode 0644:
/// a signed record is public.
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    lks_proto::fsutil::write_atomic(path, text.as_bytes(), 0o644)
        .map_err(|e| e.source)
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lks_proto::Digest;
    use lks_proto::release::ReleasedBundle;
    use lks_proto::report::one_line;

    use super::*;

    fn release() -> Release {
        let mut bundles = BTreeMap::new();
        bundles.insert(
            "app".to_string(),
            ReleasedBundle {
                version: "2".into(),
                manifest_digest: Digest::of(b"m"),
            },
        );
        Release {
            channel: "c1".into(),
            version: 3,
            expires_at_ms: 1_900_000_000_000,
            bundles,
        }
    }

    #[test]
    fn a_release_file_round_trips_and_signing_again_replaces_the_signature() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.json");
        let (a, b) = (SigningKey::generate(), SigningKey::generate());
        let mut s = SignedRelease::sign(release(), &[&a]);
        let who = add_signatures(&mut s.signatures, std::slice::from_ref(&b), |k| {
            k.sign_release(&s.release)
        });
        assert_eq!(who, vec![b.public().fingerprint()]);
        write(&path, &release_json(&s)).unwrap();
        let back = read_release(&path).unwrap();
        assert_eq!(back, s);
        let mut again = back.clone();
        add_signatures(&mut again.signatures, std::slice::from_ref(&a), |k| {
            k.sign_release(&again.release)
        });
        assert_eq!(again.signatures.len(), 2, "a key signs once");
    }

    #[test]
    fn a_root_file_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("root.json");
        let (a, b) = (SigningKey::generate(), SigningKey::generate());
        let root = TrustRoot {
            version: 2,
            keys: vec![a.public(), b.public()],
            threshold: 1,
            expires_at_ms: 0,
        };
        let s = SignedRoot::sign(root, &[&a, &b]);
        write(&path, &root_json("c1", &s)).unwrap();
        assert_eq!(read_root(&path).unwrap(), ("c1".to_string(), s));
    }

    #[test]
    fn bad_files_are_one_line_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.json");
        let s = SignedRelease::sign(release(), &[]);

        write(&path, &release_json(&s).replace(RELEASE_FORMAT, "lks-release/v9")).unwrap();
        let e = one_line(&*read_release(&path).unwrap_err());
        assert!(
            e.ends_with("format \"lks-release/v9\" is not \"lks-release/v1\""),
            "{e}"
        );

        write(
            &path,
            &release_json(&s).replace("\"version\": 3", "\"version\": 0"),
        )
        .unwrap();
        let e = one_line(&*read_release(&path).unwrap_err());
        assert!(e.contains("has version 0"), "{e}");

        let mut signed = s.clone();
        signed.signatures = vec![KeySignature {
            public_key: [1; 32],
            signature: [2; 64],
        }];
        write(&path, &release_json(&signed).replace(&"02".repeat(64), "02")).unwrap();
        let e = one_line(&*read_release(&path).unwrap_err());
        assert!(
            e.ends_with("signatures[0].signature: expected 128 hex digits"),
            "{e}"
        );

        std::fs::write(&path, vec![b' '; MAX_RELEASE_BYTES * 4 + 1]).unwrap();
        let e = one_line(&*read_release(&path).unwrap_err());
        assert!(e.contains("too large for a signed record"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}
