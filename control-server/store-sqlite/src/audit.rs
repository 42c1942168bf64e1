//! The audit trail on SQLite: the `audit` table, ids from AUTOINCREMENT so
//! a pruned record's id is never given again.

use async_trait::async_trait;
use rusqlite::params;

use lks_store::Result;

use crate::SqliteStore;
use lks_store::{AuditFilter, AuditRow, AuditStore};

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append_audit(&self, r: AuditRow) -> Result<()> {
        self.tx(move |tx| {
            tx.execute(
                "INSERT INTO audit (at_ms, verb, target, args, outcome, caller, caller_fingerprint, server)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.at_ms,
                    r.verb,
                    r.target,
                    r.args,
                    r.outcome,
                    r.caller,
                    r.caller_fingerprint,
                    r.server
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn list_audit(&self, f: AuditFilter) -> Result<Vec<AuditRow>> {
        self.call(move |c| {
            let limit = f.effective_limit() as i64;
            let mut stmt = c.prepare(&format!(
                "SELECT {AUDIT_COLUMNS} FROM (
                    SELECT * FROM audit WHERE at_ms >= ?1 AND (?2 IS NULL OR verb = ?2)
                    ORDER BY id DESC LIMIT ?3)
                 ORDER BY id"
            ))?;
            let rows = stmt
                .query_map(params![f.since_ms, f.verb, limit], audit_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn prune_audit(&self, before_ms: i64) -> Result<usize> {
        self.tx(move |tx| Ok(tx.execute("DELETE FROM audit WHERE at_ms < ?1", params![before_ms])?))
            .await
    }
}

/// The columns every audit read selects, in order.
pub(super) const AUDIT_COLUMNS: &str =
    "id, at_ms, verb, target, args, outcome, caller, caller_fingerprint, server";

/// One row of `SELECT AUDIT_COLUMNS FROM audit`.
pub(super) fn audit_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        id: r.get::<_, i64>(0)? as u64,
        at_ms: r.get(1)?,
        verb: r.get(2)?,
        target: r.get(3)?,
        args: r.get(4)?,
        outcome: r.get(5)?,
        caller: r.get(6)?,
        caller_fingerprint: r.get(7)?,
        server: r.get(8)?,
    })
}
