//! Human output (aligned tables, timestamps) and JSON views, and the one
//! writer of stdout (`out!`, `outln!`, [`print_json`]).

use lks_proto::convert::bundle_state_from_i32;
use lks_proto::pb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

mod bundles;
mod clusters;
mod nodes;
mod rollouts;

pub use bundles::*;
pub use clusters::*;
pub use nodes::*;
pub use rollouts::*;

/// `-o` formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Unix ms as RFC 3339 (UTC, whole seconds); `None` for 0.
pub fn rfc3339_ms(ms: i64) -> Option<String> {
    if ms <= 0 {
        return None;
    }
    rfc3339_s(ms / 1000)
}

pub fn rfc3339_s(s: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(s).ok()?.format(&Rfc3339).ok()
}

/// The `ed25519:…` fingerprint agents name a publisher key by, of raw key
/// bytes as messages carry them; `None` when they are not a key.
pub fn key_fingerprint(raw: &[u8]) -> Option<String> {
    let raw: [u8; 32] = raw.try_into().ok()?;
    lks_proto::sign::PublisherKey::from_bytes(&raw).map(|k| k.fingerprint())
}

/// `s`, or `-` when empty.
pub fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.to_string() }
}

fn or_dash(s: Option<String>) -> String {
    s.unwrap_or_else(|| "-".into())
}

/// Columns padded to their widest cell, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            s.push_str(c);
            if i + 1 < n {
                s.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

pub fn bundle_state_str(v: i32) -> &'static str {
    bundle_state_from_i32(v).map_or("pending", |s| s.as_str())
}

pub use lks_proto::convert::rollout_state_str;

fn labels_json(l: &std::collections::HashMap<String, String>) -> Value {
    let sorted: std::collections::BTreeMap<_, _> = l.iter().collect();
    json!(sorted)
}

pub fn labels_text(l: &std::collections::HashMap<String, String>) -> String {
    let sorted: std::collections::BTreeMap<_, _> = l.iter().collect();
    let s = sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    if s.is_empty() { "-".into() } else { s }
}

/// `-o json`: the value, pretty-printed on stdout.
pub fn print_json(v: &Value) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Writes lksctl's output (what `out!` and `outln!` expand to). A closed
/// pipe means the reader has what it wanted: exit 0 at once. Any other
/// write error is one line and status 1.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("lksctl: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Wall clock in Unix milliseconds (0 if the clock is before 1970), as
/// the server counts time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests;
