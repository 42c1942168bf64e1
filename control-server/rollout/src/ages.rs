//! How long each rollout an operator may have to act on has been in its
//! state, for `/metrics` (`lks_rollouts{state}`,
//! `lks_rollout_state_seconds{rollout, cluster, bundle, state}`).
//!
//! Only rollouts worth an alert are kept, so the series stay few: active
//! ones (running, paused, rolling back; at most one per cluster and bundle
//! name) and failed ones for [`FAILED_KEPT`] after their failure, until a
//! newer rollout of their cluster and bundle starts or they are rolled back
//! (also at most one per cluster and bundle). Everything here is in memory
//! on the replica that drives rollouts: the controller tells it each state
//! change it stores and, every pass, the rollouts it drives. A rollout seen
//! first (after a restart or a change of leader) counts from its last stored
//! change, so a duration is never overstated; a rollout that failed before
//! this replica led is not known here (`lks_rollout_events_total{kind=
//! "rollout_failed"}` still counted it where it failed).

use std::collections::BTreeMap;

use lks_store::{RolloutRow, RolloutState};

/// How long a failed rollout stays listed without an operator acting on it.
pub const FAILED_KEPT_MS: i64 = 24 * 3600 * 1000;

/// The states with series, in `lks_rollouts{state}` order.
pub const AGED_STATES: [RolloutState; 4] = [
    RolloutState::Running,
    RolloutState::Paused,
    RolloutState::RollingBack,
    RolloutState::Failed,
];

/// One rollout in a state worth watching, since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutAge {
    pub id: String,
    pub cluster: String,
    pub bundle: String,
    pub state: RolloutState,
    /// When it entered `state` (Unix ms; at the latest its last change).
    pub since_ms: i64,
}

/// The rollouts worth watching, by ID.
#[derive(Default)]
pub struct StateAges(BTreeMap<String, RolloutAge>);

impl StateAges {
    /// `row` as just stored or read.
    pub fn saw(&mut self, row: &RolloutRow, now_ms: i64) {
        if !AGED_STATES.contains(&row.state) {
            self.0.remove(&row.id);
            return;
        }
        if row.state.is_active() {
            // A newer rollout of the bundle supersedes a failed one.
            self.0.retain(|id, a| {
                *id == row.id
                    || a.state != RolloutState::Failed
                    || a.cluster != row.cluster
                    || a.bundle != row.bundle
            });
        }
        if self.0.get(&row.id).is_some_and(|a| a.state == row.state) {
            return;
        }
        self.0.insert(
            row.id.clone(),
            RolloutAge {
                id: row.id.clone(),
                cluster: row.cluster.clone(),
                bundle: row.bundle.clone(),
                state: row.state,
                since_ms: row.updated_at_ms.min(now_ms),
            },
        );
    }

    /// A controller pass: `rows` are every rollout it drives, as they
    /// stand after it. An active rollout not among them has ended (its
    /// end was seen, or it is an ended state this does not keep); a
    /// failed one stays until [`FAILED_KEPT_MS`] passed.
    pub fn pass(&mut self, rows: &[RolloutRow], now_ms: i64) {
        for r in rows {
            self.saw(r, now_ms);
        }
        self.0.retain(|id, a| {
            if a.state == RolloutState::Failed {
                now_ms - a.since_ms < FAILED_KEPT_MS
            } else {
                rows.iter().any(|r| r.id == *id)
            }
        });
    }

    /// Forgets everything: this replica no longer drives rollouts.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn snapshot(&self) -> Vec<RolloutAge> {
        self.0.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, bundle: &str, state: RolloutState, updated_at_ms: i64) -> RolloutRow {
        RolloutRow {
            id: id.into(),
            cluster: "c".into(),
            bundle: bundle.into(),
            version: "1".into(),
            selector: Default::default(),
            batch_size: 1,
            failure_threshold: 1,
            offline_deadline_ms: 1,
            state,
            nodes: Vec::new(),
            created_at_ms: 0,
            updated_at_ms,
            message: String::new(),
            revision: 0,
            previous_target: None,
            policy: Default::default(),
            pacing: Default::default(),
        }
    }

    fn states(a: &StateAges) -> Vec<(String, &'static str, i64)> {
        a.snapshot()
            .into_iter()
            .map(|r| (r.id, r.state.as_str(), r.since_ms))
            .collect()
    }

    #[test]
    fn a_state_counts_from_its_change_not_from_later_updates() {
        let mut a = StateAges::default();
        a.saw(&row("r1", "k", RolloutState::Running, 100), 100);
        a.saw(&row("r1", "k", RolloutState::Running, 200), 200);
        assert_eq!(states(&a), [("r1".into(), "running", 100)]);
        a.saw(&row("r1", "k", RolloutState::Paused, 300), 300);
        // Nodes mid-apply finish while it is paused: still paused since 300.
        a.pass(&[row("r1", "k", RolloutState::Paused, 400)], 500);
        assert_eq!(states(&a), [("r1".into(), "paused", 300)]);
    }

    #[test]
    fn ended_rollouts_leave_and_failed_ones_stay_until_superseded_or_old() {
        let mut a = StateAges::default();
        a.pass(
            &[
                row("done", "a", RolloutState::Running, 10),
                row("bad", "k", RolloutState::Running, 10),
            ],
            10,
        );
        a.saw(&row("done", "a", RolloutState::Completed, 20), 20);
        a.saw(&row("bad", "k", RolloutState::Failed, 30), 30);
        // The failed one is no longer driven once its nodes settled.
        a.pass(&[], 40);
        assert_eq!(states(&a), [("bad".into(), "failed", 30)]);
        a.pass(&[], 30 + FAILED_KEPT_MS - 1);
        assert_eq!(states(&a).len(), 1);
        a.pass(&[], 30 + FAILED_KEPT_MS);
        assert!(states(&a).is_empty(), "forgotten after a day");

        a.saw(&row("bad", "k", RolloutState::Failed, 50), 50);
        a.pass(&[row("other", "z", RolloutState::Running, 60)], 60);
        assert_eq!(states(&a).len(), 2, "another bundle's rollout changes nothing");
        a.pass(&[row("next", "k", RolloutState::Running, 70)], 70);
        assert_eq!(states(&a), [("next".into(), "running", 70)], "superseded");

        a.saw(&row("next", "k", RolloutState::Failed, 80), 80);
        a.saw(&row("next", "k", RolloutState::RollingBack, 90), 90);
        assert_eq!(states(&a), [("next".into(), "rolling_back", 90)]);
        a.clear();
        assert!(states(&a).is_empty());
    }

    #[test]
    fn a_rollout_first_seen_counts_from_its_last_change() {
        let mut a = StateAges::default();
        a.pass(&[row("r", "k", RolloutState::Paused, 1_000)], 5_000);
        assert_eq!(states(&a), [("r".into(), "paused", 1_000)]);
        // A clock behind the store's never makes a time in the future.
        let mut b = StateAges::default();
        b.pass(&[row("r", "k", RolloutState::Paused, 9_000)], 5_000);
        assert_eq!(states(&b), [("r".into(), "paused", 5_000)]);
    }
}
