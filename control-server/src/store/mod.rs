//! The control server's state, behind a narrow trait so that an etcd store
//! can stand beside the embedded SQLite one.
//!
//! Every method is one atomic unit: a caller never sees half of an
//! enrolment, a publish or a rollout start. Rows are plain Rust; protobuf
//! appears only as the opaque bytes of a stored `SignedBundle`.

pub mod blobrecs;
#[cfg(test)]
pub(crate) mod conformance;
pub mod etcd;
pub mod sqlite;

use std::collections::BTreeMap;

use async_trait::async_trait;
use lks_proto::BundleState;
use lks_proto::labels::Labels;

pub use blobrecs::{BlobRecord, BlobRecords, BundleUsers, RecordAt};
pub use etcd::{EtcdConfig, EtcdStore};
pub use sqlite::SqliteStore;

/// Why a store operation failed. The variants that describe the caller's
/// request (`NotFound`, `AlreadyExists`, `Conflict`, `Token`) map to gRPC
/// status codes; `Backend` is an internal failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Token(TokenRefusal),
    /// The backing store cannot be reached now (etcd down or without
    /// quorum); the request may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store: {0}")]
    Backend(String),
}

/// Why a bootstrap token could not be used, decided inside the enrolment
/// transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("bootstrap token is unknown or was deleted")]
    Unknown,
    #[error("bootstrap token has expired; create a new one with `lksctl token create`")]
    Expired,
    #[error("bootstrap token has no uses left; create a new one with `lksctl token create`")]
    UsedUp,
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRow {
    pub name: String,
    pub created_at_ms: i64,
    pub node_count: u32,
    /// Maintenance windows as the operator wrote them (validated by
    /// [`crate::windows`] before they are stored); empty: always open.
    pub maintenance_windows: Vec<String>,
    /// The cluster CA certificate (PEM); `None` for clusters created before
    /// clusters had CAs, until one is set. Its key is read only through
    /// [`Store::cluster_ca`].
    pub ca_cert_pem: Option<String>,
    /// The tenant cluster's API server URL (`https://…`), for kubeconfigs.
    pub api_server: Option<String>,
    /// Whether the cluster's nodes share blobs with each other, and how.
    /// The port, rate and upload limit keep their values while sharing is
    /// off.
    pub peer: PeerSettings,
}

/// A cluster's peer-sharing settings (`lksctl cluster set NAME
/// --peer-sharing on|off --peer-port … --peer-upload-rate …
/// --peer-max-uploads …`). Nodes receive them in their desired state
/// (`DesiredState.peer_sharing`) while `enabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PeerSettings {
    /// Whether the nodes share blobs; off for every cluster until turned on.
    pub enabled: bool,
    /// TCP port each agent listens on for its peers.
    pub port: u16,
    /// Upload cap per node, bytes per second; 0: none.
    pub upload_rate: u64,
    /// Concurrent uploads per node; more are refused.
    pub max_uploads: u32,
}

impl PeerSettings {
    /// The port agents listen on unless the operator chose another.
    pub const DEFAULT_PORT: u16 = 7444;
    /// Concurrent uploads per node unless the operator chose another.
    pub const DEFAULT_MAX_UPLOADS: u32 = 4;
}

impl Default for PeerSettings {
    /// Off, port 7444, no upload cap, 4 concurrent uploads.
    fn default() -> Self {
        PeerSettings {
            enabled: false,
            port: Self::DEFAULT_PORT,
            upload_rate: 0,
            max_uploads: Self::DEFAULT_MAX_UPLOADS,
        }
    }
}

/// A cluster CA as the store keeps it. `key` is opaque to the store: PEM, or
/// a sealed envelope in hex (the server seals it, see `crate::clusterca`).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCa {
    pub cert_pem: String,
    pub key: String,
}

impl std::fmt::Debug for StoredCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, sealed or not.
        f.debug_struct("StoredCa")
            .field("cert_pem", &self.cert_pem)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A cluster to create, with its CA and API server in the same write.
#[derive(Clone, Debug)]
pub struct NewCluster {
    pub name: String,
    pub now_ms: i64,
    pub ca: Option<StoredCa>,
    pub api_server: Option<String>,
}

impl NewCluster {
    /// A cluster without CA or API server.
    pub fn new(name: &str, now_ms: i64) -> Self {
        NewCluster {
            name: name.to_string(),
            now_ms,
            ca: None,
            api_server: None,
        }
    }

    /// The row the store returns for it once created.
    pub fn row(&self) -> ClusterRow {
        ClusterRow {
            name: self.name.clone(),
            created_at_ms: self.now_ms,
            node_count: 0,
            maintenance_windows: Vec::new(),
            ca_cert_pem: self.ca.as_ref().map(|c| c.cert_pem.clone()),
            api_server: self.api_server.clone(),
            peer: PeerSettings::default(),
        }
    }
}

