//! Release plans (issue [fleet-plans]): one bundle version taken to many
//! clusters in ordered groups, each cluster by a rollout of its own. A plan
//! is one record, written whole and compared on its revision: the groups
//! were expanded into clusters once, at create, and the plan's progress
//! (which cluster's rollout started, how each ended, when a group's soak
//! began, failures against the budget) is in it, so a new leader carries
//! the plan on from the store. What happens next is decided by
//! `lks_rollout::plan`; the store only keeps it.

use async_trait::async_trait;
use lks_proto::labels::Labels;
use serde::{Deserialize, Serialize};

use super::{EventRow, Result};

/// Where a plan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanState {
    /// Clusters start as groups and the in-flight limit allow.
    Running,
    /// The operator paused it: nothing new starts, its running rollouts are paused.
    Paused,
    /// Failures reached the budget: nothing new starts; running rollouts
    /// paused, or left to finish (`--on-halt finish`).
    Halted,
    /// Every group is done.
    Completed,
    /// The operator stopped it for good; its running rollouts were aborted.
    Aborted,
    /// Every cluster rollout it touched is being rolled back, newest first.
    RollingBack,
    /// Every cluster rollout it touched was rolled back.
    RolledBack,
}

impl PlanState {
    pub const ALL: [PlanState; 7] = [
        PlanState::Running,
        PlanState::Paused,
        PlanState::Halted,
        PlanState::Completed,
        PlanState::Aborted,
        PlanState::RollingBack,
        PlanState::RolledBack,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PlanState::Running => "running",
            PlanState::Paused => "paused",
            PlanState::Halted => "halted",
            PlanState::Completed => "completed",
            PlanState::Aborted => "aborted",
            PlanState::RollingBack => "rolling_back",
            PlanState::RolledBack => "rolled_back",
        }
    }

    /// Whether the plan still has anything to drive (watch its rollouts,
    /// start, pause or roll back one).
    pub fn is_live(self) -> bool {
        !matches!(self, PlanState::Completed | PlanState::RolledBack)
    }
}

/// Where one cluster of a plan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanClusterState {
    /// Its group has not reached it yet.
    Waiting,
    /// Its rollout was started and has not ended.
    Running,
    /// Its rollout completed.
    Completed,
    /// Its rollout failed (or was aborted or rolled back by someone else,
    /// or could not be started): counted against the plan's budget.
    Failed,
    /// Nothing to do there: no node matched, or the plan ended first.
    Skipped,
    /// The plan's rollback is rolling its rollout back.
    RollingBack,
    /// Its rollout was rolled back by the plan.
    RolledBack,
}

impl PlanClusterState {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanClusterState::Waiting => "waiting",
            PlanClusterState::Running => "running",
            PlanClusterState::Completed => "completed",
            PlanClusterState::Failed => "failed",
            PlanClusterState::Skipped => "skipped",
            PlanClusterState::RollingBack => "rolling_back",
            PlanClusterState::RolledBack => "rolled_back",
        }
    }

    /// The cluster's rollout has ended (or there is none to wait for).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            PlanClusterState::Completed | PlanClusterState::Failed | PlanClusterState::Skipped
        )
    }
}

/// What a plan at its failure budget does with its running rollouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnHalt {
    /// Pause them (nodes mid-apply finish).
    #[default]
    Pause,
    /// Let them finish.
    Finish,
}

impl OnHalt {
    pub fn as_str(self) -> &'static str {
        match self {
            OnHalt::Pause => "pause",
            OnHalt::Finish => "finish",
        }
    }
}

/// One cluster of a plan's group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanClusterRow {
    pub name: String,
    /// Nodes the plan's selector matched at create.
    pub nodes: u32,
    pub state: PlanClusterState,
    /// The rollout the plan started there (derived from the plan and
    /// cluster names, so known before it is started); empty: none yet.
    #[serde(default)]
    pub rollout_id: String,
    /// Why it is in its state, one line.
    #[serde(default)]
    pub message: String,
    /// The order the plan started the clusters' rollouts in (1, 2, …); 0:
    /// not started. A rollback goes newest first.
    #[serde(default)]
    pub seq: u32,
    #[serde(default)]
    pub started_at_ms: i64,
    #[serde(default)]
    pub ended_at_ms: i64,
    /// The plan paused this rollout (halt, `plan pause`); a resume resumes
    /// only those.
    #[serde(default)]
    pub paused_by_plan: bool,
}

