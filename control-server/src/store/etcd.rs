//! The replicated store: every piece of state in etcd under one versioned
//! key prefix (`--etcd-prefix`, default `/lksadmin/v1/`), so several
//! `lks-control-server` replicas share it.
//!
//! Each record is one JSON document under its own key:
//!
//! | key (after the prefix)            | what                                          |
//! |-----------------------------------|-----------------------------------------------|
//! | `meta/generation`                 | the last desired-state generation handed out  |
//! | `clusters/NAME`                   | a cluster, with its CA (key sealed if asked)  |
//! | `certs/CLUSTER/NODE/SERIAL`       | a certificate issued with the cluster's CA    |
//! | `tokens/ID`                       | a bootstrap token (secret hashed)             |
//! | `nodes/NAME`                      | a node: labels, serial, facts, reports, replica |
//! | `desired/NAME`                    | a node's desired bundles and generation       |
//! | `bundles/NAME/VERSION`            | a published bundle version                    |
//! | `targets/CLUSTER/BUNDLE`          | what joining nodes of a cluster receive       |
//! | `rollouts/ID`                     | a rollout's header (`rnodes/` holds its rows) |
//! | `rnodes/ID/NODE`                  | one node's row of rollout ID ([`rollouts`])   |
//! | `active/CLUSTER/BUNDLE`           | the id of the one active rollout, if any      |
//! | `drive/ID`                        | present while the rollout needs driving       |
//! | `events/MS-NONCE`                 | the events one change recorded                |
//! | `blobs/DIGEST/meta`, `…/c/N`      | blob bytes in chunks (`--blob-store etcd`, [`crate::blobs::EtcdChunks`]) |
//! | `blobrecs/DIGEST`                 | a blob in the blob store: size, last claim, a collector's `deleting` mark (under its lease) |
//! | `identity`                        | CA and admin credential (keys sealed if asked) |
//! | `replicas/ID`, `load/ID`, `leader`| per-replica state under the replica's lease (`load/ID`: agents held, [`crate::rebalance`]) |
//! | `seen/ID`                         | last-seen times of the nodes heard on replica ID |
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
//! replica's lease-bound key `replicas/ID` exists. Last-seen times are
//! gathered per replica and written as one document (`seen/ID`) per flush
//! interval. That document outlives its replica, so a hard kill loses no
//! last-seen time; the leader trims a dead replica's document to the nodes
//! no live replica has heard since, and deletes it once none is left
//! ([`EtcdStore::prune_seen`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use lks_proto::BundleState;
use lks_proto::labels::{Labels, selector_matches};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod blobrecs;
mod bundledocs;
mod bundles;
mod cache;
mod clusters;
mod desired;
mod events;
mod import;
mod limits;
mod nodes;
pub mod reads;
mod rollouts;
mod smallmap;
mod start;
mod status;
mod tokens;

use smallmap::SmallMap;

pub use limits::{MAX_RESPONSE_BYTES, kv_of, watch_of};
use rollouts::{RolloutDoc, RolloutNodeDoc};

pub use cache::Change;

use super::*;
use crate::clock::now_ms;

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

/// The etcd [`Store`].
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    prefix: String,
    /// This replica's id: what node documents name while their stream is here.
    replica: String,
    /// Last-seen times of the nodes heard on this replica (for `seen/ID`).
    seen: Arc<Mutex<HashMap<String, i64>>>,
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
        StoreError::Backend(format!("etcd: {e}"))
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
        desired: desired.and_then(|d| d.bundles.get(bundle).cloned()),
        actual: doc.actual.get(bundle).map(|a| actual_row(bundle, a)),
        last_seen_ms: live.last_seen(name, doc),
        connected: live.connected(doc),
        held: doc.hold.is_some(),
        facts_json: doc.facts_json.clone(),
    }
}

fn corrupt(key: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("stored document {key} is unreadable: {e}"))
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

#[derive(Serialize, Deserialize, Clone)]
struct ClusterDoc {
    created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    maintenance_windows: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_cert_pem: Option<String>,
    /// As the server handed it over: PEM, or a sealed envelope in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_server: Option<String>,
    /// Documents written before peer sharing read as the defaults (off).
    #[serde(default)]
    peer: PeerSettings,
}

