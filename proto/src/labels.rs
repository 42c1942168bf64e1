//! Node labels and selectors: `k=v,k2=v2`, with Kubernetes' syntax rules.

use std::collections::BTreeMap;

use crate::limits::MAX_LABELS;

pub type Labels = BTreeMap<String, String>;

/// Parses `k=v,k2=v2` (empty string: no labels). Keys may carry a DNS
/// prefix (`example.com/role`); names and values are at most 63 characters
/// of `[A-Za-z0-9._-]`, values may be empty.
pub fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut out = Labels::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for part in s.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("invalid label {part:?}: expected key=value"))?;
        validate_label(k, v)?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("label key {k:?} given twice"));
        }
    }
    if out.len() > MAX_LABELS {
        return Err(format!("{} labels; the limit is {MAX_LABELS}", out.len()));
    }
    Ok(out)
}

/// Checks one label pair.
pub fn validate_label(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        crate::names::validate_node_name(p)
            .map_err(|_| format!("invalid label key {key:?}: bad prefix {p:?}"))?;
    }
    if !is_label_word(name, false) {
        return Err(format!(
            "invalid label key {key:?}: use at most 63 of [A-Za-z0-9._-], starting and ending with a letter or digit"
        ));
    }
    if !is_label_word(value, true) {
        return Err(format!(
            "invalid label value {value:?} for {key:?}: use at most 63 of [A-Za-z0-9._-], starting and ending with a letter or digit"
        ));
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
}
