//! The embedded store: one SQLite database in the data dir (WAL,
//! `synchronous=FULL`, so an acknowledged change survives a crash or power
//! loss), schema migrations keyed by `PRAGMA user_version`.
//!
//! SQLite is blocking; every call runs on tokio's blocking pool holding the
//! single connection, which also serialises writers.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use lks_proto::BundleState;
use lks_proto::labels::Labels;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

mod audit;
mod blobrecs;
mod bundles;
mod clusters;
mod deltas;
mod desired;
mod dump;
mod events;
mod nodes;
mod plans;
mod reboots;
mod releases;
mod rollouts;
mod schema;
mod snapshot;
mod status;
mod tokens;

use lks_store::{
    BundleStatusRow, ClusterRow, EventRow, KubeFlags, KubeStep, NodeReboot, NodeRow, NodeState, NodeTrust,
    PeerSettings, RawBundleRow, Result, RolloutNodeRow, RolloutRow, RolloutState, StoreError, Target,
};
use schema::MIGRATIONS;

/// Events kept; older ones are pruned as new ones arrive.
const MAX_EVENTS: i64 = 100_000;
const DEFAULT_EVENT_LIMIT: u32 = 100;

/// The SQLite [`Store`].
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Opens (creating and migrating) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .map_err(|e| StoreError::backend_at(format!("open {}", path.display()), e))?;
        Self::init(conn)
    }

    /// A private in-memory database, for tests.
    pub fn open_in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self> {
        // WAL lets readers proceed during a write; FULL makes each commit
        // durable, which an operator's acknowledged publish or rollout needs.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let version = usize::try_from(version).unwrap_or(0);
        if version > MIGRATIONS.len() {
            return Err(StoreError::backend(format!(
                "database schema version {version} is newer than this server ({}); upgrade lks-control-server",
                MIGRATIONS.len()
            )));
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = conn.transaction()?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn
                .lock()
                .map_err(|_| StoreError::backend("store lock poisoned"))?;
            f(&mut c)
        })
        .await
        .map_err(|e| StoreError::backend_at("store task", e))?
    }

    /// Runs `f` in a transaction that commits only if `f` succeeds.
    async fn tx<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        self.call(move |c| {
            let tx = c.transaction()?;
            let v = f(&tx)?;
            tx.commit()?;
            Ok(v)
        })
        .await
    }
}

fn labels_to_json(l: &Labels) -> Result<String> {
    Ok(serde_json::to_string(l)?)
}

fn labels_from_json(s: &str) -> Result<Labels> {
    Ok(serde_json::from_str(s)?)
}

fn next_generation(tx: &Transaction<'_>) -> Result<u64> {
    let g: i64 = tx.query_row(
        "UPDATE meta SET value = value + 1 WHERE key = 'generation' RETURNING value",
        [],
        |r| r.get(0),
    )?;
    Ok(g as u64)
}

fn state_from_str(s: &str) -> Result<BundleState> {
    s.parse()
        .map_err(|e: lks_proto::manifest::UnknownBundleState| StoreError::backend_source(e))
}

/// The columns a cluster is read from: its row, its node count and its
/// reboot policy (`c` is the clusters table).
const CLUSTER_COLUMNS: &str =
    "c.name, c.created_at_ms, (SELECT COUNT(*) FROM nodes n WHERE n.cluster = c.name),
    c.maintenance_windows, c.ca_cert_pem, c.api_server,
    c.peer_enabled, c.peer_port, c.peer_upload_rate, c.peer_max_uploads,
    c.kubeconfig IS NOT NULL, c.kube_drain, c.labels, c.reboots";

/// A cluster as read by [`CLUSTER_COLUMNS`], its JSON columns still text.
struct RawCluster {
    name: String,
    created_at_ms: i64,
    node_count: u32,
    windows: String,
    ca_cert_pem: Option<String>,
    api_server: Option<String>,
    peer: PeerSettings,
    kube: KubeFlags,
    labels: String,
    reboots: Option<String>,
}

