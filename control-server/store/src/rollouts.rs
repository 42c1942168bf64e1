//! Rollouts: their rows, the state of each node in them, and the one
//! atomic commit of a controller decision.

use std::collections::BTreeMap;

use async_trait::async_trait;
use lks_proto::labels::{Labels, selector_matches};

use super::{BundleStatusRow, EventRow, Hint, Kind, Result, StoreError};

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
    /// The states in which a rollout takes in a node enrolled meanwhile
    /// ([`NewNode::adopted_by`](crate::NewNode::adopted_by)).
    pub const TAKING_JOINERS: [RolloutState; 2] = [RolloutState::Running, RolloutState::Paused];

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
    /// Where the node's turn stands with its tenant cluster, in a rollout
    /// that drains ([`RolloutPolicy::drain`]); `None` otherwise.
    pub kube: KubeStep,
    /// When `kube` last changed (Unix ms); the drain and Ready timeouts
    /// run from here.
    pub kube_since_ms: i64,
    /// When this turn's drain began (Unix ms; 0: it did not drain, or the
    /// row was stored before this was kept); with `turn_at_ms` (when it
    /// drained) it says how long the drain took.
    pub drain_started_ms: i64,
}

/// A draining rollout's step of one node's turn: cordoned and being
/// drained (its version not yet assigned), upgrading (drained, the agent
/// applying), or waiting for the Node to be `Ready` (applied). While a node
/// is at one of these steps, the rollout owns its cordon; at `None` it does
/// not, and a cordon it made is lifted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KubeStep {
    #[default]
    None,
    Draining,
    Upgrading,
    Readying,
}

impl KubeStep {
    pub fn as_str(self) -> &'static str {
        match self {
            KubeStep::None => "",
            KubeStep::Draining => "draining",
            KubeStep::Upgrading => "upgrading",
            KubeStep::Readying => "readying",
        }
    }

    /// The stored form; an unknown one (written by a newer release) reads
    /// as `None`, and its cordon is lifted by the repair.
    pub fn parse(s: &str) -> KubeStep {
        match s {
            "draining" => KubeStep::Draining,
            "upgrading" => KubeStep::Upgrading,
            "readying" => KubeStep::Readying,
            _ => KubeStep::None,
        }
    }

    /// The rollout owns the node's cordon at this step.
    pub fn owns_cordon(self) -> bool {
        self != KubeStep::None
    }
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
            kube: KubeStep::None,
            kube_since_ms: 0,
            drain_started_ms: 0,
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
    /// `--drain`: each node is cordoned and drained through the tenant API
    /// before its version is assigned, and must be `Ready` after; `None`:
    /// files are replaced as they are (rollouts stored before read so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainPolicy>,
    /// `StartRolloutRequest.request_id`: a start sent again with it returns
    /// this rollout. An older replica that rewrites the rollout drops it
    /// (the start it guards is long done by then).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_id: String,
}

/// How a draining rollout drains and what it waits for (issue
/// [kube-drain]); fixed for the rollout's life.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct DrainPolicy {
    /// `--drain-timeout`: the drain of one node gives up after this.
    pub timeout_ms: u64,
    /// `--ready-timeout`: the Node must be `Ready` this long after the
    /// agent applied.
    pub ready_timeout_ms: u64,
    /// `--drain-delete-local-data`: pods with hostPath volumes are
    /// evicted too.
    pub delete_local_data: bool,
    /// `--on-drain-timeout`: a node whose drain timed out fails (counts
    /// against the threshold) or is skipped.
    pub on_timeout: DrainTimeout,
    /// The kubelet version the bundle installs (`[kubernetes]
    /// kubelet_version` in bundle.toml); the Ready gate wants the Node to
    /// report it. Empty: any.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kubelet_version: String,
}

impl DrainPolicy {
    /// `--drain-timeout` unless given.
    pub const DEFAULT_TIMEOUT_MS: u64 = 10 * 60 * 1000;
    /// `--ready-timeout` unless given.
    pub const DEFAULT_READY_TIMEOUT_MS: u64 = 5 * 60 * 1000;
}

impl Default for DrainPolicy {
    fn default() -> Self {
        DrainPolicy {
            timeout_ms: Self::DEFAULT_TIMEOUT_MS,
            ready_timeout_ms: Self::DEFAULT_READY_TIMEOUT_MS,
            delete_local_data: false,
            on_timeout: DrainTimeout::Fail,
            kubelet_version: String::new(),
        }
    }
}

/// What a drain that timed out makes of its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainTimeout {
    /// `failed`, counted against the failure threshold.
    #[default]
    Fail,
    /// `skipped`, reported, no failure.
    Skip,
}

impl DrainTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainTimeout::Fail => "fail",
            DrainTimeout::Skip => "skip",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fail" => Some(DrainTimeout::Fail),
            "skip" => Some(DrainTimeout::Skip),
            _ => None,
        }
    }
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
    /// ([`default_batch_size`]).
    pub batch_size: u32,
    pub failure_threshold: u32,
    pub offline_deadline_ms: u64,
    pub policy: RolloutPolicy,
    /// The admin credential that started it (recorded in its first event).
    pub started_by: String,
    pub now_ms: i64,
}

