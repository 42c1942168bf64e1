//! The agent's persisted local state: which bundle versions are installed,
//! what each bundle's state is, the files that existed before a bundle took
//! them over, and the last desired state received from the server.
//!
//! The records are plain serde types (`state.json`); manifests are stored as
//! the shared `lks_proto::Manifest`, whose deserialisation applies the same
//! validation as a manifest that arrived over the wire.

use std::collections::BTreeMap;
use std::path::Path;

use lks_proto::fsutil::{self, FsError};
use lks_proto::{BundlePath, BundleState, Digest, Manifest, pb};
use prost::Message;

use crate::apply::desired::Desired;
use crate::apply::report::BundleStatus;

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
    /// A file the installed version manages: its bytes are the verified
    /// blob `digest` in the cache, so a backup needs no copy. Only ever a
    /// transaction's backup, never an original.
    Cached {
        digest: Digest,
        size: u64,
        mode: u32,
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
    pub installed: Option<Manifest>,
    #[serde(default)]
    pub originals: Vec<OriginalRec>,
    pub status: StatusRec,
    /// Set after a failure that must not be retried for the same bundle
    /// content (a failed step, a bad signature, a checksum mismatch): the
    /// key of that content (see `engine::bundle_key`). Failures that may go
    /// away (server unreachable, a path conflict) leave it `None`.
    #[serde(default)]
    pub sticky: Option<String>,
    /// How many times in a row an apply of `status.version` was
    /// interrupted by a crash while the bundle's steps or health check ran.
    #[serde(default)]
    pub interrupted: u32,
    /// How many times the crash-loop guard gave up on `status.version`;
    /// each time the next try waits twice as long.
    #[serde(default)]
    pub gave_up: u32,
    /// When a version given up on is tried again (Unix ms; 0: not waiting).
    #[serde(default)]
    pub retry_at_ms: i64,
    /// The highest retry request of the server (`lksctl node retry`) this
    /// record honoured.
    #[serde(default)]
    pub retry_seen: u64,
    /// The transaction whose interruption `interrupted` last counted: a
    /// rollback finished again after a crash does not count it twice.
    #[serde(default)]
    pub counted_txn: Option<u64>,
    /// When a failed certificate renewal is tried again (Unix ms; 0: as
    /// soon as one is due).
    #[serde(default)]
    pub renew_retry_at_ms: i64,
    /// What was fetched for a version, by source (reported with its status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched: Option<Fetched>,
}

/// Bytes fetched for one bundle version, by source.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    pub version: String,
    pub from_server: u64,
    pub from_peers: u64,
    /// Of `from_server`, binary-delta patches (issue [delta]).
    #[serde(default)]
    pub as_delta: u64,
}

impl BundleRecord {
    /// Bytes fetched for `version` (from the server, from peers).
    pub fn fetched_for(&self, version: &str) -> (u64, u64) {
        self.fetched
            .as_ref()
            .filter(|f| f.version == version)
            .map_or((0, 0), |f| (f.from_server, f.from_peers))
    }

    /// Of [`Self::fetched_for`]'s bytes from the server, those of patches.
    pub fn delta_for(&self, version: &str) -> u64 {
        self.fetched
            .as_ref()
            .filter(|f| f.version == version)
            .map_or(0, |f| f.as_delta)
    }

    /// Counts bytes fetched for `version` (a new version starts at 0).
    pub fn add_fetched(&mut self, version: &str, from_server: u64, from_peers: u64, as_delta: u64) {
        let f = self.fetched.get_or_insert_with(Fetched::default);
        if f.version != version {
            *f = Fetched {
                version: version.to_string(),
                ..Fetched::default()
            };
        }
        f.from_server += from_server;
        f.from_peers += from_peers;
        f.as_delta += as_delta;
    }

    /// A record for a bundle seen for the first time.
    pub fn new(status: StatusRec) -> Self {
        BundleRecord {
            installed: None,
            originals: Vec::new(),
            status,
            sticky: None,
            interrupted: 0,
            gave_up: 0,
            retry_at_ms: 0,
            retry_seen: 0,
            counted_txn: None,
            renew_retry_at_ms: 0,
            fetched: None,
        }
    }

    /// Forgets every failure, so the version is tried again.
    pub fn clear_failures(&mut self) {
        self.sticky = None;
        self.interrupted = 0;
        self.retry_at_ms = 0;
    }
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
    /// Reads `state.json`; a missing file is a fresh state.
    pub fn load(path: &Path) -> Result<Self, FsError> {
        Ok(fsutil::read_optional(path)?
            .map(|bytes| Self::parse(path, &bytes))
            .transpose()?
            .unwrap_or_default())
    }

    /// The state in `bytes`, as [`LocalState::load`] reads it from `path`
    /// (which only names the file in the error).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, FsError> {
        fsutil::parse_json(path, bytes)
    }

    /// The bytes [`LocalState::save`] stores.
    pub fn encode(&self, path: &Path) -> Result<Vec<u8>, FsError> {
        fsutil::encode_json(path, self)
    }

    pub fn save(&self, path: &Path) -> Result<(), FsError> {
        fsutil::write_atomic(path, &self.encode(path)?, 0o600)
    }

    /// Every bundle's state, as reported to the server.
    pub fn statuses(&self) -> Vec<BundleStatus> {
        self.bundles
            .iter()
            .map(|(name, r)| {
                let f = r.fetched_for(&r.status.version);
                BundleStatus {
                    name: name.clone(),
                    version: r.status.version.clone(),
                    state: r.status.state,
                    message: r.status.message.clone(),
                    updated_at_ms: r.status.updated_at_ms,
                    fetched_from_server: f.0,
                    fetched_from_peers: f.1,
                    fetched_as_delta: r.delta_for(&r.status.version),
                }
            })
            .collect()
    }
}

/// Loads the last desired state (`desired.pb`); `None` if never received.
pub fn load_desired(path: &Path) -> Result<Option<Desired>, FsError> {
    fsutil::read_optional(path)?
        .map(|bytes| parse_desired(path, &bytes).map(|d| Desired::from(&d)))
        .transpose()
}

/// The desired state message in `bytes`, as [`load_desired`] reads it from
/// `path` (which only names the file in the error).
pub fn parse_desired(path: &Path, bytes: &[u8]) -> Result<pb::DesiredState, FsError> {
    pb::DesiredState::decode(bytes).map_err(|e| FsError::new("decode", path, std::io::Error::other(e)))
}

/// Stores a desired state durably before the agent acts on it: the message
/// it was converted from, encoded.
pub fn save_desired(path: &Path, d: &Desired) -> Result<(), FsError> {
    fsutil::write_atomic(path, d.encoded(), 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetched_bytes_add_up_per_version_and_start_over_with_a_new_one() {
        let mut r = BundleRecord::new(StatusRec {
            version: "1".into(),
            state: BundleState::Applying,
            message: String::new(),
            updated_at_ms: 0,
        });
        assert_eq!(r.fetched_for("1"), (0, 0));
        r.add_fetched("1", 10, 0, 0);
        r.add_fetched("1", 5, 100, 0);
        assert_eq!(r.fetched_for("1"), (15, 100));
        assert_eq!(r.fetched_for("2"), (0, 0), "another version fetched nothing");
        r.add_fetched("2", 0, 7, 0);
        assert_eq!((r.fetched_for("1"), r.fetched_for("2")), ((0, 0), (0, 7)));
        let mut st = LocalState::default();
        r.status.version = "2".into();
        st.bundles.insert("b".into(), r);
        let s = &st.statuses()[0];
        assert_eq!((s.fetched_from_server, s.fetched_from_peers), (0, 7));
    }
}