/// A certificate the server signed with a cluster CA for a node's bundle
/// (`[[certificate]]`). Kept after the node is deleted, for audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCertRow {
    pub cluster: String,
    pub node: String,
    /// Lowercase hex, no separators.
    pub serial: String,
    pub profile: String,
    pub bundle: String,
    pub version: String,
    /// The certificate's path on the node.
    pub path: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    pub issued_at_ms: i64,
}

/// The refusal of a second CA for a cluster.
pub fn ca_already_set(cluster: &str) -> StoreError {
    StoreError::Conflict(format!(
        "cluster {cluster} already has a CA; replacing it would orphan every certificate issued with it"
    ))
}

/// Orders certificate records as `list_certificates` returns them.
/// How long the record of an expired certificate is kept once the same
/// node has a newer one for the same path: 30 days.
pub const CERT_RECORD_RETENTION_MS: i64 = 30 * 24 * 3600 * 1000;

pub fn sort_certificates(rows: &mut [IssuedCertRow]) {
    rows.sort_by(|a, b| {
        (&a.node, &a.path, a.issued_at_ms, &a.serial).cmp(&(&b.node, &b.path, b.issued_at_ms, &b.serial))
    });
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    /// SHA-256 of the secret ([`lks_proto::token::BootstrapToken::secret_hash`]).
    pub secret_hash: [u8; 32],
    pub cluster: String,
    pub expires_at_ms: i64,
    /// `None`: unlimited.
    pub remaining_uses: Option<u32>,
    pub labels: Labels,
    pub created_at_ms: i64,
}

/// A node to create by consuming one use of a token.
#[derive(Clone, Debug)]
pub struct NewNode {
    pub name: String,
    pub cluster: String,
    pub labels: Labels,
    pub cert_serial: String,
    /// `sha256:` + hex SHA-256 of the node key's SubjectPublicKeyInfo.
    pub key_hash: String,
    pub token_id: String,
    pub now_ms: i64,
}

impl NewNode {
    /// An enrolment may take over a node of that name only when it is the
    /// same enrolment again: same cluster, same key (the agent keeps its
    /// key until its identity is written), and the node never connected —
    /// the answer to the first attempt was lost (a server killed, a link
    /// cut) before the agent got its certificate.
    pub fn repeats(&self, cluster: &str, key_hash: &str, never_connected: bool) -> bool {
        never_connected && cluster == self.cluster && !self.key_hash.is_empty() && key_hash == self.key_hash
    }
}

/// What an agent reported about one bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleStatusRow {
    pub name: String,
    pub version: String,
    pub state: BundleState,
    pub message: String,
    pub updated_at_ms: i64,
    /// Generation of the desired state the report answered (0: unknown),
    /// so a rollout can tell a fresh verdict from one given before the
    /// node was assigned its version.
    pub generation: u64,
    /// What the node fetched for this version: bytes from the server, from
    /// peers (peer sharing).
    pub fetched_from_server: u64,
    pub fetched_from_peers: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub name: String,
    pub cluster: String,
    pub labels: Labels,
    pub cert_serial: String,
    /// Facts as JSON (the agent's last `Hello`), empty if never connected.
    pub facts_json: String,
    /// Unix ms; 0 if never seen.
    pub last_seen_ms: i64,
    pub connected: bool,
    pub enrolled_at_ms: i64,
    /// Generation of the node's current desired state.
    pub generation: u64,
    /// bundle name → desired version.
    pub desired: BTreeMap<String, String>,
    /// What the node last reported, by bundle name.
    pub actual: BTreeMap<String, BundleStatusRow>,
    /// Set by `lksctl node hold`: no rollout gives the node a new desired
    /// state. The reason ("" if none was given).
    pub hold: Option<String>,
    /// Hash of the node key it enrolled with ("" for nodes enrolled before
    /// it was recorded).
    pub key_hash: String,
}

