//! Exponential backoff with jitter, as in the gRPC connection-backoff spec:
//! first delay 1 s, ×1.6 per failure, capped at 120 s, each delay ±20 %;
//! and the server's retry hint (`grpc-retry-pushback-ms`), which a client
//! that was turned away waits at least.
//!
//! The policy lives here, with no runtime attached, so the agent and the
//! load generator that simulates thousands of agents (`lks-loadgen`) back
//! off alike; the agent adds the cancellable sleep.

use std::time::Duration;

/// Trailer/header with which a server asks a client to wait this many
/// milliseconds before it tries again (the gRPC retry-pushback name).
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

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

    /// The next delay, but at least the server's hint when there is one;
    /// a hint is stretched by up to the jitter, so clients that were all
    /// told the same number do not come back at the same instant. A hint
    /// beyond the cap counts as the cap: a server cannot park a client
    /// for longer than its own backoff would.
    pub fn next_delay_with(&mut self, hint: Option<Duration>) -> Duration {
        let d = self.next_delay();
        match hint {
            Some(h) => d.max(h.min(self.max).mul_f64(1.0 + self.jitter * unit_random())),
            None => d,
        }
    }
}

/// The retry hint a refusal carries, if any.
pub fn retry_hint(status: &tonic::Status) -> Option<Duration> {
    let ms: u64 = status
        .metadata()
        .get(RETRY_PUSHBACK)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// `status` with a retry hint of `after` attached.
pub fn with_retry_hint(mut status: tonic::Status, after: Duration) -> tonic::Status {
    if let Ok(v) = after.as_millis().to_string().parse() {
        status.metadata_mut().insert(RETRY_PUSHBACK, v);
    }
    status
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

    #[test]
    fn a_hint_is_waited_at_least_and_spread() {
        let mut b = Backoff::default();
        for _ in 0..20 {
            b.reset();
            let d = b.next_delay_with(Some(Duration::from_secs(5)));
            assert!(
                d >= Duration::from_secs(5) && d <= Duration::from_secs(6),
                "{d:?}"
            );
        }
        b.reset();
        assert!(b.next_delay_with(None) <= Duration::from_millis(1200));
        let huge = b.next_delay_with(Some(Duration::MAX));
        assert!(huge <= Duration::from_secs(144), "capped: {huge:?}");
    }

    #[test]
    fn the_hint_round_trips_through_a_status() {
        let st = with_retry_hint(tonic::Status::unavailable("busy"), Duration::from_millis(2500));
        assert_eq!(retry_hint(&st), Some(Duration::from_millis(2500)));
        assert_eq!(st.message(), "busy");
        assert_eq!(retry_hint(&tonic::Status::unavailable("busy")), None);
    }
}
