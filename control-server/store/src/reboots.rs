//! Coordinated reboots (issue [reboots]): each cluster's reboot policy
//! (`lksctl cluster set NAME --reboots auto|manual|off
//! --max-concurrent-reboots N --reboot-timeout DUR --on-reboot-timeout
//! free|keep`, kept with the cluster) and its reboot lock — the slots its
//! nodes hold from their drain until they are back `Ready` after boot, the
//! rolling reboot an operator started (`lksctl reboot start`), and when each
//! node was last rebooted through the lock. The lock is one document per
//! cluster, written only if it is still the revision read: replicas share
//! one lock, and a leader killed mid-reboot is replaced by one that reads
//! who holds what.

use std::collections::BTreeMap;

use async_trait::async_trait;
use lks_proto::labels::Labels;

use super::{EventRow, Result};

/// Whether the server reboots a cluster's nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootMode {
    /// Nothing is rebooted through the lock (the default).
    #[default]
    Off,
    /// Only a rolling reboot an operator starts (`lksctl reboot start`).
    Manual,
    /// Nodes that report a reboot `required` are rebooted, one slot at a
    /// time, inside the maintenance windows; and as `manual`.
    Auto,
}

impl RebootMode {
    pub const ALL: [RebootMode; 3] = [RebootMode::Off, RebootMode::Manual, RebootMode::Auto];

    pub fn as_str(self) -> &'static str {
        match self {
            RebootMode::Off => "off",
            RebootMode::Manual => "manual",
            RebootMode::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// What becomes of the slot of a node not back within the reboot timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootTimeout {
    /// The slot is given to the next node (the default).
    #[default]
    Free,
    /// The slot stays taken until the node is back or the operator aborts.
    Keep,
}

impl RebootTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            RebootTimeout::Free => "free",
            RebootTimeout::Keep => "keep",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [RebootTimeout::Free, RebootTimeout::Keep]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// A reboot gate on a Prometheus server's alerts (`cluster set
/// --reboot-alert-gate URL --alert-filter REGEX`): no slot is given while
/// an alert of that Prometheus whose name the filter matches is firing.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AlertGate {
    /// The Prometheus base URL (`http[s]://HOST:PORT[/PATH]`), asked at
    /// `URL/api/v1/alerts`.
    pub url: String,
    /// A regular expression searched in each firing alert's name (as
    /// kured's); empty: every firing alert blocks.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub filter: String,
}

/// A cluster's reboot policy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RebootPolicy {
    pub mode: RebootMode,
    /// Slots: nodes between their drain and back `Ready` at once.
    pub max_concurrent: u32,
    /// From taking its slot, how long a node has to be back `Ready`.
    pub timeout_ms: u64,
    pub on_timeout: RebootTimeout,
    /// No slot while an alert the filter matches fires there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert_gate: Option<AlertGate>,
    /// A Kubernetes label selector: a node running a pod it matches (not
    /// Succeeded or Failed) in the tenant cluster gets no slot; empty: none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub blocking_pod_selector: String,
}

impl RebootPolicy {
    pub const DEFAULT_MAX_CONCURRENT: u32 = 1;
    /// 30 minutes.
    pub const DEFAULT_TIMEOUT_MS: u64 = 30 * 60 * 1000;
}

impl Default for RebootPolicy {
    /// Off, one slot, 30 minutes, the slot freed.
    fn default() -> Self {
        RebootPolicy {
            mode: RebootMode::Off,
            max_concurrent: Self::DEFAULT_MAX_CONCURRENT,
            timeout_ms: Self::DEFAULT_TIMEOUT_MS,
            on_timeout: RebootTimeout::Free,
            alert_gate: None,
            blocking_pod_selector: String::new(),
        }
    }
}

/// Where a slot's node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotPhase {
    /// Cordoned, its pods being evicted (clusters with a kubeconfig).
    Draining,
    /// Asked to reboot; waiting for it to come back in a new boot.
    Rebooting,
    /// Back in a new boot; waiting for its Node to be `Ready`.
    Readying,
    /// Not back within the timeout, its slot kept (`--on-reboot-timeout
    /// keep`) until it is back or the operator aborts.
    Lost,
    /// Held by a FleetLock client (Zincati) under its id, from its
    /// `pre-reboot` to its `steady-state`: the client reboots itself; the
    /// lock neither drains nor asks it to reboot.
    Fleetlock,
    /// A FleetLock holder not released within the timeout, its slot kept
    /// (`--on-reboot-timeout keep`) until its `steady-state` or an abort.
    FleetlockLost,
}

