//! What makes several `lks-control-server` processes on one etcd one
//! control plane: the shared identity, each replica's lease, the election
//! of the one replica that drives rollouts, and the watch that carries
//! changes made by any replica to the agents connected to this one.
//!
//! What is written where — `replicas/ID`, `leader`, `identity`, under
//! which lease and on which compare — is `lks-store-etcd`'s
//! ([`EtcdStore::replicas`], [`EtcdStore::identity`]); when is decided here.
//!
//! - **Lease**: each replica holds an etcd lease (`--lease-ttl`, 10 s by
//!   default) and keeps it alive; `replicas/ID` (its URL) is bound to it.
//!   If the replica dies, etcd deletes it when the lease runs out, so its
//!   nodes show `connected: false` within the TTL, last seen when the
//!   replica last wrote `heard/ID` (not under the lease; the leader settles
//!   it after `SETTLE_AFTER`, `store-etcd/src/seen.rs`). If etcd loses the lease while the replica lives (etcd
//!   was down for longer than the TTL), the replica takes a new one and
//!   registers again under the same id; its streams never dropped.
//! - **Election**: the leader key `leader` is created with a transaction
//!   that succeeds only while it does not exist, bound to the winner's
//!   lease. Only the leader's controller advances rollouts; a replica that
//!   cannot keep its lease alive stops leading at once. When the leader
//!   dies, its key goes with its lease and another replica creates it on
//!   its next check (every second). Two leaders can never both advance a
//!   rollout: every decision is a transaction on the rollout's revision.
//! - **Watch**: one watch over the keys that matter to agents and operators
//!   (desired states, nodes, rollouts, replicas, the leader); a desired
//!   state changed by any replica reaches the stream on this one.

use std::sync::Arc;
use std::time::Duration;

use lks_pki::SharedIdentity;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::context::Shared;
use crate::store::etcd::{Change, ReplicaLease};
use crate::store::{EtcdStore, StoreError};

/// How often the election and the replica list are checked.
const CHECK: Duration = Duration::from_secs(1);
/// How often the leader trims the event log to its limit.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The identity document as stored in etcd (`identity`).
#[derive(Serialize, Deserialize)]
struct IdentityDoc {
    ca_cert: String,
    admin_cert: String,
    /// PEM, or a sealed envelope in hex when `sealed_with` is set.
    ca_key: String,
    admin_key: String,
    /// Key id of the encryption key that sealed the private keys.
    #[serde(default)]
    sealed_with: Option<String>,
}

pub use crate::store::etcd::ReplicaInfo;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Pki(#[from] lks_pki::PkiError),
    #[error("stored identity is unreadable: {0}")]
    Corrupt(#[source] serde_json::Error),
    #[error("stored identity is unreadable: {which}: {source}")]
    NotHex {
        which: &'static str,
        #[source]
        source: hex::FromHexError,
    },
    #[error("stored identity is unreadable: {which}: {source}")]
    NotUtf8 {
        which: &'static str,
        #[source]
        source: std::string::FromUtf8Error,
    },
    #[error(
        "the private keys in etcd are encrypted (key {key_id}); give --encryption-key-file with that key"
    )]
    Sealed { key_id: String },
    #[error("{which}: {source}")]
    Seal {
        which: &'static str,
        #[source]
        source: lks_pki::seal::SealError,
    },
    #[error("{0} already holds a control plane's identity")]
    Exists(String),
}

