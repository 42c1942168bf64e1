//! [`BlobRecords`] on SQLite: one transaction per call, which also settles
//! "no bundle references it" atomically when a blob is marked for deletion.

use std::collections::HashSet;

use async_trait::async_trait;
use lks_proto::Digest;
use rusqlite::{Connection, Transaction};
use rusqlite::{OptionalExtension, params};

use lks_store::{Kind, Result, StoreError};

use crate::{SqliteStore, read_rollouts};
use lks_store::blobrecs::{BlobRecord, BlobRecords, BundleUsers, RecordAt};

/// The next revision of the blob records' counter.
fn next_rev(tx: &Transaction<'_>) -> Result<i64> {
    let rev: i64 = tx
        .query_row("SELECT value FROM meta WHERE key = 'blob_rev'", [], |r| r.get(0))
        .optional()?
        .unwrap_or(0)
        + 1;
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('blob_rev', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![rev],
    )?;
    Ok(rev)
}

fn record_at(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, BlobRecord, i64)> {
    Ok((
        r.get(0)?,
        BlobRecord {
            size: r.get::<_, i64>(1)? as u64,
            claimed_at_ms: r.get(2)?,
            deleting: r.get(3)?,
            owner: r.get(4)?,
        },
        r.get(5)?,
    ))
}

fn parse(d: String, record: BlobRecord, rev: i64) -> Result<RecordAt> {
    let digest = d
        .parse()
        .map_err(|e| StoreError::backend_at(format!("blob record {d}"), e))?;
    Ok(RecordAt { digest, record, rev })
}

fn current_rev(tx: &Connection, d: &str) -> Result<Option<i64>> {
    Ok(tx
        .query_row(
            "SELECT rev FROM blob_records WHERE digest = ?1",
            params![d],
            |r| r.get(0),
        )
        .optional()?)
}

#[async_trait]
impl BlobRecords for SqliteStore {
    async fn blob_record(&self, d: &Digest) -> Result<Option<RecordAt>> {
        let d = d.to_string();
        self.call(move |c| {
            let row = c
                .query_row(
                    "SELECT digest, size, claimed_at_ms, deleting, owner, rev FROM blob_records WHERE digest = ?1",
                    params![d],
                    record_at,
                )
                .optional()?;
            row.map(|(d, r, rev)| parse(d, r, rev)).transpose()
        })
        .await
    }

    async fn put_blob_record(&self, d: &Digest, record: &BlobRecord, rev: i64) -> Result<Option<i64>> {
        let (d, record) = (d.to_string(), record.clone());
        self.tx(move |tx| {
            if current_rev(tx, &d)?.unwrap_or(0) != rev {
                return Ok(None);
            }
            let new = next_rev(tx)?;
            tx.execute(
                "INSERT INTO blob_records (digest, size, claimed_at_ms, deleting, owner, rev)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (digest) DO UPDATE SET size = excluded.size, claimed_at_ms = excluded.claimed_at_ms,
                   deleting = excluded.deleting, owner = excluded.owner, rev = excluded.rev",
                params![d, record.size as i64, record.claimed_at_ms, record.deleting, record.owner, new],
            )?;
            Ok(Some(new))
        })
        .await
    }

    async fn delete_blob_record(&self, d: &Digest, rev: i64) -> Result<bool> {
        let d = d.to_string();
        self.tx(move |tx| {
            Ok(tx.execute(
                "DELETE FROM blob_records WHERE digest = ?1 AND rev = ?2",
                params![d, rev],
            )? == 1)
        })
        .await
    }

    async fn blob_records(&self) -> Result<Vec<RecordAt>> {
        self.call(move |c| {
            let mut stmt =
                c.prepare("SELECT digest, size, claimed_at_ms, deleting, owner, rev FROM blob_records")?;
            let rows = stmt.query_map([], record_at)?.collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(|(d, r, rev)| parse(d, r, rev)).collect()
        })
        .await
    }