impl ClusterDoc {
    fn new(c: &NewCluster) -> Self {
        ClusterDoc {
            created_at_ms: c.now_ms,
            maintenance_windows: Vec::new(),
            ca_cert_pem: c.ca.as_ref().map(|a| a.cert_pem.clone()),
            ca_key: c.ca.as_ref().map(|a| a.key.clone()),
            api_server: c.api_server.clone(),
            peer: PeerSettings::default(),
        }
    }

    fn into_row(self, name: &str, node_count: u32) -> ClusterRow {
        ClusterRow {
            name: name.to_string(),
            created_at_ms: self.created_at_ms,
            node_count,
            maintenance_windows: self.maintenance_windows,
            ca_cert_pem: self.ca_cert_pem,
            api_server: self.api_server,
            peer: self.peer,
        }
    }
}

#[derive(Serialize, Deserialize, Clone)]
struct TokenDoc {
    secret_hash: String,
    cluster: String,
    expires_at_ms: i64,
    remaining_uses: Option<u32>,
    labels: Labels,
    created_at_ms: i64,
}

impl TokenDoc {
    fn from_row(t: &TokenRow) -> Self {
        TokenDoc {
            secret_hash: hex::encode(t.secret_hash),
            cluster: t.cluster.clone(),
            expires_at_ms: t.expires_at_ms,
            remaining_uses: t.remaining_uses,
            labels: t.labels.clone(),
            created_at_ms: t.created_at_ms,
        }
    }
}

#[derive(Serialize, Deserialize, Clone)]
struct ActualDoc {
    version: String,
    state: BundleState,
    message: String,
    updated_at_ms: i64,
    generation: u64,
    /// Bytes fetched for the version, by source; absent (0) in documents
    /// written before peer sharing, and left out while 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    fetched_server: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    fetched_peers: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, Clone)]
struct NodeDoc {
    cluster: String,
    labels: Labels,
    cert_serial: String,
    facts_json: String,
    last_seen_ms: i64,
    enrolled_at_ms: i64,
    /// The replica holding the node's stream ("" if none).
    replica: String,
    actual: SmallMap<ActualDoc>,
    /// Held by the operator, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold: Option<String>,
    /// Hash of the key the node enrolled with.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    key_hash: String,
}

#[derive(Serialize, Deserialize, Clone, Default)]
struct DesiredDoc {
    generation: u64,
    bundles: SmallMap<String>,
    /// Bundle → generation of the operator's last retry request.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    retry: SmallMap<u64>,
}

#[derive(Serialize, Deserialize, Clone)]
struct BundleDoc {
    signed_bundle: String,
    manifest_digest: String,
    signed: bool,
    files: u32,
    total_size: u64,
    published_at_ms: i64,
    blob_digests: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone)]
struct TargetDoc {
    pub version: String,
    pub selector: Labels,
    pub rollout_id: String,
}

fn actual_row(name: &str, a: &ActualDoc) -> BundleStatusRow {
    BundleStatusRow {
        name: name.to_string(),
        version: a.version.clone(),
        state: a.state,
        message: a.message.clone(),
        updated_at_ms: a.updated_at_ms,
        generation: a.generation,
        fetched_from_server: a.fetched_server,
        fetched_from_peers: a.fetched_peers,
    }
}

fn actual_doc(s: &BundleStatusRow) -> ActualDoc {
    ActualDoc {
        version: s.version.clone(),
        state: s.state,
        message: s.message.clone(),
        updated_at_ms: s.updated_at_ms,
        generation: s.generation,
        fetched_server: s.fetched_from_server,
        fetched_peers: s.fetched_from_peers,
    }
}

