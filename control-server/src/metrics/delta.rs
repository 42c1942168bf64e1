//! The delta maker's own cost and outcomes (issue [upgrade-cost]): the CPU
//! time its estimates and diffs took, the pairs it made, skipped before a
//! diff and abandoned after one, and the bytes its patches spare a fetch.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Metrics, scalar};
use lks_blobs::delta::{Outcome, PatchResult};

/// The values of `lks_delta_patches_total{result}`, each shown from the
/// start.
pub const RESULTS: [&str; 3] = ["made", "skipped", "abandoned"];

#[derive(Default)]
pub(super) struct MakerCounters {
    /// CPU time in microseconds.
    cpu_micros: AtomicU64,
    results: [AtomicU64; RESULTS.len()],
    saved: AtomicU64,
}

impl Metrics {
    /// One pair the delta maker finished (or gave up on for this pass).
    pub fn delta_outcome(&self, o: &Outcome) {
        let m = &self.delta_maker;
        let micros = u64::try_from(o.cpu.as_micros()).unwrap_or(u64::MAX);
        m.cpu_micros.fetch_add(micros, Ordering::Relaxed);
        let Some(result) = o.result else {
            return;
        };
        if let Some(i) = RESULTS.iter().position(|r| *r == result.label()) {
            m.results[i].fetch_add(1, Ordering::Relaxed);
        }
        if let PatchResult::Made { saved } = result {
            m.saved.fetch_add(saved, Ordering::Relaxed);
        }
    }

    pub(super) fn render_delta_maker(&self, s: &mut String) {
        let m = &self.delta_maker;
        scalar(
            s,
            "lks_delta_make_seconds_total",
            "counter",
            "CPU seconds the delta maker's estimates and diffs took (at the lowest priority).",
            m.cpu_micros.load(Ordering::Relaxed) as f64 / 1e6,
        );
        let _ = writeln!(
            s,
            "# HELP lks_delta_patches_total Pairs (a file and an earlier version's) the delta maker finished: made, skipped before a diff (estimate or memory cap), abandoned after one (patch over half the file)."
        );
        let _ = writeln!(s, "# TYPE lks_delta_patches_total counter");
        for (r, n) in RESULTS.iter().zip(&m.results) {
            let _ = writeln!(
                s,
                "lks_delta_patches_total{{result=\"{r}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        scalar(
            s,
            "lks_delta_bytes_saved_total",
            "counter",
            "Bytes the patches made spare one fetch of their files (file size minus patch size, per patch made).",
            m.saved.load(Ordering::Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn outcomes_are_counted_by_result_with_their_time_and_saving() {
        let m = Metrics::default();
        let done = |cpu_ms, result| Outcome {
            cpu: Duration::from_millis(cpu_ms),
            result,
        };
        m.delta_outcome(&done(1500, Some(PatchResult::Made { saved: 900 })));
        m.delta_outcome(&done(250, Some(PatchResult::Skipped)));
        m.delta_outcome(&done(250, Some(PatchResult::Abandoned)));
        m.delta_outcome(&done(0, Some(PatchResult::Skipped)));
        m.delta_outcome(&done(500, None));
        let s = m.render();
        for line in [
            "lks_delta_make_seconds_total 2.5",
            "lks_delta_patches_total{result=\"made\"} 1",
            "lks_delta_patches_total{result=\"skipped\"} 2",
            "lks_delta_patches_total{result=\"abandoned\"} 1",
            "lks_delta_bytes_saved_total 900",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} in\n{s}");
        }
    }
}
