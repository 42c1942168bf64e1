//! Transfer rates as operators write them (`cluster set --peer-upload-rate
//! 200Mbit`, `LksCluster.spec.peerSharing.uploadRate`): bytes per second.

/// A rate that [`parse_rate`] refused: the text given and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?}: {problem}")]
pub struct RateError {
    pub input: String,
    pub problem: RateProblem,
}

/// What is wrong with a rate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateProblem {
    #[error("not a rate; give bytes per second, e.g. 52428800, 50MiB or 400Mbit")]
    NotARate,
    /// A lone `b` after a prefix (`Mb`): bytes or bits?
    #[error("{unit} is ambiguous: write {prefix}B for bytes or {prefix}bit for bits")]
    Ambiguous { unit: String, prefix: String },
    #[error("unknown unit {unit:?}; use B, KB, MB, GB, KiB, MiB, GiB or bit, Kbit, Mbit, Gbit")]
    UnknownUnit { unit: String },
    #[error("not a number")]
    NotANumber,
    #[error("too large")]
    TooLarge,
    #[error("less than 1 byte per second; give 0 for no cap")]
    BelowOneByte,
}

/// A rate in bytes per second: a plain number of bytes, or a number
/// (decimals allowed) with a unit of bytes (`B`, `KB` `MB` `GB` `TB`:
/// powers of 1000; `KiB` `MiB` `GiB` `TiB`: powers of 1024) or bits (`bit`,
/// `Kbit` `Mbit` `Gbit` `Tbit`: powers of 1000, divided by 8), with an
/// optional `/s`. `0` is no cap. Units are matched ignoring case, but a
/// lone `b` after a prefix (`Mb`) is refused: bytes or bits?
pub fn parse_rate(s: &str) -> Result<u64, RateError> {
    let bad = |problem: RateProblem| RateError {
        input: s.into(),
        problem,
    };
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t).trim_end();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return Err(bad(RateProblem::NotARate));
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let lower = unit.to_ascii_lowercase();
    let prefix_b = lower.len() == 2 && unit.ends_with('b') && !unit.ends_with("ib");
    if prefix_b {
        return Err(bad(RateProblem::Ambiguous {
            unit: unit.into(),
            prefix: unit[..1].to_ascii_uppercase(),
        }));
    }
    // Bytes per second = number × mul / div.
    let (mul, div): (u128, u128) = match lower.as_str() {
        "" | "b" => (1, 1),
        "k" | "kb" => (1_000, 1),
        "m" | "mb" => (1_000_000, 1),
        "g" | "gb" => (1_000_000_000, 1),
        "t" | "tb" => (1_000_000_000_000, 1),
        "ki" | "kib" => (1 << 10, 1),
        "mi" | "mib" => (1 << 20, 1),
        "gi" | "gib" => (1 << 30, 1),
        "ti" | "tib" => (1 << 40, 1),
        "bit" => (1, 8),
        "kbit" => (1_000, 8),
        "mbit" => (1_000_000, 8),
        "gbit" => (1_000_000_000, 8),
        "tbit" => (1_000_000_000_000, 8),
        _ => {
            return Err(bad(RateProblem::UnknownUnit { unit: unit.into() }));
        }
    };
    if int.len() + frac.len() > 30 {
        return Err(bad(RateProblem::TooLarge));
    }
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| bad(RateProblem::NotANumber))?;
    let scale = 10u128.pow(frac.len() as u32);
    let bytes = digits
        .checked_mul(mul)
        .map(|n| n / (scale * div))
        .ok_or_else(|| bad(RateProblem::TooLarge))?;
    let bytes = u64::try_from(bytes).map_err(|_| bad(RateProblem::TooLarge))?;
    if bytes == 0 && digits != 0 {
        return Err(bad(RateProblem::BelowOneByte));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_bytes_per_second() {
        for (s, want) in [
            ("0", 0),
            ("0MiB", 0),
            ("1", 1),
            ("52428800", 52_428_800),
            ("50MiB", 50 << 20),
            ("50 MiB/s", 50 << 20),
            ("50mib", 50 << 20),
            ("1.5GiB", 3 << 29),
            ("10KiB", 10_240),
            ("20MB", 20_000_000),
            ("20M", 20_000_000),
            ("200Mbit", 25_000_000),
            ("1Gbit/s", 125_000_000),
            ("8bit", 1),
            ("100B", 100),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_rate(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn bad_rates_are_refused_in_one_line() {
        for (s, why) in [
            ("", "not a rate"),
            ("MiB", "not a rate"),
            ("-5", "not a rate"),
            ("1.", "not a rate"),
            ("1.2.3MiB", "not a rate"),
            ("50Mb", "ambiguous: write MB for bytes or Mbit for bits"),
            ("50kb", "ambiguous"),
            ("50 parsecs", "unknown unit"),
            ("1bit", "give 0 for no cap"),
            ("18446744073709551616", "too large"),
            ("20000000TiB", "too large"),
            ("1234567890123456789012345678901", "too large"),
        ] {
            let e = parse_rate(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn errors_name_the_input_and_the_problem() {
        assert_eq!(
            parse_rate("50Mb").unwrap_err().to_string(),
            "\"50Mb\": Mb is ambiguous: write MB for bytes or Mbit for bits"
        );
        assert_eq!(
            parse_rate("50 parsecs").unwrap_err().problem,
            RateProblem::UnknownUnit {
                unit: "parsecs".into()
            }
        );
    }
}
