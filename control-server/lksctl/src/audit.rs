//! `lksctl audit`: the audit trail — every admin call that changed state
//! or was refused trying to, with who made it (the admin certificate's
//! name and fingerprint) and how it ended. Oldest first.

use anyhow::{Context, bail};
use lks_proto::duration::parse_duration;
use lks_proto::pb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::client::{Client, status};
use crate::output::{self, Format, now_ms, print_json, rfc3339_ms, table};

/// The arguments of `lksctl audit`.
#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only records from this long ago (e.g. 24h, 7d) or since this time
    /// (RFC 3339, e.g. 2026-11-26T08:00:00Z).
    #[arg(long, value_name = "DURATION|TIME")]
    since: Option<String>,
    /// Only this call, e.g. StartRollout, HoldNode, DeleteBundle.
    #[arg(long, default_value = "")]
    verb: String,
    /// The newest this many records (0: server default, 100; at most 10000).
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    output: Format,
}

/// `--since`: a duration back from now, or an RFC 3339 time; Unix ms.
fn since_ms(v: &str, now_ms: i64) -> anyhow::Result<i64> {
    if let Ok(d) = parse_duration(v) {
        return Ok(now_ms
            .saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .max(0));
    }
    match OffsetDateTime::parse(v, &Rfc3339) {
        Ok(t) => Ok((t.unix_timestamp_nanos() / 1_000_000) as i64),
        Err(_) => {
            bail!("--since {v:?}: expected a duration such as 24h or a time such as 2026-11-26T08:00:00Z")
        }
    }
}

pub async fn run(c: &mut Client, url: &str, a: AuditArgs) -> anyhow::Result<()> {
    let since = match &a.since {
        Some(v) => since_ms(v, now_ms())?,
        None => 0,
    };
    let r = c
        .list_audit(pb::ListAuditRequest {
            since_ms: since,
            verb: a.verb,
            limit: a.limit,
        })
        .await
        .map_err(|s| status(url, s))
        .context("list the audit trail")?
        .into_inner();
    if a.output == Format::Json {
        print_json(&json!(r.records.iter().map(record_json).collect::<Vec<_>>()))?;
    } else {
        out!("{}", records_table(&r.records));
    }
    Ok(())
}

/// One record as `-o json` prints it; `args` is the JSON object itself.
pub fn record_json(r: &pb::AuditRecord) -> Value {
    json!({
        "id": r.id,
        "at": rfc3339_ms(r.at_ms),
        "verb": r.verb,
        "target": r.target,
        "args": serde_json::from_str::<Value>(&r.args).unwrap_or_else(|_| Value::String(r.args.clone())),
        "outcome": r.outcome,
        "caller": r.caller,
        "caller_fingerprint": r.caller_fingerprint,
        "server": r.server,
    })
}

pub fn records_table(rs: &[pb::AuditRecord]) -> String {
    let rows: Vec<Vec<String>> = rs
        .iter()
        .map(|r| {
            vec![
                rfc3339_ms(r.at_ms).unwrap_or_else(|| "-".into()),
                r.verb.clone(),
                output::dash(&r.target),
                r.outcome.clone(),
                format!("{} ({})", r.caller, short(&r.caller_fingerprint)),
                if r.args == "{}" {
                    "-".into()
                } else {
                    r.args.clone()
                },
            ]
        })
        .collect();
    table(&["TIME", "VERB", "TARGET", "OUTCOME", "CALLER", "ARGS"], &rows)
}

/// `sha256:0123456789ab…`: enough to tell credentials apart in a table.
fn short(fingerprint: &str) -> String {
    match fingerprint.char_indices().nth(19) {
        Some((i, _)) => format!("{}…", &fingerprint[..i]),
        None => fingerprint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_or_a_time() {
        assert_eq!(since_ms("1h", 10_000_000).unwrap(), 10_000_000 - 3_600_000);
        assert_eq!(since_ms("7d", 1_000).unwrap(), 0, "never before 1970");
        assert_eq!(since_ms("2026-11-26T08:00:00Z", 0).unwrap(), 1_795_680_000_000);
        let e = since_ms("yesterday", 0).unwrap_err().to_string();
        assert!(e.starts_with("--since \"yesterday\": expected"), "{e}");
    }

    #[test]
    fn records_print_their_arguments_as_json_and_a_short_fingerprint() {
        let r = pb::AuditRecord {
            id: 7,
            at_ms: 1_795_680_000_000,
            verb: "HoldNode".into(),
            target: "n1".into(),
            args: r#"{"reason":"disk"}"#.into(),
            outcome: "ok".into(),
            caller: "admin".into(),
            caller_fingerprint: format!("sha256:{}", "ab".repeat(32)),
            server: "https://s:7443".into(),
        };
        let j = record_json(&r);
        assert_eq!(j["args"]["reason"], "disk");
        assert_eq!(j["at"], "2026-11-26T08:00:00Z");
        let t = records_table(&[r]);
        assert!(t.contains("admin (sha256:abababababab…)"), "{t}");
        assert!(t.lines().next().unwrap().starts_with("TIME"));
    }
}
