//! Node labels and selectors: `k=v,k2=v2`, with Kubernetes' syntax rules.

use std::collections::BTreeMap;

use crate::limits::MAX_LABELS;
use crate::names::NameError;

pub type Labels = BTreeMap<String, String>;

const WORD_RULE: &str = "use at most 63 of [A-Za-z0-9._-], starting and ending with a letter or digit";

/// Why a label list or one label was refused; each carries the key or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("invalid label {part:?}: expected key=value")]
    NoEquals { part: String },
    #[error("label key {key:?} given twice")]
    Duplicate { key: String },
    #[error("{count} labels; the limit is {MAX_LABELS}")]
    TooMany { count: usize },
    /// The DNS prefix of a key (`example.com/`) is no valid subdomain.
    #[error("invalid label key {key:?}: bad prefix {prefix:?}")]
    Prefix {
        key: String,
        prefix: String,
        #[source]
        source: NameError,
    },
    #[error("invalid label key {key:?}: {WORD_RULE}")]
    Key { key: String },
    #[error("invalid label value {value:?} for {key:?}: {WORD_RULE}")]
    Value { key: String, value: String },
}

/// Parses `k=v,k2=v2` (empty string: no labels). Keys may carry a DNS
/// prefix (`example.com/role`); names and values are at most 63 characters
/// of `[A-Za-z0-9._-]`, values may be empty.
pub fn parse_labels(s: &str) -> Result<Labels, LabelError> {
    let mut out = Labels::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for part in s.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| LabelError::NoEquals { part: part.into() })?;
        validate_label(k, v)?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(LabelError::Duplicate { key: k.into() });
        }
    }
    if out.len() > MAX_LABELS {
        return Err(LabelError::TooMany { count: out.len() });
    }
    Ok(out)
}

/// Checks one label pair.
pub fn validate_label(key: &str, value: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        crate::names::validate_node_name(p).map_err(|source| LabelError::Prefix {
            key: key.into(),
            prefix: p.into(),
            source,
        })?;
    }
    if !is_label_word(name, false) {
        return Err(LabelError::Key { key: key.into() });
    }
    if !is_label_word(value, true) {
        return Err(LabelError::Value {
            key: key.into(),
            value: value.into(),
        });
    }
    Ok(())
}

fn is_label_word(s: &str, may_be_empty: bool) -> bool {
    if s.is_empty() {
        return may_be_empty;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// True if every pair of `selector` is in `labels` (an empty selector matches all).
pub fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// `k=v,k2=v2` in key order.
pub fn format_labels(labels: &Labels) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_match() {
        let l = parse_labels("role=worker,zone=eu-1,example.com/tier=gold").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(format_labels(&l), "example.com/tier=gold,role=worker,zone=eu-1");
        assert!(selector_matches(&parse_labels("role=worker").unwrap(), &l));
        assert!(!selector_matches(&parse_labels("role=master").unwrap(), &l));
        assert!(selector_matches(&Labels::new(), &l));
        assert!(parse_labels("").unwrap().is_empty());
        assert_eq!(parse_labels("a=").unwrap()["a"], "");
    }

    #[test]
    fn rejects() {
        for bad in ["a", "a=b,a=c", "=b", "a b=c", "a=-b", "-a=b", "a=b,", "UPPER/x=1"] {
            assert!(parse_labels(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_are_unchanged_and_carry_the_key() {
        let rule = "use at most 63 of [A-Za-z0-9._-], starting and ending with a letter or digit";
        for (bad, want) in [
            ("a", "invalid label \"a\": expected key=value".to_string()),
            ("a=b,a=c", "label key \"a\" given twice".to_string()),
            (
                "UPPER/x=1",
                "invalid label key \"UPPER/x\": bad prefix \"UPPER\"".to_string(),
            ),
            ("-a=b", format!("invalid label key \"-a\": {rule}")),
            ("a=-b", format!("invalid label value \"-b\" for \"a\": {rule}")),
        ] {
            assert_eq!(parse_labels(bad).unwrap_err().to_string(), want, "{bad}");
        }
        let many = (0..=MAX_LABELS)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            parse_labels(&many).unwrap_err().to_string(),
            format!("{} labels; the limit is {MAX_LABELS}", MAX_LABELS + 1)
        );
        match parse_labels("a=1,b=2,a=3") {
            Err(LabelError::Duplicate { key }) => assert_eq!(key, "a"),
            other => panic!("{other:?}"),
        }
    }
}
