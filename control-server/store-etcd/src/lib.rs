//! The replicated store: every piece of state in etcd under one versioned
//! key prefix (`--etcd-prefix`, default `/lksadmin/v1/`), so several
//! `lks-control-server` replicas share it.
//!
//! This crate is the only code that knows the layout: every key below is
//! written and read here, behind the `Store` traits and the handles of what
//! the replicas share ([`EtcdStore::identity`], [`EtcdStore::replicas`],
//! [`EtcdStore::load_board`], [`EtcdStore::blob_chunks`],
//! [`EtcdStore::swarm`], [`EtcdStore::archive`]); no other crate links
//! etcd-client or spells a key (`scripts/check-layers.sh` checks it, with
//! the families of this table). Each record is one document (JSON unless
//! said) under its own key:
//!
//! | key (after the prefix)            | what                                          | module |
//! |-----------------------------------|-----------------------------------------------|--------|
//! | `meta/generation`                 | the generation floor (decimal text; `migrate` and `restore` set it) | lib.rs |
//! | `clusters/NAME`                   | a cluster, with its CA (key sealed if asked)  | `clusters` |
//! | `clusterkube/NAME`                | a cluster's tenant Kubernetes access (kubeconfig sealed if asked) | `clusters` |
//! | `certs/CLUSTER/NODE/SERIAL`       | a certificate issued with the cluster's CA    | `clusters` |
//! | `tokens/ID`                       | a bootstrap token (secret hashed)             | `tokens` |
//! | `nodes/NAME`                      | a node: labels, serial, facts, reports, replica | `nodes` |
//! | `desired/NAME`                    | a node's desired bundles and generation       | `desired` |
//! | `bundles/NAME/VERSION`            | a published bundle version                    | `bundles` |
//! | `targets/CLUSTER/BUNDLE`          | what joining nodes of a cluster receive       | `bundles` |
//! | `rollouts/ID`                     | a rollout's header (`rnodes/` holds its rows) | `rolloutdocs` |
//! | `rnodes/ID/NODE`                  | one node's row of rollout ID                  | `rolloutdocs` |
//! | `active/CLUSTER/BUNDLE`           | the id of the one active rollout, if any      | `rollouts` |
//! | `drive/ID`                        | present while the rollout needs driving       | `rollouts` |
//! | `timeline/MS-NONCE`               | the events one change recorded                | `events` |
//! | `events/MS-NONCE`                 | the events before 2026-11-26 (read and pruned) | `events` |
//! | `audit/MS-NONCE`                  | one audit record                              | `audit` |
//! | `releases/CLUSTER/VERSION`        | a signed release (version as 20 digits)       | `releases` |
//! | `plans/NAME`                      | a release plan: its groups, clusters and progress | `plans` |
//! | `relhead/CLUSTER`                 | the highest release's version and digest      | `releases` |
//! | `roots/CLUSTER/VERSION`           | a signed trust-root rotation (20 digits)      | `releases` |
//! | `deltas/HEX/FILE`                 | a patch record of a bundle version's file     | `deltas` |
//! | `blobs/DIGEST/c/N`                | a blob's bytes in chunks of 1 MiB (raw; `--blob-store etcd`) | `chunks` |
//! | `blobs/DIGEST/meta`               | a blob's size and chunk count, written last, deleted first | `chunks` |
//! | `blobrecs/DIGEST`                 | a blob in the blob store: size, last claim, a collector's `deleting` mark (under its lease) | `blobrecs` |
//! | `identity`                        | CA and admin credential (keys sealed if asked; its format is the server's) | `identity` |
//! | `replicas/ID`                     | a live replica (URL, release, store format), under its lease | `replicas` |
//! | `leader`                          | the id of the replica that drives rollouts (raw), under its lease | `replicas` |
//! | `load/ID`                         | how many agents replica ID holds, under its lease | `load` |
//! | `heard/ID`                        | when replica ID last heard one of its agents   | `seen` |
//! | `seen/ID`                         | (before `heard/`, read and folded away) last-seen time per node heard on replica ID | `seen` |
//! | `swarm/fetching/CLUSTER/HEX/ID`   | nodes fetching a blob through replica ID (under its lease) | `swarm` |
//! | `swarm/seed/CLUSTER/HEX`          | the one node of a cluster that may fetch a blob from the server now | `swarm` |
//!
//! A sealed CA key or kubeconfig is bound to its full key and field
//! (`<prefix>clusters/NAME#ca_key`, `<prefix>clusterkube/NAME#kubeconfig`):
//! the sealing code asks `ClusterStore::sealed_aad` for these bytes.
//!
//! Backup and restore (`lks-control-server backup|restore --store etcd`)
//! take every key but those under a lease, `blobs/` and `deltas/`
//! ([`archive`]); `migrate` writes a `Dump` into an empty prefix
//! (`import`).
//!
//! Every change is one etcd transaction whose compares name the
//! `mod_revision` of each document it was computed from (absent documents:
//! `create_revision == 0`). If another replica wrote any of them in between,
//! the transaction does nothing and the change is computed again from fresh
//! reads — optimistic concurrency as Kubernetes' own storage layer does it,
//! never a blind read-then-write. Token uses, node names, name@version
//! immutability, "one active rollout per cluster and bundle" and rollout
//! revisions are all settled this way.
//!
//! Connection state is not written per heartbeat: a node document names the
//! replica its stream is on, and it counts as connected while that
//! replica's lease-bound key `replicas/ID` exists. Nor are last-seen times
//! written per node: each replica writes, every flush interval, when it
//! last heard one of its agents (`heard/ID`, a few bytes), and a node whose
//! document names replica ID was seen then (or at its own `last_seen_ms`,
//! written at connect and disconnect, if later). That document is not
//! under the lease, so it outlives a replica killed hard: its nodes show
//! disconnected once the lease expires, seen at its last flush. The leader
//! settles what a dead replica left ([`EtcdStore::prune_seen`]): after
//! [`SETTLE_AFTER`] it writes that time into the documents of the nodes that
//! did not come back and no longer names the replica in them, then deletes
//! `heard/ID`. Until 2026-11 each replica wrote one document listing every
//! node it held (`seen/ID`, ~330 KiB per replica at 10,000 agents, every 5
//! s: 200 KiB/s of etcd history at 30,000 agents while idle); those of a
//! replica of that version are still read, and folded into the node
//! documents once it is gone.

