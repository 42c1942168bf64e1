//! The agent's enrolment (`join.toml`, written by `join`) and the layout of
//! the state dir.
//!
//! ```text
//! STATE_DIR/join.toml           servers, node, cluster, root, labels, CA pin
//!                               (`agent.toml` before: still read, never written)
//! STATE_DIR/pki/{node.key,node.crt,ca.crt}
//! STATE_DIR/trusted/*.pub       publisher keys (copies of --trust-key)
//! STATE_DIR/trust.json          with trust_threshold ≥ 1: the trust journal (apply/trust.rs)
//! STATE_DIR/desired.pb          last desired state from the server (protobuf)
//! STATE_DIR/state.json          what is installed, bundle states, originals
//! STATE_DIR/journal.json        the transaction in progress, if any
//! STATE_DIR/txn/<seq>/          backups of the transaction in progress
//! STATE_DIR/originals/<hex>     files that existed before a bundle took them over
//! STATE_DIR/cache/sha256/<hex>  content-addressed blob cache (+ cache/partial)
//! STATE_DIR/status.json         connection status, written by `run`
//! STATE_DIR/reboot.json         what the node owes a reboot, the reboot in progress (node/reboot/state.rs)
//! ```
//!
//! `trust.json` (JSON, 0600, written temp → fsync → rename → fsync of the
//! directory before the agent acts on what it records):
//!
//! ```text
//! { "state":   { "root": { "version", "keys": [PEM…], "threshold", "expires_at_ms" },
//!                "release_version", "release_digest": "sha256:…" | null,
//!                "latest_known_time_ms" },          // lks_proto::release::TrustState
//!   "release": "<base64 of the accepted lks.v1.SignedRelease, protobuf>",   // absent before the first
//!   "refusal": { "condition", "message", "key" } }  // absent unless the last one was refused
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lks_proto::fsutil::FsError;
use lks_proto::sign::PublisherKey;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/lksadmin";
pub const DEFAULT_ROOT: &str = "/";
/// The state dir's enrolment file, written by `join`.
pub const JOIN_FILE: &str = "join.toml";
/// Its name before: the same as `run`'s settings file
/// (`/etc/lksadmin/agent.toml`), so it was renamed; still read.
pub const LEGACY_JOIN_FILE: &str = "agent.toml";

/// What `join` stored for `run` (`join.toml`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentConfig {
    /// Every replica `join` was given, in the order given; `run` starts with
    /// the first. A state dir with a single `server = "URL"` (or `servers`
    /// as a plain string) loads as a list of one.
    #[serde(alias = "server", deserialize_with = "one_or_many")]
    pub servers: Vec<String>,
    pub node_name: String,
    pub cluster: String,
    pub root: PathBuf,
    /// `sha256:<hex>` of the CA's SubjectPublicKeyInfo, as given to `join`.
    pub ca_cert_hash: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `join --trust-threshold`: how many trusted keys must sign a release
    /// record; 0 (the default, and every such file from before) is off.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub trust_threshold: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path} not found: this node has not joined a cluster yet (run `lksadmin-agent join`)")]
    NotJoined { path: PathBuf },
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("trusted key {path}: not an ed25519 public key in PEM form")]
    BadTrustedKey { path: PathBuf },
}

/// Paths inside the state dir.
#[derive(Clone, Debug)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateDir { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
    /// Where `join` commits the enrolment: `join.toml`. It was `agent.toml`,
    /// the name of `run`'s settings file in `/etc/lksadmin/` too, which
    /// operators took for one another.
    pub fn config(&self) -> PathBuf {
        self.dir.join(JOIN_FILE)
    }
    /// The name agents before `join.toml` wrote. Read, never written nor
    /// renamed: an older agent binary put back by a self-update rollback
    /// must still find it.
    pub fn legacy_config(&self) -> PathBuf {
        self.dir.join(LEGACY_JOIN_FILE)
    }
    /// The enrolment file this state dir holds: `join.toml`, else the
    /// legacy `agent.toml`; `None` before `join` committed.
    pub fn config_in_use(&self) -> Option<PathBuf> {
        [self.config(), self.legacy_config()]
            .into_iter()
            .find(|p| p.exists())
    }
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub fn node_key(&self) -> PathBuf {
        self.pki().join("node.key")
    }
    pub fn node_cert(&self) -> PathBuf {
        self.pki().join("node.crt")
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.pki().join("ca.crt")
    }
    pub fn trusted(&self) -> PathBuf {
        self.dir.join("trusted")
    }
    pub fn desired(&self) -> PathBuf {
        self.dir.join("desired.pb")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal.json")
    }
    pub fn txn(&self, seq: u64) -> PathBuf {
        self.dir.join("txn").join(seq.to_string())
    }
    pub fn originals(&self) -> PathBuf {
        self.dir.join("originals")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.join("cache")
    }
    pub fn status(&self) -> PathBuf {
        self.dir.join("status.json")
    }
    pub fn trust(&self) -> PathBuf {
        self.dir.join("trust.json")
    }
    pub fn reboot(&self) -> PathBuf {
        self.dir.join("reboot.json")
    }

    /// True once `join` has committed (`join.toml`, or the legacy
    /// `agent.toml`, is its commit marker).
    pub fn is_joined(&self) -> bool {
        self.config_in_use().is_some()
    }

    pub fn load_config(&self) -> Result<AgentConfig, ConfigError> {
        let Some(path) = self.config_in_use() else {
            return Err(ConfigError::NotJoined { path: self.config() });
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            // Gone between the look and the read: a join undone meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::NotJoined { path });
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let cfg: AgentConfig = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.clone(),
            reason: e.message().to_string(),
        })?;
        if cfg.servers.is_empty() {
            return Err(ConfigError::Invalid {
                path,
                reason: "no server URL".into(),
            });
        }
        Ok(cfg)
    }

    /// The trusted publisher keys (`trusted/*.pub`), sorted by file name.
    pub fn trusted_keys(&self) -> Result<Vec<PublisherKey>, ConfigError> {
        let dir = self.trusted();
        let mut paths = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "pub"))
                .collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(ConfigError::Read { path: dir, source }),
        };
        paths.sort();
        paths
            .into_iter()
            .map(|path| {
                let pem = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                PublisherKey::from_pem(&pem).ok_or(ConfigError::BadTrustedKey { path })
            })
            .collect()
    }
}

