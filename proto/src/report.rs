//! An error as the one line a user reads: the error, then each cause in
//! turn, each said once.
//!
//! Many errors here end their own text with their cause's (`read {path}:
//! {source}`) and keep the cause as their source too, so that a caller can
//! walk the chain; anyhow's `{:#}` would then print that cause twice.

use std::error::Error;

/// `e` and its causes joined by ": ", leaving out a cause whose text an
/// earlier part already holds.
pub fn one_line(e: &(dyn Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("{what}: {source}")]
    struct Says {
        what: &'static str,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{what}")]
    struct Keeps {
        what: &'static str,
        #[source]
        source: Says,
    }

    fn io() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    /// A cause the error already shows is not said again.
    #[test]
    fn a_cause_in_the_text_is_said_once() {
        let e = Says {
            what: "read /a",
            source: io(),
        };
        assert_eq!(one_line(&e), "read /a: no such file");
    }

    /// A cause the error does not show follows it.
    #[test]
    fn a_cause_not_in_the_text_follows_it() {
        let e = Keeps {
            what: "load config",
            source: Says {
                what: "read /a",
                source: io(),
            },
        };
        assert_eq!(one_line(&e), "load config: read /a: no such file");
    }
}