/// A decision taken on revision `based_on` of rollout `id` may be
/// committed only while that revision is still the stored one.
pub fn check_revision(id: &str, stored: u64, based_on: u64) -> Result<()> {
    if stored == based_on {
        return Ok(());
    }
    Err(StoreError::Conflict(format!(
        "rollout {id} changed meanwhile (revision {stored} is stored, the decision was based on {based_on}); try again"
    )))
}

/// What a rollout's start is checked against, as a backend read it in the
/// start's transaction (or, on etcd, in the reads its transaction compares).
#[derive(Clone, Debug, Default)]
pub struct StartChecks {
    pub cluster_exists: bool,
    /// The version to roll out is published.
    pub bundle_published: bool,
    /// Another rollout of the bundle in the cluster that is still active:
    /// its id and state.
    pub active: Option<(String, String)>,
}

impl NewRollout {
    /// The start's preconditions, in the order an operator meets them: the
    /// cluster exists, the version is published, and no other rollout of
    /// the bundle in the cluster is still active. Both backends start
    /// through it.
    pub fn may_start(&self, c: &StartChecks) -> Result<()> {
        if !c.cluster_exists {
            return Err(self.no_cluster());
        }
        if !c.bundle_published {
            return Err(self.not_published());
        }
        if let Some((id, state)) = &c.active {
            return Err(still_active(&self.cluster, &self.bundle, id, state));
        }
        Ok(())
    }

    /// The refusal of a rollout to a cluster that does not exist.
    pub fn no_cluster(&self) -> StoreError {
        StoreError::not_found(Kind::Cluster, self.cluster.to_string())
    }

    /// The refusal of a rollout of a bundle version not published.
    pub fn not_published(&self) -> StoreError {
        StoreError::not_found_hint(
            Kind::Bundle,
            format!("{}@{}", self.bundle, self.version),
            Hint::PublishBundle,
        )
    }

    /// Whether the rollout takes a node of `cluster` labelled `labels`:
    /// one of its cluster that its selector matches.
    pub fn takes(&self, cluster: &str, labels: &Labels) -> bool {
        cluster == self.cluster && selector_matches(&self.selector, labels)
    }

    /// The rollout as its start records it: running, its `members` waiting
    /// in name order, the batch size the operator gave or the default for
    /// that many nodes ([`default_batch_size`]), and the cluster's target
    /// for the bundle before it (what a rollback returns to).
    pub fn start(&self, mut members: Vec<RolloutNodeRow>, previous_target: Option<Target>) -> RolloutRow {
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let batch_size = if self.batch_size == 0 {
            default_batch_size(members.len())
        } else {
            self.batch_size
        };
        RolloutRow {
            id: self.id.clone(),
            cluster: self.cluster.clone(),
            bundle: self.bundle.clone(),
            version: self.version.clone(),
            selector: self.selector.clone(),
            batch_size,
            failure_threshold: self.failure_threshold,
            offline_deadline_ms: self.offline_deadline_ms,
            state: RolloutState::Running,
            created_at_ms: self.now_ms,
            updated_at_ms: self.now_ms,
            message: String::new(),
            revision: 0,
            previous_target,
            nodes: members,
            policy: self.policy.clone(),
            pacing: RolloutPacing::default(),
        }
    }
}

/// Default batch: this share (percent, rounded up, at least one node) of
/// the rollout's nodes.
pub const DEFAULT_BATCH_PERCENT: usize = 10;

/// The batch size used when the operator gives none.
pub fn default_batch_size(nodes: usize) -> u32 {
    let n = nodes.saturating_mul(DEFAULT_BATCH_PERCENT).div_ceil(100).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
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

/// Rollouts and the decisions that drive them.
#[async_trait]
pub trait RolloutStore: Send + Sync {
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
    /// A live replica of the region whose [`STORE_FORMAT`] is below
    /// `format` (its release is older), if any: what must wait until every
    /// replica is upgraded asks this (control-server/README.md, "Version
    /// skew"). A single server has none.
    async fn older_replica(&self, _format: u32) -> Result<Option<OlderReplica>> {
        Ok(None)
    }
}

/// The store format this release reads and writes, announced by each
/// replica in `replicas/ID` (the version-skew contract,
/// control-server/README.md). A replica reads every document of its format
/// and the one before, ignores fields it does not know, and writes a field
/// of a newer format only where the whole region reads it:
/// - 0 (absent): releases before the contract (the rollout rows of
///   [scale-out], peer sharing, signed releases);
/// - 1: rollout policies may carry `drain` (rollouts that drain, issue
///   [kube-drain]) and `request_id`, rollout rows `kube_step` and
///   `kube_since_ms`, and clusters a `clusterkube/NAME` document.
///   A release-0 replica that rewrites a rollout drops the fields it does
///   not know, so a rollout that drains starts only once every replica
///   announces format 1; `request_id` may be dropped (it guards only a
///   start sent again) and `clusterkube/` is a key release 0 never reads.
pub const STORE_FORMAT: u32 = 1;

/// A live replica of an older release (see [`RolloutStore::older_replica`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OlderReplica {
    pub replica: String,
    /// Its release (empty for releases before the contract).
    pub release: String,
    pub format: u32,
}