impl PlanClusterRow {
    pub fn waiting(name: &str, nodes: u32) -> Self {
        PlanClusterRow {
            name: name.to_string(),
            nodes,
            state: PlanClusterState::Waiting,
            rollout_id: String::new(),
            message: String::new(),
            seq: 0,
            started_at_ms: 0,
            ended_at_ms: 0,
            paused_by_plan: false,
        }
    }
}

/// One ordered group of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanGroupRow {
    pub name: String,
    /// The selector as the operator wrote it: names, `k=v,…` or `*`.
    pub selector: String,
    /// When every cluster of the group settled (its soak counts from
    /// there); 0: not yet.
    #[serde(default)]
    pub done_at_ms: i64,
    pub clusters: Vec<PlanClusterRow>,
}

/// A release plan as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRow {
    pub name: String,
    pub bundle: String,
    pub version: String,
    /// Which nodes of each cluster its rollout targets.
    #[serde(default)]
    pub selector: Labels,
    /// The per-cluster rollout policy: the encoded `StartRolloutRequest`
    /// every cluster's rollout is started with (cluster, bundle, selector
    /// and request ID filled in per cluster); decoded by
    /// `lks_rollout::Policy`'s one conversion.
    #[serde(with = "hex_bytes", default)]
    pub policy: Vec<u8>,
    /// Between one group's end and the next group's start.
    pub soak_ms: u64,
    /// Most clusters with a running rollout at once.
    pub max_in_flight: u32,
    /// Failed clusters (since the last resume) that halt the plan.
    pub failure_budget: u32,
    pub on_halt: OnHalt,
    /// A plan running longer than this raises an alert; 0: never.
    #[serde(default)]
    pub alert_after_ms: u64,
    pub state: PlanState,
    pub groups: Vec<PlanGroupRow>,
    /// Failed clusters, all told.
    #[serde(default)]
    pub failures: u32,
    /// `failures` at the last resume: the budget counts failures after it.
    #[serde(default)]
    pub failures_at_resume: u32,
    /// Why it is in its state, one line.
    #[serde(default)]
    pub message: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// When it went into its state.
    #[serde(default)]
    pub state_since_ms: i64,
    #[serde(default)]
    pub started_by: String,
    /// The store's revision of this record, compared by
    /// [`PlanStore::update_plan`]; not part of the record.
    #[serde(skip)]
    pub revision: i64,
}

impl PlanRow {
    /// Every cluster of the plan, group by group.
    pub fn clusters(&self) -> impl Iterator<Item = &PlanClusterRow> {
        self.groups.iter().flat_map(|g| g.clusters.iter())
    }

    /// Failures counted against the budget now.
    pub fn budget_used(&self) -> u32 {
        self.failures.saturating_sub(self.failures_at_resume)
    }
}

/// The refusal of a plan whose name is taken.
pub fn plan_exists(name: &str) -> super::StoreError {
    super::StoreError::AlreadyExists(format!("plan {name} already exists"))
}

/// The refusal of a plan written from a stale read.
pub fn plan_changed(name: &str) -> super::StoreError {
    super::StoreError::Conflict(format!("plan {name} changed meanwhile; try again"))
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        hex::decode(s).map_err(serde::de::Error::custom)
    }
}

/// Release plans: one record each, compared on its revision.
#[async_trait]
pub trait PlanStore: Send + Sync {
    /// Stores a new plan and records `event`; `AlreadyExists`
    /// ([`plan_exists`]) if the name is taken. Returns it with its revision.
    async fn create_plan(&self, plan: PlanRow, event: EventRow) -> Result<PlanRow>;
    async fn get_plan(&self, name: &str) -> Result<Option<PlanRow>>;
    /// Every plan, by name.
    async fn list_plans(&self) -> Result<Vec<PlanRow>>;
    /// Every plan's name and revision, by name, without reading the plans:
    /// the plan driver reads again only the plans that changed.
    async fn plan_revisions(&self) -> Result<Vec<(String, i64)>>;
    /// Replaces the plan if it is still at `plan.revision` and records
    /// `events`; `Conflict` ([`plan_changed`]) if it changed since, `NotFound`
    /// if it is gone. Returns it with its new revision.
    async fn update_plan(&self, plan: PlanRow, events: Vec<EventRow>) -> Result<PlanRow>;
}