/// The answers of a transaction of `wanted` reads, in order; an error if
/// etcd answered anything else.
fn read_answers(resp: etcd_client::TxnResponse, wanted: usize) -> Result<Vec<etcd_client::GetResponse>> {
    let answers = resp.op_responses();
    if answers.len() != wanted {
        return Err(StoreError::Backend(format!(
            "etcd answered {} of {wanted} reads",
            answers.len()
        )));
    }
    answers
        .into_iter()
        .map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Ok(g),
            _ => Err(StoreError::Backend(
                "etcd answered a read with something else".into(),
            )),
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
    serde_json::to_vec(v).map_err(|e| StoreError::Backend(format!("encode: {e}")))
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

/// Live replicas and what each last heard, read in one go.
struct Liveness {
    replicas: BTreeSet<String>,
    seen: HashMap<String, i64>,
}

impl Liveness {
    fn connected(&self, doc: &NodeDoc) -> bool {
        !doc.replica.is_empty() && self.replicas.contains(&doc.replica)
    }

    fn last_seen(&self, name: &str, doc: &NodeDoc) -> i64 {
        doc.last_seen_ms.max(self.seen.get(name).copied().unwrap_or(0))
    }
}

impl EtcdStore {
    /// Connects to etcd and checks that it answers; `replica` is this
    /// server's id for connection state.
    pub async fn connect(cfg: &EtcdConfig, replica: &str) -> Result<Self> {
        if cfg.endpoints.is_empty() {
            return Err(StoreError::Backend("--etcd-endpoints is empty".into()));
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
        let mut prefix = cfg.prefix.clone();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let store = EtcdStore {
            client,
            prefix,
            replica: replica.to_string(),
            seen: Arc::default(),
            lease: Arc::default(),
            cache: Arc::default(),
            written: Arc::default(),
            statuses: Arc::default(),
            bundle_docs: Arc::default(),
        };
        // A get proves etcd answers (a dial alone is lazy).
        let mut kv = crate::store::etcd::kv_of(&store.client);
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

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The lease `seen/ID` is written under; set by the replica's lease keeper.
    pub fn set_lease(&self, lease: i64) {
        if let Ok(mut l) = self.lease.lock() {
            *l = lease;
        }
    }

    pub fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    async fn get_raw(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>> {
        let mut kv = crate::store::etcd::kv_of(&self.client);
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
            let mut kv = crate::store::etcd::kv_of(&self.client);
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
        let mut kv = crate::store::etcd::kv_of(&self.client);
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

    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut kv = crate::store::etcd::kv_of(&self.client);
        let resp = kv
            .get(prefix, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned())
            .collect())
    }

    /// Runs one transaction; true if its compares held.
    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<bool> {
        let mut kv = crate::store::etcd::kv_of(&self.client);
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
                return Err(StoreError::Backend(format!(
                    "desired bundle {b}@{v} of node {node} is missing"
                )));
            };
            bundles.push(Vec::clone(&doc));
        }
        Ok(DesiredState {
            generation: d.generation,
            bundles,
            retry: d.retry.into(),
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

    async fn liveness(&self) -> Result<Liveness> {
        let replicas = self.keys(&self.key("replicas/")).await?.into_iter().collect();
        let mut seen: HashMap<String, i64> = HashMap::new();
        for (_, map, _) in self.range::<HashMap<String, i64>>(&self.key("seen/")).await? {
            for (n, t) in map {
                let e = seen.entry(n).or_default();
                *e = (*e).max(t);
            }
        }
        Ok(Liveness { replicas, seen })
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
                .map(|(b, a)| (b.clone(), actual_row(b, a)))
                .collect(),
            cluster: doc.cluster,
            labels: doc.labels,
            cert_serial: doc.cert_serial,
            facts_json: doc.facts_json,
            enrolled_at_ms: doc.enrolled_at_ms,
            generation: desired.generation,
            desired: desired.bundles.into(),
            hold: doc.hold,
            key_hash: doc.key_hash,
        }
    }

    fn event_op(&self, events: &[EventRow]) -> Result<Option<TxnOp>> {
        if events.is_empty() {
            return Ok(None);
        }
        let at = events.iter().map(|e| e.at_ms).max().unwrap_or_default().max(0);
        let docs: Vec<EventDoc> = events.iter().map(EventDoc::from_row).collect();
        Ok(Some(
            self.put(&format!("events/{at:016}-{}", nonce()), json(&docs)?),
        ))
    }

    /// Drops the oldest event documents beyond [`MAX_EVENT_DOCS`].
    pub async fn prune_events(&self) -> Result<usize> {
        self.prune_events_to(MAX_EVENT_DOCS).await
    }

    /// Keeps the newest `keep` event documents.
    async fn prune_events_to(&self, keep: usize) -> Result<usize> {
        let prefix = self.key("events/");
        let keys = self.keys(&prefix).await?;
        if keys.len() <= keep {
            return Ok(0);
        }
        let drop = keys.len() - keep;
        // Keys sort by time: delete [first, the first one kept).
        let end = format!("{prefix}{}", keys[drop]);
        let mut kv = crate::store::etcd::kv_of(&self.client);
        kv.delete(
            format!("{prefix}{}", keys[0]),
            Some(etcd_client::DeleteOptions::new().with_range(end)),
        )
        .await
        .map_err(unavailable)?;
        Ok(drop)
    }

    /// Trims the `seen/ID` documents of replicas that are gone (no
    /// `replicas/ID`) to the nodes that still exist and that no live
    /// replica has heard from since, deleting a document left empty.
    /// Returns how many documents were deleted.
    pub async fn prune_seen(&self) -> Result<usize> {
        let live: BTreeSet<String> = self.keys(&self.key("replicas/")).await?.into_iter().collect();
        let nodes: BTreeSet<String> = self.keys(&self.key("nodes/")).await?.into_iter().collect();
        let docs = self.range::<HashMap<String, i64>>(&self.key("seen/")).await?;
        let mut heard: HashMap<&str, i64> = HashMap::new();
        for (_, map, _) in docs.iter().filter(|(id, _, _)| live.contains(id)) {
            for (n, t) in map {
                let e = heard.entry(n.as_str()).or_default();
                *e = (*e).max(*t);
            }
        }
        let mut deleted = 0;
        for (id, map, rev) in docs.iter().filter(|(id, _, _)| !live.contains(id)) {
            let kept: HashMap<&String, &i64> = map
                .iter()
                .filter(|(n, t)| nodes.contains(*n) && heard.get(n.as_str()).is_none_or(|h| h < *t))
                .collect();
            if kept.len() == map.len() {
                continue;
            }
            let key = self.key(&format!("seen/{id}"));
            let at = Compare::mod_revision(key.clone(), CompareOp::Equal, *rev);
            let op = if kept.is_empty() {
                deleted += 1;
                TxnOp::delete(key, None)
            } else {
                TxnOp::put(key, json(&kept)?, None)
            };
            // Lost to a concurrent trim: the next pass looks again.
            self.txn(vec![at], vec![op]).await?;
        }
        Ok(deleted)
    }

    /// Writes this replica's gathered last-seen times as one document,
    /// not under the lease: it outlives a replica killed hard.
    async fn flush_seen(&self) -> Result<()> {
        let (map, lease) = {
            let seen = self
                .seen
                .lock()
                .map_err(|_| StoreError::Backend("seen map poisoned".into()))?;
            let lease = *self
                .lease
                .lock()
                .map_err(|_| StoreError::Backend("lease poisoned".into()))?;
            (json(&*seen)?, lease)
        };
        if lease == 0 {
            return Ok(());
        }
        let mut kv = crate::store::etcd::kv_of(&self.client);
        kv.put(self.key(&format!("seen/{}", self.replica)), map, None)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Reads a value stored by [`Self::create_once`] or anything else.
    pub async fn get_bytes(&self, rest: &str) -> Result<Option<(Vec<u8>, i64)>> {
        self.get_raw(&self.key(rest)).await
    }

    /// Stores `value` at `rest` if the key does not exist; returns what is
    /// stored afterwards (ours, or the one another replica stored first).
    pub async fn create_once(&self, rest: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        let key = self.key(rest);
        let mut kv = crate::store::etcd::kv_of(&self.client);
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
        Err(StoreError::Backend(format!("{key} vanished while it was read")))
    }

    /// Replaces `rest` if it still has revision `rev`.
    pub async fn replace(&self, rest: &str, rev: i64, value: Vec<u8>) -> Result<bool> {
        let key = self.key(rest);
        self.txn(
            vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
            vec![TxnOp::put(key, value, None)],
        )
        .await
    }

    /// Puts raw bytes (content-addressed data that needs no compare).
    pub async fn put_bytes(&self, rest: &str, value: Vec<u8>) -> Result<()> {
        let mut kv = crate::store::etcd::kv_of(&self.client);
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
        let mut kv = crate::store::etcd::kv_of(&self.client);
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

/// An event as stored (its id comes from the etcd revision that stored it).
#[derive(Serialize, Deserialize)]
struct EventDoc {
    at_ms: i64,
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    rollout_id: String,
    kind: String,
    #[serde(default)]
    bundle: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    message: String,
}

impl EventDoc {
    fn from_row(e: &EventRow) -> Self {
        EventDoc {
            at_ms: e.at_ms,
            cluster: e.cluster.clone(),
            node: e.node.clone(),
            rollout_id: e.rollout_id.clone(),
            kind: e.kind.clone(),
            bundle: e.bundle.clone(),
            version: e.version.clone(),
            message: e.message.clone(),
        }
    }

    fn into_row(self, id: u64) -> EventRow {
        EventRow {
            id,
            at_ms: self.at_ms,
            cluster: self.cluster,
            node: self.node,
            rollout_id: self.rollout_id,
            kind: self.kind,
            bundle: self.bundle,
            version: self.version,
            message: self.message,
        }
    }
}

fn bundle_row(name: &str, version: &str, d: BundleDoc) -> Result<BundleRow> {
    Ok(BundleRow {
        name: name.to_string(),
        version: version.to_string(),
        signed_bundle: hex::decode(&d.signed_bundle)
            .map_err(|e| corrupt(&format!("bundles/{name}/{version}"), e))?,
        manifest_digest: d.manifest_digest,
        signed: d.signed,
        files: d.files,
        total_size: d.total_size,
        published_at_ms: d.published_at_ms,
    })
}

impl EtcdStore {
    /// Read-modify-write of one node document; `f` returns false to leave
    /// it unchanged. A missing node is not an error (it was deleted).
    async fn update_node(&self, name: &str, f: impl Fn(&mut NodeDoc) -> bool) -> Result<()> {
        let nkey = self.key(&format!("nodes/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let doc: Doc<NodeDoc> = self.get(&nkey).await?;
            let Some(mut d) = doc.value.clone() else {
                return Ok(());
            };
            if !f(&mut d) {
                return Ok(());
            }
            if self
                .txn(
                    vec![doc.compare(&nkey)],
                    vec![TxnOp::put(nkey.clone(), json(&d)?, None)],
                )
                .await?
            {
                return Ok(());
            }
        }
        Err(busy("update node"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::conformance;

    /// A throwaway etcd on loopback (Debian's etcd-server), killed on drop.
    pub(crate) struct TestEtcd {
        child: std::process::Child,
        url: String,
        _dir: tempfile::TempDir,
    }

    impl TestEtcd {
        pub(crate) fn start() -> TestEtcd {
            let port = || lks_e2e::free_addr().port();
            let (client, peer) = (port(), port());
            let dir = tempfile::tempdir().unwrap();
            let url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child =
                std::process::Command::new(std::env::var("LKS_ETCD").unwrap_or_else(|_| "etcd".into()))
                    .arg("--data-dir")
                    .arg(dir.path().join("data"))
                    .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
                    .args([
                        "--listen-peer-urls",
                        &peer_url,
                        "--initial-advertise-peer-urls",
                        &peer_url,
                    ])
                    .args(["--name", "t", "--initial-cluster", &format!("t={peer_url}")])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("start etcd (Debian's etcd-server; bash scripts/setup.sh installs it)");
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
                assert!(std::time::Instant::now() < deadline, "etcd did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
            TestEtcd {
                child,
                url,
                _dir: dir,
            }
        }

        /// A store for `replica`, registered as a live replica (as
        /// `replicas::run_lease` does) so that its streams count as connected.
        pub(crate) async fn store(&self, replica: &str) -> EtcdStore {
            let cfg = EtcdConfig {
                endpoints: vec![self.url.clone()],
                prefix: "/test/".into(),
                ..Default::default()
            };
            let s = EtcdStore::connect(&cfg, replica).await.unwrap();
            let id = s.client().lease_client().grant(60, None).await.unwrap().id();
            s.client()
                .kv_client()
                .put(
                    s.key(&format!("replicas/{replica}")),
                    "{}",
                    Some(PutOptions::new().with_lease(id)),
                )
                .await
                .unwrap();
            s.set_lease(id);
            s
        }
    }

    impl Drop for TestEtcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    macro_rules! conformance {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test]
            async fn $name() {
                let etcd = TestEtcd::start();
                conformance::$name(&etcd.store("r1").await).await;
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

    pub(crate) fn token(id: &str, uses: Option<u32>) -> TokenRow {
        TokenRow {
            id: id.into(),
            secret_hash: [7; 32],
            cluster: "c".into(),
            expires_at_ms: i64::MAX,
            remaining_uses: uses,
            labels: Labels::new(),
            created_at_ms: 0,
        }
    }

    pub(crate) fn new_node(name: &str, tok: &str) -> NewNode {
        NewNode {
            name: name.into(),
            cluster: "c".into(),
            labels: Labels::new(),
            cert_serial: format!("s-{name}"),
            key_hash: String::new(),
            token_id: tok.into(),
            now_ms: 1,
        }
    }

    /// A range larger than gRPC's default 4 MiB message (every node
    /// document of a 10,000-node fleet is ~5.5 MiB) is read whole.
    #[tokio::test]
    async fn ranges_larger_than_four_mib_are_read() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        // etcd takes requests up to 1.5 MiB: six documents of 1 MiB each.
        let doc = serde_json::to_string(&"x".repeat(1 << 20)).unwrap();
        for i in 0..6 {
            kv_of(&s.client)
                .put(s.key(&format!("big/{i}")), doc.clone(), None)
                .await
                .unwrap();
        }
        let got: Vec<(String, String, i64)> = s.range(&s.key("big/")).await.unwrap();
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|(_, v, _)| v.len() == 1 << 20));
    }

    #[tokio::test]
    async fn a_decision_larger_than_one_transaction_is_stored_in_consistent_steps() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        s.create_token(token("tok000", None)).await.unwrap();
        let n = rollouts::ROWS_PER_TXN * 2 + 30;
        for i in 0..n {
            s.enroll_node(new_node(&format!("n{i:04}"), "tok000"))
                .await
                .unwrap();
        }
        s.put_bundle(NewBundle {
            name: "b".into(),
            version: "1".into(),
            signed_bundle: b"b@1".to_vec(),
            manifest_digest: "d1".into(),
            signed: false,
            files: 1,
            total_size: 1,
            blob_digests: vec!["blob1".into()],
            now_ms: 2,
        })
        .await
        .unwrap();
        let r = s
            .start_rollout(NewRollout {
                id: "r".into(),
                cluster: "c".into(),
                bundle: "b".into(),
                version: "1".into(),
                selector: Labels::new(),
                batch_size: n as u32,
                failure_threshold: 1,
                offline_deadline_ms: 1000,
                policy: Default::default(),
                started_by: String::new(),
                now_ms: 3,
            })
            .await
            .unwrap();
        assert_eq!(r.nodes.len(), n);
        let mut next = r.clone();
        for x in &mut next.nodes {
            x.state = NodeState::Applying;
            x.touched = true;
        }
        let assign = next
            .nodes
            .iter()
            .map(|x| (x.name.clone(), Some("1".to_string())))
            .collect();
        let (stored, changed) = s
            .commit_rollout(RolloutCommit {
                rollout: next,
                assign,
                target: TargetChange::Keep,
                events: Vec::new(),
            })
            .await
            .unwrap();
        assert_eq!(changed.len(), n);
        assert_eq!(stored.revision, 3, "three transactions: 60 + 60 + the rest");
        assert!(
            stored
                .nodes
                .iter()
                .all(|x| x.state == NodeState::Applying && x.generation > 0)
        );
        for x in &stored.nodes {
            let d = s.desired_state(&x.name).await.unwrap();
            assert_eq!(d.generation, x.generation);
            assert_eq!(d.bundles, vec![b"b@1".to_vec()]);
        }
        // A decision based on the old revision is refused.
        let e = s
            .commit_rollout(RolloutCommit {
                rollout: r,
                assign: Vec::new(),
                target: TargetChange::Keep,
                events: Vec::new(),
            })
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    }

    #[tokio::test]
    async fn connection_state_follows_the_replica_lease() {
        let etcd = TestEtcd::start();
        let a = etcd.store("ra").await;
        a.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        a.create_token(token("tok000", None)).await.unwrap();
        a.enroll_node(new_node("n1", "tok000")).await.unwrap();
        // Replica ra (registered under its lease) holds n1's stream.
        let id = *a.lease.lock().unwrap();
        let mut lease = a.client().lease_client();
        a.node_connected("n1", "{}", Vec::new(), 500).await.unwrap();
        a.touch_nodes(vec![("n1".into(), 900)]).await.unwrap();
        let b = etcd.store("rb").await;
        let n = b.get_node("n1").await.unwrap().unwrap();
        assert!(n.connected, "seen from another replica");
        assert_eq!(n.last_seen_ms, 900, "batched last-seen");
        // A disconnect reported by another replica does not touch ra's stream.
        b.node_disconnected("n1", 950).await.unwrap();
        assert!(b.get_node("n1").await.unwrap().unwrap().connected);
        // ra dies: its lease goes, and with it the node's connection; its
        // last-seen time stays.
        lease.revoke(id).await.unwrap();
        let n = b.get_node("n1").await.unwrap().unwrap();
        assert!(!n.connected);
        assert_eq!(n.last_seen_ms, 900, "last-seen survives its replica");
        // The leader's trim keeps it while no live replica heard n1 since…
        b.enroll_node(new_node("n2", "tok000")).await.unwrap();
        a.touch_nodes(vec![("n2".into(), 700)]).await.unwrap();
        assert_eq!(b.prune_seen().await.unwrap(), 0);
        assert_eq!(b.get_node("n1").await.unwrap().unwrap().last_seen_ms, 900);
        // …drops what a live replica heard later, and the document once empty.
        b.touch_nodes(vec![("n1".into(), 1000), ("n2".into(), 1000)])
            .await
            .unwrap();
        assert_eq!(b.prune_seen().await.unwrap(), 1);
        assert!(b.get_bytes("seen/ra").await.unwrap().is_none());
        assert_eq!(b.get_node("n1").await.unwrap().unwrap().last_seen_ms, 1000);
        // A deleted node's entry goes too.
        b.touch_nodes(vec![("n1".into(), 1100)]).await.unwrap();
        let c = etcd.store("rc").await;
        c.touch_nodes(vec![("n2".into(), 2000)]).await.unwrap();
        let rc_lease = *c.lease.lock().unwrap();
        let mut lease = c.client().lease_client();
        lease.revoke(rc_lease).await.unwrap();
        b.delete_node("n2").await.unwrap();
        assert_eq!(b.prune_seen().await.unwrap(), 1, "rc's document named only n2");
    }

    #[tokio::test]
    async fn the_oldest_events_are_pruned_and_the_newest_kept() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        for i in 0..5 {
            s.add_event(EventRow {
                id: 0,
                at_ms: 1000 + i,
                cluster: "c".into(),
                node: String::new(),
                rollout_id: String::new(),
                kind: "k".into(),
                bundle: String::new(),
                version: String::new(),
                message: format!("e{i}"),
            })
            .await
            .unwrap();
        }
        assert_eq!(s.prune_events_to(3).await.unwrap(), 2);
        assert_eq!(s.prune_events_to(3).await.unwrap(), 0);
        let left = s.list_events(EventFilter::default()).await.unwrap();
        let msgs: Vec<&str> = left.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(msgs, ["e2", "e3", "e4"], "oldest first, the newest three kept");
        let two = s
            .list_events(EventFilter {
                limit: 2,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            two.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
            ["e3", "e4"]
        );
    }

    #[tokio::test]
    async fn a_boot_storm_on_one_token_enrols_every_node_once() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        s.create_token(token("tok064", Some(64))).await.unwrap();
        let tasks: Vec<_> = (0..72)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move { s.enroll_node(new_node(&format!("n{i:02}"), "tok064")).await })
            })
            .collect();
        let mut ok = 0;
        let mut used_up = 0;
        let mut generations = BTreeSet::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(g) => {
                    ok += 1;
                    generations.insert(g);
                }
                Err(StoreError::Token(TokenRefusal::UsedUp)) => used_up += 1,
                Err(e) => panic!("unexpected refusal: {e}"),
            }
        }
        assert_eq!((ok, used_up), (64, 8), "every use taken exactly once");
        assert_eq!(s.list_nodes(Some("c")).await.unwrap().len(), 64);
        assert_eq!(
            s.get_token("tok064").await.unwrap().unwrap().remaining_uses,
            Some(0)
        );
        assert!(generations.iter().all(|g| *g > 0));
    }

    #[tokio::test]
    async fn generations_rise_per_node_and_respect_a_migrated_floor() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        // As migrate leaves it: generations up to 5000 were handed out.
        s.put_bytes("meta/generation", b"5000".to_vec()).await.unwrap();
        s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        s.create_token(token("tok000", None)).await.unwrap();
        let g1 = s.enroll_node(new_node("n1", "tok000")).await.unwrap();
        assert!(g1 > 5000, "{g1}");
        // Deleted and enrolled again: still higher than before.
        assert!(s.delete_node("n1").await.unwrap());
        let g2 = s.enroll_node(new_node("n1", "tok000")).await.unwrap();
        assert!(g2 > g1, "{g2} > {g1}");
    }

    #[test]
    fn a_cluster_document_from_before_peer_sharing_reads_the_defaults() {
        let doc: ClusterDoc =
            serde_json::from_str(r#"{"created_at_ms":1,"api_server":"https://k:6443"}"#).unwrap();
        let row = doc.into_row("old", 0);
        assert_eq!(row.peer, PeerSettings::default());
        assert_eq!(row.api_server.as_deref(), Some("https://k:6443"));
    }

    #[tokio::test]
    async fn an_imported_dump_carries_cluster_cas_api_servers_peer_settings_and_certificates() {
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        let ca = StoredCa {
            cert_pem: "cert".into(),
            key: "sealed".into(),
        };
        let cert = IssuedCertRow {
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
        };
        let d = Dump {
            clusters: vec![
                ClusterRow {
                    peer: PeerSettings {
                        enabled: true,
                        port: 7555,
                        upload_rate: 1 << 20,
                        max_uploads: 8,
                    },
                    ..NewCluster {
                        api_server: Some("https://a.example:6443".into()),
                        ..NewCluster::new("a", 1)
                    }
                    .row()
                },
                NewCluster::new("b", 1).row(),
            ],
            cluster_cas: vec![("a".into(), ca.clone())],
            certificates: vec![cert.clone()],
            ..Default::default()
        };
        s.import(&d).await.unwrap();
        assert_eq!(s.cluster_ca("a").await.unwrap(), Some(ca));
        assert_eq!(s.cluster_ca("b").await.unwrap(), None);
        let a = s.get_cluster("a").await.unwrap().unwrap();
        assert_eq!(a.api_server.as_deref(), Some("https://a.example:6443"));
        assert_eq!(a.ca_cert_pem.as_deref(), Some("cert"));
        assert_eq!((a.peer.enabled, a.peer.port, a.peer.max_uploads), (true, 7555, 8));
        let b = s.get_cluster("b").await.unwrap().unwrap();
        assert_eq!(b.peer, PeerSettings::default());
        assert_eq!(s.list_certificates(Some("a"), None).await.unwrap(), [cert]);
    }
}
