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

/// The longest label selector accepted (`--blocking-pod-selector`).
pub const MAX_SELECTOR: usize = 1024;

/// Why a Kubernetes label selector was refused: one line naming the part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("the selector is empty")]
    Empty,
    #[error("the selector is over {MAX_SELECTOR} characters")]
    TooLong,
    #[error("{0}")]
    Label(#[from] LabelError),
    #[error("at {part:?}: expected {expected}")]
    Syntax { part: String, expected: &'static str },
}

/// One requirement of a label selector, as Kubernetes reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key`
    Exists(String),
    /// `!key`
    Absent(String),
    /// `key=value` (or `==`)
    Equals(String, String),
    /// `key!=value`
    NotEquals(String, String),
    /// `key in (a,b)`
    In(String, Vec<String>),
    /// `key notin (a,b)`
    NotIn(String, Vec<String>),
}

impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::Absent(k) => write!(f, "!{k}"),
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(",")),
        }
    }
}

impl Requirement {
    /// Whether `labels` meet it (Kubernetes' semantics: `!=` and `notin`
    /// also match a missing key).
    pub fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
        }
    }
}

/// A Kubernetes label selector (`k=v,k2 in (a,b),!k3`): every requirement
/// must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

impl std::fmt::Display for LabelSelector {
    /// The canonical form, as the tenant API is given it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join(","))
    }
}

impl LabelSelector {
    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }
}

/// A token of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Not,
    Eq,
    NotEq,
    Open,
    Close,
    Comma,
}

fn tokens(s: &str) -> Result<Vec<Tok>, SelectorError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            ',' | '(' | ')' => {
                chars.next();
                out.push(match c {
                    ',' => Tok::Comma,
                    '(' => Tok::Open,
                    _ => Tok::Close,
                });
            }
            '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                out.push(Tok::Eq);
            }
            '!' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    out.push(Tok::NotEq);
                } else {
                    out.push(Tok::Not);
                }
            }
            '<' | '>' => {
                return Err(SelectorError::Syntax {
                    part: c.to_string(),
                    expected: "=, ==, !=, in or notin (< and > are not supported)",
                });
            }
            _ => {
                let mut w = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || ",()=!<>".contains(c) {
                        break;
                    }
                    w.push(c);
                    chars.next();
                }
                out.push(Tok::Word(w));
            }
        }
    }
    Ok(out)
}

fn key(k: &str) -> Result<String, SelectorError> {
    validate_label(k, "")?;
    Ok(k.to_string())
}

fn value(k: &str, v: &str) -> Result<String, SelectorError> {
    validate_label(k, v)?;
    Ok(v.to_string())
}

fn syntax(part: Option<&Tok>, expected: &'static str) -> SelectorError {
    let part = match part {
        None => "the end".to_string(),
        Some(Tok::Word(w)) => w.clone(),
        Some(Tok::Not) => "!".into(),
        Some(Tok::Eq) => "=".into(),
        Some(Tok::NotEq) => "!=".into(),
        Some(Tok::Open) => "(".into(),
        Some(Tok::Close) => ")".into(),
        Some(Tok::Comma) => ",".into(),
    };
    SelectorError::Syntax { part, expected }
}