#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod archive;
mod audit;
mod blobrecs;
mod bundledocs;
mod bundles;
mod cache;
mod chunks;
mod clusters;
mod deltas;
mod desired;
mod docs;
mod events;
mod identity;
mod import;
mod limits;
mod load;
mod name;
mod nodes;
mod plans;
pub mod reads;
mod reboots;
mod releases;
mod replicas;
mod rolloutdocs;
mod rollouts;
mod seen;
mod smallmap;
mod start;
mod status;
mod swarm;
mod tokens;

pub use archive::Archive;
pub use chunks::{BlobChunks, ChunkError, ChunkMeta};
pub use identity::Identity;
pub use limits::MAX_RESPONSE_BYTES;
use limits::{kv_of, watch_of};
pub use load::{Load, LoadBoard};
pub use replicas::{ReplicaLease, Replicas};
use seen::Liveness;
pub use seen::SETTLE_AFTER;
pub use swarm::Swarm;

pub use cache::Change;
pub use docs::ReplicaInfo;

use lks_store::{DesiredState, NodeBundleView, NodeRow, Result, StoreError};

use crate::docs::{DesiredDoc, NodeDoc, actual_row};

/// Optimistic transactions retried before giving up with `Conflict`.
const MAX_ATTEMPTS: usize = 16;
/// Enrolments contend on their token's use count; they retry longer.
const ENROL_ATTEMPTS: usize = 100;
const DEFAULT_EVENT_LIMIT: u32 = 100;
/// Event documents kept; older ones are pruned by the leader.
pub const MAX_EVENT_DOCS: usize = 20_000;
/// Deadline of one etcd call: a call that cannot finish in this time fails
/// with `Unavailable` instead of hanging a handler.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Key prefix; normalised to end with `/`.
    pub prefix: String,
    /// PEM of the CA that signed etcd's serving certificates (https endpoints).
    pub ca_pem: Option<String>,
    /// Client certificate and key (PEM) for etcd's client-certificate auth.
    pub client_cert_pem: Option<(String, String)>,
}

