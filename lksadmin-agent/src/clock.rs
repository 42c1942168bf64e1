//! Wall-clock time behind a trait, so timestamps are fakeable in tests.

use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Unix milliseconds.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// Unix milliseconds from the system clock (0 if it is before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A Unix-milliseconds time as RFC 3339 (UTC), for logs, events and
/// `lksadmin-agent status`; `"{ms} ms"` for one no calendar date can say.
pub fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// RFC 3339 of a Unix-milliseconds time; "never" for 0.
pub fn when(ms: i64) -> String {
    if ms <= 0 {
        return "never".into();
    }
    rfc3339(ms)
}