/// Loads the control plane's identity from etcd, creating it if this is
/// the first replica ever (compare-and-swap: if two replicas start at once,
/// one identity wins and both use it).
pub async fn load_or_create_identity(
    store: &EtcdStore,
    seal: Option<&lks_pki::seal::SealKey>,
) -> Result<SharedIdentity, IdentityError> {
    // Read first: a new identity is made (and sent to etcd) only when there
    // is none, so no unused key material ever reaches etcd's log.
    let (stored, created) = match store.identity().get().await? {
        Some((v, _)) => (v, false),
        None => {
            let fresh = SharedIdentity::generate()?;
            let doc = seal_identity(store, &fresh, seal)?;
            let bytes = serde_json::to_vec(&doc).map_err(IdentityError::Corrupt)?;
            let stored = store.identity().create(bytes.clone()).await?;
            let created = stored == bytes;
            (stored, created)
        }
    };
    let doc: IdentityDoc = serde_json::from_slice(&stored).map_err(IdentityError::Corrupt)?;
    let id = open_identity(store, &doc, seal)?;
    if created {
        tracing::info!("created the control plane's CA and admin credential in etcd");
    } else if doc.sealed_with.is_none()
        && let Some(key) = seal
    {
        // Stored before an encryption key was given: seal it now.
        let resealed =
            serde_json::to_vec(&seal_identity(store, &id, Some(key))?).map_err(IdentityError::Corrupt)?;
        if let Some((_, rev)) = store.identity().get().await?
            && store.identity().replace(rev, resealed).await?
        {
            tracing::info!(key = %key.key_id(), "sealed the private keys stored in etcd with the encryption key");
        }
    }
    if doc.sealed_with.is_none() && seal.is_none() {
        tracing::warn!(
            "private keys in etcd are not encrypted (as Kubernetes keeps Secrets by default); \
             give --encryption-key-file to encrypt them at rest"
        );
    }
    Ok(id)
}

/// Stores an existing identity (a single server's, moved by `migrate`) as
/// the control plane's, in the same document [`load_or_create_identity`]
/// reads, sealed with `seal` if given. Refused if an identity is stored
/// already: two control planes are never merged.
pub async fn store_identity(
    store: &EtcdStore,
    id: &SharedIdentity,
    seal: Option<&lks_pki::seal::SealKey>,
) -> Result<(), IdentityError> {
    let doc = seal_identity(store, id, seal)?;
    let bytes = serde_json::to_vec(&doc).map_err(IdentityError::Corrupt)?;
    let stored = store.identity().create(bytes.clone()).await?;
    if stored != bytes {
        return Err(IdentityError::Exists(store.identity().key()));
    }
    Ok(())
}

/// The identity document `stored` (as read from `store`'s prefix, by
/// `backup --store etcd`): the id of the key that sealed its private keys,
/// if any, and the identity opened, proving the CA loads — `None` if it is
/// sealed and no key was given (nothing to open it with).
pub fn read_stored_identity(
    store: &EtcdStore,
    stored: &[u8],
    seal: Option<&lks_pki::seal::SealKey>,
) -> Result<(Option<String>, Option<SharedIdentity>), IdentityError> {
    let doc: IdentityDoc = serde_json::from_slice(stored).map_err(IdentityError::Corrupt)?;
    if doc.sealed_with.is_some() && seal.is_none() {
        return Ok((doc.sealed_with, None));
    }
    let id = open_identity(store, &doc, seal)?;
    lks_pki::Pki::from_shared(&id, &["localhost".to_string()])?;
    Ok((doc.sealed_with, Some(id)))
}

fn aad(store: &EtcdStore, which: &str) -> Vec<u8> {
    store.identity().aad(which)
}

fn seal_identity(
    store: &EtcdStore,
    id: &SharedIdentity,
    seal: Option<&lks_pki::seal::SealKey>,
) -> Result<IdentityDoc, IdentityError> {
    Ok(match seal {
        None => IdentityDoc {
            ca_cert: id.ca_cert.clone(),
            admin_cert: id.admin_cert.clone(),
            ca_key: id.ca_key.clone(),
            admin_key: id.admin_key.clone(),
            sealed_with: None,
        },
        Some(k) => IdentityDoc {
            ca_cert: id.ca_cert.clone(),
            admin_cert: id.admin_cert.clone(),
            ca_key: hex::encode(
                k.seal(id.ca_key.as_bytes(), &aad(store, "ca_key"))
                    .map_err(|source| IdentityError::Seal {
                        which: "ca_key",
                        source,
                    })?,
            ),
            admin_key: hex::encode(
                k.seal(id.admin_key.as_bytes(), &aad(store, "admin_key"))
                    .map_err(|source| IdentityError::Seal {
                        which: "admin_key",
                        source,
                    })?,
            ),
            sealed_with: Some(k.key_id()),
        },
    })
}

