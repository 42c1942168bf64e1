//! Reading a whole SQLite store out, for `lks-control-server migrate`:
//! opened under an exclusive lock, so that a server still running on the
//! data dir is detected and none can start while the dump is moved, and
//! read in one transaction that changes nothing.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use rusqlite::{OptionalExtension, params};

use lks_store::{
    AuditRow, ClusterKube, ClusterRow, Dump, DumpedBundle, DumpedTarget, EventRow, NodeRow, ReleaseRow,
    Result, RolloutRow, RootRow, StoreError, StoredCa, Target, TokenRow, stored_digest,
};

use std::sync::{Arc, Mutex};

use crate::schema::MIGRATIONS;
use crate::tokens::{StoredToken, TOKEN_COLUMNS, token_row};

use crate::{
    SqliteStore, bundle_row, clusters, event_row, labels_from_json, read_clusters, read_node, read_rollouts,
};

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
        .map_err(|e| StoreError::backend_at(format!("open {}", path.display()), e))?;
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
            e => StoreError::backend_at(format!("lock {}", path.display()), e),
        };
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(busy)?;
        conn.execute_batch("BEGIN EXCLUSIVE").map_err(busy)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(busy)?;
        conn.execute_batch("ROLLBACK")?;
        if version != MIGRATIONS.len() as i64 {
            return Err(StoreError::backend(format!(
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
        self.tx(|tx| read_dump(tx)).await
    }
}

/// Everything the store holds, each kind in its own step; `c` is one
/// transaction, so the steps see one state.
fn read_dump(c: &Connection) -> Result<Dump> {
    let generation = read_generation(c)?;
    let clusters = read_clusters(c)?;
    let cluster_cas = read_cluster_cas(c, &clusters)?;
    let certificates = clusters::read_certs(c, None, None)?;
    let cluster_kube = read_cluster_kube(c, &clusters)?;
    let tokens = read_tokens(c)?;
    let nodes = read_nodes(c)?;
    let bundles = read_bundles(c)?;
    let targets = read_targets(c)?;
    let rollouts = read_all_rollouts(c)?;
    let events = read_events(c)?;
    let audit = read_audit(c)?;
    let (releases, roots) = read_releases(c, &clusters)?;
    let plans = crate::plans::read_all(c)?;
    Ok(Dump {
        generation: generation.max(0) as u64,
        clusters,
        cluster_cas,
        certificates,
        cluster_kube,
        tokens,
        nodes,
        bundles,
        targets,
        rollouts,
        events,
        audit,
        releases,
        roots,
        plans,
    })
}

/// The generation counter (0 before the first).
fn read_generation(c: &Connection) -> Result<i64> {
    Ok(
        c.query_row("SELECT value FROM meta WHERE key = 'generation'", [], |r| {
            r.get(0)
        })
        .optional()?
        .unwrap_or(0),
    )
}

/// The clusters' CAs, for those that have one.
fn read_cluster_cas(c: &Connection, clusters: &[ClusterRow]) -> Result<Vec<(String, StoredCa)>> {
    let mut cluster_cas = Vec::new();
    for cl in clusters {
        if let Some(ca) = clusters::read_ca(c, &cl.name)? {
            cluster_cas.push((cl.name.clone(), ca));
        }
    }
    Ok(cluster_cas)
}

/// The clusters' Kubernetes access, for those that set it.
fn read_cluster_kube(c: &Connection, clusters: &[ClusterRow]) -> Result<Vec<(String, ClusterKube)>> {
    let mut cluster_kube = Vec::new();
    for cl in clusters {
        if let Some(k) = clusters::read_kube(c, &cl.name)?
            && k != ClusterKube::default()
        {
            cluster_kube.push((cl.name.clone(), k));
        }
    }
    Ok(cluster_kube)
}

/// Join tokens, by id.
fn read_tokens(c: &Connection) -> Result<Vec<TokenRow>> {
    c.prepare(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id"))?
        .query_map([], token_row)?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(StoredToken::typed)
        .collect()
}

/// Nodes by name, none connected (the dump moves to another store).
fn read_nodes(c: &Connection) -> Result<Vec<NodeRow>> {
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
    Ok(nodes)
}

/// Bundle versions with the blobs they use.
fn read_bundles(c: &Connection) -> Result<Vec<DumpedBundle>> {
    let rows = c
        .prepare(
            "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
             FROM bundles ORDER BY name, published_at_ms, version",
        )?
        .query_map([], bundle_row)?
        .map(|r| r?.typed())
        .collect::<Result<Vec<_>>>()?;
    let mut digests =
        c.prepare("SELECT digest FROM bundle_blobs WHERE name = ?1 AND version = ?2 ORDER BY digest")?;
    let mut bundles = Vec::with_capacity(rows.len());
    for row in rows {
        let blob_digests = digests
            .query_map(params![row.name, row.version], |r| r.get::<_, String>(0))?
            .map(|d| stored_digest(&row.name, &row.version, &d?))
            .collect::<Result<Vec<_>>>()?;
        bundles.push(DumpedBundle { row, blob_digests });
    }
    Ok(bundles)
}

/// The clusters' targets.
fn read_targets(c: &Connection) -> Result<Vec<DumpedTarget>> {
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
    Ok(targets)
}

/// Rollouts, oldest first.
fn read_all_rollouts(c: &Connection) -> Result<Vec<RolloutRow>> {
    let ids = c
        .prepare("SELECT id FROM rollouts ORDER BY created_at_ms, id")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    read_rollouts(c, ids)
}

/// Events, by id.
fn read_events(c: &Connection) -> Result<Vec<EventRow>> {
    Ok(c.prepare(
        "SELECT id, at_ms, cluster, node, rollout_id, kind, bundle, version, message FROM events ORDER BY id",
    )?
    .query_map([], event_row)?
    .collect::<Result<Vec<_>, _>>()?)
}

/// The audit trail, by id.
fn read_audit(c: &Connection) -> Result<Vec<AuditRow>> {
    Ok(c.prepare(&format!(
        "SELECT {} FROM audit ORDER BY id",
        super::audit::AUDIT_COLUMNS
    ))?
    .query_map([], super::audit::audit_row)?
    .collect::<Result<Vec<_>, _>>()?)
}

/// Every cluster's releases, oldest first, and its trust roots.
fn read_releases(c: &Connection, clusters: &[ClusterRow]) -> Result<(Vec<ReleaseRow>, Vec<RootRow>)> {
    let mut releases = Vec::new();
    let mut roots = Vec::new();
    for cluster in clusters.iter().map(|c| c.name.as_str()) {
        let mut r = super::releases::read_releases(c, cluster, 0)?;
        r.reverse();
        releases.extend(r);
        roots.extend(super::releases::read_roots(c, cluster)?);
    }
    Ok((releases, roots))
}

#[cfg(test)]
mod tests {
    use lks_proto::Digest;

    use super::*;
    use lks_proto::BundleState;
    use lks_proto::labels::Labels;

    use lks_store::conformance;
    use lks_store::{
        BundleStatusRow, BundleStore, ClusterStore, IssuedCertRow, NewBundle, NewCluster, NewNode,
        NewRollout, NodeState, NodeStatusStore, NodeStore, RolloutCommit, RolloutState, RolloutStore,
        StoredCa, TargetChange, TokenRow, TokenStore,
    };

    #[tokio::test]
    async fn a_database_a_server_holds_open_is_refused_and_then_locked_for_the_dump() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        let server = SqliteStore::open(&p).unwrap();
        server.create_cluster(NewCluster::new("a", 1)).await.unwrap();
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

    /// Clusters `a` (with a CA and an API server) and `b`, and one
    /// certificate a's CA issued.
    async fn two_clusters_and_a_certificate(s: &SqliteStore) {
        s.create_cluster(NewCluster {
            ca: Some(StoredCa {
                cert_pem: "cert".into(),
                key: "key".into(),
            }),
            api_server: Some("https://a.example:6443".into()),
            ..NewCluster::new("a", 1)
        })
        .await
        .unwrap();
        s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
        s.record_certificate(IssuedCertRow {
            cluster: "a".into(),
            node: "n1".into(),
            serial: "0a".into(),
            profile: "kubelet-client".into(),
            bundle: "k".into(),
            version: "1".into(),
            path: "/p".into(),
            not_before_ms: 1,
            not_after_ms: 2,
            issued_at_ms: 1,
        })
        .await
        .unwrap();
    }

    /// Token tok001 of `a` (3 uses), and nodes n1 and n2 enrolled with it.
    async fn a_token_and_two_nodes(s: &SqliteStore) {
        s.create_token(TokenRow {
            id: "tok001".into(),
            secret_hash: [7; 32],
            cluster: "a".into(),
            expires_at_ms: i64::MAX,
            remaining_uses: Some(3),
            labels: Labels::new(),
            created_at_ms: 2,
        })
        .await
        .unwrap();
        for n in ["n1", "n2"] {
            s.enroll_node(NewNode {
                name: n.into(),
                cluster: "a".into(),
                labels: Labels::new(),
                cert_serial: format!("serial-{n}"),
                key_hash: String::new(),
                token_id: "tok001".into(),
                now_ms: 3,
            })
            .await
            .unwrap();
        }
    }

    /// Bundle k@1 (two blobs) published and rolled out to both nodes, the
    /// rollout completed; returns the bundle and its blobs.
    async fn k1_rolled_out_to_both_nodes(s: &SqliteStore) -> (NewBundle, Digest, Digest) {
        let (blob_a, blob_b) = (Digest::of(b"blob-a"), Digest::of(b"blob-b"));
        let k1 = NewBundle {
            blob_digests: vec![blob_b, blob_a],
            ..conformance::bundle("k", "1", "d1")
        };
        s.put_bundle(k1.clone()).await.unwrap();
        let r = s
            .start_rollout(NewRollout {
                id: "r1".into(),
                cluster: "a".into(),
                bundle: "k".into(),
                version: "1".into(),
                selector: Labels::new(),
                batch_size: 0,
                failure_threshold: 1,
                offline_deadline_ms: 600_000,
                policy: Default::default(),
                started_by: String::new(),
                now_ms: 5,
            })
            .await
            .unwrap();
        let mut done = r.clone();
        done.state = RolloutState::Completed;
        for n in &mut done.nodes {
            n.state = NodeState::Updated;
            n.touched = true;
        }
        s.commit_rollout(RolloutCommit {
            rollout: done,
            assign: vec![("n1".into(), Some("1".into())), ("n2".into(), Some("1".into()))],
            target: TargetChange::SetToRollout,
            events: Vec::new(),
        })
        .await
        .unwrap();
        (k1, blob_a, blob_b)
    }

    /// n1 connects, reporting k@1 applied at generation 3.
    async fn n1_reports_k1_applied(s: &SqliteStore) {
        s.node_connected(
            "n1",
            "{}",
            vec![BundleStatusRow {
                fetched_from_server: 0,
                fetched_from_peers: 0,
                fetched_as_delta: 0,
                name: "k".into(),
                version: "1".into(),
                state: BundleState::Applied,
                message: String::new(),
                updated_at_ms: 6,
                generation: 3,
            }],
            6,
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn the_dump_holds_every_kind_with_generations_revisions_and_targets() {
        let s = SqliteStore::open_in_memory().unwrap();
        two_clusters_and_a_certificate(&s).await;
        a_token_and_two_nodes(&s).await;
        let (k1, blob_a, blob_b) = k1_rolled_out_to_both_nodes(&s).await;
        n1_reports_k1_applied(&s).await;

        let d = s.dump().await.unwrap();
        assert_eq!(d.clusters.len(), 2);
        assert_eq!(d.clusters[0].node_count, 2);
        assert_eq!(
            d.clusters[0].api_server.as_deref(),
            Some("https://a.example:6443")
        );
        assert_eq!(d.cluster_cas.len(), 1, "only a's CA");
        assert_eq!(d.cluster_cas[0].0, "a");
        assert_eq!(d.cluster_cas[0].1.key, "key");
        assert_eq!(d.certificates.len(), 1);
        assert_eq!(d.certificates[0].serial, "0a");
        assert_eq!(d.tokens.len(), 1);
        assert_eq!(d.tokens[0].remaining_uses, Some(1));
        assert_eq!(d.nodes.len(), 2);
        assert!(d.nodes.iter().all(|n| !n.connected), "no connection state moves");
        assert_eq!(d.nodes[0].desired["k"], "1");
        assert_eq!(d.nodes[0].actual["k"].generation, 3);
        assert_eq!(d.nodes[0].cert_serial, "serial-n1");
        // Read back typed, the digests in the order of their text.
        let mut served = vec![blob_a, blob_b];
        served.sort_by_key(ToString::to_string);
        assert_eq!(d.bundles[0].blob_digests, served);
        assert_eq!(d.bundles[0].row, conformance::row_of(&k1));
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.targets[0].target.rollout_id, "r1");
        assert_eq!(d.rollouts.len(), 1);
        assert_eq!(d.rollouts[0].revision, 1);
        assert_eq!(d.rollouts[0].state, RolloutState::Completed);
        assert!(d.events.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
        assert!(d.events.iter().any(|e| e.kind == "enrolled"));
        // Two enrolments and two assignments handed out generations 1..=4.
        assert_eq!(d.generation, 4);
        assert_eq!(d.max_generation(), 4);
        let mut ahead = d.clone();
        ahead.rollouts[0].nodes[0].generation = 9;
        assert_eq!(ahead.max_generation(), 9);
    }

    #[tokio::test]
    async fn a_missing_database_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        assert!(SqliteStore::open_exclusive(&p).is_err());
        assert!(!p.exists());
    }
}