impl EtcdConfig {
    /// The key prefix as the store uses it: ending with `/`.
    pub fn normalized_prefix(&self) -> String {
        let mut prefix = self.prefix.clone();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        prefix
    }
}

/// The etcd [`Store`].
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    prefix: String,
    /// This replica's id: what node documents name while their stream is here.
    replica: String,
    /// When this replica last heard one of its agents (for `heard/ID`).
    heard_at: Arc<std::sync::atomic::AtomicI64>,
    /// The time last written to `heard/ID`.
    heard_written: Arc<std::sync::atomic::AtomicI64>,
    /// The lease this replica's keys are written under (0: none yet).
    lease: Arc<Mutex<i64>>,
    /// The watch-fed copy rollout views are read from (`cache.rs`).
    cache: Arc<cache::ViewCache>,
    /// The newest revision this replica's own transactions wrote: a view
    /// read from the copy waits for it (read-your-writes).
    written: Arc<std::sync::atomic::AtomicI64>,
    /// Status reports waiting for their batch (`status.rs`).
    statuses: Arc<status::StatusQueue>,
    /// Signed bundles as last read (`bundledocs.rs`).
    bundle_docs: Arc<bundledocs::BundleDocs>,
}

/// etcd could not be reached or had no quorum: `Unavailable`, which the
/// caller may retry; anything else etcd refused is a `Backend` failure.
fn unavailable(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    let transient = match &e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(st) => matches!(
            st.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
        ),
        _ => false,
    };
    if transient {
        StoreError::Unavailable(format!("etcd: {e}"))
    } else {
        StoreError::backend_at("etcd", e)
    }
}

/// How often the etcd members' client ports are probed.
const ENDPOINT_PROBE: Duration = Duration::from_secs(1);

/// Takes an etcd member whose client port refuses connections out of the
/// client's balanced channel, and puts it back once it answers again. The
/// channel alone keeps sending a share of requests to a dead member, each
/// failing `unavailable` (the region test in `tests/tests/ha.rs`). The last
/// member standing is never taken out. Ends when the store is dropped
/// (`alive` is its view copy).
async fn watch_endpoints(client: Client, endpoints: Vec<String>, alive: std::sync::Weak<cache::ViewCache>) {
    let mut out: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::time::sleep(ENDPOINT_PROBE).await;
        if alive.upgrade().is_none() {
            return;
        }
        for e in &endpoints {
            let hostport = e
                .split("://")
                .nth(1)
                .unwrap_or(e)
                .trim_end_matches('/')
                .to_string();
            let up = matches!(
                tokio::time::timeout(
                    Duration::from_millis(500),
                    tokio::net::TcpStream::connect(&hostport)
                )
                .await,
                Ok(Ok(_))
            );
            if !up && !out.contains(e) && out.len() + 1 < endpoints.len() {
                if client.remove_endpoint(e).await.is_ok() {
                    tracing::warn!(endpoint = %e, "etcd member unreachable: no requests go there until it answers");
                    out.insert(e.clone());
                }
            } else if up && out.contains(e) && client.add_endpoint(e).await.is_ok() {
                tracing::info!(endpoint = %e, "etcd member answers again");
                out.remove(e);
            }
        }
    }
}

/// What a rollout of `bundle` needs to know of node `name`.
fn node_view(
    bundle: &str,
    name: &str,
    doc: &NodeDoc,
    desired: Option<&DesiredDoc>,
    live: &Liveness,
) -> NodeBundleView {
    NodeBundleView {
        desired: desired.and_then(|d| d.bundles.get(bundle).map(String::from)),
        actual: doc.actual.get(bundle).map(|a| actual_row(bundle, a)),
        last_seen_ms: live.last_seen(name, doc),
        connected: live.connected(doc),
        held: doc.hold.is_some(),
        facts_json: doc.facts_json.to_string(),
    }
}

