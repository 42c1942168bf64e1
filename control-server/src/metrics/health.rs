//! The families operators alert on that are not plain counters: rollouts
//! by state and how long each has been in it, the store and blob store
//! probes, enrolled nodes, certificate renewals and cordons lksadmin left
//! in tenant clusters (packaging/kubernetes/monitoring/ holds the rules).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};

use lks_rollout::ages::AGED_STATES;

use super::{Metrics, RENEWAL_OUTCOMES, scalar};
use crate::clock::now_ms;

/// A gauge set by a probe, not rendered before the first one.
pub(super) struct Probed(AtomicI64);

impl Default for Probed {
    fn default() -> Self {
        Probed(AtomicI64::new(-1))
    }
}

impl Probed {
    pub(super) fn set(&self, v: u64) {
        self.0
            .store(i64::try_from(v).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    fn get(&self) -> Option<i64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|v| *v >= 0)
    }
}

impl Metrics {
    pub(super) fn render_rollouts(&self, s: &mut String) {
        let ages = lks_proto::sync::lock(&self.rollouts).clone();
        let _ = writeln!(
            s,
            "# HELP lks_rollouts Rollouts by state on the replica that drives them: running, paused, rolling_back, and failed within the last 24 h and not yet rolled back or superseded."
        );
        let _ = writeln!(s, "# TYPE lks_rollouts gauge");
        for state in AGED_STATES {
            let n = ages.iter().filter(|a| a.state == state).count();
            let _ = writeln!(s, "lks_rollouts{{state=\"{}\"}} {n}", state.as_str());
        }
        let _ = writeln!(
            s,
            "# HELP lks_rollout_state_seconds Seconds each rollout counted in lks_rollouts has been in its state."
        );
        let _ = writeln!(s, "# TYPE lks_rollout_state_seconds gauge");
        let now = now_ms();
        for a in &ages {
            let _ = writeln!(
                s,
                "lks_rollout_state_seconds{{rollout=\"{}\",cluster=\"{}\",bundle=\"{}\",state=\"{}\"}} {}",
                escape(&a.id),
                escape(&a.cluster),
                escape(&a.bundle),
                a.state.as_str(),
                (now - a.since_ms).max(0) / 1000
            );
        }
    }

    pub(super) fn render_health(&self, s: &mut String) {
        let probed = [
            (
                "lks_store_up",
                "1 if the store (SQLite or etcd) answered this replica's last probe, else 0.",
                &self.store_up,
            ),
            (
                "lks_blob_store_up",
                "1 if the blob store answered this replica's last probe, else 0.",
                &self.blob_store_up,
            ),
            (
                "lks_enrolled_nodes",
                "Nodes enrolled in every cluster, at the last probe the store answered.",
                &self.enrolled_nodes,
            ),
        ];
        for (name, help, v) in probed {
            if let Some(v) = v.get() {
                scalar(s, name, "gauge", help, v);
            }
        }
        let _ = writeln!(
            s,
            "# HELP lks_certificate_renewals_total RenewCertificate calls by outcome (refused: the node or its CSR was not accepted; error: the server failed)."
        );
        let _ = writeln!(s, "# TYPE lks_certificate_renewals_total counter");
        // Every outcome from the start, so that increase() sees the first.
        for o in RENEWAL_OUTCOMES {
            let _ = writeln!(
                s,
                "lks_certificate_renewals_total{{outcome=\"{o}\"}} {}",
                self.cert_renewals.get(o)
            );
        }
        let _ = writeln!(
            s,
            "# HELP lks_kube_cordoned_nodes Tenant nodes cordoned by lksadmin at the last cordon repair (leader only): owned by an active rollout's turn, or stray (no active rollout owns it and the repair could not lift it)."
        );
        let _ = writeln!(s, "# TYPE lks_kube_cordoned_nodes gauge");
        for (state, n) in ["owned", "stray"].iter().zip(&self.cordoned) {
            let _ = writeln!(
                s,
                "lks_kube_cordoned_nodes{{state=\"{state}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
    }
}

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;
    use crate::store::RolloutState;
    use lks_rollout::ages::RolloutAge;

    #[test]
    fn rollouts_by_state_and_their_age() {
        let m = Metrics::default();
        let t = m.render();
        for state in ["running", "paused", "rolling_back", "failed"] {
            assert!(
                t.contains(&format!("lks_rollouts{{state=\"{state}\"}} 0\n")),
                "{t}"
            );
        }
        assert!(!t.contains("lks_rollout_state_seconds{"));
        m.set_rollouts(vec![RolloutAge {
            id: "r-1".into(),
            cluster: "c1".into(),
            bundle: "kubelet".into(),
            state: RolloutState::Paused,
            since_ms: crate::clock::now_ms() - 90_500,
        }]);
        let t = m.render();
        assert!(t.contains("lks_rollouts{state=\"paused\"} 1\n"), "{t}");
        assert!(t.contains("lks_rollouts{state=\"running\"} 0\n"), "{t}");
        let line = t
            .lines()
            .find(|l| l.starts_with("lks_rollout_state_seconds{"))
            .unwrap();
        let (series, secs) = line.rsplit_once(' ').unwrap();
        assert_eq!(
            series,
            "lks_rollout_state_seconds{rollout=\"r-1\",cluster=\"c1\",bundle=\"kubelet\",state=\"paused\"}"
        );
        let secs: i64 = secs.parse().unwrap();
        assert!((90..100).contains(&secs), "{line}");
    }

    #[test]
    fn probes_renewals_and_cordons() {
        let m = Metrics::default();
        let t = m.render();
        assert!(!t.contains("lks_store_up"), "not rendered before the first probe");
        assert!(!t.contains("lks_enrolled_nodes"));
        for o in ["ok", "refused", "error"] {
            assert!(t.contains(&format!("lks_certificate_renewals_total{{outcome=\"{o}\"}} 0\n")));
        }
        assert!(t.contains("lks_kube_cordoned_nodes{state=\"stray\"} 0\n"));
        m.store_probed(Some(7));
        m.blob_store_probed(true);
        m.certificate_renewal("ok");
        m.certificate_renewal("refused");
        m.certificate_renewal("refused");
        m.set_cordoned(2, 1);
        let t = m.render();
        assert!(t.contains("lks_store_up 1\n"));
        assert!(t.contains("lks_blob_store_up 1\n"));
        assert!(t.contains("lks_enrolled_nodes 7\n"));
        assert!(t.contains("lks_certificate_renewals_total{outcome=\"refused\"} 2\n"));
        assert!(t.contains("lks_certificate_renewals_total{outcome=\"ok\"} 1\n"));
        assert!(t.contains("lks_kube_cordoned_nodes{state=\"owned\"} 2\n"));
        assert!(t.contains("lks_kube_cordoned_nodes{state=\"stray\"} 1\n"));
        // The store stops answering: down, the last count kept.
        m.store_probed(None);
        m.blob_store_probed(false);
        let t = m.render();
        assert!(t.contains("lks_store_up 0\n"));
        assert!(t.contains("lks_blob_store_up 0\n"));
        assert!(t.contains("lks_enrolled_nodes 7\n"));
    }
}
