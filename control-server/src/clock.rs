//! The server's wall clock: every time the server stores or compares
//! (token expiry, last-seen, rollout timestamps, events) is Unix
//! milliseconds from [`now_ms`] (the store's clock, `lks_store::clock`),
//! whichever store holds it; [`rfc3339`] is how the server writes one in a
//! message.

pub use lks_store::clock::now_ms;

/// A Unix-milliseconds time as RFC 3339 (UTC), for messages and events;
/// `"{ms} ms"` for one outside what a calendar date can say.
pub fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{ms} ms"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(super::rfc3339(1_795_680_000_000), "2026-11-26T08:00:00Z");
        assert_eq!(super::rfc3339(1_795_680_000_250), "2026-11-26T08:00:00.25Z");
        assert_eq!(super::rfc3339(i64::MAX), format!("{} ms", i64::MAX));
    }
}
