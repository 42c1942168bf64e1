//! How a rollout's state follows from what its nodes report.
//!
//! Pure functions over store rows, so the rules are unit-tested without a
//! server. The rollout driver (in `server.rs`) applies them whenever a node
//! reports and persists any change.

use std::collections::BTreeMap;

use lks_proto::BundleState;

use crate::store::{BundleStatusRow, RolloutRow, RolloutState};

/// Failures tolerated before a rollout fails, when the operator gives none.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 1;

/// Per-state node counts of a rollout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub total: u32,
    pub updated: u32,
    pub failed: u32,
    /// Not yet applied: waiting or applying.
    pub pending: u32,
    pub applying: u32,
}

pub fn counts(r: &RolloutRow) -> Counts {
    let mut c = Counts {
        total: r.nodes.len() as u32,
        ..Default::default()
    };
    for n in &r.nodes {
        match n.state.as_str() {
            "updated" => c.updated += 1,
            "failed" => c.failed += 1,
            "applying" => {
                c.applying += 1;
                c.pending += 1;
            }
            "waiting" => c.pending += 1,
            _ => {}
        }
    }
    c
}

/// The node's state in the rollout given its reported status (`None` in
/// `statuses` means never reported; a missing key means the node is gone).
fn node_state(version: &str, status: Option<&Option<BundleStatusRow>>) -> (&'static str, String) {
    match status {
        None => ("skipped", "node was deleted".into()),
        Some(None) => ("waiting", String::new()),
        Some(Some(s)) if s.version == version => match s.state {
            BundleState::Applied => ("updated", String::new()),
            BundleState::Failed | BundleState::RolledBack => ("failed", s.message.clone()),
            BundleState::Applying => ("applying", String::new()),
            BundleState::Pending => ("waiting", String::new()),
        },
        Some(Some(_)) => ("waiting", String::new()),
    }
}

/// Re-derives node states and the rollout state of a running rollout.
/// Returns the updated row, or `None` if nothing changed.
pub fn evaluate(
    r: &RolloutRow,
    statuses: &BTreeMap<String, Option<BundleStatusRow>>,
    now_ms: i64,
) -> Option<RolloutRow> {
    if r.state != RolloutState::Running {
        return None;
    }
    let mut next = r.clone();
    for n in &mut next.nodes {
        let (state, message) = node_state(&r.version, statuses.get(&n.name));
        n.state = state.to_string();
        n.message = message;
    }
    let c = counts(&next);
    let threshold = if r.failure_threshold == 0 {
        DEFAULT_FAILURE_THRESHOLD
    } else {
        r.failure_threshold
    };
    let skipped = next.nodes.iter().filter(|n| n.state == "skipped").count() as u32;
    if c.failed >= threshold {
        next.state = RolloutState::Failed;
        let first = next
            .nodes
            .iter()
            .find(|n| n.state == "failed")
            .map(|n| format!(" (first: {}: {})", n.name, n.message))
            .unwrap_or_default();
        next.message = format!("{} node(s) failed, threshold {threshold}{first}", c.failed);
    } else if c.updated + c.failed + skipped == c.total {
        next.state = RolloutState::Completed;
        next.message = format!("{} of {} node(s) updated", c.updated, c.total);
    }
    if next == *r {
        return None;
    }
    next.updated_at_ms = now_ms;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RolloutNodeRow;

    fn rollout(nodes: &[&str], threshold: u32) -> RolloutRow {
        RolloutRow {
            id: "r".into(),
            cluster: "c".into(),
            bundle: "k".into(),
            version: "2".into(),
            selector: Default::default(),
            batch_size: 0,
            failure_threshold: threshold,
            state: RolloutState::Running,
            nodes: nodes
                .iter()
                .map(|n| RolloutNodeRow {
                    name: n.to_string(),
                    previous_version: "1".into(),
                    state: "waiting".into(),
                    message: String::new(),
                })
                .collect(),
            created_at_ms: 0,
            updated_at_ms: 0,
            message: String::new(),
        }
    }

    fn st(version: &str, state: BundleState) -> Option<BundleStatusRow> {
        Some(BundleStatusRow {
            name: "k".into(),
            version: version.into(),
            state,
            message: "boom".into(),
            updated_at_ms: 0,
        })
    }

    #[test]
    fn completes_when_every_node_applied() {
        let r = rollout(&["a", "b"], 0);
        let mut s = BTreeMap::new();
        s.insert("a".to_string(), st("2", BundleState::Applied));
        s.insert("b".to_string(), st("1", BundleState::Applied));
        let r1 = evaluate(&r, &s, 5).unwrap();
        assert_eq!(r1.state, RolloutState::Running);
        assert_eq!(
            counts(&r1),
            Counts {
                total: 2,
                updated: 1,
                failed: 0,
                pending: 1,
                applying: 0
            }
        );
        assert!(evaluate(&r1, &s, 6).is_none(), "no change, no write");
        s.insert("b".to_string(), st("2", BundleState::Applied));
        assert_eq!(evaluate(&r1, &s, 7).unwrap().state, RolloutState::Completed);
    }

    #[test]
    fn fails_at_the_threshold_and_skips_deleted_nodes() {
        let r = rollout(&["a", "b", "c"], 2);
        let mut s = BTreeMap::new();
        s.insert("a".to_string(), st("2", BundleState::RolledBack));
        s.insert("b".to_string(), None);
        let r1 = evaluate(&r, &s, 1).unwrap();
        assert_eq!(r1.state, RolloutState::Running);
        assert_eq!(r1.nodes[2].state, "skipped");
        s.insert("b".to_string(), st("2", BundleState::Failed));
        let r2 = evaluate(&r1, &s, 2).unwrap();
        assert_eq!(r2.state, RolloutState::Failed);
        assert!(r2.message.contains("2 node(s) failed"));
    }

    #[test]
    fn empty_rollout_completes() {
        let r = rollout(&[], 0);
        assert_eq!(
            evaluate(&r, &BTreeMap::new(), 1).unwrap().state,
            RolloutState::Completed
        );
    }
}
