//! The periodic probe behind `lks_store_up`, `lks_enrolled_nodes` and
//! `lks_blob_store_up`: one count of the enrolled nodes (a count-only read
//! of the store itself, not of a copy) and one lookup of a blob no store
//! holds, every [`EVERY`], each given [`TIMEOUT`] to answer.

use std::sync::Arc;
use std::time::Duration;

use lks_proto::Digest;
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::store::NodeStore;
use lks_blobs::Blobs;

/// How often the stores are probed.
pub const EVERY: Duration = Duration::from_secs(15);
/// How long a probe may take before the store counts as down.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Probes until `cancel` fires; the first probe runs at once.
pub async fn run(
    store: Arc<dyn NodeStore>,
    blobs: Arc<Blobs>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let empty = Digest::of(b"");
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (nodes, blob) = tokio::join!(
            tokio::time::timeout(TIMEOUT, store.count_nodes()),
            // Whether it holds the empty blob does not matter, only that
            // it answers, through the path every lookup takes.
            tokio::time::timeout(TIMEOUT, blobs.store().contains(&empty)),
        );
        let enrolled = match nodes {
            Ok(Ok(n)) => Some(n),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "store probe failed");
                None
            }
            Err(_) => {
                tracing::warn!(timeout = ?TIMEOUT, "store probe: no answer");
                None
            }
        };
        metrics.store_probed(enrolled);
        let up = match blob {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "blob store probe failed");
                false
            }
            Err(_) => {
                tracing::warn!(timeout = ?TIMEOUT, "blob store probe: no answer");
                false
            }
        };
        metrics.blob_store_probed(up);
    }
}
