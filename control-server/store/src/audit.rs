//! The audit trail: one record per admin call that changed state or was
//! refused trying to — when, which call, on what, with which arguments
//! (secrets redacted by the API before they get here), how it ended and
//! who made it. Append-only: no API call deletes a record; only the
//! retention sweep drops records older than the operator's
//! `--audit-retention`.

use async_trait::async_trait;

use super::Result;

/// Records `list_audit` returns when no limit is asked for.
pub const DEFAULT_AUDIT_LIMIT: u32 = 100;
/// The most records one `list_audit` returns.
pub const MAX_AUDIT_LIMIT: u32 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRow {
    /// Given by the store: increasing in the order records were written.
    pub id: u64,
    pub at_ms: i64,
    /// The call: `CreateCluster`, `StartRollout`, ...
    pub verb: String,
    /// What it acted on: a cluster, a node, `NAME@VERSION`, a rollout id.
    pub target: String,
    /// The arguments as a JSON object, secrets redacted.
    pub args: String,
    /// `ok`, or the code and message it was refused with.
    pub outcome: String,
    /// The admin certificate's name.
    pub caller: String,
    /// `sha256:<hex>` of the caller's certificate (DER).
    pub caller_fingerprint: String,
    /// The replica that served the call.
    pub server: String,
}

/// Which records `list_audit` returns: at or after `since_ms`, of `verb`
/// if given; the newest `limit` of them (0: [`DEFAULT_AUDIT_LIMIT`]),
/// oldest first.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub since_ms: i64,
    pub verb: Option<String>,
    pub limit: u32,
}

impl AuditFilter {
    /// The number of records to return: the default for 0, capped.
    pub fn effective_limit(&self) -> usize {
        (match self.limit {
            0 => DEFAULT_AUDIT_LIMIT,
            n => n.min(MAX_AUDIT_LIMIT),
        }) as usize
    }

    /// Whether `r` passes the filter's time and verb.
    pub fn admits(&self, r: &AuditRow) -> bool {
        r.at_ms >= self.since_ms && self.verb.as_ref().is_none_or(|v| r.verb == *v)
    }
}

#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Appends one record (its `id` is ignored and given by the store).
    async fn append_audit(&self, r: AuditRow) -> Result<()>;
    /// The records `f` admits, oldest first.
    async fn list_audit(&self, f: AuditFilter) -> Result<Vec<AuditRow>>;
    /// Drops the records older than `before_ms` (the retention sweep);
    /// returns how many went.
    async fn prune_audit(&self, before_ms: i64) -> Result<usize>;
}
