//! Release plans on `/metrics` (issue [fleet-plans]): `lks_plans{state}`,
//! every state shown from the start (0 on a replica that does not drive
//! plans), and `lks_plans_overdue`, plans running longer than their
//! `--alert-after`. Set by the plan driver after each pass over the plans.

use std::fmt::Write as _;

use lks_proto::sync::lock;
use lks_store::PlanState;

use super::Metrics;

/// Plans by state (in `PlanState::ALL` order) and how many are overdue.
#[derive(Default, Clone, Copy)]
pub(super) struct PlanCounts {
    by_state: [i64; PlanState::ALL.len()],
    overdue: i64,
}

impl Metrics {
    /// What the plan driver saw in its last pass: each plan's state and
    /// whether it is overdue. `None`: this replica does not drive plans.
    pub fn set_plans(&self, plans: Option<&[(PlanState, bool)]>) {
        let mut c = PlanCounts::default();
        for (state, overdue) in plans.unwrap_or_default() {
            if let Some(i) = PlanState::ALL.iter().position(|s| s == state) {
                c.by_state[i] += 1;
            }
            c.overdue += i64::from(*overdue);
        }
        *lock(&self.plans) = c;
    }

    pub(super) fn render_plans(&self, s: &mut String) {
        let c = *lock(&self.plans);
        let _ = writeln!(
            s,
            "# HELP lks_plans Release plans by state, on the replica that drives them.\n# TYPE lks_plans gauge"
        );
        for (state, n) in PlanState::ALL.iter().zip(c.by_state) {
            let _ = writeln!(s, "lks_plans{{state=\"{}\"}} {n}", state.as_str());
        }
        let _ = writeln!(
            s,
            "# HELP lks_plans_overdue Release plans running (or paused or halted) longer than their --alert-after.\n# TYPE lks_plans_overdue gauge\nlks_plans_overdue {}",
            c.overdue
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_shown_and_overdue_plans_counted() {
        let m = Metrics::default();
        let text = m.render();
        assert!(text.contains("lks_plans{state=\"halted\"} 0"));
        assert!(text.contains("lks_plans_overdue 0"));
        m.set_plans(Some(&[
            (PlanState::Halted, true),
            (PlanState::Running, false),
            (PlanState::Running, true),
        ]));
        let text = m.render();
        assert!(text.contains("lks_plans{state=\"halted\"} 1"));
        assert!(text.contains("lks_plans{state=\"running\"} 2"));
        assert!(text.contains("lks_plans{state=\"rolled_back\"} 0"));
        assert!(text.contains("lks_plans_overdue 2"));
        m.set_plans(None);
        assert!(m.render().contains("lks_plans{state=\"running\"} 0"));
    }
}
