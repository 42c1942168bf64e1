//! Exponential backoff with jitter, as in the gRPC connection-backoff spec:
//! first delay 1 s, ×1.6 per failure, capped at 120 s, each delay ±20 %.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
    current: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(120))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            multiplier: 1.6,
            jitter: 0.2,
            current: initial,
        }
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }

    /// The next delay, jittered; grows the base for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current.as_secs_f64();
        self.current = Duration::from_secs_f64((base * self.multiplier).min(self.max.as_secs_f64()));
        let factor = 1.0 + self.jitter * (2.0 * unit_random() - 1.0);
        Duration::from_secs_f64(base * factor)
    }

    /// Sleeps for the next delay. Returns false if cancelled first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let d = self.next_delay();
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

/// A uniform random number in [0, 1) from the OS.
pub fn unit_random() -> f64 {
    let mut b = [0u8; 8];
    // Jitter only spreads load; if the OS source fails, no jitter is fine.
    if getrandom::getrandom(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_1_6_with_jitter_and_caps() {
        let mut b = Backoff::default();
        let mut base = 1.0f64;
        for _ in 0..20 {
            let d = b.next_delay().as_secs_f64();
            assert!(
                d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9,
                "{d} vs base {base}"
            );
            base = (base * 1.6).min(120.0);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(1200));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_honours_cancellation() {
        let mut b = Backoff::new(Duration::from_secs(100), Duration::from_secs(100));
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!b.wait(&cancel).await);
        let fresh = CancellationToken::new();
        assert!(b.wait(&fresh).await);
    }
}
