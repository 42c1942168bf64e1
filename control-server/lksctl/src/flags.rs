//! Flag values several verbs and the console check the same way, each
//! error naming the flag (or form field) it came from.

use anyhow::Context as _;
use lks_proto::labels::{Labels, parse_labels};

/// `k=v,…` labels or a selector, an error naming `flag`.
pub fn labels(flag: &str, s: &str) -> anyhow::Result<Labels> {
    parse_labels(s).with_context(|| flag.to_string())
}