fn raw_cluster(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawCluster> {
    Ok(RawCluster {
        name: r.get(0)?,
        created_at_ms: r.get(1)?,
        node_count: r.get(2)?,
        windows: r.get(3)?,
        ca_cert_pem: r.get(4)?,
        api_server: r.get(5)?,
        peer: PeerSettings {
            enabled: r.get(6)?,
            port: r.get(7)?,
            upload_rate: r.get::<_, i64>(8)? as u64,
            max_uploads: r.get(9)?,
        },
        kube: KubeFlags {
            kubeconfig: r.get(10)?,
            drain: r.get(11)?,
        },
        labels: r.get(12)?,
        reboots: r.get(13)?,
    })
}

impl RawCluster {
    fn decode(self) -> Result<ClusterRow> {
        Ok(ClusterRow {
            name: self.name,
            created_at_ms: self.created_at_ms,
            node_count: self.node_count,
            maintenance_windows: serde_json::from_str(&self.windows)?,
            ca_cert_pem: self.ca_cert_pem,
            api_server: self.api_server,
            peer: self.peer,
            kube: self.kube,
            labels: serde_json::from_str(&self.labels)?,
            reboots: reboots::decode_policy(self.reboots.as_deref())?,
        })
    }
}

/// Every cluster, by name, with its node count: one query (the reboot
/// leader lists every cluster every 2 s; a query per cluster made that
/// most of an idle server's CPU at 1,000 clusters, BENCHMARKS.md).
fn read_clusters(c: &Connection) -> Result<Vec<ClusterRow>> {
    let raw = c
        .prepare(&format!(
            "SELECT {CLUSTER_COLUMNS} FROM clusters c ORDER BY c.name"
        ))?
        .query_map([], raw_cluster)?
        .collect::<Result<Vec<_>, _>>()?;
    raw.into_iter().map(RawCluster::decode).collect()
}

fn read_cluster(c: &Connection, name: &str) -> Result<Option<ClusterRow>> {
    c.query_row(
        &format!("SELECT {CLUSTER_COLUMNS} FROM clusters c WHERE c.name = ?1"),
        [name],
        raw_cluster,
    )
    .optional()?
    .map(RawCluster::decode)
    .transpose()
}

fn read_node(tx: &Connection, name: &str) -> Result<Option<NodeRow>> {
    let row = tx
        .query_row(
            "SELECT name, cluster, labels, cert_serial, facts, last_seen_ms, connected, enrolled_at_ms, generation,
                    hold_reason, key_hash, trust, reboot, reboot_request
             FROM nodes WHERE name = ?1",
            [name],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, bool>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, i64>(8)?,
                    r.get::<_, Option<String>>(9)?,
                    r.get::<_, String>(10)?,
                    r.get::<_, Option<String>>(11)?,
                    (r.get::<_, Option<String>>(12)?, r.get::<_, i64>(13)?),
                ))
            },
        )
        .optional()?;
    let Some((
        name,
        cluster,
        labels,
        cert_serial,
        facts_json,
        last_seen_ms,
        connected,
        enrolled_at_ms,
        generation,
        hold,
        key_hash,
        trust,
        (reboot, reboot_request),
    )) = row
    else {
        return Ok(None);
    };
    let trust = trust.map(|t| serde_json::from_str::<NodeTrust>(&t)).transpose()?;
    let reboot = reboot
        .map(|t| serde_json::from_str::<NodeReboot>(&t))
        .transpose()?;
    let mut desired = BTreeMap::new();
    let mut stmt = tx.prepare_cached("SELECT bundle, version FROM desired WHERE node = ?1")?;
    for r in stmt.query_map([&name], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
        let (b, v) = r?;
        desired.insert(b, v);
    }
    let mut actual = BTreeMap::new();
    let mut stmt = tx.prepare_cached(
        "SELECT bundle, version, state, message, updated_at_ms, generation, fetched_server, fetched_peers,
           fetched_delta
         FROM actual WHERE node = ?1",
    )?;
    let rows = stmt.query_map([&name], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
            (r.get::<_, i64>(6)?, r.get::<_, i64>(7)?, r.get::<_, i64>(8)?),
        ))
    })?;
    for r in rows {
        let (b, version, state, message, updated_at_ms, generation, fetched) = r?;
        actual.insert(
            b.clone(),
            BundleStatusRow {
                name: b,
                version,
                state: state_from_str(&state)?,
                message,
                updated_at_ms,
                generation: generation as u64,
                fetched_from_server: fetched.0 as u64,
                fetched_from_peers: fetched.1 as u64,
                fetched_as_delta: fetched.2 as u64,
            },
        );
    }
    Ok(Some(NodeRow {
        name,
        cluster,
        labels: labels_from_json(&labels)?,
        cert_serial,
        facts_json,
        last_seen_ms,
        connected,
        enrolled_at_ms,
        generation: generation as u64,
        desired,
        actual,
        hold,
        key_hash,
        trust,
        reboot,
        reboot_request: reboot_request.max(0) as u64,
    }))
}

/// The rollouts with these ids, in the given order (a vanished id is skipped).
fn read_rollouts(c: &Connection, ids: Vec<String>) -> Result<Vec<RolloutRow>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = read_rollout(c, &id)? {
            out.push(r);
        }
    }
    Ok(out)
}

