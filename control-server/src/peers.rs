//! Each cluster's peer-sharing settings as this replica last read them, for
//! the desired states it sends (`DesiredState.peer_sharing`).
//!
//! Every push of a desired state needs its node's cluster settings; reading
//! the cluster from the store each time would cost a read per agent per
//! push (10,000 at once after a `notify_all`). So each replica keeps them
//! per cluster for [`TTL`], filled by one read at a time per cluster
//! ([`crate::clustercache`]).
//!
//! How a change reaches the agents:
//! - on the replica that serves `SetCluster`: the entry is dropped
//!   ([`PeerCache::invalidate`]) and every stream told to look again
//!   ([`crate::hub::Hub::notify_all`]);
//! - on the other replicas (`--store etcd`): [`run`] re-reads every cached
//!   cluster every [`TTL`]; any read that finds settings different from the
//!   ones it replaces (that one, or a fill after an entry expired) tells
//!   every stream to look again. A change is thus seen within about
//!   [`TTL`], and never missed: the settings a stream sent are always ones
//!   some read replaced, or still holds.
//!
//! A stream sends its desired state again when the settings it would send
//! differ from the ones it last sent, even if the generation did not move.

use std::sync::Arc;
use std::time::Duration;

use lks_proto::pb;
use tokio_util::sync::CancellationToken;

use crate::clustercache::{ClusterCache, Lookup, Slot};
use crate::hub::Hub;
use crate::store::{ClusterStore, PeerSettings, Result};

/// How long a cluster's settings are used before they are read again, and
/// how often [`run`] re-reads them.
pub const TTL: Duration = Duration::from_secs(5);

/// The settings as agents receive them: `None` while sharing is off.
pub fn peer_pb(p: PeerSettings) -> Option<pb::PeerSharing> {
    p.enabled.then_some(pb::PeerSharing {
        port: u32::from(p.port),
        upload_rate: p.upload_rate,
        max_uploads: p.max_uploads,
    })
}

/// Peer-sharing settings by cluster, read through [`Store::get_cluster`]
/// at most once per [`TTL`] and cluster.
pub struct PeerCache {
    cache: ClusterCache<PeerSettings>,
}

impl Default for PeerCache {
    fn default() -> Self {
        Self::new(TTL)
    }
}

impl PeerCache {
    pub fn new(ttl: Duration) -> Self {
        PeerCache {
            cache: ClusterCache::new(ttl),
        }
    }

    /// The cluster's settings (the defaults, off, for a cluster that does
    /// not exist). Read from the store when older than the TTL; a read that
    /// finds them changed tells every stream of `hub` to look again.
    pub async fn get(
        &self,
        store: &(impl ClusterStore + ?Sized),
        hub: &Hub,
        cluster: &str,
    ) -> Result<PeerSettings> {
        match self.cache.lookup(cluster).await {
            Lookup::Fresh(v) => Ok(v),
            Lookup::Read(fill) => read(fill.slot(), store, hub, cluster).await,
        }
    }

    /// Forgets the cluster's settings (they were just changed here): the
    /// next [`PeerCache::get`] reads them.
    pub fn invalidate(&self, cluster: &str) {
        self.cache.invalidate(cluster);
    }

    /// Reads again the settings of every cluster held, telling every stream
    /// to look again if any changed (what other replicas wrote).
    pub async fn refresh(&self, store: &(impl ClusterStore + ?Sized), hub: &Hub) {
        for (cluster, slot) in self.cache.held() {
            let fill = slot.fill().await;
            if let Err(e) = read(fill.slot(), store, hub, &cluster).await {
                tracing::warn!(cluster = %cluster, error = %e, "read peer-sharing settings");
            }
        }
    }
}