/// A bundle version to store. `signed_bundle` is the encoded protobuf
/// `SignedBundle` exactly as it will be sent to agents.
#[derive(Clone, Debug)]
pub struct NewBundle {
    pub name: String,
    pub version: String,
    pub signed_bundle: Vec<u8>,
    /// `sha256:<hex>` of the canonical manifest.
    pub manifest_digest: String,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    /// Digests served by the control server (files without a mirror URL).
    pub blob_digests: Vec<String>,
    pub now_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleRow {
    pub name: String,
    pub version: String,
    pub signed_bundle: Vec<u8>,
    pub manifest_digest: String,
    pub signed: bool,
    pub files: u32,
    pub total_size: u64,
    pub published_at_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// The same name@version was already stored with identical content.
    Unchanged,
}

/// The desired state of one node: generation and the stored bundles.
#[derive(Clone, Debug, Default)]
pub struct DesiredState {
    pub generation: u64,
    /// Encoded `SignedBundle`s, ordered by bundle name.
    pub bundles: Vec<Vec<u8>>,
    /// Bundle name → the generation of the operator's last retry request
    /// (`lksctl node retry`); absent: none.
    pub retry: BTreeMap<String, u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RolloutState {
    Running,
    Paused,
    Completed,
    Failed,
    Aborted,
    RolledBack,
    RollingBack,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::Completed => "completed",
            RolloutState::Failed => "failed",
            RolloutState::Aborted => "aborted",
            RolloutState::RolledBack => "rolled_back",
            RolloutState::RollingBack => "rolling_back",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RolloutState::Running,
            "paused" => RolloutState::Paused,
            "completed" => RolloutState::Completed,
            "failed" => RolloutState::Failed,
            "aborted" => RolloutState::Aborted,
            "rolled_back" => RolloutState::RolledBack,
            "rolling_back" => RolloutState::RollingBack,
            _ => return None,
        })
    }

    /// True once the rollout can no longer change on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RolloutState::Completed | RolloutState::Failed | RolloutState::Aborted | RolloutState::RolledBack
        )
    }

    /// Running, paused or rolling back: at most one such rollout exists per
    /// cluster and bundle name.
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }
}

/// A node's part in a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Its turn has not come (or it is offline and waited for).
    Waiting,
    /// Its desired state was changed; it holds a batch slot until it reports.
    Applying,
    /// It committed the rollout's version.
    Updated,
    Failed,
    /// Never started: deleted, or the rollout ended before its turn.
    Skipped,
    /// Returned to the version it had before.
    RolledBack,
    /// Offline at its turn (`--offline defer`): holds no slot, is no
    /// failure, and starts when it is back.
    Deferred,
    /// Held (`lksctl node hold`) at its turn: starts after `unhold`.
    Held,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Waiting => "waiting",
            NodeState::Applying => "applying",
            NodeState::Updated => "updated",
            NodeState::Failed => "failed",
            NodeState::Skipped => "skipped",
            NodeState::RolledBack => "rolled_back",
            NodeState::Deferred => "deferred",
            NodeState::Held => "held",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "waiting" => NodeState::Waiting,
            "applying" => NodeState::Applying,
            "updated" => NodeState::Updated,
            "failed" => NodeState::Failed,
            "skipped" => NodeState::Skipped,
            "rolled_back" => NodeState::RolledBack,
            "deferred" => NodeState::Deferred,
            "held" => NodeState::Held,
            _ => return None,
        })
    }
}

/// One node's part in a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutNodeRow {
    pub name: String,
    /// Version the node was assigned before ("" if none).
    pub previous_version: String,
    pub state: NodeState,
    pub message: String,
    /// Generation of the desired state this rollout last gave the node (0:
    /// never); only reports answering it or a later one count.
    pub generation: u64,
    /// When the node's turn came (Unix ms, 0: not yet); offline deadlines
    /// run from here.
    pub turn_at_ms: i64,
    /// This rollout changed the node's desired state to its version, so a
    /// rollback returns the node to `previous_version`.
    pub touched: bool,
    /// The node is in the rollback phase: its target is `previous_version`.
    pub reverting: bool,
    /// It was offline when it was assigned and has not connected since.
    pub unreached: bool,
    /// Picked as a canary (`--canary`): it goes first.
    pub canary: bool,
}

impl RolloutNodeRow {
    /// A node whose turn has not come yet.
    pub fn waiting(name: &str, previous_version: &str) -> Self {
        RolloutNodeRow {
            name: name.to_string(),
            previous_version: previous_version.to_string(),
            state: NodeState::Waiting,
            message: String::new(),
            generation: 0,
            turn_at_ms: 0,
            touched: false,
            reverting: false,
            unreached: false,
            canary: false,
        }
    }

    /// Not started yet, and waiting for nothing but a chance: its turn, its
    /// return (deferred) or its release (held).
    pub fn startable(&self) -> bool {
        matches!(
            self.state,
            NodeState::Waiting | NodeState::Deferred | NodeState::Held
        )
    }
}

/// How a rollout treats a node that is offline when its turn comes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OfflinePolicy {
    /// Skip it for now (no slot, no failure); it applies when it is back.
    #[default]
    Defer,
    /// Give it its slot and wait up to the offline deadline.
    Wait,
}

impl OfflinePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OfflinePolicy::Defer => "defer",
            OfflinePolicy::Wait => "wait",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "defer" => Some(OfflinePolicy::Defer),
            "wait" => Some(OfflinePolicy::Wait),
            _ => None,
        }
    }
}

