//! Publishing for the trust tests: signed bundles whose file contents the
//! test knows, release records and trust roots signed with test keys, and
//! desired states carrying them, all in their wire form, for a server the
//! test plays itself ([`crate::rogue`]).

use std::collections::BTreeMap;

use lks_proto::release::{Release, ReleasedBundle, SignedRelease, SignedRoot};
use lks_proto::sign::SigningKey;
use lks_proto::{BundlePath, Digest, FileSpec, Manifest, canonical, pb};

/// One version of one bundle, signed, with the bytes of its files.
#[derive(Clone)]
pub struct TestBundle {
    pub manifest: Manifest,
    pub signed: pb::SignedBundle,
    /// (target path, content) of each file.
    pub files: Vec<(String, Vec<u8>)>,
}

impl TestBundle {
    /// `name@version` with `files` (target path, content; mode 0644),
    /// signed by `key`.
    pub fn new(key: &SigningKey, name: &str, version: &str, files: &[(&str, &[u8])]) -> TestBundle {
        let manifest = Manifest {
            name: name.into(),
            version: version.into(),
            files: files
                .iter()
                .map(|(path, content)| FileSpec {
                    path: BundlePath::new(path).unwrap_or_else(|e| panic!("bundle path {path}: {e}")),
                    digest: Digest::of(content),
                    size: content.len() as u64,
                    mode: 0o644,
                    url: None,
                    chunks: None,
                    arch: None,
                })
                .collect(),
            ..Manifest::default()
        };
        manifest
            .validate()
            .unwrap_or_else(|e| panic!("test bundle {name}@{version}: {e}"));
        TestBundle {
            signed: pb::SignedBundle::from(&key.sign_bundle(manifest.clone())),
            manifest,
            files: files.iter().map(|(p, c)| (p.to_string(), c.to_vec())).collect(),
        }
    }

    /// `NAME@VERSION`.
    pub fn id(&self) -> String {
        self.manifest.id()
    }

    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    pub fn version(&self) -> &str {
        &self.manifest.version
    }

    /// How a release names this bundle: its version and the digest of its
    /// canonical manifest.
    pub fn released(&self) -> (String, ReleasedBundle) {
        (
            self.manifest.name.clone(),
            ReleasedBundle {
                version: self.manifest.version.clone(),
                manifest_digest: canonical::manifest_digest(&self.manifest),
            },
        )
    }
}

/// A release of `channel` naming `bundles`, not yet signed.
pub fn release(channel: &str, version: u64, expires_at_ms: i64, bundles: &[&TestBundle]) -> Release {
    Release {
        channel: channel.into(),
        version,
        expires_at_ms,
        bundles: bundles.iter().map(|b| b.released()).collect::<BTreeMap<_, _>>(),
    }
}

/// A desired state carrying `release` (if any), the root rotations
/// `roots` and `bundles`; the server sets the generation.
pub fn desired(
    release: Option<&SignedRelease>,
    roots: &[SignedRoot],
    bundles: &[&TestBundle],
) -> pb::DesiredState {
    pb::DesiredState {
        generation: 0,
        bundles: bundles.iter().map(|b| b.signed.clone()).collect(),
        retry: Default::default(),
        peer_sharing: None,
        release: release.map(pb::SignedRelease::from),
        roots: roots.iter().map(pb::SignedRoot::from).collect(),
        reboot: None,
    }
}

/// Milliseconds since the Unix epoch, as records count time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