fn open_identity(
    store: &EtcdStore,
    doc: &IdentityDoc,
    seal: Option<&lks_pki::seal::SealKey>,
) -> Result<SharedIdentity, IdentityError> {
    let open = |which: &'static str, v: &str| -> Result<String, IdentityError> {
        let Some(key_id) = &doc.sealed_with else {
            return Ok(v.to_string());
        };
        let Some(k) = seal else {
            return Err(IdentityError::Sealed {
                key_id: key_id.clone(),
            });
        };
        let sealed = hex::decode(v).map_err(|source| IdentityError::NotHex { which, source })?;
        let plain = k
            .open(&sealed, &aad(store, which))
            .map_err(|source| IdentityError::Seal { which, source })?;
        String::from_utf8(plain).map_err(|source| IdentityError::NotUtf8 { which, source })
    };
    Ok(SharedIdentity {
        ca_cert: doc.ca_cert.clone(),
        admin_cert: doc.admin_cert.clone(),
        ca_key: open("ca_key", &doc.ca_key)?,
        admin_key: open("admin_key", &doc.admin_key)?,
    })
}

/// Replica URLs (this replica's first) as the watch last saw them.
pub async fn replica_urls(store: &EtcdStore, own: &str) -> Result<Vec<String>, StoreError> {
    store.replicas().urls(own).await
}

/// Holds this replica's lease, its registration and (when elected) the
/// leader key, until shutdown; then revokes the lease so that its nodes
/// show disconnected and another replica leads at once.
pub async fn run_lease(
    s: Arc<Shared>,
    store: EtcdStore,
    url: String,
    ttl: Duration,
    leader: watch::Sender<bool>,
) {
    let ttl_s = ttl.as_secs().max(2) as i64;
    let info = replica_info(&s, url);
    let mut logged_down = false;
    loop {
        if s.cancel.is_cancelled() {
            return;
        }
        leader.send_if_modified(|l| std::mem::replace(l, false));
        let lease = match store.replicas().grant(ttl_s).await {
            Ok(l) => l,
            Err(e) => {
                if !logged_down {
                    tracing::warn!(error = %e, "etcd: cannot take a lease; retrying");
                    logged_down = true;
                }
                tokio::select! {
                    _ = s.cancel.cancelled() => return,
                    _ = tokio::time::sleep(CHECK) => continue,
                }
            }
        };
        let Some(held) = register(&store, lease, &info).await else {
            continue;
        };
        if logged_down {
            tracing::info!("etcd: reachable again; lease renewed");
            logged_down = false;
        }
        tracing::info!(
            replica = store.replica(),
            lease = held.id(),
            ttl_s,
            "registered this replica"
        );
        match hold(&s, &store, held, ttl_s, &leader).await {
            LeaseEnd::Shutdown => return,
            LeaseEnd::Lost => {}
        }
    }
}

/// This replica's registration (`replicas/ID`).
fn replica_info(s: &Shared, url: String) -> ReplicaInfo {
    ReplicaInfo {
        url,
        started_at_ms: crate::clock::now_ms(),
        blob_store: s.blobs.store().describe(),
        release: env!("CARGO_PKG_VERSION").to_string(),
        store_format: crate::store::STORE_FORMAT,
    }
}

/// How holding a lease ended.
enum LeaseEnd {
    /// Shutdown: the lease is revoked.
    Shutdown,
    /// etcd did not renew it: take a new one.
    Lost,
}

/// Registers this replica under `lease` and starts keeping it alive;
/// `None` (the warning logged) to take a new lease.
async fn register(store: &EtcdStore, mut lease: ReplicaLease, info: &ReplicaInfo) -> Option<ReplicaLease> {
    if let Err(e) = store.replicas().register(&lease, info).await {
        tracing::warn!(error = %e, "etcd: cannot register this replica; retrying");
        return None;
    }
    match lease.keep_alive().await {
        Ok(()) => Some(lease),
        Err(e) => {
            tracing::warn!(error = %e, "etcd: cannot keep the lease alive; retrying");
            None
        }
    }
}

