//! What a rollout step decides over: the per-state counts of a rollout,
//! each node as the controller sees it ([`NodeView`], with the tenant
//! cluster's answer as a [`KubeFact`]), the controller's [`Clock`], and the
//! [`Decision`] a step returns with its [`Note`]s; the helpers every phase
//! shares.

use lks_proto::windows::Window;
use lks_store::{BundleStatusRow, EventRow, NodeState, RolloutRow, TargetChange};

/// Per-state node counts of a rollout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub total: u32,
    pub updated: u32,
    pub failed: u32,
    /// Not done yet: waiting or applying.
    pub pending: u32,
    pub applying: u32,
    pub rolled_back: u32,
    pub skipped: u32,
    /// Offline at their turn; they start when they are back.
    pub deferred: u32,
    /// Held by the operator at their turn.
    pub held: u32,
}

pub fn counts(r: &RolloutRow) -> Counts {
    let mut c = Counts {
        total: r.nodes.len() as u32,
        ..Default::default()
    };
    for n in &r.nodes {
        match n.state {
            NodeState::Updated => c.updated += 1,
            NodeState::Failed => c.failed += 1,
            NodeState::Applying => {
                c.applying += 1;
                c.pending += 1;
            }
            NodeState::Waiting => c.pending += 1,
            NodeState::RolledBack => c.rolled_back += 1,
            NodeState::Skipped => c.skipped += 1,
            NodeState::Deferred => c.deferred += 1,
            NodeState::Held => c.held += 1,
        }
    }
    c
}

/// The one-line outcome of a forward rollout, e.g. "3 of 4 node(s)
/// updated, 1 deferred".
pub(crate) fn summary(c: &Counts) -> String {
    let mut m = format!("{} of {} node(s) updated", c.updated, c.total);
    for (n, what) in [
        (c.failed, "failed"),
        (c.skipped, "skipped"),
        (c.deferred, "deferred"),
        (c.held, "held"),
        (c.applying, "applying"),
    ] {
        if n > 0 {
            m.push_str(&format!(", {n} {what}"));
        }
    }
    m
}

/// One node of a rollout as the controller sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// The bundle's desired version on the node.
    pub desired: Option<String>,
    /// What the node last reported about the bundle.
    pub actual: Option<BundleStatusRow>,
    pub connected: bool,
    /// Last time the node was heard from (Unix ms).
    pub last_seen_ms: i64,
    /// Held by the operator (`lksctl node hold`).
    pub held: bool,
    /// A newer rollout of the same cluster and bundle that includes the
    /// node and is still driven: a deferred or held node is its business now.
    pub claimed_by: Option<String>,
    /// Why the node's agent cannot carry out this bundle (it did not
    /// announce a feature the bundle needs): the node fails at its turn
    /// instead of silently dropping part of the bundle.
    pub unsupported: Option<String>,
    /// In a draining rollout, what the tenant cluster said of the node's
    /// current step (its drain, its Ready gate); `None`: nothing yet.
    pub kube: Option<KubeFact>,
}

/// What the tenant cluster said of a draining node's current step, as the
/// controller's kube work found it (module `drain` says what each does).
/// `lks-kube`'s tasks answer in these terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeFact {
    /// Cordoned and drained: what was evicted and left.
    Drained(String),
    /// The drain gave up and lifted its cordon: the one line saying why.
    Blocked(String),
    /// The Node is Ready (and runs the kubelet the bundle declares).
    Ready,
    /// Not Ready yet: the gate's last answer.
    NotReady(String),
}

/// The controller's clock: now, when it started (a node is never held
/// offline for time the controller itself was not running), and the
/// maintenance windows of the rollout's cluster (empty: always open).
#[derive(Clone, Debug)]
pub struct Clock {
    pub now_ms: i64,
    pub since_ms: i64,
    pub windows: Vec<Window>,
    /// The cluster's stored windows no longer parse: treated as closed.
    pub windows_unreadable: bool,
}

/// Something that happened, to be recorded as an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Empty for the rollout as a whole.
    pub node: String,
    pub kind: &'static str,
    pub message: String,
}

/// What to store: the rollout's next state, desired-state changes, the
/// target change and what to record.
#[derive(Clone, Debug)]
pub struct Decision {
    pub rollout: RolloutRow,
    /// Node → version to assign (`None`: remove the bundle).
    pub assign: Vec<(String, Option<String>)>,
    pub target: TargetChange,
    pub notes: Vec<Note>,
}

impl Decision {
    pub(crate) fn new(r: &RolloutRow) -> Self {
        Decision {
            rollout: r.clone(),
            assign: Vec::new(),
            target: TargetChange::Keep,
            notes: Vec::new(),
        }
    }

    pub(crate) fn note(&mut self, node: &str, kind: &'static str, message: impl Into<String>) {
        self.notes.push(Note {
            node: node.to_string(),
            kind,
            message: message.into(),
        });
    }

    /// The notes as event rows.
    pub fn events(&self, at_ms: i64) -> Vec<EventRow> {
        let r = &self.rollout;
        self.notes
            .iter()
            .map(|n| EventRow {
                id: 0,
                at_ms,
                cluster: r.cluster.clone(),
                node: n.node.clone(),
                rollout_id: r.id.clone(),
                kind: n.kind.to_string(),
                bundle: r.bundle.clone(),
                version: r.version.clone(),
                message: n.message.clone(),
            })
            .collect()
    }
}

pub(crate) fn version_or_none(v: &str) -> &str {
    if v.is_empty() { "no version" } else { v }
}

/// Marks every node that has not started (waiting, deferred, held) skipped.
pub(crate) fn skip_waiting(d: &mut Decision, why: &str) {
    let mut skipped = Vec::new();
    for n in d.rollout.nodes.iter_mut().filter(|n| n.startable()) {
        n.state = NodeState::Skipped;
        n.message = why.to_string();
        skipped.push(n.name.clone());
    }
    for n in skipped {
        d.note(&n, "skipped", why);
    }
}