/// Parses a Kubernetes label selector: requirements joined by `,`, each
/// `key`, `!key`, `key=value` (`==`), `key!=value`, `key in (v1,v2)` or
/// `key notin (v1,v2)`; keys and values follow the label rules.
pub fn parse_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    if s.len() > MAX_SELECTOR {
        return Err(SelectorError::TooLong);
    }
    let toks = tokens(s)?;
    if toks.is_empty() {
        return Err(SelectorError::Empty);
    }
    let mut it = toks.iter().peekable();
    let mut out = Vec::new();
    loop {
        let r = match it.next() {
            Some(Tok::Not) => match it.next() {
                Some(Tok::Word(k)) => Requirement::Absent(key(k)?),
                t => return Err(syntax(t, "a key after !")),
            },
            Some(Tok::Word(k)) => {
                let k = key(k)?;
                match it.peek() {
                    None | Some(Tok::Comma) => Requirement::Exists(k),
                    Some(Tok::Eq) | Some(Tok::NotEq) => {
                        let eq = it.next() == Some(&Tok::Eq);
                        let v = match it.peek() {
                            Some(Tok::Word(v)) => {
                                it.next();
                                value(&k, v)?
                            }
                            None | Some(Tok::Comma) => String::new(),
                            t => return Err(syntax(t.copied(), "a value")),
                        };
                        if eq {
                            Requirement::Equals(k, v)
                        } else {
                            Requirement::NotEquals(k, v)
                        }
                    }
                    Some(Tok::Word(op)) if op == "in" || op == "notin" => {
                        let is_in = op == "in";
                        it.next();
                        let vs = set(&k, &mut it)?;
                        if is_in {
                            Requirement::In(k, vs)
                        } else {
                            Requirement::NotIn(k, vs)
                        }
                    }
                    t => return Err(syntax(t.copied(), "=, ==, !=, in, notin, or , after a key")),
                }
            }
            t => return Err(syntax(t, "a key or !key")),
        };
        out.push(r);
        match it.next() {
            None => break,
            Some(Tok::Comma) => {}
            t => return Err(syntax(t, "a , between requirements")),
        }
    }
    Ok(LabelSelector(out))
}

/// `(v1,v2)` after `in` or `notin`: at least one value.
fn set<'a>(
    k: &str,
    it: &mut std::iter::Peekable<impl Iterator<Item = &'a Tok>>,
) -> Result<Vec<String>, SelectorError> {
    match it.next() {
        Some(Tok::Open) => {}
        t => return Err(syntax(t, "( after in or notin")),
    }
    let mut vs = Vec::new();
    loop {
        match it.next() {
            Some(Tok::Word(v)) => vs.push(value(k, v)?),
            t => return Err(syntax(t, "a value in ( )")),
        }
        match it.next() {
            Some(Tok::Comma) => {}
            Some(Tok::Close) => return Ok(vs),
            t => return Err(syntax(t, ", or ) in ( )")),
        }
    }
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
    #[test]
    fn selectors_parse_as_kubernetes_reads_them() {
        let s = parse_selector(" app = db ,tier in (a, b),!legacy, zone notin (x), owner, env!=prod,k==v")
            .unwrap();
        assert_eq!(
            s.to_string(),
            "app=db,tier in (a,b),!legacy,zone notin (x),owner,env!=prod,k=v"
        );
        assert_eq!(parse_selector(&s.to_string()).unwrap(), s);
        let l = |s: &str| parse_labels(s).unwrap();
        assert!(s.matches(&l("app=db,tier=a,owner=me,k=v")));
        assert!(!s.matches(&l("app=db,tier=c,owner=me,k=v")));
        assert!(!s.matches(&l("app=db,tier=a,owner=me,k=v,legacy=1")));
        assert!(!s.matches(&l("app=db,tier=a,owner=me,k=v,env=prod")));
        assert!(!s.matches(&l("app=db,tier=a,k=v")));
        assert!(parse_selector("a=").unwrap().matches(&l("a=")));
        assert!(parse_selector("example.com/role=x").is_ok());
    }

    #[test]
    fn bad_selectors_are_refused_in_one_line() {
        for (bad, want) in [
            ("", "the selector is empty"),
            ("a=b,", "at \"the end\": expected a key or !key"),
            ("a in b", "at \"b\": expected ( after in or notin"),
            ("a in ()", "at \")\": expected a value in ( )"),
            ("a in (b", "at \"the end\": expected , or ) in ( )"),
            ("a b", "at \"b\": expected =, ==, !=, in, notin, or , after a key"),
            (
                "a>1",
                "at \">\": expected =, ==, !=, in or notin (< and > are not supported)",
            ),
            ("a=b=c", "at \"=\": expected a , between requirements"),
        ] {
            assert_eq!(parse_selector(bad).unwrap_err().to_string(), want, "{bad}");
        }
        assert!(
            parse_selector("-a=b")
                .unwrap_err()
                .to_string()
                .contains("invalid label key")
        );
        assert!(
            parse_selector("a=-b")
                .unwrap_err()
                .to_string()
                .contains("invalid label value")
        );
        assert_eq!(
            parse_selector(&"a".repeat(MAX_SELECTOR + 1)).unwrap_err(),
            SelectorError::TooLong
        );
    }
}
