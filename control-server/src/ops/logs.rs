//! What an operator reads of the logs: the event log (`ListEvents`, at
//! most [`MAX_EVENT_LIMIT`] a call) and the audit trail (`ListAudit`, its
//! limit and verb filter checked).

use super::event::clip;
use super::{Kind, OpError};
use crate::store::{AuditFilter, AuditRow, AuditStore, EventFilter, EventRow, EventStore, MAX_AUDIT_LIMIT};

/// Most events one `ListEvents` answers; a larger limit is cut to it.
pub const MAX_EVENT_LIMIT: u32 = 10_000;
/// Longest verb name accepted in a `ListAudit` filter.
const MAX_VERB: usize = 64;

/// Why a read of the audit trail was refused.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("limit {0} is over the maximum of {MAX_AUDIT_LIMIT}")]
    AuditLimit(u32),
    /// `verb` clipped to [`MAX_VERB`] bytes.
    #[error("verb {0:?}: a call name such as StartRollout")]
    Verb(String),
}

impl LogsError {
    pub fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// The events `filter` matches, newest first, at most [`MAX_EVENT_LIMIT`].
pub async fn events(
    store: &(impl EventStore + ?Sized),
    filter: EventFilter,
) -> Result<Vec<EventRow>, OpError> {
    let filter = EventFilter {
        limit: filter.limit.min(MAX_EVENT_LIMIT),
        ..filter
    };
    Ok(store.list_events(filter).await?)
}

/// The audit records `filter` matches; `verb` (empty: any) must be a
/// call name.
pub async fn audit(
    store: &(impl AuditStore + ?Sized),
    since_ms: i64,
    verb: String,
    limit: u32,
) -> Result<Vec<AuditRow>, OpError> {
    if limit > MAX_AUDIT_LIMIT {
        return Err(LogsError::AuditLimit(limit).into());
    }
    if verb.len() > MAX_VERB || !verb.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(LogsError::Verb(clip(&verb, MAX_VERB).to_string()).into());
    }
    let filter = AuditFilter {
        since_ms,
        verb: (!verb.is_empty()).then_some(verb),
        limit,
    };
    Ok(store.list_audit(filter).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn an_audit_query_over_the_limit_or_with_a_bad_verb_is_refused() {
        let store = SqliteStore::open_in_memory().unwrap();
        let e = audit(&store, 0, "Bad Verb".into(), MAX_AUDIT_LIMIT + 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), Some(Kind::Invalid));
        assert_eq!(
            e.to_string(),
            format!(
                "limit {} is over the maximum of {MAX_AUDIT_LIMIT}",
                MAX_AUDIT_LIMIT + 1
            )
        );
        let e = audit(&store, 0, "Bad Verb".into(), 10).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "verb \"Bad Verb\": a call name such as StartRollout"
        );
        let e = audit(&store, 0, "x".repeat(100), 10).await.unwrap_err();
        assert!(
            matches!(e, OpError::Logs(LogsError::Verb(ref v)) if v.len() == MAX_VERB),
            "{e}"
        );
        assert!(
            audit(&store, 0, "StartRollout".into(), 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(audit(&store, 0, String::new(), 0).await.unwrap().is_empty());
    }
}
