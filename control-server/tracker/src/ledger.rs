//! Peer sharing across replicas (issue [swarm-speed] 2): what one replica's
//! tracker must know of the others' so that a fleet spread over replicas
//! still takes about one copy of a blob from the control plane.
//!
//! - **Fetchers.** Each replica writes the nodes fetching a blob through it
//!   (and which of them fetch from the server) to
//!   `swarm/fetching/CLUSTER/HEX/REPLICA`, under its lease, when that set
//!   changes; the others read `swarm/fetching/CLUSTER/HEX/` at most once a
//!   [`REMOTE_TTL`] and name those nodes as peers too. Without this, the
//!   nodes on each replica would only know each other, and each replica's
//!   group would need its own seed.
//! - **Seeds.** A node may fetch from the server as a seed only while it
//!   holds the claim `swarm/seed/CLUSTER/HEX` ([`MAX_SEEDS`](crate::MAX_SEEDS)
//!   = 1 for the whole fleet): created or taken over (when expired) with a
//!   compare on its revision, so two replicas never both grant it; renewed
//!   by the seed's own asks, it lapses [`SEED_TTL_MS`] after the last one
//!   (a seed that died frees its place after that, or its replica's
//!   lease).
//!
//! The keys, documents, leases and compares are `lks-store-etcd`'s
//! ([`EtcdStore::swarm`]); what is cached, and when it is read again, is
//! here.
//!
//! A replica that cannot reach etcd answers from what it knows itself (as a
//! single server would): a wrong answer costs bytes or time, never a
//! rollout (agents fall back to the server on their own).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lks_proto::Digest;

use lks_store::StoreError;
use lks_store_etcd::EtcdStore;

/// How stale another replica's fetchers may be when named.
pub const REMOTE_TTL: Duration = Duration::from_secs(1);
/// How stale they may be for an answer that would name fewer peers than it
/// may (at the start of a batch, when every replica's fetchers grow by the
/// moment): at most 4 reads a second per blob per replica.
pub const REMOTE_FRESH: Duration = Duration::from_millis(250);
/// How long a seed's claim lasts after its last ask (agents ask every 3 s
/// while they fetch).
pub const SEED_TTL_MS: i64 = 10_000;

type Key = (String, Digest);
/// Nodes fetching a blob: (node, from the server).
pub type Fetchers = Arc<Vec<(String, bool)>>;

/// The etcd side of the tracker.
pub struct Ledger {
    store: EtcdStore,
    /// Other replicas' fetchers per blob, and when they were read.
    remote: Mutex<HashMap<Key, (Instant, Fetchers)>>,
    /// What this replica last wrote per blob.
    written: Mutex<HashMap<Key, BTreeMap<String, bool>>>,
}

impl Ledger {
    pub fn new(store: EtcdStore) -> Ledger {
        Ledger {
            store,
            remote: Mutex::default(),
            written: Mutex::default(),
        }
    }

    /// The nodes other replicas say fetch `digest` (node, from the server),
    /// read again if what was read is older than `max_age` ([`REMOTE_TTL`],
    /// [`REMOTE_FRESH`]).
    pub async fn others_within(
        &self,
        cluster: &str,
        digest: &Digest,
        max_age: Duration,
    ) -> Result<Fetchers, StoreError> {
        let key = (cluster.to_string(), *digest);
        if let Some((at, v)) = lock(&self.remote).get(&key)
            && at.elapsed() < max_age
        {
            return Ok(v.clone());
        }
        self.others_now(cluster, digest).await
    }

    /// Like [`Self::others_within`], read now.
    pub async fn others_now(&self, cluster: &str, digest: &Digest) -> Result<Fetchers, StoreError> {
        let key = (cluster.to_string(), *digest);
        let v = Arc::new(self.store.swarm().others_fetching(cluster, digest).await?);
        let mut remote = lock(&self.remote);
        // Blobs asked about no more are forgotten.
        remote.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(60));
        remote.insert(key, (Instant::now(), v.clone()));
        Ok(v)
    }

    /// Writes this replica's fetchers of `digest` if they changed since the
    /// last write (removes the key when there are none).
    pub async fn publish(
        &self,
        cluster: &str,
        digest: &Digest,
        nodes: BTreeMap<String, bool>,
    ) -> Result<(), StoreError> {
        let key = (cluster.to_string(), *digest);
        if lock(&self.written).get(&key) == Some(&nodes) {
            return Ok(());
        }
        self.store
            .swarm()
            .publish_fetching(cluster, digest, &nodes)
            .await?;
        let mut written = lock(&self.written);
        if nodes.is_empty() {
            written.remove(&key);
        } else {
            written.insert(key, nodes);
        }
        Ok(())
    }

    /// Whether `node` is (now) the seed of `digest` in its cluster: it held
    /// the claim, or nobody holds a live one; renewed when half spent.
    pub async fn claim_seed(
        &self,
        cluster: &str,
        digest: &Digest,
        node: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.store
            .swarm()
            .claim_seed(cluster, digest, node, now_ms, SEED_TTL_MS)
            .await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
