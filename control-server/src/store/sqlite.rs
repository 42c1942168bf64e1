//! The embedded store: one SQLite database in the data dir (WAL,
//! `synchronous=FULL`, so an acknowledged change survives a crash or power
//! loss), schema migrations keyed by `PRAGMA user_version`.
//!
//! SQLite is blocking; every call runs on tokio's blocking pool holding the
//! single connection, which also serialises writers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lks_proto::BundleState;
use lks_proto::labels::{Labels, selector_matches};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::clock::now_ms;

mod blobrecs;
mod clusters;
mod dump;

use super::*;

/// Schema versions in order; `user_version` counts how many are applied.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO meta (key, value) VALUES ('generation', 0);
CREATE TABLE clusters (name TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    secret_hash BLOB NOT NULL,
    cluster TEXT NOT NULL REFERENCES clusters(name),
    expires_at_ms INTEGER NOT NULL,
    remaining_uses INTEGER,
    labels TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    cluster TEXT NOT NULL REFERENCES clusters(name),
    labels TEXT NOT NULL,
    cert_serial TEXT NOT NULL,
    facts TEXT NOT NULL DEFAULT '',
    last_seen_ms INTEGER NOT NULL DEFAULT 0,
    connected INTEGER NOT NULL DEFAULT 0,
    enrolled_at_ms INTEGER NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX nodes_cluster ON nodes(cluster);
CREATE TABLE bundles (
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    signed_bundle BLOB NOT NULL,
    manifest_digest TEXT NOT NULL,
    signed INTEGER NOT NULL,
    files INTEGER NOT NULL,
    total_size INTEGER NOT NULL,
    published_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE bundle_blobs (
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (name, version, digest),
    FOREIGN KEY (name, version) REFERENCES bundles(name, version)
);
CREATE INDEX bundle_blobs_digest ON bundle_blobs(digest);
CREATE TABLE desired (
    node TEXT NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    PRIMARY KEY (node, bundle),
    FOREIGN KEY (bundle, version) REFERENCES bundles(name, version)
);
CREATE TABLE actual (
    node TEXT NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (node, bundle)
);
CREATE TABLE cluster_targets (
    cluster TEXT NOT NULL REFERENCES clusters(name),
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    selector TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    PRIMARY KEY (cluster, bundle)
);
CREATE TABLE rollouts (
    id TEXT PRIMARY KEY,
    cluster TEXT NOT NULL,
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    selector TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    failure_threshold INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX rollouts_cluster ON rollouts(cluster, bundle);
CREATE TABLE rollout_nodes (
    rollout_id TEXT NOT NULL REFERENCES rollouts(id),
    node TEXT NOT NULL,
    previous_version TEXT NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (rollout_id, node)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    cluster TEXT NOT NULL,
    node TEXT NOT NULL,
    rollout_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX events_node ON events(node);
"#,
    // Batched rollouts: nodes are started by the rollout controller, so each
    // rollout node remembers its turn, the generation it was given, and
    // whether the rollout changed it; reports remember the generation they
    // answered. Rollouts stored before this assigned every node at once.
    r#"
ALTER TABLE rollouts ADD COLUMN offline_deadline_ms INTEGER NOT NULL DEFAULT 600000;
ALTER TABLE rollouts ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN prev_target_version TEXT;
ALTER TABLE rollouts ADD COLUMN prev_target_selector TEXT;
ALTER TABLE rollouts ADD COLUMN prev_target_rollout TEXT;
ALTER TABLE rollout_nodes ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN turn_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN touched INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN reverting INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN unreached INTEGER NOT NULL DEFAULT 0;
UPDATE rollout_nodes SET touched = 1
    WHERE previous_version != (SELECT r.version FROM rollouts r WHERE r.id = rollout_id);
UPDATE rollout_nodes SET state = 'applying'
    WHERE state = 'waiting' AND rollout_id IN (SELECT id FROM rollouts WHERE state = 'running');
ALTER TABLE actual ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
CREATE INDEX events_rollout ON events(rollout_id);
CREATE INDEX rollout_nodes_node ON rollout_nodes(node);
"#,
    // Rollout policies: maintenance windows per cluster, holds per node,
    // the policy and pacing of each rollout (JSON), canary nodes. Rollouts
    // stored before this waited for offline nodes, so they keep doing so.
    r#"
ALTER TABLE clusters ADD COLUMN maintenance_windows TEXT NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN hold_reason TEXT;
ALTER TABLE rollouts ADD COLUMN policy TEXT NOT NULL DEFAULT '{"offline":"wait"}';
ALTER TABLE rollouts ADD COLUMN pacing TEXT NOT NULL DEFAULT '{}';
ALTER TABLE rollout_nodes ADD COLUMN canary INTEGER NOT NULL DEFAULT 0;
ALTER TABLE desired ADD COLUMN retry INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN key_hash TEXT NOT NULL DEFAULT '';
"#,
    // Cluster CAs (key as the server hands it over: PEM in this 0700 data
    // dir), API servers, and the record of certificates issued with the CAs.
    r#"
ALTER TABLE clusters ADD COLUMN ca_cert_pem TEXT;
ALTER TABLE clusters ADD COLUMN ca_key TEXT;
ALTER TABLE clusters ADD COLUMN api_server TEXT;
CREATE TABLE issued_certs (
    cluster TEXT NOT NULL REFERENCES clusters(name),
    node TEXT NOT NULL,
    serial TEXT NOT NULL,
    profile TEXT NOT NULL,
    bundle TEXT NOT NULL,
    version TEXT NOT NULL,
    path TEXT NOT NULL,
    not_before_ms INTEGER NOT NULL,
    not_after_ms INTEGER NOT NULL,
    issued_at_ms INTEGER NOT NULL,
    PRIMARY KEY (cluster, node, serial)
);
CREATE INDEX issued_certs_node ON issued_certs(node, path, issued_at_ms);
"#,
    // Blob garbage collection (store/blobrecs.rs): a record per blob in the
    // blob store; `rev` comes from one counter in `meta`, so a record
    // deleted and made again never repeats a revision.
    r#"
CREATE TABLE blob_records (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    claimed_at_ms INTEGER NOT NULL,
    deleting INTEGER NOT NULL,
    owner TEXT NOT NULL,
    rev INTEGER NOT NULL
);
"#,
    // Peer sharing per cluster: off, with the defaults of `PeerSettings`
    // (port 7444, no upload cap, 4 uploads), for clusters made before.
    // The upload rate is a u64 kept in SQLite's i64 (bits as they are).
    r#"
ALTER TABLE clusters ADD COLUMN peer_enabled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE clusters ADD COLUMN peer_port INTEGER NOT NULL DEFAULT 7444;
ALTER TABLE clusters ADD COLUMN peer_upload_rate INTEGER NOT NULL DEFAULT 0;
ALTER TABLE clusters ADD COLUMN peer_max_uploads INTEGER NOT NULL DEFAULT 4;
"#,
    // What each node fetched for the version it reports, by source (peer
    // sharing); 0 for reports from before.
    r#"
ALTER TABLE actual ADD COLUMN fetched_server INTEGER NOT NULL DEFAULT 0;
ALTER TABLE actual ADD COLUMN fetched_peers INTEGER NOT NULL DEFAULT 0;
"#,
];

/// Events kept; older ones are pruned as new ones arrive.
const MAX_EVENTS: i64 = 100_000;
const DEFAULT_EVENT_LIMIT: u32 = 100;

/// The SQLite [`Store`].
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Backend(format!("stored JSON: {e}"))
    }
}

impl SqliteStore {
    /// Opens (creating and migrating) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.display())))?;
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
            return Err(StoreError::Backend(format!(
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
                .map_err(|_| StoreError::Backend("store lock poisoned".into()))?;
            f(&mut c)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("store task: {e}")))?
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
    s.parse().map_err(StoreError::Backend)
}

/// Every cluster, by name, with its node count.
fn read_clusters(c: &Connection) -> Result<Vec<ClusterRow>> {
    let names = c
        .prepare("SELECT name FROM clusters ORDER BY name")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        out.extend(read_cluster(c, &n)?);
    }
    Ok(out)
}

fn read_cluster(c: &Connection, name: &str) -> Result<Option<ClusterRow>> {
    let row = c
        .query_row(
            "SELECT c.name, c.created_at_ms, (SELECT COUNT(*) FROM nodes n WHERE n.cluster = c.name),
                    c.maintenance_windows, c.ca_cert_pem, c.api_server,
                    c.peer_enabled, c.peer_port, c.peer_upload_rate, c.peer_max_uploads
             FROM clusters c WHERE c.name = ?1",
            [name],
            |r| {
                Ok((
                    (
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, u32>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                    ),
                    PeerSettings {
                        enabled: r.get(6)?,
                        port: r.get(7)?,
                        upload_rate: r.get::<_, i64>(8)? as u64,
                        max_uploads: r.get(9)?,
                    },
                ))
            },
        )
        .optional()?;
    row.map(
        |((name, created_at_ms, node_count, windows, ca_cert_pem, api_server), peer)| {
            Ok(ClusterRow {
                name,
                created_at_ms,
                node_count,
                maintenance_windows: serde_json::from_str(&windows)?,
                ca_cert_pem,
                api_server,
                peer,
            })
        },
    )
    .transpose()
}

fn read_node(tx: &Connection, name: &str) -> Result<Option<NodeRow>> {
    let row = tx
        .query_row(
            "SELECT name, cluster, labels, cert_serial, facts, last_seen_ms, connected, enrolled_at_ms, generation,
                    hold_reason, key_hash
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
    )) = row
    else {
        return Ok(None);
    };
    let mut desired = BTreeMap::new();
    let mut stmt = tx.prepare_cached("SELECT bundle, version FROM desired WHERE node = ?1")?;
    for r in stmt.query_map([&name], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
        let (b, v) = r?;
        desired.insert(b, v);
    }
    let mut actual = BTreeMap::new();
    let mut stmt = tx.prepare_cached(
        "SELECT bundle, version, state, message, updated_at_ms, generation, fetched_server, fetched_peers
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
            (r.get::<_, i64>(6)?, r.get::<_, i64>(7)?),
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
    let mut stmt = c.prepare_cached(
        "SELECT node, previous_version, state, message, generation, turn_at_ms, touched, reverting, unreached,
                canary
         FROM rollout_nodes WHERE rollout_id = ?1 ORDER BY node",
    )?;
    let raw = stmt
        .query_map([&id], |r| {
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
    ) in raw
    {
        let state = NodeState::parse(&st)
            .ok_or_else(|| StoreError::Backend(format!("stored rollout node state {st:?} is unknown")))?;
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
        });
    }
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
            .ok_or_else(|| StoreError::Backend(format!("stored rollout state {state:?} is unknown")))?,
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
             fetched_server, fetched_peers)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (node, bundle) DO UPDATE SET version = excluded.version, state = excluded.state,
             message = excluded.message, updated_at_ms = excluded.updated_at_ms, generation = excluded.generation,
             fetched_server = excluded.fetched_server, fetched_peers = excluded.fetched_peers",
        params![
            node,
            s.name,
            s.version,
            s.state.as_str(),
            s.message,
            s.updated_at_ms,
            s.generation as i64,
            s.fetched_from_server as i64,
            s.fetched_from_peers as i64
        ],
    )?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_cluster(&self, c: NewCluster) -> Result<ClusterRow> {
        self.create_cluster_row(c).await
    }

    async fn set_cluster_api_server(
        &self,
        name: &str,
        api_server: Option<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        self.update_cluster_api_server(name, api_server, event).await
    }

    async fn set_cluster_peer(&self, name: &str, peer: PeerSettings, event: EventRow) -> Result<ClusterRow> {
        self.update_cluster_peer(name, peer, event).await
    }

    async fn set_cluster_ca(&self, name: &str, ca: StoredCa, event: EventRow) -> Result<ClusterRow> {
        self.update_cluster_ca(name, ca, event).await
    }

    async fn cluster_ca(&self, name: &str) -> Result<Option<StoredCa>> {
        self.read_cluster_ca(name).await
    }

    async fn record_certificate(&self, row: IssuedCertRow) -> Result<()> {
        self.insert_certificate(row).await
    }

    async fn list_certificates(
        &self,
        cluster: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<IssuedCertRow>> {
        self.read_certificates(cluster, node).await
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterRow>> {
        self.call(|c| read_clusters(c)).await
    }

    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRow>> {
        let name = name.to_string();
        self.call(move |c| read_cluster(c, &name)).await
    }

    async fn set_cluster_windows(
        &self,
        name: &str,
        windows: Vec<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET maintenance_windows = ?2 WHERE name = ?1",
                params![name, serde_json::to_string(&windows)?],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound(format!("cluster {name} does not exist")));
            }
            insert_event(tx, &event)?;
            read_cluster(tx, &name)?
                .ok_or_else(|| StoreError::Backend(format!("cluster {name} vanished in its own transaction")))
        })
        .await
    }

    async fn cluster_exists(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.call(move |c| {
            Ok(
                c.query_row("SELECT 1 FROM clusters WHERE name = ?1", [name], |_| Ok(()))
                    .optional()?
                    .is_some(),
            )
        })
        .await
    }

    async fn create_token(&self, t: TokenRow) -> Result<()> {
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&t.cluster], |_| Ok(()))
                .optional()?
                .is_some();
            if !exists {
                return Err(StoreError::NotFound(format!(
                    "cluster {} does not exist; create it with `lksctl cluster create {}`",
                    t.cluster, t.cluster
                )));
            }
            tx.execute(
                "INSERT INTO tokens (id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    t.id,
                    t.secret_hash.as_slice(),
                    t.cluster,
                    t.expires_at_ms,
                    t.remaining_uses,
                    labels_to_json(&t.labels)?,
                    t.created_at_ms
                ],
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                    StoreError::AlreadyExists("token id collision; try again".into())
                }
                e => e.into(),
            })?;
            Ok(())
        })
        .await
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>> {
        let id = id.to_string();
        self.call(move |c| {
            let row = c
                .query_row(
                    "SELECT id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms
                     FROM tokens WHERE id = ?1",
                    [id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, Vec<u8>>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, Option<u32>>(4)?,
                            r.get::<_, String>(5)?,
                            r.get::<_, i64>(6)?,
                        ))
                    },
                )
                .optional()?;
            let Some((id, hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms)) = row else {
                return Ok(None);
            };
            let secret_hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| StoreError::Backend(format!("token {id}: stored hash is not 32 bytes")))?;
            Ok(Some(TokenRow {
                id,
                secret_hash,
                cluster,
                expires_at_ms,
                remaining_uses,
                labels: labels_from_json(&labels)?,
                created_at_ms,
            }))
        })
        .await
    }

    async fn enroll_node(&self, n: NewNode) -> Result<u64> {
        self.tx(move |tx| {
            let tok = tx
                .query_row(
                    "SELECT cluster, expires_at_ms, remaining_uses FROM tokens WHERE id = ?1",
                    [&n.token_id],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<u32>>(2)?)),
                )
                .optional()?;
            let Some((cluster, expires_at_ms, remaining)) = tok else {
                return Err(StoreError::Token(TokenRefusal::Unknown));
            };
            if expires_at_ms <= n.now_ms {
                return Err(StoreError::Token(TokenRefusal::Expired));
            }
            if cluster != n.cluster {
                return Err(StoreError::Conflict(format!(
                    "token belongs to cluster {cluster}, not {}",
                    n.cluster
                )));
            }
            if let Some((existing, key_hash, facts, last_seen, generation)) = tx
                .query_row(
                    "SELECT cluster, key_hash, facts, last_seen_ms, generation FROM nodes WHERE name = ?1",
                    [&n.name],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    },
                )
                .optional()?
            {
                if n.repeats(&existing, &key_hash, facts.is_empty() && last_seen == 0) {
                    tx.execute(
                        "UPDATE nodes SET cert_serial = ?2 WHERE name = ?1",
                        params![n.name, n.cert_serial],
                    )?;
                    insert_event(tx, &EventRow::reenrolled(&n))?;
                    return Ok(generation as u64);
                }
                return Err(StoreError::AlreadyExists(format!(
                    "node {} is already enrolled in cluster {existing}; to replace it, run `lksctl node delete {}` first",
                    n.name, n.name
                )));
            }
            if remaining == Some(0) {
                return Err(StoreError::Token(TokenRefusal::UsedUp));
            }
            if remaining.is_some() {
                tx.execute(
                    "UPDATE tokens SET remaining_uses = remaining_uses - 1 WHERE id = ?1",
                    [&n.token_id],
                )?;
            }
            let generation = next_generation(tx)?;
            tx.execute(
                "INSERT INTO nodes (name, cluster, labels, cert_serial, enrolled_at_ms, generation, key_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    n.name,
                    n.cluster,
                    labels_to_json(&n.labels)?,
                    n.cert_serial,
                    n.now_ms,
                    generation as i64,
                    n.key_hash
                ],
            )?;
            let targets = {
                let mut stmt = tx.prepare("SELECT bundle, version, selector FROM cluster_targets WHERE cluster = ?1")?;
                stmt.query_map([&n.cluster], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            let mut given: BTreeMap<String, String> = BTreeMap::new();
            for (bundle, version, selector) in targets {
                if selector_matches(&labels_from_json(&selector)?, &n.labels) {
                    tx.execute(
                        "INSERT INTO desired (node, bundle, version) VALUES (?1, ?2, ?3)",
                        params![n.name, bundle, version],
                    )?;
                    given.insert(bundle, version);
                }
            }
            // A running or paused rollout of the cluster takes the joiner in
            // too: it starts on the current target and waits for its turn.
            let running = {
                let mut stmt = tx.prepare(
                    "SELECT id, bundle, selector FROM rollouts WHERE cluster = ?1 AND state IN ('running', 'paused')",
                )?;
                stmt.query_map([&n.cluster], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            for (id, bundle, selector) in running {
                if selector_matches(&labels_from_json(&selector)?, &n.labels) {
                    let previous = given.get(&bundle).cloned().unwrap_or_default();
                    tx.execute(
                        "INSERT INTO rollout_nodes (rollout_id, node, previous_version, state, message)
                         VALUES (?1, ?2, ?3, 'waiting', '') ON CONFLICT DO NOTHING",
                        params![id, n.name, previous],
                    )?;
                }
            }
            insert_event(
                tx,
                &EventRow::enrolled(&n),
            )?;
            Ok(generation)
        })
        .await
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeRow>> {
        let name = name.to_string();
        self.call(move |c| read_node(c, &name)).await
    }

    async fn node_identity(&self, name: &str) -> Result<Option<(String, String)>> {
        let name = name.to_string();
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT cluster, cert_serial FROM nodes WHERE name = ?1",
                [name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn list_nodes(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>> {
        let cluster = cluster.map(str::to_string);
        self.call(move |c| {
            let names = {
                let mut stmt =
                    c.prepare("SELECT name FROM nodes WHERE ?1 IS NULL OR cluster = ?1 ORDER BY name")?;
                stmt.query_map([&cluster], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                if let Some(row) = read_node(c, &n)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn retry_node(
        &self,
        name: &str,
        bundle: Option<&str>,
        admin: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>> {
        let (name, bundle, admin) = (name.to_string(), bundle.map(str::to_string), admin.to_string());
        self.tx(move |tx| {
            let cluster: Option<String> = tx
                .query_row("SELECT cluster FROM nodes WHERE name = ?1", [&name], |r| r.get(0))
                .optional()?;
            let Some(cluster) = cluster else {
                return Ok(None);
            };
            let desired = {
                let mut stmt = tx.prepare("SELECT bundle FROM desired WHERE node = ?1 ORDER BY bundle")?;
                stmt.query_map([&name], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            let bundles = retry_targets(&name, desired, bundle.as_deref())?;
            if bundles.is_empty() {
                return Ok(Some(bundles));
            }
            let g = next_generation(tx)?;
            for b in &bundles {
                tx.execute(
                    "UPDATE desired SET retry = ?3 WHERE node = ?1 AND bundle = ?2",
                    params![name, b, g as i64],
                )?;
            }
            tx.execute(
                "UPDATE nodes SET generation = ?1 WHERE name = ?2",
                params![g as i64, name],
            )?;
            insert_event(tx, &EventRow::retry(&cluster, &name, &bundles, &admin, now_ms))?;
            Ok(Some(bundles))
        })
        .await
    }

    async fn set_node_hold(&self, name: &str, hold: Option<String>, mut event: EventRow) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| {
            let cluster: Option<String> = tx
                .query_row("SELECT cluster FROM nodes WHERE name = ?1", [&name], |r| r.get(0))
                .optional()?;
            let Some(cluster) = cluster else {
                return Ok(false);
            };
            tx.execute(
                "UPDATE nodes SET hold_reason = ?2 WHERE name = ?1",
                params![name, hold],
            )?;
            event.cluster = cluster;
            insert_event(tx, &event)?;
            Ok(true)
        })
        .await
    }

    async fn delete_node(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| {
            let cluster: Option<String> = tx
                .query_row("SELECT cluster FROM nodes WHERE name = ?1", [&name], |r| r.get(0))
                .optional()?;
            let Some(cluster) = cluster else {
                return Ok(false);
            };
            tx.execute("DELETE FROM nodes WHERE name = ?1", [&name])?;
            insert_event(tx, &EventRow::deleted(&cluster, &name, now_ms()))?;
            Ok(true)
        })
        .await
    }

    async fn replace_cert_serial(&self, name: &str, old: &str, new: &str) -> Result<()> {
        let (name, old, new) = (name.to_string(), old.to_string(), new.to_string());
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE nodes SET cert_serial = ?3 WHERE name = ?1 AND cert_serial = ?2",
                params![name, old, new],
            )?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "the certificate of node {name} was replaced or revoked meanwhile"
                )));
            }
            Ok(())
        })
        .await
    }

    async fn node_connected(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        now_ms: i64,
    ) -> Result<()> {
        let (name, facts) = (name.to_string(), facts_json.to_string());
        self.tx(move |tx| {
            tx.execute(
                "UPDATE nodes SET facts = ?2, connected = 1, last_seen_ms = ?3 WHERE name = ?1",
                params![name, facts, now_ms],
            )?;
            // The Hello lists everything the node holds; anything else it
            // reported earlier is gone.
            tx.execute("DELETE FROM actual WHERE node = ?1", [&name])?;
            for s in &held {
                upsert_actual(tx, &name, s)?;
            }
            Ok(())
        })
        .await
    }

    async fn node_disconnected(&self, name: &str, now_ms: i64) -> Result<()> {
        let name = name.to_string();
        self.tx(move |tx| {
            tx.execute(
                "UPDATE nodes SET connected = 0, last_seen_ms = MAX(last_seen_ms, ?2) WHERE name = ?1",
                params![name, now_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn record_status(&self, name: &str, statuses: Vec<BundleStatusRow>) -> Result<()> {
        let name = name.to_string();
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM nodes WHERE name = ?1", [&name], |_| Ok(()))
                .optional()?
                .is_some();
            if exists {
                for s in &statuses {
                    upsert_actual(tx, &name, s)?;
                }
                // Left out of the report and no longer desired: removed.
                let mut stmt = tx.prepare_cached(
                    "SELECT a.bundle FROM actual a WHERE a.node = ?1
                       AND NOT EXISTS (SELECT 1 FROM desired d WHERE d.node = a.node AND d.bundle = a.bundle)",
                )?;
                let undesired = stmt
                    .query_map([&name], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                for b in undesired.iter().filter(|b| !statuses.iter().any(|s| s.name == **b)) {
                    tx.execute("DELETE FROM actual WHERE node = ?1 AND bundle = ?2", params![name, b])?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn touch_nodes(&self, seen: Vec<(String, i64)>) -> Result<()> {
        if seen.is_empty() {
            return Ok(());
        }
        self.tx(move |tx| {
            let mut stmt =
                tx.prepare_cached("UPDATE nodes SET last_seen_ms = MAX(last_seen_ms, ?2) WHERE name = ?1")?;
            for (n, t) in &seen {
                stmt.execute(params![n, t])?;
            }
            Ok(())
        })
        .await
    }

    async fn mark_all_disconnected(&self) -> Result<()> {
        self.tx(|tx| {
            tx.execute("UPDATE nodes SET connected = 0 WHERE connected != 0", [])?;
            Ok(())
        })
        .await
    }

    async fn put_bundle(&self, b: NewBundle) -> Result<PutOutcome> {
        self.tx(move |tx| {
            let existing: Option<String> = tx
                .query_row(
                    "SELECT manifest_digest FROM bundles WHERE name = ?1 AND version = ?2",
                    params![b.name, b.version],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(d) = existing {
                return if d == b.manifest_digest {
                    Ok(PutOutcome::Unchanged)
                } else {
                    Err(StoreError::AlreadyExists(format!(
                        "bundle {}@{} already exists with other content ({d}); versions are immutable, publish a new version",
                        b.name, b.version
                    )))
                };
            }
            tx.execute(
                "INSERT INTO bundles (name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    b.name,
                    b.version,
                    b.signed_bundle,
                    b.manifest_digest,
                    b.signed,
                    b.files,
                    b.total_size as i64,
                    b.now_ms
                ],
            )?;
            let mut stmt = tx.prepare_cached(
                "INSERT INTO bundle_blobs (name, version, digest) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            )?;
            for d in &b.blob_digests {
                stmt.execute(params![b.name, b.version, d])?;
            }
            Ok(PutOutcome::Created)
        })
        .await
    }

    async fn get_bundle(&self, name: &str, version: &str) -> Result<Option<BundleRow>> {
        let (name, version) = (name.to_string(), version.to_string());
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
                 FROM bundles WHERE name = ?1 AND version = ?2",
                params![name, version],
                bundle_row,
            )
            .optional()?)
        })
        .await
    }

    async fn list_bundles(&self, name: Option<&str>) -> Result<Vec<BundleRow>> {
        let name = name.map(str::to_string);
        self.call(move |c| {
            let mut stmt = c.prepare(
                "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
                 FROM bundles WHERE ?1 IS NULL OR name = ?1 ORDER BY name, published_at_ms, version",
            )?;
            Ok(stmt.query_map([&name], bundle_row)?.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn desired_state(&self, node: &str) -> Result<DesiredState> {
        let node = node.to_string();
        self.call(move |c| {
            let generation: Option<i64> = c
                .query_row("SELECT generation FROM nodes WHERE name = ?1", [&node], |r| {
                    r.get(0)
                })
                .optional()?;
            let Some(generation) = generation else {
                return Err(StoreError::NotFound(format!("node {node} is not enrolled")));
            };
            let mut stmt = c.prepare_cached(
                "SELECT b.signed_bundle, d.bundle, d.retry FROM desired d
                 JOIN bundles b ON b.name = d.bundle AND b.version = d.version
                 WHERE d.node = ?1 ORDER BY d.bundle",
            )?;
            let rows = stmt
                .query_map([&node], |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = DesiredState {
                generation: generation as u64,
                ..Default::default()
            };
            for (bytes, bundle, retry) in rows {
                out.bundles.push(bytes);
                if retry > 0 {
                    out.retry.insert(bundle, retry as u64);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn blob_grants(&self, node: &str, digest: &str) -> Result<Vec<(String, String)>> {
        let (node, digest) = (node.to_string(), digest.to_string());
        self.call(move |c| {
            let mut st = c.prepare_cached(
                // A reported bundle counts only if a rollout of the node's
                // cluster assigned that version to it (as its target or as
                // the version it replaced): a node cannot read another
                // tenant's blobs by claiming to hold their bundle.
                "SELECT bb.name, bb.version FROM bundle_blobs bb WHERE bb.digest = ?2 AND (
                    EXISTS (SELECT 1 FROM desired d WHERE d.node = ?1 AND d.bundle = bb.name AND d.version = bb.version)
                    OR EXISTS (
                        SELECT 1 FROM actual a
                        JOIN nodes n ON n.name = a.node
                        JOIN rollout_nodes rn ON rn.node = a.node
                        JOIN rollouts r ON r.id = rn.rollout_id AND r.cluster = n.cluster AND r.bundle = a.bundle
                        WHERE a.node = ?1 AND a.bundle = bb.name AND a.version = bb.version
                          AND ((rn.touched = 1 AND r.version = a.version) OR rn.previous_version = a.version)))
                 LIMIT 16",
            )?;
            let rows = st
                .query_map(params![node, digest], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<std::result::Result<Vec<(String, String)>, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn start_rollout(&self, r: NewRollout) -> Result<RolloutRow> {
        self.tx(move |tx| {
            let cluster_ok = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&r.cluster], |_| Ok(()))
                .optional()?
                .is_some();
            if !cluster_ok {
                return Err(StoreError::NotFound(format!("cluster {} does not exist", r.cluster)));
            }
            let bundle_ok = tx
                .query_row(
                    "SELECT 1 FROM bundles WHERE name = ?1 AND version = ?2",
                    params![r.bundle, r.version],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if !bundle_ok {
                return Err(StoreError::NotFound(format!(
                    "bundle {}@{} is not published; publish it with `lksctl bundle publish DIR`",
                    r.bundle, r.version
                )));
            }
            if let Some((id, state)) = active_rollout(tx, &r.cluster, &r.bundle, &r.id)? {
                return Err(still_active(&r.cluster, &r.bundle, &id, &state));
            }
            let candidates = {
                let mut stmt = tx.prepare(
                    "SELECT n.name, n.labels, d.version FROM nodes n
                     LEFT JOIN desired d ON d.node = n.name AND d.bundle = ?2
                     WHERE n.cluster = ?1 ORDER BY n.name",
                )?;
                stmt.query_map(params![r.cluster, r.bundle], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, Option<String>>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            let mut nodes = Vec::new();
            for (node, labels, previous) in candidates {
                if selector_matches(&r.selector, &labels_from_json(&labels)?) {
                    nodes.push((node, previous.unwrap_or_default()));
                }
            }
            let batch_size = if r.batch_size == 0 {
                crate::rollout::default_batch_size(nodes.len())
            } else {
                r.batch_size
            };
            let previous_target = tx
                .query_row(
                    "SELECT version, selector, rollout_id FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2",
                    params![r.cluster, r.bundle],
                    |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()?;
            let (ptv, pts, ptr) = match previous_target {
                Some((v, s, id)) => (Some(v), Some(s), Some(id)),
                None => (None, None, None),
            };
            let selector = labels_to_json(&r.selector)?;
            tx.execute(
                "INSERT INTO rollouts (id, cluster, bundle, version, selector, batch_size, failure_threshold, state,
                     created_at_ms, updated_at_ms, message, offline_deadline_ms, revision,
                     prev_target_version, prev_target_selector, prev_target_rollout, policy, pacing)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8, ?8, '', ?9, 0, ?10, ?11, ?12, ?13, '{}')",
                params![
                    r.id,
                    r.cluster,
                    r.bundle,
                    r.version,
                    selector,
                    batch_size,
                    r.failure_threshold,
                    r.now_ms,
                    r.offline_deadline_ms as i64,
                    ptv,
                    pts,
                    ptr,
                    serde_json::to_string(&r.policy)?
                ],
            )?;
            for (node, previous) in &nodes {
                tx.execute(
                    "INSERT INTO rollout_nodes (rollout_id, node, previous_version, state, message)
                     VALUES (?1, ?2, ?3, 'waiting', '')",
                    params![r.id, node, previous],
                )?;
            }
            insert_event(
                tx,
                &EventRow::rollout_started(&r, batch_size, nodes.len()),
            )?;
            read_rollout(tx, &r.id)?
                .ok_or_else(|| StoreError::Backend(format!("rollout {} vanished in its own transaction", r.id)))
        })
        .await
    }

    async fn get_rollout(&self, id: &str) -> Result<Option<RolloutRow>> {
        let id = id.to_string();
        self.call(move |c| read_rollout(c, &id)).await
    }

    async fn list_rollouts(&self, cluster: Option<&str>, only_active: bool) -> Result<Vec<RolloutRow>> {
        let cluster = cluster.map(str::to_string);
        self.call(move |c| {
            let ids = {
                let mut stmt = c.prepare(
                    "SELECT id FROM rollouts WHERE (?1 IS NULL OR cluster = ?1)
                       AND (?2 = 0 OR state IN ('running', 'paused', 'rolling_back'))
                     ORDER BY created_at_ms, id",
                )?;
                stmt.query_map(params![cluster, only_active], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            read_rollouts(c, ids)
        })
        .await
    }

    async fn rollouts_to_drive(&self) -> Result<Vec<RolloutRow>> {
        self.call(move |c| {
            let ids = {
                let mut stmt = c.prepare(
                    "SELECT id FROM rollouts r WHERE state IN ('running', 'paused', 'rolling_back')
                        OR EXISTS (SELECT 1 FROM rollout_nodes rn WHERE rn.rollout_id = r.id AND rn.state = 'applying')
                        OR (state = 'completed' AND EXISTS (SELECT 1 FROM rollout_nodes rn
                              WHERE rn.rollout_id = r.id AND rn.state IN ('deferred', 'held')))
                     ORDER BY created_at_ms, id",
                )?;
                stmt.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            read_rollouts(c, ids)
        })
        .await
    }

    async fn commit_rollout(&self, c: RolloutCommit) -> Result<(RolloutRow, Vec<String>)> {
        self.tx(move |tx| {
            let mut r = c.rollout;
            let Some(stored) = read_rollout(tx, &r.id)? else {
                return Err(StoreError::NotFound(format!("rollout {} does not exist", r.id)));
            };
            if stored.revision != r.revision {
                return Err(StoreError::Conflict(format!(
                    "rollout {} changed meanwhile (revision {} is stored, the decision was based on {}); try again",
                    r.id, stored.revision, r.revision
                )));
            }
            if r.state.is_active()
                && !stored.state.is_active()
                && let Some((id, state)) = active_rollout(tx, &r.cluster, &r.bundle, &r.id)?
            {
                return Err(still_active(&r.cluster, &r.bundle, &id, &state));
            }
            let mut changed = Vec::new();
            for (node, version) in &c.assign {
                let Some(n) = r.nodes.iter_mut().find(|n| n.name == *node) else {
                    return Err(StoreError::Backend(format!(
                        "rollout {}: node {node} to assign is not part of it",
                        r.id
                    )));
                };
                let current: Option<Option<String>> = tx
                    .query_row(
                        "SELECT (SELECT version FROM desired WHERE node = ?1 AND bundle = ?2) FROM nodes WHERE name = ?1",
                        params![node, r.bundle],
                        |row| row.get(0),
                    )
                    .optional()?;
                let Some(current) = current else {
                    n.state = NodeState::Skipped;
                    n.message = "node was deleted".into();
                    continue;
                };
                let was_touched = stored.nodes.iter().any(|s| s.name == *node && s.touched);
                if !n.reverting && !was_touched {
                    n.previous_version = current.unwrap_or_default();
                }
                match version {
                    Some(v) => tx.execute(
                        "INSERT INTO desired (node, bundle, version) VALUES (?1, ?2, ?3)
                         ON CONFLICT (node, bundle) DO UPDATE SET version = excluded.version",
                        params![node, r.bundle, v],
                    )?,
                    None => tx.execute(
                        "DELETE FROM desired WHERE node = ?1 AND bundle = ?2",
                        params![node, r.bundle],
                    )?,
                };
                let g = next_generation(tx)?;
                tx.execute(
                    "UPDATE nodes SET generation = ?1 WHERE name = ?2",
                    params![g as i64, node],
                )?;
                n.generation = g;
                changed.push(node.clone());
            }
            r.revision = stored.revision + 1;
            tx.execute(
                "UPDATE rollouts SET state = ?2, message = ?3, updated_at_ms = ?4, revision = ?5, pacing = ?6
                 WHERE id = ?1",
                params![
                    r.id,
                    r.state.as_str(),
                    r.message,
                    r.updated_at_ms,
                    r.revision as i64,
                    serde_json::to_string(&r.pacing)?
                ],
            )?;
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE rollout_nodes SET previous_version = ?3, state = ?4, message = ?5, generation = ?6,
                         turn_at_ms = ?7, touched = ?8, reverting = ?9, unreached = ?10, canary = ?11
                     WHERE rollout_id = ?1 AND node = ?2",
                )?;
                for n in &r.nodes {
                    stmt.execute(params![
                        r.id,
                        n.name,
                        n.previous_version,
                        n.state.as_str(),
                        n.message,
                        n.generation as i64,
                        n.turn_at_ms,
                        n.touched,
                        n.reverting,
                        n.unreached,
                        n.canary
                    ])?;
                }
            }
            match c.target {
                TargetChange::Keep => {}
                TargetChange::SetToRollout => {
                    tx.execute(
                        "INSERT INTO cluster_targets (cluster, bundle, version, selector, rollout_id)
                         VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT (cluster, bundle) DO UPDATE SET version = excluded.version,
                             selector = excluded.selector, rollout_id = excluded.rollout_id",
                        params![r.cluster, r.bundle, r.version, labels_to_json(&r.selector)?, r.id],
                    )?;
                }
                TargetChange::RestorePrevious => {
                    // Only if this rollout is still what set the target.
                    let ours = tx
                        .query_row(
                            "SELECT 1 FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2 AND rollout_id = ?3",
                            params![r.cluster, r.bundle, r.id],
                            |_| Ok(()),
                        )
                        .optional()?
                        .is_some();
                    if ours {
                        match &r.previous_target {
                            Some(t) => tx.execute(
                                "UPDATE cluster_targets SET version = ?3, selector = ?4, rollout_id = ?5
                                 WHERE cluster = ?1 AND bundle = ?2",
                                params![r.cluster, r.bundle, t.version, labels_to_json(&t.selector)?, t.rollout_id],
                            )?,
                            None => tx.execute(
                                "DELETE FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2",
                                params![r.cluster, r.bundle],
                            )?,
                        };
                    }
                }
            }
            for e in &c.events {
                insert_event(tx, e)?;
            }
            let row = read_rollout(tx, &r.id)?
                .ok_or_else(|| StoreError::Backend(format!("rollout {} vanished in its own transaction", r.id)))?;
            Ok((row, changed))
        })
        .await
    }

    async fn rollout_views(&self, rollout_id: &str) -> Result<BTreeMap<String, NodeBundleView>> {
        let id = rollout_id.to_string();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT rn.node, n.last_seen_ms, d.version, a.version, a.state, a.message, a.updated_at_ms,
                        a.generation, r.bundle, n.connected, n.hold_reason IS NOT NULL, n.facts
                 FROM rollout_nodes rn
                 JOIN rollouts r ON r.id = rn.rollout_id
                 JOIN nodes n ON n.name = rn.node
                 LEFT JOIN desired d ON d.node = rn.node AND d.bundle = r.bundle
                 LEFT JOIN actual a ON a.node = rn.node AND a.bundle = r.bundle
                 WHERE rn.rollout_id = ?1",
            )?;
            let rows = stmt
                .query_map([&id], |r| {
                    Ok((
                        (
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<String>>(2)?,
                            r.get::<_, bool>(9)?,
                            r.get::<_, bool>(10)?,
                            r.get::<_, String>(11)?,
                        ),
                        (
                            r.get::<_, Option<String>>(3)?,
                            r.get::<_, Option<String>>(4)?,
                            r.get::<_, Option<String>>(5)?,
                            r.get::<_, Option<i64>>(6)?,
                            r.get::<_, Option<i64>>(7)?,
                            r.get::<_, String>(8)?,
                        ),
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = BTreeMap::new();
            for (
                (node, last_seen_ms, desired, connected, held, facts_json),
                (version, state, message, updated_at_ms, generation, bundle),
            ) in rows
            {
                let actual = match (version, state) {
                    (Some(version), Some(state)) => Some(BundleStatusRow {
                        fetched_from_server: 0,
                        fetched_from_peers: 0,
                        name: bundle,
                        version,
                        state: state_from_str(&state)?,
                        message: message.unwrap_or_default(),
                        updated_at_ms: updated_at_ms.unwrap_or_default(),
                        generation: generation.unwrap_or_default() as u64,
                    }),
                    _ => None,
                };
                out.insert(
                    node,
                    NodeBundleView {
                        desired,
                        actual,
                        last_seen_ms,
                        connected,
                        held,
                        facts_json,
                    },
                );
            }
            Ok(out)
        })
        .await
    }

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

fn bundle_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<BundleRow> {
    Ok(BundleRow {
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
    use crate::store::conformance;

    /// Each conformance case against a fresh in-memory database (the etcd
    /// store runs the same list against a throwaway etcd).
    macro_rules! conformance {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test]
            async fn $name() {
                conformance::$name(&SqliteStore::open_in_memory().unwrap()).await;
            }
        )*};
    }

    conformance!(
        clusters_and_tokens,
        enrolment_consumes_uses_atomically_and_names_are_unique,
        bundles_are_immutable,
        rollouts_assign_only_what_the_controller_decides,
        a_report_that_leaves_out_an_undesired_bundle_means_it_was_removed,
        status_and_events,
        rollout_policies_are_stored,
        a_lost_enrolment_answer_can_be_repeated_with_the_same_key,
        cluster_cas_and_issued_certificates,
        peer_settings_are_stored_per_cluster,
        certificate_records_outlive_their_node,
        certificate_records_expire_with_renewals,
        blob_records_are_compared_on_revisions,
        bundle_versions_in_use_are_not_deleted,
    );

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