fn corrupt(key: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> StoreError {
    StoreError::backend_at(format!("stored document {key} is unreadable"), e)
}

fn busy(what: &str) -> StoreError {
    StoreError::Conflict(format!(
        "{what}: other replicas kept changing the same records; try again"
    ))
}

/// A document as read, with the revision its write must compare against
/// (0: absent).
struct Doc<T> {
    value: Option<T>,
    rev: i64,
}

impl<T> Doc<T> {
    fn compare(&self, key: &str) -> Compare {
        if self.rev == 0 {
            Compare::create_revision(key, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key, CompareOp::Equal, self.rev)
        }
    }
}

/// The answers of a transaction of `wanted` reads, in order; an error if
/// etcd answered anything else.
fn read_answers(resp: etcd_client::TxnResponse, wanted: usize) -> Result<Vec<etcd_client::GetResponse>> {
    let answers = resp.op_responses();
    if answers.len() != wanted {
        return Err(StoreError::backend(format!(
            "etcd answered {} of {wanted} reads",
            answers.len()
        )));
    }
    answers
        .into_iter()
        .map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Ok(g),
            _ => Err(StoreError::backend("etcd answered a read with something else")),
        })
        .collect()
}

/// A document read as JSON, as its type.
fn typed<T: DeserializeOwned>(key: &str, d: Option<Doc<serde_json::Value>>) -> Result<Doc<T>> {
    match d {
        Some(Doc { value: Some(v), rev }) => Ok(Doc {
            value: Some(serde_json::from_value(v).map_err(|e| corrupt(key, e))?),
            rev,
        }),
        _ => Ok(Doc { value: None, rev: 0 }),
    }
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| StoreError::backend_at("encode", e))
}

/// Sleeps a random 1..=2^min(attempt, 7) ms before another try of a
/// transaction that lost a race.
async fn backoff(attempt: usize) {
    let mut b = [0u8; 2];
    let _ = getrandom::getrandom(&mut b);
    let cap = 1u64 << attempt.min(7);
    let ms = 1 + u64::from(u16::from_le_bytes(b)) % cap;
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A random 16-hex-digit nonce.
fn nonce() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::getrandom(&mut b);
    hex::encode(b)
}