impl SlotPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotPhase::Draining => "draining",
            SlotPhase::Rebooting => "rebooting",
            SlotPhase::Readying => "back",
            SlotPhase::Lost | SlotPhase::FleetlockLost => "lost",
            SlotPhase::Fleetlock => "fleetlock",
        }
    }

    /// Held by a FleetLock client (its `node` is the client's id).
    pub fn is_fleetlock(self) -> bool {
        matches!(self, SlotPhase::Fleetlock | SlotPhase::FleetlockLost)
    }

    /// Lost, its slot kept by the policy.
    pub fn is_lost(self) -> bool {
        matches!(self, SlotPhase::Lost | SlotPhase::FleetlockLost)
    }
}

/// One node's slot in its cluster's reboot lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebootSlot {
    /// The node; for a FleetLock holder, the client's id (the node, when
    /// it names one of the cluster).
    pub node: String,
    pub phase: SlotPhase,
    /// When the node took the slot (Unix ms): the timeout counts from it.
    pub taken_ms: i64,
    /// When the current phase began.
    pub since_ms: i64,
    /// The node's boot ID when it took the slot: back means another.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// Whether the drain cordoned the node (the owner's cordon is lifted
    /// when the slot ends).
    #[serde(default)]
    pub drained: bool,
    /// The reboot request sent (0: not yet).
    #[serde(default)]
    pub request: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// A rolling reboot's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    Running,
    /// No new slot is given; the nodes holding one finish.
    Paused,
    /// Ended by the operator: no new slot; the holders finish.
    Aborted,
    /// Every node rebooted (or lost, or blocked).
    Completed,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Aborted => "aborted",
            RunState::Completed => "completed",
        }
    }

    pub fn is_active(self) -> bool {
        matches!(self, RunState::Running | RunState::Paused)
    }
}

/// How a node of a rolling reboot ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunOutcome {
    Done,
    Lost,
    /// Its drain gave up (budgets, no Node): not rebooted.
    Blocked,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Done => "done",
            RunOutcome::Lost => "lost",
            RunOutcome::Blocked => "blocked",
        }
    }
}

/// A rolling reboot an operator started (`lksctl reboot start`): every
/// node the selector matched then, whether it needs a reboot or not.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebootRun {
    pub state: RunState,
    #[serde(default)]
    pub selector: Labels,
    pub started_ms: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub started_by: String,
    /// The nodes still to reboot, in order.
    pub waiting: Vec<String>,
    /// The nodes it is done with, and how each ended.
    #[serde(default)]
    pub ended: BTreeMap<String, RunOutcome>,
}

/// A cluster's reboot lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RebootLock {
    /// The nodes holding a slot (and lost ones kept per policy).
    pub slots: Vec<RebootSlot>,
    pub run: Option<RebootRun>,
    /// When and how each node last left a slot: a node is not taken again
    /// for `required` within the cool-down, so a node that says `required`
    /// after every boot (or whose drain is blocked) does not loop.
    pub last: BTreeMap<String, LastReboot>,
}

/// When and how a node last left a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LastReboot {
    pub at_ms: i64,
    pub outcome: RunOutcome,
}

/// A cluster's lock as read, with the revision a write must match (0: the
/// lock was never written).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockAt {
    pub lock: RebootLock,
    pub revision: i64,
}

/// Reboot locks (the policies are the clusters': `ClusterStore::set_cluster_reboots`).
#[async_trait]
pub trait RebootStore: Send + Sync {
    /// The cluster's reboot lock (the empty lock, revision 0, if it was
    /// never written).
    async fn reboot_lock(&self, cluster: &str) -> Result<LockAt>;
    /// Writes the cluster's lock and `events` in one transaction, if the
    /// stored lock is still at `revision`; answers the new revision, or
    /// `None` if another write came first (read again and decide again).
    /// `NotFound` if the cluster does not exist.
    async fn put_reboot_lock(
        &self,
        cluster: &str,
        lock: &RebootLock,
        revision: i64,
        events: Vec<EventRow>,
    ) -> Result<Option<i64>>;
    /// Every cluster's lock that was ever written, by cluster name.
    async fn reboot_locks(&self) -> Result<Vec<(String, LockAt)>>;
}
