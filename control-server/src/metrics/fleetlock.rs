//! FleetLock on `/metrics` (issue [reboots]):
//! `lks_fleetlock_requests_total{op, result}`, every pair shown from the
//! start, counted by the FleetLock listener (`--fleetlock-listen`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Metrics;

/// The ops a FleetLock request names (`other`: none could be read).
pub const OPS: [&str; 3] = ["pre-reboot", "steady-state", "other"];
/// How a request ended: a slot taken, held already, released (or none to
/// release), refused by a gate, a bad request (or an unknown cluster),
/// the store failing.
pub const RESULTS: [&str; 6] = ["granted", "held", "released", "refused", "bad_request", "error"];

/// Requests by (op, result).
#[derive(Default)]
pub(super) struct FleetlockCounts([[AtomicU64; RESULTS.len()]; OPS.len()]);

impl Metrics {
    /// Counts one FleetLock request (names outside [`OPS`] and [`RESULTS`]
    /// are counted as the last of each).
    pub fn fleetlock_request(&self, op: &str, result: &str) {
        let o = OPS.iter().position(|x| *x == op).unwrap_or(OPS.len() - 1);
        let r = RESULTS
            .iter()
            .position(|x| *x == result)
            .unwrap_or(RESULTS.len() - 1);
        self.fleetlock.0[o][r].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn render_fleetlock(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP lks_fleetlock_requests_total FleetLock requests (Zincati) by op and result.\n# TYPE lks_fleetlock_requests_total counter"
        );
        for (o, op) in OPS.iter().enumerate() {
            for (r, result) in RESULTS.iter().enumerate() {
                let n = self.fleetlock.0[o][r].load(Ordering::Relaxed);
                let _ = writeln!(
                    s,
                    "lks_fleetlock_requests_total{{op=\"{op}\",result=\"{result}\"}} {n}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_shown_and_counted() {
        let m = Metrics::default();
        m.fleetlock_request("pre-reboot", "granted");
        m.fleetlock_request("bogus", "bogus");
        let text = m.render();
        assert!(text.contains("lks_fleetlock_requests_total{op=\"pre-reboot\",result=\"granted\"} 1"));
        assert!(text.contains("lks_fleetlock_requests_total{op=\"other\",result=\"error\"} 1"));
        assert!(text.contains("lks_fleetlock_requests_total{op=\"steady-state\",result=\"refused\"} 0"));
    }
}