/// Keeps the lease alive and follows the election every `CHECK`, until
/// shutdown (then steps down and revokes the lease) or the lease is lost.
async fn hold(
    s: &Shared,
    store: &EtcdStore,
    mut lease: ReplicaLease,
    ttl_s: i64,
    leader: &watch::Sender<bool>,
) -> LeaseEnd {
    let keep_every = Duration::from_secs((ttl_s as u64 / 3).max(1));
    let mut last_kept = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(CHECK);
    let mut last_prune = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => {
                leader.send_if_modified(|l| std::mem::replace(l, false));
                // Give the leader key and the connection state up now
                // instead of letting them time out.
                let _ = tokio::time::timeout(Duration::from_secs(2), lease.revoke()).await;
                return LeaseEnd::Shutdown;
            }
            _ = tick.tick() => {}
        }
        if last_kept.elapsed() >= keep_every {
            if !lease.renew().await {
                tracing::warn!(
                    replica = store.replica(),
                    "etcd: lease lost; stepping down and taking a new one"
                );
                return LeaseEnd::Lost;
            }
            last_kept = tokio::time::Instant::now();
        }
        follow_election(s, store, &lease, leader, &mut last_prune).await;
    }
}

/// One election check: campaign, and tell the rollout driver when this
/// replica became or stopped being the leader; the leader also prunes.
async fn follow_election(
    s: &Shared,
    store: &EtcdStore,
    lease: &ReplicaLease,
    leader: &watch::Sender<bool>,
    last_prune: &mut tokio::time::Instant,
) {
    match store.replicas().campaign(lease).await {
        Ok(is_leader) => {
            // The leader keeps the event log bounded.
            if is_leader && last_prune.elapsed() >= PRUNE_EVERY {
                *last_prune = tokio::time::Instant::now();
                prune(store).await;
            }
            let changed = leader.send_if_modified(|l| std::mem::replace(l, is_leader) != is_leader);
            if changed {
                if is_leader {
                    tracing::info!(replica = store.replica(), "elected: this replica drives rollouts");
                    s.rollouts_changed.notify_one();
                } else {
                    tracing::info!(replica = store.replica(), "no longer the leader");
                }
            }
        }
        Err(e) => {
            // Without etcd no one can commit a decision anyway.
            leader.send_if_modified(|l| std::mem::replace(l, false));
            tracing::debug!(error = %e, "election check");
        }
    }
}

/// The leader's pruning: the oldest events, and what replicas that are
/// gone left (`heard/ID`).
async fn prune(store: &EtcdStore) {
    match store.prune_events().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(documents = n, "pruned the oldest events"),
        Err(e) => tracing::warn!(error = %e, "prune events"),
    }
    if let Err(e) = store.prune_seen().await {
        tracing::warn!(error = %e, "settle the last-seen times of replicas that are gone");
    }
}

/// Carries changes made through any replica to this one: agents' desired
/// states, deleted nodes, rollout progress, the replica list. The watch
/// itself (and the view copy it feeds) is the store's
/// ([`EtcdStore::watch_changes`]); this wires what it reports to the agent
/// streams, the rollout controller and the replica list.
pub async fn run_watch(s: Arc<Shared>, store: EtcdStore, servers: watch::Sender<Vec<String>>) {
    let refresh = Arc::new(tokio::sync::Notify::new());
    // The replica list is read on its own task: the watch's callback must
    // not wait on etcd.
    {
        let (s, store, refresh) = (s.clone(), store.clone(), refresh.clone());
        let own = s.server_url.clone();
        s.tasks.clone().spawn(async move {
            loop {
                if let Ok(urls) = replica_urls(&store, &own).await {
                    servers.send_if_modified(|v| std::mem::replace(v, urls.clone()) != urls);
                }
                tokio::select! {
                    _ = s.cancel.cancelled() => return,
                    _ = refresh.notified() => {}
                }
            }
        });
    }
    store
        .watch_changes(&s.cancel, |c| match c {
            Change::Desired(node) => s.hub.notify(node),
            Change::Node { name, deleted } => {
                if deleted {
                    s.hub.kick(name);
                }
                s.rollouts_changed.notify_one();
            }
            Change::Rollout => {
                s.rollout_updates.send_modify(|v| *v += 1);
                s.rollouts_changed.notify_one();
            }
            Change::Replicas => {
                refresh.notify_one();
                s.rollouts_changed.notify_one();
            }
            Change::Resync => {
                refresh.notify_one();
                resync(&s);
            }
        })
        .await;
}

/// After a gap in the watch: every stream re-reads its desired state (it
/// sends only if the generation moved) and every rollout watcher looks again.
fn resync(s: &Shared) {
    s.hub.notify_all();
    s.rollout_updates.send_modify(|v| *v += 1);
    s.rollouts_changed.notify_one();
}