impl EtcdStore {
    /// Connects to etcd and checks that it answers; `replica` is this
    /// server's id for connection state.
    pub async fn connect(cfg: &EtcdConfig, replica: &str) -> Result<Self> {
        if cfg.endpoints.is_empty() {
            return Err(StoreError::backend("--etcd-endpoints is empty"));
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if cfg.ca_pem.is_some() || cfg.client_cert_pem.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &cfg.ca_pem {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &cfg.client_cert_pem {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        }
        let client = Client::connect(&cfg.endpoints, Some(opts))
            .await
            .map_err(|e| StoreError::Unavailable(format!("etcd at {}: {e}", cfg.endpoints.join(","))))?;
        let prefix = cfg.normalized_prefix();
        let store = EtcdStore {
            client,
            prefix,
            replica: replica.to_string(),
            heard_at: Arc::default(),
            heard_written: Arc::default(),
            lease: Arc::default(),
            cache: Arc::default(),
            written: Arc::default(),
            statuses: Arc::default(),
            bundle_docs: Arc::default(),
        };
        // A get proves etcd answers (a dial alone is lazy).
        let mut kv = crate::kv_of(&store.client);
        tokio::time::timeout(CALL_TIMEOUT, kv.get(store.key("meta/generation"), None))
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "etcd at {} did not answer within {}s",
                    cfg.endpoints.join(","),
                    CALL_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| StoreError::Unavailable(format!("etcd at {}: {e}", cfg.endpoints.join(","))))?;
        if cfg.endpoints.len() > 1 {
            tokio::spawn(watch_endpoints(
                store.client.clone(),
                cfg.endpoints.clone(),
                Arc::downgrade(&store.cache),
            ));
        }
        Ok(store)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The lease this replica registered under (0: not registered; no
    /// `heard/ID` is written before); set by [`Replicas::register`].
    pub(crate) fn set_lease(&self, lease: i64) {
        *lks_proto::sync::lock(&self.lease) = lease;
    }

    /// The full key of `rest`: only this crate writes the layout.
    pub(crate) fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    async fn get_raw(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv.get(key, None).await.map_err(unavailable)?;
        self.note_read(reads::Read::Get, key, resp.kvs());
        Ok(resp
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Doc<T>> {
        match self.get_raw(key).await? {
            None => Ok(Doc { value: None, rev: 0 }),
            Some((v, rev)) => Ok(Doc {
                value: Some(serde_json::from_slice(&v).map_err(|e| corrupt(key, e))?),
                rev,
            }),
        }
    }

    /// Several documents in one round trip (a transaction of reads; at most
    /// 128, etcd's `--max-txn-ops`), in the order of `keys`.
    async fn get_many<T: DeserializeOwned>(&self, keys: &[String]) -> Result<Vec<Doc<T>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(128) {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let mut kv = crate::kv_of(&self.client);
            let resp = kv.txn(Txn::new().and_then(ops)).await.map_err(unavailable)?;
            for (key, g) in chunk.iter().zip(read_answers(resp, chunk.len())?) {
                self.note_read(reads::Read::Get, key, g.kvs());
                out.push(match g.kvs().first() {
                    None => Doc { value: None, rev: 0 },
                    Some(kv) => Doc {
                        value: Some(serde_json::from_slice(kv.value()).map_err(|e| corrupt(key, e))?),
                        rev: kv.mod_revision(),
                    },
                });
            }
        }
        Ok(out)
    }

    /// Every document under `prefix` (a full key prefix), by key suffix.
    async fn range<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(String, T, i64)>> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, prefix, resp.kvs());
        let mut out = Vec::with_capacity(resp.kvs().len());
        for item in resp.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let v = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            out.push((key[prefix.len()..].to_string(), v, item.mod_revision()));
        }
        Ok(out)
    }

    /// How many keys are under `prefix` (a full key prefix); etcd counts
    /// them in its index and sends no value.
    async fn count(&self, prefix: &str) -> Result<u64> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(prefix, Some(GetOptions::new().with_prefix().with_count_only()))
            .await
            .map_err(unavailable)?;
        Ok(u64::try_from(resp.count()).unwrap_or(0))
    }