/// What the operator chose when starting a rollout; fixed for its life.
/// Stored as one JSON document, so options can be added without a schema
/// change; rollouts stored before it existed read as [`Self::legacy`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RolloutPolicy {
    pub offline: OfflinePolicy,
    /// Nodes that go first (`--canary`); 0: none.
    pub canary: u32,
    /// How long every canary must stay committed before others start.
    pub canary_soak_ms: u64,
    /// Seed of the canary pick, so the pick can be explained and repeated.
    pub canary_seed: u64,
    /// Pause between batches (`--batch-interval`); 0: a freed slot is
    /// refilled at once.
    pub batch_interval_ms: u64,
    /// `--ignore-windows`: start nodes outside the cluster's windows.
    pub ignore_windows: bool,
}

impl RolloutPolicy {
    /// Rollouts stored before policies existed waited for offline nodes.
    pub fn legacy() -> Self {
        RolloutPolicy {
            offline: OfflinePolicy::Wait,
            ..Default::default()
        }
    }
}

/// Where a rollout stands beyond its node rows: pacing, canary phase and
/// window wait. Changed only by the controller's decisions.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RolloutPacing {
    /// No node starts before this (Unix ms; `--batch-interval`).
    pub next_batch_at_ms: i64,
    /// When the last canary committed (0: not yet); the soak runs from here.
    pub canaries_committed_at_ms: i64,
    /// The canary phase is over: other nodes may start.
    pub canaries_passed: bool,
    /// Nodes wait because every maintenance window of the cluster is closed.
    pub waiting_for_window: bool,
    /// The next opening while waiting (Unix ms, 0: none known).
    pub next_window_ms: i64,
}

/// What a cluster's joining nodes receive for one bundle name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub version: String,
    pub selector: Labels,
    /// The rollout that made it the target.
    pub rollout_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRow {
    pub id: String,
    pub cluster: String,
    pub bundle: String,
    pub version: String,
    pub selector: Labels,
    pub batch_size: u32,
    pub failure_threshold: u32,
    /// How long a node may be offline at its turn (or while applying)
    /// before it counts as failed.
    pub offline_deadline_ms: u64,
    pub state: RolloutState,
    /// Ordered by node name: the order nodes are started in.
    pub nodes: Vec<RolloutNodeRow>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub message: String,
    /// Bumped by every stored decision; a decision based on an older
    /// revision is refused.
    pub revision: u64,
    /// The cluster's target for this bundle when the rollout started,
    /// restored by a rollback of a completed rollout.
    pub previous_target: Option<Target>,
    pub policy: RolloutPolicy,
    pub pacing: RolloutPacing,
}

impl RolloutRow {
    /// The controller still has something to do: the rollout is active, a
    /// node is mid-apply, or (completed) a deferred or held node may still
    /// catch up.
    pub fn needs_driving(&self) -> bool {
        self.state.is_active()
            || self.nodes.iter().any(|n| {
                n.state == NodeState::Applying
                    || (self.state == RolloutState::Completed
                        && matches!(n.state, NodeState::Deferred | NodeState::Held))
            })
    }
}

/// A rollout to start. Nothing is assigned yet: the rollout controller
/// starts nodes batch by batch. `failure_threshold` and
/// `offline_deadline_ms` are already resolved; `batch_size` may be 0, since
/// its default depends on the target nodes, which the store counts.
#[derive(Clone, Debug)]
pub struct NewRollout {
    pub id: String,
    pub cluster: String,
    pub bundle: String,
    pub version: String,
    pub selector: Labels,
    /// 0: decided by the store from the number of target nodes
    /// ([`crate::rollout::default_batch_size`]).
    pub batch_size: u32,
    pub failure_threshold: u32,
    pub offline_deadline_ms: u64,
    pub policy: RolloutPolicy,
    /// The admin credential that started it (recorded in its first event).
    pub started_by: String,
    pub now_ms: i64,
}

/// How a decision changes the cluster's target for the rollout's bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetChange {
    Keep,
    /// The rollout completed: joining nodes get its version.
    SetToRollout,
    /// The rollout was rolled back: joining nodes get what they got before
    /// it (if it is still the target).
    RestorePrevious,
}

/// One decision of the rollout controller, stored in one transaction.
#[derive(Clone, Debug)]
pub struct RolloutCommit {
    /// The rollout as it is to be stored; its `revision` is the one the
    /// decision was based on.
    pub rollout: RolloutRow,
    /// Nodes whose desired state changes: the version to assign, or `None`
    /// to remove the bundle. Each gets a new generation, recorded in its
    /// rollout node row.
    pub assign: Vec<(String, Option<String>)>,
    pub target: TargetChange,
    pub events: Vec<EventRow>,
}

