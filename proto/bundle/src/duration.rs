//! Durations as operators write them: `500ms`, `60s`, `5m`, `1h30m`, `7d`.

use std::time::Duration;

/// A duration that is not `<integer><unit>` parts; carries the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: expected e.g. \"500ms\", \"60s\", \"5m\", \"1h30m\", \"7d\"")]
pub struct DurationError {
    pub input: String,
}

/// Parses a duration made of one or more `<integer><unit>` parts, units
/// `ms`, `s`, `m`, `h`, `d`. A bare number is refused: the unit is never guessed.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError { input: s.into() };
    if s.is_empty() {
        return Err(bad());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 12 {
            return Err(bad());
        }
        let n: u128 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('d') {
            (86_400_000, 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += n * unit_ms;
    }
    u64::try_from(total).map(Duration::from_millis).map_err(|_| bad())
}

/// Formats a duration in the largest exact units (`90s` → `1m30s`).
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, name) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ] {
        if ms >= unit {
            out.push_str(&format!("{}{name}", ms / unit));
            ms %= unit;
        }
    }
    out
}

/// `#[serde(with = "lks_proto::duration::millis")]`: a duration stored as
/// whole milliseconds, the unit the wire contract uses.
pub mod millis {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        <u64 as serde::Deserialize>::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86400));
        for bad in ["", "60", "s", "1x", "1h 2m", "-1s", "1.5s", "99999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_duration("1x").unwrap_err().to_string(),
            "invalid duration \"1x\": expected e.g. \"500ms\", \"60s\", \"5m\", \"1h30m\", \"7d\""
        );
        assert_eq!(parse_duration("1h 2m").unwrap_err().input, "1h 2m");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
