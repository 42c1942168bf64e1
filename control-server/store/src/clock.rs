//! The store's wall clock: every time a store keeps or compares (token
//! expiry, last-seen, rollout timestamps, events) is Unix milliseconds from
//! here, whichever backend holds it; [`rfc3339`] is how one is written in a
//! message. The server's `clock` re-exports both.

/// Wall clock in Unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

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
    fn the_clock_is_unix_milliseconds() {
        let before = super::now_ms();
        // 2020-01-01 in Unix ms; any machine running this is later.
        assert!(before > 1_577_836_800_000, "{before}");
        assert!(super::now_ms() >= before);
    }

    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(super::rfc3339(1_795_680_000_000), "2026-11-26T08:00:00Z");
        assert_eq!(super::rfc3339(1_795_680_000_250), "2026-11-26T08:00:00.25Z");
        assert_eq!(super::rfc3339(i64::MAX), format!("{} ms", i64::MAX));
    }
}