/// What the store knows about one node of a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeBundleView {
    /// The bundle's desired version on the node.
    pub desired: Option<String>,
    /// What the node last reported about the bundle.
    pub actual: Option<BundleStatusRow>,
    pub last_seen_ms: i64,
    /// Its stream is open on this server or (with etcd) on a live replica.
    pub connected: bool,
    /// Held by the operator: no rollout starts it.
    pub held: bool,
    /// The facts of its last `Hello` as stored (JSON; empty if it never
    /// connected). Read through [`facts_features`] only for the few bundles
    /// that need an agent feature, not on every controller tick.
    pub facts_json: String,
}

/// The `features` and `architecture` of a node's facts JSON (what a
/// rollout judges it by); `None` when it has no facts yet.
pub fn facts_needed(facts_json: &str) -> Option<(Vec<String>, Option<lks_proto::arch::Arch>)> {
    #[derive(serde::Deserialize, Default)]
    struct Facts {
        #[serde(default)]
        features: Vec<String>,
        #[serde(default)]
        architecture: String,
    }
    if facts_json.is_empty() {
        return None;
    }
    let f = serde_json::from_str::<Facts>(facts_json).unwrap_or_default();
    Some((f.features, lks_proto::arch::Arch::parse(&f.architecture).ok()))
}

/// The architecture a node reported (`None`: none, or no facts yet).
pub fn facts_architecture(facts_json: &str) -> Option<lks_proto::arch::Arch> {
    facts_needed(facts_json).and_then(|(_, a)| a)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub id: u64,
    pub at_ms: i64,
    pub cluster: String,
    pub node: String,
    pub rollout_id: String,
    pub kind: String,
    pub bundle: String,
    pub version: String,
    pub message: String,
}

impl EventRow {
    /// An event about a bundle version itself (published, deleted).
    pub fn bundle(kind: &str, name: &str, version: &str, message: String, at_ms: i64) -> EventRow {
        EventRow {
            id: 0,
            at_ms,
            cluster: String::new(),
            node: String::new(),
            rollout_id: String::new(),
            kind: kind.into(),
            bundle: name.into(),
            version: version.into(),
            message,
        }
    }

    /// What every store records when a node enrols.
    pub fn enrolled(n: &NewNode) -> EventRow {
        EventRow {
            id: 0,
            at_ms: n.now_ms,
            cluster: n.cluster.clone(),
            node: n.name.clone(),
            rollout_id: String::new(),
            kind: "enrolled".into(),
            bundle: String::new(),
            version: String::new(),
            message: format!("enrolled with token {}", n.token_id),
        }
    }

    /// What every store records when an enrolment is repeated (its first
    /// answer was lost): the node gets a new certificate, no token use.
    pub fn reenrolled(n: &NewNode) -> EventRow {
        Self::about(
            &n.cluster,
            &n.name,
            "enrolled",
            n.now_ms,
            format!(
                "enrolment repeated with token {} and the same key (the first answer was lost); new certificate",
                n.token_id
            ),
        )
    }

    /// What every store records when a node is deleted.
    pub fn deleted(cluster: &str, node: &str, at_ms: i64) -> EventRow {
        Self::about(
            cluster,
            node,
            "deleted",
            at_ms,
            "node deleted; its certificate is revoked".into(),
        )
    }

    /// An event about a cluster or one of its nodes, outside any rollout.
    fn about(cluster: &str, node: &str, kind: &str, at_ms: i64, message: String) -> EventRow {
        EventRow {
            id: 0,
            at_ms,
            cluster: cluster.to_string(),
            node: node.to_string(),
            rollout_id: String::new(),
            kind: kind.to_string(),
            bundle: String::new(),
            version: String::new(),
            message,
        }
    }

    /// What every store records when an operator asks a node to retry.
    pub fn retry(cluster: &str, node: &str, bundles: &[String], admin: &str, at_ms: i64) -> EventRow {
        let message = format!("retry of {} requested by {admin}", bundles.join(", "));
        let mut e = Self::about(cluster, node, "retry_requested", at_ms, message);
        if let [one] = bundles {
            e.bundle = one.clone();
        }
        e
    }

    /// What every store records when a node is held or released.
    pub fn hold(cluster: &str, node: &str, hold: Option<&str>, admin: &str, at_ms: i64) -> EventRow {
        let (kind, message) = match hold {
            Some("") => ("held", format!("held by {admin}")),
            Some(why) => ("held", format!("held by {admin}: {why}")),
            None => ("unheld", format!("released by {admin}")),
        };
        Self::about(cluster, node, kind, at_ms, message)
    }

