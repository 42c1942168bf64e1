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

/// Trailer with which a replica that holds more than its share of agents
/// names the replica (one of the agent's own server URLs) to reconnect to.
pub const RECONNECT_TO: &str = "lks-reconnect-to";

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

/// The replica a status asks the client to reconnect to, if any.
pub fn reconnect_hint(status: &tonic::Status) -> Option<String> {
    let url = status.metadata().get(RECONNECT_TO)?.to_str().ok()?.trim();
    (!url.is_empty()).then(|| url.to_string())
}

/// `status` naming `url` as the replica to reconnect to.
pub fn with_reconnect_hint(mut status: tonic::Status, url: &str) -> tonic::Status {
    if let Ok(v) = url.parse() {
        status.metadata_mut().insert(RECONNECT_TO, v);
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

/// Which server to try next, and when to back off: the next replica is
/// tried at once after a failed attempt, and the backoff is waited only once
/// every server has failed in turn, or after a session that was up (so a
/// server that accepts and then drops the stream is not hammered). With one
/// server this is plain reconnect-with-backoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    len: usize,
    current: usize,
    /// Failed attempts since the last backoff.
    failed: usize,
}

impl Rotation {
    pub fn new(len: usize) -> Self {
        Rotation::starting_at(len, 0)
    }

    /// Server `start` first (a fleet that does not all try the first
    /// server of the same list first).
    pub fn starting_at(len: usize, start: usize) -> Self {
        let len = len.max(1);
        Rotation {
            len,
            current: start % len,
            failed: 0,
        }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    /// Goes to server `i` next (a replica the last one sent us to), as
    /// after a session that was up.
    pub fn jump(&mut self, i: usize) {
        self.current = i % self.len;
        self.failed = 0;
    }

    /// Moves on after the attempt at the current server ended; true if the
    /// backoff is due before the next attempt. After a stream that was up,
    /// the next server is one of the others picked at random, not the next
    /// in the list: the agents of a replica that dies spread evenly over
    /// the survivors instead of all landing on the one after it in their
    /// lists (which then admits them alone, at half the region's rate,
    /// and hands the excess on later). After a failed attempt it is the
    /// next in the list, so every server gets its try before a backoff.
    pub fn advance(&mut self, was_connected: bool) -> bool {
        self.advance_by(was_connected, unit_random())
    }

    /// [`Self::advance`] with the random pick given: `r` in [0, 1).
    fn advance_by(&mut self, was_connected: bool, r: f64) -> bool {
        let step = if was_connected && self.len > 2 {
            let others = self.len - 1;
            1 + ((r * others as f64) as usize).min(others - 1)
        } else {
            1
        };
        self.current = (self.current + step) % self.len;
        if was_connected {
            self.failed = 0;
            return true;
        }
        self.failed += 1;
        if self.failed >= self.len {
            self.failed = 0;
            return true;
        }
        false
    }
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
    fn the_reconnect_hint_round_trips_through_a_status() {
        let st = with_reconnect_hint(tonic::Status::unavailable("move"), "https://b:7443");
        assert_eq!(reconnect_hint(&st).as_deref(), Some("https://b:7443"));
        assert_eq!(reconnect_hint(&tonic::Status::unavailable("x")), None);
    }

    #[test]
    fn the_hint_round_trips_through_a_status() {
        let st = with_retry_hint(tonic::Status::unavailable("busy"), Duration::from_millis(2500));
        assert_eq!(retry_hint(&st), Some(Duration::from_millis(2500)));
        assert_eq!(st.message(), "busy");
        assert_eq!(retry_hint(&tonic::Status::unavailable("busy")), None);
    }

    /// `(server tried, backoff before the next)` for each outcome.
    fn trace(len: usize, outcomes: &[bool]) -> Vec<(usize, bool)> {
        let mut r = Rotation::new(len);
        outcomes
            .iter()
            .map(|&connected| {
                let at = r.current();
                (at, r.advance_by(connected, 0.0))
            })
            .collect()
    }

    #[test]
    fn one_server_backs_off_after_every_attempt() {
        assert_eq!(
            trace(1, &[false, false, true, false]),
            [(0, true), (0, true), (0, true), (0, true)]
        );
    }

    #[test]
    fn failures_go_round_the_list_then_back_off() {
        assert_eq!(
            trace(3, &[false, false, false, false, false, false]),
            [
                (0, false),
                (1, false),
                (2, true),
                (0, false),
                (1, false),
                (2, true)
            ]
        );
    }

    #[test]
    fn a_dropped_session_moves_on_and_starts_a_new_round() {
        // Up on 1, dropped: back off, then 2, 0 and 1 each get a try before
        // the next backoff.
        assert_eq!(
            trace(3, &[false, true, false, false, false]),
            [(0, false), (1, true), (2, false), (0, false), (1, true)]
        );
    }

    #[test]
    fn a_dropped_session_goes_to_any_other_server_at_random() {
        let mut landed = [0usize; 4];
        for _ in 0..4000 {
            let mut r = Rotation::new(4);
            r.jump(2);
            assert!(r.advance(true));
            landed[r.current()] += 1;
        }
        assert_eq!(landed[2], 0, "never the server that dropped it: {landed:?}");
        for i in [0, 1, 3] {
            assert!(
                (1100..1570).contains(&landed[i]),
                "about a third each: {landed:?}"
            );
        }
        // The ends of the pick's range.
        let mut r = Rotation::new(3);
        r.advance_by(true, 0.0);
        assert_eq!(r.current(), 1);
        r.advance_by(true, 0.999_999);
        assert_eq!(r.current(), 0);
        // Two servers: the other one.
        let mut r = Rotation::new(2);
        r.advance(true);
        assert_eq!(r.current(), 1);
    }

    #[test]
    fn a_move_goes_to_the_named_server_then_round_the_list() {
        let mut r = Rotation::new(3);
        r.advance_by(true, 0.0);
        assert_eq!(r.current(), 1);
        // Told to move to 0: 0 is next; if it fails, 1 and 2 get a try.
        r.jump(0);
        assert_eq!(r.current(), 0);
        assert!(!r.advance(false));
        assert_eq!(r.current(), 1);
        assert!(!r.advance(false));
        assert!(r.advance(false), "every server failed in turn: back off");
    }
}
