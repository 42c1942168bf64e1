//! The SQLite schema: every migration in order, from the first table to
//! the newest column. A database records in `PRAGMA user_version` how many
//! it has applied; opening it applies the rest, each in its own transaction.

/// Schema versions in order; `user_version` counts how many are applied.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // The audit trail: one row per admin call that changed state or
    // tried to. AUTOINCREMENT: a pruned record's id is never reused.
    r#"
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    verb TEXT NOT NULL,
    target TEXT NOT NULL,
    args TEXT NOT NULL,
    outcome TEXT NOT NULL,
    caller TEXT NOT NULL,
    caller_fingerprint TEXT NOT NULL,
    server TEXT NOT NULL
);
CREATE INDEX audit_at ON audit (at_ms);
"#,
    // Signed releases and trust-root rotations per cluster (issue
    // [trust]), as the encoded protobuf agents receive; and each node's
    // last reported release trust (JSON, NULL: never reported).
    r#"
CREATE TABLE releases (
    cluster TEXT NOT NULL,
    version INTEGER NOT NULL,
    digest TEXT NOT NULL,
    signed_release BLOB NOT NULL,
    published_at_ms INTEGER NOT NULL,
    PRIMARY KEY (cluster, version)
);
CREATE TABLE roots (
    cluster TEXT NOT NULL,
    version INTEGER NOT NULL,
    signed_root BLOB NOT NULL,
    published_at_ms INTEGER NOT NULL,
    PRIMARY KEY (cluster, version)
);
ALTER TABLE nodes ADD COLUMN trust TEXT;
"#,
    // Each cluster's tenant Kubernetes access (issue [kube-drain]): the
    // kubeconfig as the server hands it over (in this 0700 data dir, like
    // the CA keys), and whether its rollouts drain by default; each rollout
    // node's step with its tenant cluster (KubeStep) and since when.
    r#"
ALTER TABLE clusters ADD COLUMN kubeconfig TEXT;
ALTER TABLE clusters ADD COLUMN kube_drain INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN kube_step TEXT NOT NULL DEFAULT '';
ALTER TABLE rollout_nodes ADD COLUMN kube_since_ms INTEGER NOT NULL DEFAULT 0;
"#,
    // Binary deltas (issue [delta]): per file of a bundle version, the
    // patch from an earlier version's file (`patch` '': tried and skipped,
    // not tried again). Kept while the version is; the collector keeps a
    // patch while its row is.
    r#"
CREATE TABLE deltas (
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    path TEXT NOT NULL,
    arch TEXT NOT NULL,
    base TEXT NOT NULL,
    from_version TEXT NOT NULL,
    target TEXT NOT NULL,
    size INTEGER NOT NULL,
    patch TEXT NOT NULL,
    patch_size INTEGER NOT NULL,
    algorithm TEXT NOT NULL,
    note TEXT NOT NULL,
    made_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, version, path, arch, base)
);
CREATE INDEX deltas_target ON deltas (target);
CREATE INDEX deltas_patch ON deltas (patch);
ALTER TABLE actual ADD COLUMN fetched_delta INTEGER NOT NULL DEFAULT 0;
"#,
    // Why a file has no patch (issue [upgrade-cost]): `NoPatch`'s stored
    // form ('' for a patch, and for rows recorded before).
    r#"
ALTER TABLE deltas ADD COLUMN why TEXT NOT NULL DEFAULT '';
"#,
    // Reboots (issue [reboots]): each node's reboot state as its agent
    // last reported it (JSON, NULL: never reported) and its last reboot
    // request (`lksctl node reboot`; 0: none), which its desired state carries.
    r#"
ALTER TABLE nodes ADD COLUMN reboot TEXT;
ALTER TABLE nodes ADD COLUMN reboot_request INTEGER NOT NULL DEFAULT 0;
"#,
    // When a rollout node's drain began (issue [shape-3]), so its outcome
    // says how long the drain took without reading it back from the
    // message (0: it did not drain, or the row is older).
    r#"
ALTER TABLE rollout_nodes ADD COLUMN drain_started_ms INTEGER NOT NULL DEFAULT 0;
"#,
    // Coordinated reboots (issue [reboots]): each cluster's reboot policy
    // (JSON, NULL: off) and its reboot lock (the slots, the rolling reboot,
    // as JSON) with the revision each write bumps.
    r#"
ALTER TABLE clusters ADD COLUMN reboots TEXT;
CREATE TABLE reboot_locks (
    cluster TEXT PRIMARY KEY REFERENCES clusters(name),
    doc TEXT NOT NULL,
    revision INTEGER NOT NULL
);
"#,
    // Release plans (issue [fleet-plans]): each plan one JSON record
    // (`lks_store::PlanRow`) with the revision its next write compares;
    // and each cluster's labels, which plans select clusters by.
    r#"
CREATE TABLE plans (
    name     TEXT PRIMARY KEY,
    doc      TEXT NOT NULL,
    revision INTEGER NOT NULL
);
ALTER TABLE clusters ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
"#,
];
