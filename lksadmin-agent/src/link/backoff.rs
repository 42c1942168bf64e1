//! The shared backoff policy (`lks_proto::backoff`: 1 s, ×1.6, cap 120 s,
//! ±20 %, server retry hints), with the agent's cancellable sleep.

use std::time::Duration;

pub use lks_proto::backoff::{Backoff, Rotation, retry_hint, unit_random};
use tokio_util::sync::CancellationToken;

/// Sleeps for the next delay of `backoff`, at least `hint` if the server
/// gave one. Returns false if cancelled first.
pub async fn wait(backoff: &mut Backoff, hint: Option<Duration>, cancel: &CancellationToken) -> bool {
    let d = backoff.next_delay_with(hint);
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wait_honours_cancellation() {
        let mut b = Backoff::new(Duration::from_secs(100), Duration::from_secs(100));
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!wait(&mut b, None, &cancel).await);
        let fresh = CancellationToken::new();
        assert!(wait(&mut b, None, &fresh).await);
    }
}
