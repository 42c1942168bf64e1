//! Releases and trust roots on SQLite: the `releases` and `roots` tables,
//! each put one transaction that reads the highest stored version first.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use lks_store::{Result, StoreError, release_digest};

use crate::SqliteStore;
use lks_store::{
    ReleaseRow, ReleaseStore, RootRow, Stored, StoredRelease, StoredRoot, highest_root, release_order,
    root_order,
};

#[async_trait]
impl ReleaseStore for SqliteStore {
    async fn put_release(&self, r: StoredRelease, now_ms: i64) -> Result<Stored> {
        self.tx(move |tx| {
            let cluster = r.cluster().to_string();
            let highest: Option<(i64, String)> = tx
                .query_row(
                    "SELECT version, digest FROM releases WHERE cluster = ?1 ORDER BY version DESC LIMIT 1",
                    params![cluster],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let highest = highest
                .map(|(v, d)| Ok::<_, StoreError>((v as u64, release_digest(&cluster, v as u64, &d)?)))
                .transpose()?;
            let same: Option<String> = tx
                .query_row(
                    "SELECT digest FROM releases WHERE cluster = ?1 AND version = ?2",
                    params![cluster, r.version() as i64],
                    |row| row.get(0),
                )
                .optional()?;
            let same = same
                .map(|d| release_digest(&cluster, r.version(), &d))
                .transpose()?;
            if let Some(done) = release_order(&r, highest, same)? {
                return Ok(done);
            }
            tx.execute(
                "INSERT INTO releases (cluster, version, digest, signed_release, published_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    cluster,
                    r.version() as i64,
                    r.digest().to_string(),
                    r.encoded(),
                    now_ms
                ],
            )?;
            Ok(Stored::Created)
        })
        .await
    }

    async fn list_releases(&self, cluster: &str, limit: u32) -> Result<Vec<ReleaseRow>> {
        let cluster = cluster.to_string();
        self.call(move |c| read_releases(c, &cluster, limit)).await
    }

    async fn put_root(&self, cluster: &str, root: StoredRoot, now_ms: i64) -> Result<Stored> {
        let cluster = cluster.to_string();
        self.tx(move |tx| {
            let highest: Option<i64> = tx.query_row(
                "SELECT MAX(version) FROM roots WHERE cluster = ?1",
                params![cluster],
                |row| row.get(0),
            )?;
            let same: Option<Vec<u8>> = tx
                .query_row(
                    "SELECT signed_root FROM roots WHERE cluster = ?1 AND version = ?2",
                    params![cluster, root.version() as i64],
                    |row| row.get(0),
                )
                .optional()?;
            let same = same
                .map(|b| StoredRoot::decode(&cluster, root.version(), b))
                .transpose()?;
            let highest = highest_root(highest.map(|v| v as u64));
            if let Some(done) = root_order(&cluster, &root, highest, same.as_ref())? {
                return Ok(done);
            }
            tx.execute(
                "INSERT INTO roots (cluster, version, signed_root, published_at_ms) VALUES (?1, ?2, ?3, ?4)",
                params![cluster, root.version() as i64, root.encoded(), now_ms],
            )?;
            Ok(Stored::Created)
        })
        .await
    }

    async fn list_roots(&self, cluster: &str) -> Result<Vec<RootRow>> {
        let cluster = cluster.to_string();
        self.call(move |c| read_roots(c, &cluster)).await
    }
}

/// A release digest stored as text.
/// The cluster's releases, newest first, at most `limit` (0: all).
pub(super) fn read_releases(c: &Connection, cluster: &str, limit: u32) -> Result<Vec<ReleaseRow>> {
    let limit = if limit == 0 { -1 } else { i64::from(limit) };
    let mut stmt = c.prepare_cached(
        "SELECT version, signed_release, published_at_ms FROM releases WHERE cluster = ?1
         ORDER BY version DESC LIMIT ?2",
    )?;
    let rows = stmt
        .query_map(params![cluster, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, i64>(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(v, bytes, at)| {
            Ok(ReleaseRow {
                cluster: cluster.to_string(),
                release: StoredRelease::decode(cluster, v as u64, bytes)?,
                published_at_ms: at,
            })
        })
        .collect()
}

/// The cluster's roots in version order.
pub(super) fn read_roots(c: &Connection, cluster: &str) -> Result<Vec<RootRow>> {
    let mut stmt = c.prepare_cached(
        "SELECT version, signed_root, published_at_ms FROM roots WHERE cluster = ?1 ORDER BY version",
    )?;
    let rows = stmt
        .query_map(params![cluster], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, i64>(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(v, bytes, at)| {
            Ok(RootRow {
                cluster: cluster.to_string(),
                root: StoredRoot::decode(cluster, v as u64, bytes)?,
                published_at_ms: at,
            })
        })
        .collect()
}
