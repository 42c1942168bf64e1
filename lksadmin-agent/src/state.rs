//! The agent's persisted local state: which bundle versions are installed,
//! what each bundle's state is, the files that existed before a bundle took
//! them over, and the last desired state received from the server.
//!
//! The records are plain serde types (`state.json`); manifests are stored in
//! their own record type and converted back through the shared protobuf
//! conversion, so a reloaded manifest is validated by the same rules as one
//! that arrived over the wire.

use std::collections::BTreeMap;
use std::path::Path;

use lks_proto::manifest::ManifestError;
use lks_proto::{BundlePath, BundleState, Digest, Manifest, pb};
use prost::Message;

use crate::fsutil::{self, FsError};

/// One file of a stored manifest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileRec {
    pub path: BundlePath,
    pub digest: Digest,
    pub size: u64,
    pub mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepRec {
    pub name: String,
    pub run: Vec<String>,
    pub timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealthRec {
    pub run: Vec<String>,
    pub timeout_ms: u64,
    pub retries: u32,
    pub interval_ms: u64,
}

/// A manifest as stored in `state.json` and the journal.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestRec {
    pub name: String,
    pub version: String,
    pub files: Vec<FileRec>,
    #[serde(default)]
    pub steps: Vec<StepRec>,
    #[serde(default)]
    pub health: Option<HealthRec>,
}

impl From<&Manifest> for ManifestRec {
    fn from(m: &Manifest) -> Self {
        ManifestRec {
            name: m.name.clone(),
            version: m.version.clone(),
            files: m
                .files
                .iter()
                .map(|f| FileRec {
                    path: f.path.clone(),
                    digest: f.digest,
                    size: f.size,
                    mode: f.mode,
                    url: f.url.clone(),
                })
                .collect(),
            steps: m
                .steps
                .iter()
                .map(|s| StepRec {
                    name: s.name.clone(),
                    run: s.run.clone(),
                    timeout_ms: s.timeout.as_millis() as u64,
                })
                .collect(),
            health: m.health.as_ref().map(|h| HealthRec {
                run: h.run.clone(),
                timeout_ms: h.timeout.as_millis() as u64,
                retries: h.retries,
                interval_ms: h.interval.as_millis() as u64,
            }),
        }
    }
}

impl TryFrom<&ManifestRec> for Manifest {
    type Error = ManifestError;

    fn try_from(r: &ManifestRec) -> Result<Self, Self::Error> {
        pb::Manifest {
            name: r.name.clone(),
            version: r.version.clone(),
            files: r
                .files
                .iter()
                .map(|f| pb::FileEntry {
                    path: f.path.to_string(),
                    digest: f.digest.to_string(),
                    size: f.size,
                    mode: f.mode,
                    url: f.url.clone().unwrap_or_default(),
                })
                .collect(),
            steps: r
                .steps
                .iter()
                .map(|s| pb::Step {
                    name: s.name.clone(),
                    run: s.run.clone(),
                    timeout_ms: s.timeout_ms,
                })
                .collect(),
            health: r.health.as_ref().map(|h| pb::HealthCheck {
                run: h.run.clone(),
                timeout_ms: h.timeout_ms,
                retries: h.retries,
                interval_ms: h.interval_ms,
            }),
        }
        .try_into()
    }
}

/// What a path held: nothing, or a regular file with these bytes and mode.
/// `stored` names the copy of the bytes (a file name in the backup or
/// originals directory).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Content {
    Absent,
    File {
        digest: Digest,
        size: u64,
        mode: u32,
        stored: String,
    },
}

/// A file that existed before a bundle first replaced it; put back when the
/// bundle (or that file of it) goes away.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OriginalRec {
    pub path: BundlePath,
    pub content: Content,
}

/// The state of one bundle as reported to the server and by `status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusRec {
    pub version: String,
    pub state: BundleState,
    #[serde(default)]
    pub message: String,
    pub updated_at_ms: i64,
}

/// Everything the agent knows about one bundle name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BundleRecord {
    /// The committed version on disk, if any.
    #[serde(default)]
    pub installed: Option<ManifestRec>,
    #[serde(default)]
    pub originals: Vec<OriginalRec>,
    pub status: StatusRec,
    /// Set after a failure that must not be retried for the same bundle
    /// content (a failed step, a bad signature, a checksum mismatch): the
    /// key of that content (see `engine::bundle_key`). Failures that may go
    /// away (server unreachable, a path conflict) leave it `None`.
    #[serde(default)]
    pub sticky: Option<String>,
    /// How many times an apply of `status.version` was interrupted by a crash.
    #[serde(default)]
    pub interrupted: u32,
}

/// A notable thing the engine did, for `status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Activity {
    pub at_ms: i64,
    pub bundle: String,
    pub version: String,
    pub outcome: String,
    #[serde(default)]
    pub message: String,
}

/// `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocalState {
    #[serde(default)]
    pub bundles: BTreeMap<String, BundleRecord>,
    #[serde(default)]
    pub last_apply: Option<Activity>,
    #[serde(default)]
    pub last_repair: Option<Activity>,
    /// Sequence of the last transaction started.
    #[serde(default)]
    pub txn_seq: u64,
    /// Generation of the desired state last acted on.
    #[serde(default)]
    pub generation: u64,
}

impl LocalState {
    pub fn load(path: &Path) -> Result<Self, FsError> {
        Ok(fsutil::read_json(path)?.unwrap_or_default())
    }

    pub fn save(&self, path: &Path) -> Result<(), FsError> {
        fsutil::write_json(path, self, 0o600)
    }

    /// The bundle states as the wire wants them.
    pub fn statuses(&self) -> Vec<pb::BundleStatus> {
        self.bundles
            .iter()
            .map(|(name, r)| pb::BundleStatus {
                name: name.clone(),
                version: r.status.version.clone(),
                state: pb::BundleState::from(r.status.state) as i32,
                message: r.status.message.clone(),
                updated_at_ms: r.status.updated_at_ms,
            })
            .collect()
    }
}

/// Loads the last desired state (`desired.pb`); `None` if never received.
pub fn load_desired(path: &Path) -> Result<Option<pb::DesiredState>, FsError> {
    match std::fs::read(path) {
        Ok(bytes) => pb::DesiredState::decode(bytes.as_slice())
            .map(Some)
            .map_err(|e| FsError::new("decode", path, std::io::Error::other(e))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::new("read", path, e)),
    }
}

/// Stores a desired state durably before the agent acts on it.
pub fn save_desired(path: &Path, d: &pb::DesiredState) -> Result<(), FsError> {
    fsutil::write_atomic(path, &d.encode_to_vec(), 0o600)
}