/// The rollout `id` with its node rows, if it exists.
fn read_rollout(c: &Connection, id: &str) -> Result<Option<RolloutRow>> {
    let row = c
        .query_row(
            "SELECT id, cluster, bundle, version, selector, batch_size, failure_threshold, state,
                    created_at_ms, updated_at_ms, message, offline_deadline_ms, revision,
                    prev_target_version, prev_target_selector, prev_target_rollout, policy, pacing
             FROM rollouts WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    (
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, u32>(5)?,
                        r.get::<_, u32>(6)?,
                        r.get::<_, String>(7)?,
                    ),
                    (
                        r.get::<_, i64>(8)?,
                        r.get::<_, i64>(9)?,
                        r.get::<_, String>(10)?,
                        r.get::<_, i64>(11)?,
                        r.get::<_, i64>(12)?,
                        r.get::<_, Option<String>>(13)?,
                        r.get::<_, Option<String>>(14)?,
                        r.get::<_, Option<String>>(15)?,
                    ),
                    (r.get::<_, String>(16)?, r.get::<_, String>(17)?),
                ))
            },
        )
        .optional()?;
    let Some((
        (id, cluster, bundle, version, selector, batch_size, failure_threshold, state),
        (created, updated, message, deadline, revision, pt_version, pt_selector, pt_rollout),
        (policy, pacing),
    )) = row
    else {
        return Ok(None);
    };
    let nodes = read_rollout_nodes(c, &id)?;
    let previous_target = match (pt_version, pt_selector, pt_rollout) {
        (Some(version), Some(selector), Some(rollout_id)) => Some(Target {
            version,
            selector: labels_from_json(&selector)?,
            rollout_id,
        }),
        _ => None,
    };
    Ok(Some(RolloutRow {
        id,
        cluster,
        bundle,
        version,
        selector: labels_from_json(&selector)?,
        batch_size,
        failure_threshold,
        offline_deadline_ms: deadline.max(0) as u64,
        state: RolloutState::parse(&state)
            .ok_or_else(|| StoreError::backend(format!("stored rollout state {state:?} is unknown")))?,
        nodes,
        created_at_ms: created,
        updated_at_ms: updated,
        message,
        revision: revision as u64,
        previous_target,
        policy: serde_json::from_str(&policy)?,
        pacing: serde_json::from_str(&pacing)?,
    }))
}

/// A rollout's node rows, by node name.
fn read_rollout_nodes(c: &Connection, id: &str) -> Result<Vec<RolloutNodeRow>> {
    let mut stmt = c.prepare_cached(
        "SELECT node, previous_version, state, message, generation, turn_at_ms, touched, reverting, unreached,
                canary, kube_step, kube_since_ms, drain_started_ms
         FROM rollout_nodes WHERE rollout_id = ?1 ORDER BY node",
    )?;
    let raw = stmt
        .query_map([id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, bool>(6)?,
                r.get::<_, bool>(7)?,
                r.get::<_, bool>(8)?,
                r.get::<_, bool>(9)?,
                (
                    r.get::<_, String>(10)?,
                    r.get::<_, i64>(11)?,
                    r.get::<_, i64>(12)?,
                ),
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut nodes = Vec::with_capacity(raw.len());
    for (
        name,
        previous_version,
        st,
        message,
        generation,
        turn_at_ms,
        touched,
        reverting,
        unreached,
        canary,
        (kube_step, kube_since_ms, drain_started_ms),
    ) in raw
    {
        let state = NodeState::parse(&st)
            .ok_or_else(|| StoreError::backend(format!("stored rollout node state {st:?} is unknown")))?;
        nodes.push(RolloutNodeRow {
            name,
            previous_version,
            state,
            message,
            generation: generation as u64,
            turn_at_ms,
            touched,
            reverting,
            unreached,
            canary,
            kube: KubeStep::parse(&kube_step),
            kube_since_ms,
            drain_started_ms,
        });
    }
    Ok(nodes)
}

/// The active rollout of `bundle` in `cluster` other than `except`, if any.
fn active_rollout(
    tx: &Connection,
    cluster: &str,
    bundle: &str,
    except: &str,
) -> Result<Option<(String, String)>> {
    Ok(tx
        .query_row(
            "SELECT id, state FROM rollouts WHERE cluster = ?1 AND bundle = ?2 AND id != ?3
               AND state IN ('running', 'paused', 'rolling_back')
             ORDER BY created_at_ms LIMIT 1",
            params![cluster, bundle, except],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )
        .optional()?)
}

fn insert_event(tx: &Connection, e: &EventRow) -> Result<()> {
    tx.execute(
        "INSERT INTO events (at_ms, cluster, node, rollout_id, kind, bundle, version, message)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            e.at_ms,
            e.cluster,
            e.node,
            e.rollout_id,
            e.kind,
            e.bundle,
            e.version,
            e.message
        ],
    )?;
    tx.execute(
        "DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?1",
        [MAX_EVENTS],
    )?;
    Ok(())
}

fn upsert_actual(tx: &Transaction<'_>, node: &str, s: &BundleStatusRow) -> Result<()> {
    tx.execute(
        "INSERT INTO actual (node, bundle, version, state, message, updated_at_ms, generation,
             fetched_server, fetched_peers, fetched_delta)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (node, bundle) DO UPDATE SET version = excluded.version, state = excluded.state,
             message = excluded.message, updated_at_ms = excluded.updated_at_ms, generation = excluded.generation,
             fetched_server = excluded.fetched_server, fetched_peers = excluded.fetched_peers,
             fetched_delta = excluded.fetched_delta",
        params![
            node,
            s.name,
            s.version,
            s.state.as_str(),
            s.message,
            s.updated_at_ms,
            s.generation as i64,
            s.fetched_from_server as i64,
            s.fetched_from_peers as i64,
            s.fetched_as_delta as i64
        ],
    )?;
    Ok(())
}