    /// The keys under `prefix` (a full key prefix), without it, each with
    /// its `mod_revision`; etcd sends no value.
    async fn key_revisions(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(prefix, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                    kv.mod_revision(),
                )
            })
            .collect())
    }

    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .key_revisions(prefix)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Runs one transaction; true if its compares held.
    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<bool> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .txn(Txn::new().when(compares).and_then(ops))
            .await
            .map_err(unavailable)?;
        if resp.succeeded()
            && let Some(h) = resp.header()
        {
            self.wrote(h.revision());
        }
        Ok(resp.succeeded())
    }

    /// [`Store::list_nodes`] read from etcd: every node document, desired
    /// state and last-seen document of the region.
    async fn nodes_from_etcd(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>> {
        let nodes = self.range::<NodeDoc>(&self.key("nodes/")).await?;
        let mut desired: HashMap<String, DesiredDoc> = self
            .range::<DesiredDoc>(&self.key("desired/"))
            .await?
            .into_iter()
            .map(|(k, v, _)| (k, v))
            .collect();
        let live = self.liveness().await?;
        Ok(nodes
            .into_iter()
            .filter(|(_, d, _)| cluster.is_none_or(|c| d.cluster == c))
            .map(|(name, d, _)| {
                let des = desired.remove(&name);
                Self::node_row(&name, d, des, &live)
            })
            .collect())
    }

    /// The desired state of `node` whose document is `d`, with its signed
    /// bundles.
    async fn desired_from(&self, node: &str, d: DesiredDoc) -> Result<DesiredState> {
        let keys: Vec<String> = d
            .bundles
            .iter()
            .map(|(b, v)| self.key(&format!("bundles/{b}/{v}")))
            .collect();
        // Copies of the signed bundles when etcd still has those documents.
        let signed = self.signed_bundles(&keys).await?;
        let mut bundles = Vec::with_capacity(d.bundles.len());
        for (doc, (b, v)) in signed.into_iter().zip(&d.bundles) {
            let Some(doc) = doc else {
                return Err(StoreError::backend(format!(
                    "desired bundle {b}@{v} of node {node} is missing"
                )));
            };
            bundles.push(Vec::clone(&doc));
        }
        Ok(DesiredState {
            generation: d.generation,
            bundles,
            retry: d.retry.into(),
            reboot: d.reboot,
        })
    }

    /// Counts a read of `kvs` under `key` (a full key) in [`reads`].
    fn note_read(&self, read: reads::Read, key: &str, kvs: &[etcd_client::KeyValue]) {
        let rest = key.strip_prefix(self.prefix.as_str()).unwrap_or(key);
        reads::note(read, rest, kvs.iter().map(|kv| kv.value().len()).sum());
    }

    fn put(&self, rest: &str, bytes: Vec<u8>) -> TxnOp {
        TxnOp::put(self.key(rest), bytes, None)
    }

    fn node_row(name: &str, doc: NodeDoc, desired: Option<DesiredDoc>, live: &Liveness) -> NodeRow {
        let desired = desired.unwrap_or_default();
        NodeRow {
            name: name.to_string(),
            connected: live.connected(&doc),
            last_seen_ms: live.last_seen(name, &doc),
            actual: doc
                .actual
                .iter()
                .map(|(b, a)| (b.to_string(), actual_row(b, a)))
                .collect(),
            cluster: doc.cluster.to_string(),
            labels: doc.labels,
            cert_serial: doc.cert_serial.into(),
            facts_json: doc.facts_json.into(),
            enrolled_at_ms: doc.enrolled_at_ms,
            generation: desired.generation,
            desired: desired.bundles.into(),
            hold: doc.hold.map(String::from),
            key_hash: doc.key_hash.into(),
            trust: doc.trust.map(|t| *t),
            reboot: doc.reboot.map(|r| *r),
            reboot_request: desired.reboot,
        }
    }

    /// Reads a value stored by [`Self::create_once`] or anything else.
    pub(crate) async fn get_bytes(&self, rest: &str) -> Result<Option<(Vec<u8>, i64)>> {
        self.get_raw(&self.key(rest)).await
    }

    /// Stores `value` at `rest` if the key does not exist; returns what is
    /// stored afterwards (ours, or the one another replica stored first).
    pub(crate) async fn create_once(&self, rest: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        let key = self.key(rest);
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await
            .map_err(unavailable)?;
        if resp.succeeded() {
            return Ok(value);
        }
        for r in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = r
                && let Some(kv) = g.kvs().first()
            {
                return Ok(kv.value().to_vec());
            }
        }
        Err(StoreError::backend(format!("{key} vanished while it was read")))
    }

    /// Replaces `rest` if it still has revision `rev`.
    pub(crate) async fn replace(&self, rest: &str, rev: i64, value: Vec<u8>) -> Result<bool> {
        let key = self.key(rest);
        self.txn(
            vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
            vec![TxnOp::put(key, value, None)],
        )
        .await
    }

    /// Puts raw bytes (content-addressed data that needs no compare).
    pub(crate) async fn put_bytes(&self, rest: &str, value: Vec<u8>) -> Result<()> {
        let mut kv = crate::kv_of(&self.client);
        kv.put(self.key(rest), value, None).await.map_err(unavailable)?;
        Ok(())
    }

    /// The least generation a desired state written now may take: the
    /// floor `meta/generation` (set by `migrate` to the highest generation
    /// it brought along, else 0) plus etcd's current revision, read after
    /// everything the write is based on, plus one.
    ///
    /// No counter is written: a node's previous desired state was written
    /// at a revision its generation does not exceed, and that write was
    /// read before this call, so a generation from here is larger than any
    /// the node had. Concurrent enrolments and rollouts therefore never
    /// contend on a shared key.
    async fn next_generation(&self) -> Result<u64> {
        let mut kv = crate::kv_of(&self.client);
        let resp = kv
            .get(self.key("meta/generation"), None)
            .await
            .map_err(unavailable)?;
        let rev = resp.header().map_or(0, |h| h.revision()).max(0) as u64;
        let floor = resp
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        // floor is fixed once data exists, so this rises with the revision.
        Ok(floor + rev + 1)
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
pub(crate) mod tests;