    async fn referenced_blobs(&self) -> Result<(HashSet<Digest>, i64)> {
        self.call(move |c| {
            // A patch is referenced while its bundle version's row is.
            let mut stmt = c.prepare(
                "SELECT DISTINCT digest FROM bundle_blobs UNION SELECT patch FROM deltas WHERE patch != ''",
            )?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            let set = rows
                .into_iter()
                .map(|d| {
                    d.parse()
                        .map_err(|e| StoreError::backend_at(format!("bundle blob {d}"), e))
                })
                .collect::<Result<HashSet<Digest>>>()?;
            // mark_blob_deleting checks references in its own transaction.
            Ok((set, 0))
        })
        .await
    }

    async fn mark_blob_deleting(
        &self,
        d: &Digest,
        mark: &BlobRecord,
        rev: i64,
        _bundles_rev: i64,
    ) -> Result<Option<i64>> {
        let (d, mark) = (d.to_string(), mark.clone());
        self.tx(move |tx| {
            if current_rev(tx, &d)?.unwrap_or(0) != rev {
                return Ok(None);
            }
            let referenced: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM bundle_blobs WHERE digest = ?1)
                   OR EXISTS (SELECT 1 FROM deltas WHERE patch = ?1)",
                params![d],
                |r| r.get(0),
            )?;
            if referenced {
                return Ok(None);
            }
            let new = next_rev(tx)?;
            tx.execute(
                "INSERT INTO blob_records (digest, size, claimed_at_ms, deleting, owner, rev)
                 VALUES (?1, ?2, ?3, 1, ?4, ?5)
                 ON CONFLICT (digest) DO UPDATE SET deleting = 1, owner = excluded.owner, rev = excluded.rev",
                params![d, mark.size as i64, mark.claimed_at_ms, mark.owner, new],
            )?;
            Ok(Some(new))
        })
        .await
    }

    async fn delete_bundle(&self, name: &str, version: &str) -> Result<()> {
        let (name, version) = (name.to_string(), version.to_string());
        self.tx(move |tx| {
            let id = format!("{name}@{version}");
            let exists: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM bundles WHERE name = ?1 AND version = ?2)",
                params![name, version],
                |r| r.get(0),
            )?;
            if !exists {
                return Err(StoreError::not_found(Kind::Bundle, id.to_string()));
            }
            let column = |sql: &str| -> Result<Vec<String>> {
                let mut stmt = tx.prepare(sql)?;
                Ok(stmt
                    .query_map(params![name, version], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?)
            };
            let candidates = column(
                "SELECT id FROM rollouts WHERE bundle = ?1 AND (version = ?2 OR id IN
                   (SELECT rollout_id FROM rollout_nodes WHERE previous_version = ?2))
                 ORDER BY created_at_ms, id",
            )?;
            let users = BundleUsers {
                nodes: column("SELECT node FROM desired WHERE bundle = ?1 AND version = ?2 ORDER BY node")?,
                clusters: column(
                    "SELECT cluster FROM cluster_targets WHERE bundle = ?1 AND version = ?2 ORDER BY cluster",
                )?,
                rollouts: read_rollouts(tx, candidates)?
                    .into_iter()
                    .filter(|r| r.may_assign(&version))
                    .map(|r| r.id)
                    .collect(),
            };
            if !users.is_empty() {
                return Err(StoreError::Conflict(users.refusal(&id)));
            }
            tx.execute(
                "DELETE FROM bundle_blobs WHERE name = ?1 AND version = ?2",
                params![name, version],
            )?;
            tx.execute(
                "DELETE FROM deltas WHERE name = ?1 AND version = ?2",
                params![name, version],
            )?;
            tx.execute(
                "DELETE FROM bundles WHERE name = ?1 AND version = ?2",
                params![name, version],
            )?;
            Ok(())
        })
        .await
    }
}