/// An `events` row selected as `id, at_ms, cluster, node, rollout_id, kind,
/// bundle, version, message`.
pub(crate) fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
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
}

/// A `bundles` row as stored; [`RawBundleRow::typed`] reads it.
fn bundle_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawBundleRow> {
    Ok(RawBundleRow {
        name: r.get(0)?,
        version: r.get(1)?,
        signed_bundle: r.get(2)?,
        manifest_digest: r.get(3)?,
        signed: r.get(4)?,
        files: r.get(5)?,
        total_size: r.get::<_, i64>(6)? as u64,
        published_at_ms: r.get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_store::conformance;
    use lks_store::{ClusterStore, NewCluster};

    // Every conformance case against a fresh in-memory database.
    conformance::conformance_suite!({ ((), SqliteStore::open_in_memory().unwrap()) });

    impl conformance::WriteStored for SqliteStore {
        async fn write_stored_bundle(&self, name: &str, version: &str, bytes: &[u8], digest: &str) {
            let (n, v, b, d) = (
                name.to_string(),
                version.to_string(),
                bytes.to_vec(),
                digest.to_string(),
            );
            self.call(move |c| {
                c.execute(
                    "UPDATE bundles SET signed_bundle = ?3, manifest_digest = ?4 WHERE name = ?1 AND version = ?2",
                    params![n, v, b, d],
                )?;
                Ok(())
            })
            .await
            .unwrap();
        }
    }

    #[tokio::test]
    async fn a_database_from_before_peer_sharing_reads_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        {
            // The schema as the server before peer sharing left it.
            let mut conn = Connection::open(&p).unwrap();
            let before = MIGRATIONS.len() - 1;
            for (i, m) in MIGRATIONS[..before].iter().enumerate() {
                let tx = conn.transaction().unwrap();
                tx.execute_batch(m).unwrap();
                tx.pragma_update(None, "user_version", (i + 1) as i64).unwrap();
                tx.commit().unwrap();
            }
            conn.execute(
                "INSERT INTO clusters (name, created_at_ms, api_server) VALUES ('old', 1, 'https://k:6443')",
                [],
            )
            .unwrap();
        }
        let s = SqliteStore::open(&p).unwrap();
        let old = s.get_cluster("old").await.unwrap().unwrap();
        assert_eq!(old.peer, PeerSettings::default());
        assert_eq!(old.api_server.as_deref(), Some("https://k:6443"));
        let on = PeerSettings {
            enabled: true,
            ..PeerSettings::default()
        };
        s.set_cluster_peer("old", on, EventRow::peer_sharing_set("old", &on, "admin", 2))
            .await
            .unwrap();
        drop(s);
        let s = SqliteStore::open(&p).unwrap();
        assert_eq!(s.get_cluster("old").await.unwrap().unwrap().peer, on);
    }

    #[tokio::test]
    async fn reopening_keeps_state_and_schema() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.db");
        {
            let s = SqliteStore::open(&p).unwrap();
            s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
        }
        let s = SqliteStore::open(&p).unwrap();
        assert_eq!(s.list_clusters().await.unwrap().len(), 1);
    }
}
