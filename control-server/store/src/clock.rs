//! The store's wall clock: every time a store keeps or compares (token
//! expiry, last-seen, rollout timestamps, events) is Unix milliseconds from
//! here, whichever backend holds it. The server's `clock` re-exports it.

/// Wall clock in Unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
}
