//! Reading a whole SQLite store out, for `lks-control-server migrate`:
//! opened under an exclusive lock, so that a server still running on the
//! data dir is detected and none can start while the dump is moved, and
//! read in one transaction that changes nothing.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::*;

impl SqliteStore {
    /// Opens an existing database for reading it out, holding SQLite's
    /// exclusive lock until the store is dropped. Refused with `Conflict` if
    /// another connection (a running server) has the database open; refused
    /// if the schema is not this server's (nothing is migrated in place).
    pub fn open_exclusive(path: &Path) -> Result<Self> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.display())))?;
        // A server keeps a shared lock on its database file for as long as
        // it runs (WAL mode); an exclusive lock is granted only once it is gone.
        conn.busy_timeout(std::time::Duration::ZERO)?;
        let busy = |e: rusqlite::Error| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                StoreError::Conflict(format!(
                    "{} is in use: an lks-control-server may still be running on it; stop the server first",
                    path.display()
                ))
            }
            e => StoreError::Backend(format!("lock {}: {e}", path.display())),
        };
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(busy)?;
        conn.execute_batch("BEGIN EXCLUSIVE").map_err(busy)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(busy)?;
        conn.execute_batch("ROLLBACK")?;
        if version != MIGRATIONS.len() as i64 {
            return Err(StoreError::Backend(format!(
                "{} has schema version {version}, this lks-control-server reads version {}; \
                 start and stop this version's server on the data dir once first",
                path.display(),
                MIGRATIONS.len()
            )));
        }
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Everything the store holds, read in one transaction.
    pub async fn dump(&self) -> Result<Dump> {
        self.call(|c| {
            let tx = c.transaction()?;
            let d = read_dump(&tx)?;
            // Read only: nothing to commit.
            tx.rollback()?;
            Ok(d)
        })
        .await
    }
}

fn read_dump(c: &Connection) -> Result<Dump> {
    let generation: i64 = c
        .query_row("SELECT value FROM meta WHERE key = 'generation'", [], |r| {
            r.get(0)
        })
        .optional()?
        .unwrap_or(0);
    let clusters = c
        .prepare("SELECT name, created_at_ms FROM clusters ORDER BY name")?
        .query_map([], |r| {
            Ok(ClusterRow {
                name: r.get(0)?,
                created_at_ms: r.get(1)?,
                node_count: 0,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;

    let mut tokens = Vec::new();
    let raw = c
        .prepare(
            "SELECT id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms
             FROM tokens ORDER BY id",
        )?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, Option<u32>>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, i64>(6)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms) in raw {
        let secret_hash: [u8; 32] = hash
            .try_into()
            .map_err(|_| StoreError::Backend(format!("token {id}: stored hash is not 32 bytes")))?;
        tokens.push(TokenRow {
            id,
            secret_hash,
            cluster,
            expires_at_ms,
            remaining_uses,
            labels: labels_from_json(&labels)?,
            created_at_ms,
        });
    }

    let names = c
        .prepare("SELECT name FROM nodes ORDER BY name")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let mut nodes = Vec::with_capacity(names.len());
    for n in names {
        if let Some(mut row) = read_node(c, &n)? {
            row.connected = false;
            nodes.push(row);
        }
    }
    let mut clusters = clusters;
    for cl in &mut clusters {
        cl.node_count = nodes.iter().filter(|n| n.cluster == cl.name).count() as u32;
    }

    let rows = c
        .prepare(
            "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
             FROM bundles ORDER BY name, published_at_ms, version",
        )?
        .query_map([], bundle_row)?
        .collect::<Result<Vec<_>, _>>()?;
    let mut digests =
        c.prepare("SELECT digest FROM bundle_blobs WHERE name = ?1 AND version = ?2 ORDER BY digest")?;
    let mut bundles = Vec::with_capacity(rows.len());
    for row in rows {
        let blob_digests = digests
            .query_map(params![row.name, row.version], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        bundles.push(DumpedBundle { row, blob_digests });
    }

    let raw = c
        .prepare(
            "SELECT cluster, bundle, version, selector, rollout_id FROM cluster_targets ORDER BY cluster, bundle",
        )?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut targets = Vec::with_capacity(raw.len());
    for (cluster, bundle, version, selector, rollout_id) in raw {
        targets.push(DumpedTarget {
            cluster,
            bundle,
            target: Target {
                version,
                selector: labels_from_json(&selector)?,
                rollout_id,
            },
        });
    }

    let ids = c
        .prepare("SELECT id FROM rollouts ORDER BY created_at_ms, id")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let rollouts = read_rollouts(c, ids)?;

    let events = c
        .prepare(
            "SELECT id, at_ms, cluster, node, rollout_id, kind, bundle, version, message FROM events ORDER BY id",
        )?
        .query_map([], |r| {
            Ok(EventRow {
                id: r.get::<_, i64>(0)? as u64,
                at_ms: r.get(1)?,
                cluster: r.get(2)?,
                node: r.get(3)?,
                rollout_id: r.get(4)?,
                kind: r.get(5)?,
                bundle: r.get(6)?,
                version: r.get(7)?,
                message: r.get(8)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;

    Ok(Dump {
        generation: generation.max(0) as u64,
        clusters,
        tokens,
        nodes,
        bundles,
        targets,
        rollouts,
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_database_a_server_holds_open_is_refused_and_then_locked_for_the_dump() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        let server = SqliteStore::open(&p).unwrap();
        server.create_cluster("a", 1).await.unwrap();
        server.list_clusters().await.unwrap();
        let e = SqliteStore::open_exclusive(&p).err().unwrap();
        assert!(
            matches!(&e, StoreError::Conflict(m) if m.contains("stop the server first")),
            "{e}"
        );
        drop(server);

        let locked = SqliteStore::open_exclusive(&p).unwrap();
        assert_eq!(locked.dump().await.unwrap().clusters.len(), 1);
        // No server starts on it while it is being moved.
        assert!(SqliteStore::open(&p).is_err());
        drop(locked);
        let again = SqliteStore::open(&p).unwrap();
        assert_eq!(again.list_clusters().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_missing_database_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        assert!(SqliteStore::open_exclusive(&p).is_err());
        assert!(!p.exists());
    }
}
