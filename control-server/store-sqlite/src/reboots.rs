//! Reboot policies (a JSON column of the cluster's row) and reboot locks
//! (one row per cluster: the lock as JSON and a revision each write bumps)
//! on SQLite.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use lks_store::{EventRow, Kind, LockAt, RebootLock, RebootPolicy, RebootStore, Result, StoreError};

use crate::{SqliteStore, insert_event};

/// A reboot policy from its column: the default (off) when none was set.
pub(crate) fn decode_policy(json: Option<&str>) -> Result<RebootPolicy> {
    Ok(match json {
        Some(j) => serde_json::from_str(j)?,
        None => RebootPolicy::default(),
    })
}

fn read_lock(c: &Connection, cluster: &str) -> Result<LockAt> {
    let row: Option<(String, i64)> = c
        .query_row(
            "SELECT doc, revision FROM reboot_locks WHERE cluster = ?1",
            [cluster],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match row {
        Some((doc, revision)) => LockAt {
            lock: serde_json::from_str(&doc)?,
            revision,
        },
        None => LockAt::default(),
    })
}

#[async_trait]
impl RebootStore for SqliteStore {
    async fn reboot_lock(&self, cluster: &str) -> Result<LockAt> {
        let cluster = cluster.to_string();
        self.call(move |c| read_lock(c, &cluster)).await
    }

    async fn put_reboot_lock(
        &self,
        cluster: &str,
        lock: &RebootLock,
        revision: i64,
        events: Vec<EventRow>,
    ) -> Result<Option<i64>> {
        let cluster = cluster.to_string();
        let doc = serde_json::to_string(lock)?;
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&cluster], |_| Ok(()))
                .optional()?
                .is_some();
            if !exists {
                return Err(StoreError::not_found(Kind::Cluster, cluster.clone()));
            }
            if read_lock(tx, &cluster)?.revision != revision {
                return Ok(None);
            }
            let next = revision + 1;
            tx.execute(
                "INSERT INTO reboot_locks (cluster, doc, revision) VALUES (?1, ?2, ?3)
                 ON CONFLICT(cluster) DO UPDATE SET doc = ?2, revision = ?3",
                params![cluster, doc, next],
            )?;
            for e in &events {
                insert_event(tx, e)?;
            }
            Ok(Some(next))
        })
        .await
    }

    async fn reboot_locks(&self) -> Result<Vec<(String, LockAt)>> {
        self.call(|c| {
            let rows = c
                .prepare("SELECT cluster, doc, revision FROM reboot_locks ORDER BY cluster")?
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(cluster, doc, revision)| {
                    Ok((
                        cluster,
                        LockAt {
                            lock: serde_json::from_str(&doc)?,
                            revision,
                        },
                    ))
                })
                .collect()
        })
        .await
    }
}
