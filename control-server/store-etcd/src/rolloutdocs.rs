//! A rollout's documents on etcd: the header (`rollouts/ID`) and one row
//! per node (`rnodes/ID/NODE`), and their keys.

use lks_proto::labels::Labels;
use serde::{Deserialize, Serialize};

use lks_store::{
    KubeStep, NodeState, Result, RolloutNodeRow, RolloutPacing, RolloutPolicy, RolloutRow, RolloutState,
    StoreError, Target,
};

use crate::docs::TargetDoc;

#[derive(Serialize, Deserialize, Clone, PartialEq)]
pub(crate) struct RolloutNodeDoc {
    #[serde(rename = "n")]
    pub name: String,
    #[serde(rename = "p")]
    pub previous_version: String,
    #[serde(rename = "s")]
    pub state: String,
    #[serde(rename = "m", default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(rename = "g", default)]
    pub generation: u64,
    #[serde(rename = "t", default)]
    pub turn_at_ms: i64,
    #[serde(rename = "f", default)]
    pub flags: u8,
    /// The node's step with its tenant cluster ([`KubeStep`]); absent when
    /// none, so rows of rollouts that do not drain are as before.
    #[serde(rename = "k", default, skip_serializing_if = "String::is_empty")]
    pub kube: String,
    #[serde(rename = "ks", default, skip_serializing_if = "is_zero")]
    pub kube_since_ms: i64,
    /// When the turn's drain began; absent when it did not drain (and in
    /// rows written before it was kept), which the previous release
    /// ignores.
    #[serde(rename = "ds", default, skip_serializing_if = "is_zero")]
    pub drain_started_ms: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

pub(crate) const TOUCHED: u8 = 1;
pub(super) const REVERTING: u8 = 2;
pub(super) const UNREACHED: u8 = 4;
pub(super) const CANARY: u8 = 8;

impl RolloutNodeDoc {
    pub fn from_row(n: &RolloutNodeRow) -> Self {
        RolloutNodeDoc {
            name: n.name.clone(),
            previous_version: n.previous_version.clone(),
            state: n.state.as_str().to_string(),
            message: n.message.clone(),
            generation: n.generation,
            turn_at_ms: n.turn_at_ms,
            flags: (if n.touched { TOUCHED } else { 0 })
                | (if n.reverting { REVERTING } else { 0 })
                | (if n.unreached { UNREACHED } else { 0 })
                | (if n.canary { CANARY } else { 0 }),
            kube: n.kube.as_str().to_string(),
            kube_since_ms: n.kube_since_ms,
            drain_started_ms: n.drain_started_ms,
        }
    }

    pub fn into_row(self) -> Result<RolloutNodeRow> {
        Ok(RolloutNodeRow {
            state: NodeState::parse(&self.state).ok_or_else(|| {
                StoreError::backend(format!("stored rollout node state {:?} is unknown", self.state))
            })?,
            name: self.name,
            previous_version: self.previous_version,
            message: self.message,
            generation: self.generation,
            turn_at_ms: self.turn_at_ms,
            touched: self.flags & TOUCHED != 0,
            reverting: self.flags & REVERTING != 0,
            unreached: self.flags & UNREACHED != 0,
            canary: self.flags & CANARY != 0,
            kube: KubeStep::parse(&self.kube),
            kube_since_ms: self.kube_since_ms,
            drain_started_ms: self.drain_started_ms,
        })
    }
}

/// A rollout's header (`rollouts/ID`).
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct RolloutDoc {
    pub cluster: String,
    pub bundle: String,
    pub version: String,
    pub selector: Labels,
    pub batch_size: u32,
    pub failure_threshold: u32,
    pub offline_deadline_ms: u64,
    pub state: String,
    /// The node rows of a document stored before rows were keys of their
    /// own; empty (and not written) in a header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<RolloutNodeDoc>,
    /// The node rows are the keys `rnodes/ID/NODE`; false for a document
    /// stored before, whose rows are `nodes`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rows: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub message: String,
    pub revision: u64,
    pub previous_target: Option<TargetDoc>,
    /// Rollouts stored before policies existed waited for offline nodes.
    #[serde(default = "RolloutPolicy::legacy")]
    pub policy: RolloutPolicy,
    #[serde(default)]
    pub pacing: RolloutPacing,
}

impl RolloutDoc {
    /// The header of `r` (its rows are written as keys of their own).
    pub fn header(r: &RolloutRow) -> Self {
        RolloutDoc {
            cluster: r.cluster.clone(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            selector: r.selector.clone(),
            batch_size: r.batch_size,
            failure_threshold: r.failure_threshold,
            offline_deadline_ms: r.offline_deadline_ms,
            state: r.state.as_str().to_string(),
            nodes: Vec::new(),
            rows: true,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            message: r.message.clone(),
            revision: r.revision,
            previous_target: r.previous_target.as_ref().map(|t| TargetDoc {
                version: t.version.clone(),
                selector: t.selector.clone(),
                rollout_id: t.rollout_id.clone(),
            }),
            policy: r.policy.clone(),
            pacing: r.pacing.clone(),
        }
    }

    /// The rollout of this header and `rows` (ignored for a document with
    /// its rows inline), rows sorted by node name.
    pub fn into_row(self, id: &str, rows: impl IntoIterator<Item = RolloutNodeDoc>) -> Result<RolloutRow> {
        let state = RolloutState::parse(&self.state).ok_or_else(|| {
            StoreError::backend(format!("stored rollout state {:?} is unknown", self.state))
        })?;
        let docs: Vec<RolloutNodeDoc> = if self.rows {
            rows.into_iter().collect()
        } else {
            self.nodes
        };
        let mut nodes = docs
            .into_iter()
            .map(RolloutNodeDoc::into_row)
            .collect::<Result<Vec<_>>>()?;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(RolloutRow {
            id: id.to_string(),
            cluster: self.cluster,
            bundle: self.bundle,
            version: self.version,
            selector: self.selector,
            batch_size: self.batch_size,
            failure_threshold: self.failure_threshold,
            offline_deadline_ms: self.offline_deadline_ms,
            state,
            nodes,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            message: self.message,
            revision: self.revision,
            previous_target: self.previous_target.map(|t| Target {
                version: t.version,
                selector: t.selector,
                rollout_id: t.rollout_id,
            }),
            policy: self.policy,
            pacing: self.pacing,
        })
    }
}

/// The key of a rollout's header, below the prefix.
pub(crate) fn header_key(id: &str) -> String {
    format!("rollouts/{id}")
}

/// The prefix of a rollout's row keys, below the store's prefix.
pub(crate) fn rows_prefix(id: &str) -> String {
    format!("rnodes/{id}/")
}

/// The key of one node's row, below the prefix.
pub(crate) fn row_key(id: &str, node: &str) -> String {
    format!("rnodes/{id}/{node}")
}