    /// What every store records when a cluster's API server changes.
    pub fn api_server_set(cluster: &str, api_server: Option<&str>, admin: &str, at_ms: i64) -> EventRow {
        let message = match api_server {
            Some(u) => format!("API server set to {u} by {admin}"),
            None => format!("API server cleared by {admin}"),
        };
        Self::about(cluster, "", "api_server", at_ms, message)
    }

    /// What every store records when a cluster's peer-sharing settings
    /// change.
    pub fn peer_sharing_set(cluster: &str, peer: &PeerSettings, admin: &str, at_ms: i64) -> EventRow {
        let rate = match peer.upload_rate {
            0 => "no upload cap".to_string(),
            r => format!("uploads capped at {r} bytes/s"),
        };
        let settings = format!(
            "port {}, {rate}, at most {} concurrent uploads",
            peer.port, peer.max_uploads
        );
        let message = if peer.enabled {
            format!("peer sharing on by {admin}: {settings}")
        } else {
            format!("peer sharing off by {admin} (kept: {settings})")
        };
        Self::about(cluster, "", "peer_sharing", at_ms, message)
    }

    /// What every store records when a cluster gets its CA (`how`:
    /// "imported" or "generated"); `hash` is the CA's `sha256:` pin.
    pub fn ca_set(cluster: &str, how: &str, hash: &str, admin: &str, at_ms: i64) -> EventRow {
        Self::about(
            cluster,
            "",
            "cluster_ca",
            at_ms,
            format!("cluster CA {how} by {admin} ({hash})"),
        )
    }

    /// What the admin API records when a cluster is created.
    pub fn cluster_created(cluster: &str, message: String, at_ms: i64) -> EventRow {
        Self::about(cluster, "", "cluster_created", at_ms, message)
    }

    /// What every store records when a cluster's windows change.
    pub fn windows_set(cluster: &str, windows: &[String], admin: &str, at_ms: i64) -> EventRow {
        let message = if windows.is_empty() {
            format!("maintenance windows cleared by {admin}: nodes may start at any time")
        } else {
            format!("maintenance windows set by {admin}: {}", windows.join("; "))
        };
        Self::about(cluster, "", "maintenance_windows", at_ms, message)
    }

    /// What every store records when a rollout of `nodes` nodes starts.
    pub fn rollout_started(r: &NewRollout, batch_size: u32, nodes: usize) -> EventRow {
        EventRow {
            id: 0,
            at_ms: r.now_ms,
            cluster: r.cluster.clone(),
            node: String::new(),
            rollout_id: r.id.clone(),
            kind: "rollout_started".into(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            message: {
                let d = |ms: u64| lks_proto::duration::format_duration(std::time::Duration::from_millis(ms));
                let p = &r.policy;
                let mut m = format!(
                    "{nodes} node(s), batch size {batch_size}, failure threshold {}, offline {}",
                    r.failure_threshold,
                    p.offline.as_str(),
                );
                if p.offline == OfflinePolicy::Wait {
                    m.push_str(&format!(" (deadline {})", d(r.offline_deadline_ms)));
                }
                if p.canary > 0 {
                    m.push_str(&format!(
                        ", {} canary node(s) soaking {}",
                        p.canary,
                        d(p.canary_soak_ms)
                    ));
                }
                if p.batch_interval_ms > 0 {
                    m.push_str(&format!(", {} between batches", d(p.batch_interval_ms)));
                }
                if p.ignore_windows {
                    m.push_str(", ignoring maintenance windows");
                }
                if !r.started_by.is_empty() {
                    m.push_str(&format!("; started by {}", r.started_by));
                }
                m
            },
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    pub cluster: Option<String>,
    pub node: Option<String>,
    pub rollout_id: Option<String>,
    pub limit: u32,
}

/// A bundle version as dumped, with the blobs the server serves for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedBundle {
    pub row: BundleRow,
    /// Digests served by the control server (files without a mirror URL).
    pub blob_digests: Vec<String>,
}

/// A cluster's target for one bundle name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedTarget {
    pub cluster: String,
    pub bundle: String,
    pub target: Target,
}

/// Everything a store holds, read in one consistent snapshot, to move an
/// installation from one backend to another (`lks-control-server migrate`).
/// Connection state is not part of it: no agent is connected to a store
/// being moved.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The last desired-state generation handed out.
    pub generation: u64,
    pub clusters: Vec<ClusterRow>,
    /// Cluster CAs by cluster name, keys as stored.
    pub cluster_cas: Vec<(String, StoredCa)>,
    /// Every issued-certificate record.
    pub certificates: Vec<IssuedCertRow>,
    pub tokens: Vec<TokenRow>,
    /// With desired state, generation and reports.
    pub nodes: Vec<NodeRow>,
    pub bundles: Vec<DumpedBundle>,
    pub targets: Vec<DumpedTarget>,
    /// With their node rows and revisions.
    pub rollouts: Vec<RolloutRow>,
    /// Oldest first.
    pub events: Vec<EventRow>,
}