/// A string or a list of strings, as a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

impl AgentConfig {
    pub fn to_toml(&self) -> String {
        // Serialising plain strings, paths and a string map cannot fail.
        toml::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REST: &str = "node_name = \"n1\"\ncluster = \"c1\"\nroot = \"/\"\nca_cert_hash = \"sha256:00\"\n";

    fn load(text: &str) -> Result<AgentConfig, ConfigError> {
        let d = tempfile::tempdir().unwrap();
        let dirs = StateDir::new(d.path());
        std::fs::write(dirs.config(), text).unwrap();
        dirs.load_config()
    }

    #[test]
    fn a_single_server_loads_as_a_list_of_one() {
        for head in [
            "server = \"https://a:7443\"\n",
            "servers = \"https://a:7443\"\n",
            "servers = [\"https://a:7443\"]\n",
        ] {
            let cfg = load(&format!("{head}{REST}")).unwrap();
            assert_eq!(cfg.servers, vec!["https://a:7443".to_string()], "{head}");
            assert!(cfg.labels.is_empty());
            assert_eq!(cfg.trust_threshold, 0, "an old agent.toml has trust off");
        }
    }

    #[test]
    fn a_list_keeps_its_order_and_round_trips() {
        let cfg = load(&format!(
            "servers = [\"https://b:7443\", \"https://a:7443\"]\n{REST}"
        ))
        .unwrap();
        assert_eq!(cfg.servers, ["https://b:7443", "https://a:7443"]);
        let text = cfg.to_toml();
        assert!(text.contains("servers = ["), "{text}");
        assert_eq!(load(&text).unwrap(), cfg);
    }

    #[test]
    fn the_trust_threshold_round_trips_and_is_absent_when_off() {
        let mut cfg = load(&format!("servers = [\"https://a:7443\"]\n{REST}")).unwrap();
        assert!(!cfg.to_toml().contains("trust_threshold"));
        cfg.trust_threshold = 2;
        let text = cfg.to_toml();
        assert!(text.contains("trust_threshold = 2"), "{text}");
        assert_eq!(load(&text).unwrap(), cfg);
    }

    #[test]
    fn no_server_at_all_is_invalid() {
        for head in ["servers = []\n", ""] {
            let err = load(&format!("{head}{REST}")).unwrap_err();
            assert!(matches!(err, ConfigError::Invalid { .. }), "{head:?}: {err}");
        }
    }

    #[test]
    fn a_state_dir_joined_before_the_rename_is_read_from_agent_toml() {
        let d = tempfile::tempdir().unwrap();
        let dirs = StateDir::new(d.path());
        assert!(!dirs.is_joined());
        std::fs::write(
            dirs.legacy_config(),
            format!("server = \"https://old:7443\"\n{REST}"),
        )
        .unwrap();
        assert!(dirs.is_joined(), "an existing install stays joined");
        assert_eq!(dirs.config_in_use(), Some(d.path().join("agent.toml")));
        assert_eq!(dirs.load_config().unwrap().servers, ["https://old:7443"]);
        // join.toml, once there, is the one read.
        std::fs::write(dirs.config(), format!("servers = [\"https://new:7443\"]\n{REST}")).unwrap();
        assert_eq!(dirs.config_in_use(), Some(d.path().join("join.toml")));
        assert_eq!(dirs.load_config().unwrap().servers, ["https://new:7443"]);
        // A broken legacy file is named as such.
        std::fs::remove_file(dirs.config()).unwrap();
        std::fs::write(dirs.legacy_config(), "servers = [\n").unwrap();
        let err = dirs.load_config().unwrap_err();
        assert!(err.to_string().contains("agent.toml"), "{err}");
    }

    #[test]
    fn not_joined_says_so() {
        let d = tempfile::tempdir().unwrap();
        let err = StateDir::new(d.path()).load_config().unwrap_err();
        assert!(matches!(err, ConfigError::NotJoined { .. }), "{err}");
        assert!(err.to_string().contains("join.toml not found"), "{err}");
    }
}
