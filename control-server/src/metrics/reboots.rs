//! Reboot waits on `/metrics` (issue [reboots]):
//! `lks_reboot_waiting_nodes{cluster, reason}`, the nodes of a cluster that
//! want a reboot slot and wait, by why (`lks_rollout::reboot::waiting`:
//! a closed window, every slot taken, a firing alert, a blocking pod, a
//! gate that cannot be asked, …). Set by the reboot controller on the
//! replica that drives reboots, every pass; every reason is shown for each
//! cluster it steps (0 included), none on other replicas.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lks_rollout::gates::WaitKind;

use lks_proto::sync::lock;

use super::Metrics;

/// Cluster → reason → nodes waiting.
pub(super) type RebootWaits = BTreeMap<String, BTreeMap<WaitKind, u64>>;

impl Metrics {
    /// The waits of every cluster the reboot controller stepped in its last
    /// pass (empty: it does not lead, or no cluster reboots).
    pub fn set_reboot_waits(&self, waits: RebootWaits) {
        *lock(&self.reboot_waits) = waits;
    }

    pub(super) fn render_reboot_waits(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP lks_reboot_waiting_nodes Nodes that want a reboot slot and wait, by cluster and why (on the replica driving reboots).\n# TYPE lks_reboot_waiting_nodes gauge"
        );
        for (cluster, by) in lock(&self.reboot_waits).iter() {
            for k in WaitKind::ALL {
                let n = by.get(&k).copied().unwrap_or(0);
                let _ = writeln!(
                    s,
                    "lks_reboot_waiting_nodes{{cluster=\"{cluster}\",reason=\"{}\"}} {n}",
                    k.as_str()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_of_a_stepped_cluster_is_shown_and_a_new_pass_replaces_the_last() {
        let m = Metrics::default();
        m.set_reboot_waits(BTreeMap::from([(
            "c1".to_string(),
            BTreeMap::from([(WaitKind::Alert, 3), (WaitKind::Slots, 1)]),
        )]));
        let text = m.render();
        assert!(text.contains("lks_reboot_waiting_nodes{cluster=\"c1\",reason=\"alert\"} 3"));
        assert!(text.contains("lks_reboot_waiting_nodes{cluster=\"c1\",reason=\"slots\"} 1"));
        assert!(text.contains("lks_reboot_waiting_nodes{cluster=\"c1\",reason=\"blocking_pod\"} 0"));
        assert_eq!(
            text.matches("lks_reboot_waiting_nodes{").count(),
            WaitKind::ALL.len()
        );
        m.set_reboot_waits(BTreeMap::new());
        assert!(!m.render().contains("lks_reboot_waiting_nodes{"));
    }
}