/// Reads the settings into `slot` (its fill lock held). When the store
/// cannot be read, the settings held are kept (and read again next time).
async fn read(
    slot: &Slot<PeerSettings>,
    store: &(impl ClusterStore + ?Sized),
    hub: &Hub,
    cluster: &str,
) -> Result<PeerSettings> {
    let old = slot.current();
    let new = match store.get_cluster(cluster).await {
        Ok(c) => c.map(|c| c.peer).unwrap_or_default(),
        Err(e) => {
            return match old {
                Some(p) => {
                    tracing::warn!(cluster = %cluster, error = %e, "read peer-sharing settings; using the last ones read");
                    Ok(p)
                }
                None => Err(e),
            };
        }
    };
    slot.set(new);
    if old.is_some_and(|o| o != new) {
        tracing::info!(cluster = %cluster, enabled = new.enabled, "peer-sharing settings changed");
        hub.notify_all();
    }
    Ok(new)
}

/// Every [`TTL`], on every replica: reads again the settings of the
/// clusters whose agents this replica serves ([`PeerCache::refresh`]).
pub async fn run(
    peers: Arc<PeerCache>,
    store: Arc<dyn ClusterStore>,
    hub: Arc<Hub>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(TTL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        peers.refresh(&*store, &hub).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ClusterStore;
    use crate::store::{EventRow, NewCluster, SqliteStore};

    #[test]
    fn only_enabled_settings_reach_agents() {
        let off = PeerSettings::default();
        assert_eq!(peer_pb(off), None);
        let on = PeerSettings {
            enabled: true,
            port: 7555,
            upload_rate: 10 << 20,
            max_uploads: 8,
        };
        assert_eq!(
            peer_pb(on),
            Some(pb::PeerSharing {
                port: 7555,
                upload_rate: 10 << 20,
                max_uploads: 8
            })
        );
    }

    async fn set(store: &SqliteStore, p: PeerSettings) {
        store
            .set_cluster_peer("a", p, EventRow::peer_sharing_set("a", &p, "t", 1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn settings_are_cached_until_invalidated_or_refreshed() {
        let store = SqliteStore::open_in_memory().unwrap();
        store.create_cluster(NewCluster::new("a", 1)).await.unwrap();
        let hub = Hub::default();
        let mut reg = hub.register("n1");
        let cache = PeerCache::new(Duration::from_secs(3600));
        assert_eq!(
            cache.get(&store, &hub, "a").await.unwrap(),
            PeerSettings::default()
        );
        assert_eq!(
            cache.get(&store, &hub, "nope").await.unwrap(),
            PeerSettings::default(),
            "an unknown cluster shares nothing"
        );
        let on = PeerSettings {
            enabled: true,
            ..PeerSettings::default()
        };
        set(&store, on).await;
        // Within the TTL the cached settings stand ...
        assert_eq!(
            cache.get(&store, &hub, "a").await.unwrap(),
            PeerSettings::default()
        );
        assert!(!reg.changed.has_changed().unwrap());
        // ... until a refresh finds the change and tells every stream.
        cache.refresh(&store, &hub).await;
        assert!(reg.changed.has_changed().unwrap());
        reg.changed.borrow_and_update();
        assert_eq!(cache.get(&store, &hub, "a").await.unwrap(), on);
        // An unchanged refresh tells nobody.
        cache.refresh(&store, &hub).await;
        assert!(!reg.changed.has_changed().unwrap());
        // Invalidated: read at once, without a second notification (the
        // writer notified).
        set(&store, PeerSettings::default()).await;
        cache.invalidate("a");
        assert_eq!(
            cache.get(&store, &hub, "a").await.unwrap(),
            PeerSettings::default()
        );
        assert!(!reg.changed.has_changed().unwrap());
    }

    #[tokio::test]
    async fn an_expired_entry_is_read_again_and_a_change_announced() {
        let store = SqliteStore::open_in_memory().unwrap();
        store.create_cluster(NewCluster::new("a", 1)).await.unwrap();
        let hub = Hub::default();
        let mut reg = hub.register("n1");
        let cache = PeerCache::new(Duration::ZERO);
        assert_eq!(
            cache.get(&store, &hub, "a").await.unwrap(),
            PeerSettings::default()
        );
        let on = PeerSettings {
            enabled: true,
            port: 9000,
            ..PeerSettings::default()
        };
        set(&store, on).await;
        assert_eq!(cache.get(&store, &hub, "a").await.unwrap(), on);
        assert!(
            reg.changed.has_changed().unwrap(),
            "other streams must hear of it"
        );
        reg.changed.borrow_and_update();
    }
}