impl Dump {
    /// The highest generation anything in the dump refers to: a store
    /// importing it must hand out only higher ones.
    pub fn max_generation(&self) -> u64 {
        let nodes = self
            .nodes
            .iter()
            .flat_map(|n| std::iter::once(n.generation).chain(n.actual.values().map(|a| a.generation)));
        let rollouts = self
            .rollouts
            .iter()
            .flat_map(|r| r.nodes.iter().map(|n| n.generation));
        nodes.chain(rollouts).fold(self.generation, u64::max)
    }
}

/// The control server's persistent state.
#[async_trait]
pub trait Store: BlobRecords + Send + Sync + 'static {
    /// Creates the cluster with its CA and API server in one write;
    /// `AlreadyExists` if the name is taken.
    async fn create_cluster(&self, cluster: NewCluster) -> Result<ClusterRow>;
    async fn list_clusters(&self) -> Result<Vec<ClusterRow>>;
    async fn cluster_exists(&self, name: &str) -> Result<bool>;
    /// One cluster (its node count may be 0: only `list_clusters` counts).
    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRow>>;
    /// Replaces the cluster's maintenance windows and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_windows(
        &self,
        name: &str,
        windows: Vec<String>,
        event: EventRow,
    ) -> Result<ClusterRow>;
    /// Sets or clears the cluster's API server and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_api_server(
        &self,
        name: &str,
        api_server: Option<String>,
        event: EventRow,
    ) -> Result<ClusterRow>;
    /// Replaces the cluster's peer-sharing settings and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_peer(&self, name: &str, peer: PeerSettings, event: EventRow) -> Result<ClusterRow>;
    /// Gives a cluster without a CA its CA and records `event`. `Conflict`
    /// ([`ca_already_set`]) if it has one: a CA is never replaced.
    async fn set_cluster_ca(&self, name: &str, ca: StoredCa, event: EventRow) -> Result<ClusterRow>;
    /// The cluster's CA with its key as stored; `None` if the cluster does
    /// not exist or has no CA.
    async fn cluster_ca(&self, name: &str) -> Result<Option<StoredCa>>;

    /// Records a certificate issued with a cluster CA. `AlreadyExists` if
    /// the node already has a record of that serial; `NotFound` if the
    /// cluster does not exist. Then drops the records of the same node and
    /// path that expired more than [`CERT_RECORD_RETENTION_MS`] before this
    /// one was issued: each renewal adds a record, and without this a
    /// node's records (read by every `node list`) would grow for ever. A
    /// deleted node's records, and those of a node that stopped renewing,
    /// stay (audit).
    async fn record_certificate(&self, row: IssuedCertRow) -> Result<()>;
    /// Issued-certificate records, optionally of one cluster and/or node,
    /// ordered by node, path and issue time ([`sort_certificates`]).
    async fn list_certificates(
        &self,
        cluster: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<IssuedCertRow>>;

    async fn create_token(&self, token: TokenRow) -> Result<()>;
    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>>;

    /// In one transaction: checks the token is still usable at `now_ms`,
    /// takes one use, creates the node (refusing a name in use), and gives it
    /// the cluster's target bundles. Returns the node's generation.
    async fn enroll_node(&self, node: NewNode) -> Result<u64>;
    async fn get_node(&self, name: &str) -> Result<Option<NodeRow>>;
    /// Cluster and current certificate serial of a node: what every agent
    /// call is authorised by, read without the rest of the node.
    async fn node_identity(&self, name: &str) -> Result<Option<(String, String)>>;
    async fn list_nodes(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>>;
    /// Holds (`Some(reason)`) or releases (`None`) a node and records
    /// `event` (its cluster is filled in). False if the node is absent.
    async fn set_node_hold(&self, name: &str, hold: Option<String>, event: EventRow) -> Result<bool>;
    /// Asks the node to try its desired version of `bundle` (`None`: every
    /// desired bundle) again: stamps those bundles with a new generation
    /// and gives the node that generation, so its desired state is pushed.
    /// Returns the bundles stamped, or `None` if the node does not exist;
    /// `NotFound` if `bundle` is not desired for it.
    async fn retry_node(
        &self,
        name: &str,
        bundle: Option<&str>,
        admin: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>>;
    /// Removes the node with its desired and reported state. False if absent.
    async fn delete_node(&self, name: &str) -> Result<bool>;
    /// Replaces the node's certificate serial if it is still `old`.
    async fn replace_cert_serial(&self, name: &str, old: &str, new: &str) -> Result<()>;
    /// Records a `Hello`: facts, what the node holds, connected.
    async fn node_connected(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        now_ms: i64,
    ) -> Result<()>;
    async fn node_disconnected(&self, name: &str, now_ms: i64) -> Result<()>;
    /// Upserts reported bundle states. A bundle the report leaves out that
    /// is no longer desired for the node is forgotten: the node removed it.
    async fn record_status(&self, name: &str, statuses: Vec<BundleStatusRow>) -> Result<()>;
    /// Batched heartbeat flush: last-seen times by node.
    async fn touch_nodes(&self, seen: Vec<(String, i64)>) -> Result<()>;
    /// At start: no agent is connected to a server that was not running.
    async fn mark_all_disconnected(&self) -> Result<()>;

    async fn put_bundle(&self, bundle: NewBundle) -> Result<PutOutcome>;
    async fn get_bundle(&self, name: &str, version: &str) -> Result<Option<BundleRow>>;
    async fn list_bundles(&self, name: Option<&str>) -> Result<Vec<BundleRow>>;

    async fn desired_state(&self, node: &str) -> Result<DesiredState>;

    /// The node's desired state for a stream that last sent generation
    /// `sent` (`None`: nothing yet). A store may answer from a copy of its
    /// own when that copy holds a generation newer than `sent` (as good as
    /// a read a moment earlier: the newer one, if any, follows with its
    /// change); otherwise, and by default, [`Store::desired_state`].
    async fn desired_state_after(&self, node: &str, sent: Option<u64>) -> Result<DesiredState> {
        let _ = sent;
        self.desired_state(node).await
    }
    /// True if `digest` belongs to a bundle version desired for `node`, or
    /// reported held by it after a rollout of its cluster assigned it.
    async fn blob_allowed(&self, node: &str, digest: &str) -> Result<bool> {
        Ok(!self.blob_grants(node, digest).await?.is_empty())
    }
    /// The bundle versions through which `node` may have `digest` (the
    /// rule of [`Store::blob_allowed`]); the caller checks that the file is
    /// for the node's architecture in one of them.
    async fn blob_grants(&self, node: &str, digest: &str) -> Result<Vec<(String, String)>>;

    /// Records a new running rollout with every matching node of the
    /// cluster waiting (nothing is assigned yet). Refused with `Conflict`
    /// while another rollout of the same cluster and bundle is active.
    async fn start_rollout(&self, rollout: NewRollout) -> Result<RolloutRow>;
    async fn get_rollout(&self, id: &str) -> Result<Option<RolloutRow>>;
    async fn list_rollouts(&self, cluster: Option<&str>, only_active: bool) -> Result<Vec<RolloutRow>>;
    /// The rollouts the controller still drives: active ones, and ended
    /// ones with nodes still applying.
    async fn rollouts_to_drive(&self) -> Result<Vec<RolloutRow>>;
    /// Stores one controller decision atomically: rollout and node states,
    /// desired-state changes (each with a new generation), target change and
    /// events. Refused with `Conflict` if the rollout's revision moved, or if
    /// it would make a second rollout of the cluster and bundle active.
    /// Returns the rollout as stored and the nodes whose desired state changed.
    async fn commit_rollout(&self, commit: RolloutCommit) -> Result<(RolloutRow, Vec<String>)>;
    /// Desired version, last report and last-seen time of the rollout's
    /// bundle on each of its nodes that still exists (a deleted node has no
    /// entry), in one read.
    async fn rollout_views(&self, rollout_id: &str) -> Result<BTreeMap<String, NodeBundleView>>;

    async fn add_event(&self, event: EventRow) -> Result<()>;
    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRow>>;
}

/// The bundles a retry request of `node` stamps: `bundle` if it is one of
/// the node's `desired` bundles, or all of them.
pub fn retry_targets(node: &str, desired: Vec<String>, bundle: Option<&str>) -> Result<Vec<String>> {
    match bundle {
        Some(b) if !desired.iter().any(|d| d == b) => Err(StoreError::NotFound(format!(
            "bundle {b} is not desired for node {node}"
        ))),
        Some(b) => Ok(vec![b.to_string()]),
        None => Ok(desired),
    }
}

/// The refusal of a second active rollout of one cluster and bundle.
pub fn still_active(cluster: &str, bundle: &str, id: &str, state: &str) -> StoreError {
    let hint = match state {
        "paused" => "resume or abort it first",
        "rolling_back" => "wait for its rollback to finish",
        _ => "abort it or wait for it to end",
    };
    StoreError::Conflict(format!(
        "rollout {id} of {bundle} in cluster {cluster} is still {state}; {hint}"
    ))
}
