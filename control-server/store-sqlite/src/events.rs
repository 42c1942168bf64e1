//! The event log on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use lks_store::{EventFilter, EventRow, EventStore, Result};

use crate::{DEFAULT_EVENT_LIMIT, SqliteStore, event_row, insert_event};

#[async_trait]
impl EventStore for SqliteStore {
    async fn add_event(&self, e: EventRow) -> Result<()> {
        self.tx(move |tx| insert_event(tx, &e)).await
    }

    async fn list_events(&self, f: EventFilter) -> Result<Vec<EventRow>> {
        self.call(move |c| {
            let limit = if f.limit == 0 { DEFAULT_EVENT_LIMIT } else { f.limit };
            let mut stmt = c.prepare(
                "SELECT id, at_ms, cluster, node, rollout_id, kind, bundle, version, message FROM (
                    SELECT * FROM events
                    WHERE (?1 IS NULL OR cluster = ?1) AND (?2 IS NULL OR node = ?2) AND (?3 IS NULL OR rollout_id = ?3)
                    ORDER BY id DESC LIMIT ?4)
                 ORDER BY id",
            )?;
            let rows = stmt
                .query_map(params![f.cluster, f.node, f.rollout_id, limit], event_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
