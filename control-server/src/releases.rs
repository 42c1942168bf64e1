//! Each cluster's signed releases and trust-root rotations as this replica
//! last read them, for the desired states it sends
//! (`DesiredState.release`, `DesiredState.roots`; issue [trust]).
//!
//! Every push of a desired state needs its cluster's releases; reading and
//! decoding them per agent per push would cost a store read per agent
//! (10,000 at once after a `notify_all`). So each replica keeps them per
//! cluster, decoded once, the wire forms ready to clone, filled by one read
//! at a time per cluster ([`crate::clustercache`], as [`crate::peers`]):
//!
//! - on the replica that serves `PublishRelease`/`PublishRoot`: the entry
//!   is dropped ([`ReleaseCache::invalidate`]) and the cluster's streams
//!   told to look again;
//! - on the other replicas (`--store etcd`): [`run`] re-reads every cached
//!   cluster every [`TTL`]; a read that finds another head release or
//!   another number of roots tells the cluster's streams to look again.
//!
//! Which release a node is sent ([`Channel::release_for`]): the highest
//! that admits every bundle of its desired state (name, version, manifest
//! digest), else the highest; none while the cluster has none. Its roots:
//! every rotation of the cluster, in version order. A re-read while an
//! entry is held reads the roots and only the head release; the releases
//! (the newest [`CACHED_RELEASES`]) only when those changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lks_proto::sync::lock;
use lks_proto::{Digest, pb};
use tokio_util::sync::CancellationToken;

use crate::clustercache::{ClusterCache, Lookup, Slot};
use crate::hub::Hub;
use crate::store::{BundleStore, NodeStore, ReleaseStore, Result, StoredRelease};

/// How long a cluster's releases are used before they are read again, and
/// how often [`run`] re-reads them.
pub const TTL: Duration = Duration::from_secs(5);

/// The newest releases of a cluster held (and chosen from). A node whose
/// bundles only an older release admits is sent the highest, as one whose
/// bundles none admits; it bounds each cluster's entry (a release is at
/// most 128 KiB).
pub const CACHED_RELEASES: u32 = 128;

/// One cluster's releases (newest first) and roots (in version order).
#[derive(Default)]
pub struct Channel {
    pub releases: Vec<StoredRelease>,
    pub roots: Vec<pb::SignedRoot>,
}

impl Channel {
    /// What tells one read from another: the head release and the number
    /// of roots (both only grow).
    fn head(&self) -> (Option<(u64, Digest)>, usize) {
        (
            self.releases.first().map(|r| (r.version(), r.digest())),
            self.roots.len(),
        )
    }

    /// The release a node with these desired bundles (name, version,
    /// manifest digest) is sent: the highest that admits them all, else
    /// the highest.
    pub fn release_for(&self, bundles: &[(String, String, Digest)]) -> Option<&StoredRelease> {
        self.releases
            .iter()
            .find(|r| {
                let rel = &r.signed().release;
                bundles
                    .iter()
                    .all(|(name, version, digest)| rel.admits(name, version, digest).is_ok())
            })
            .or_else(|| self.releases.first())
    }
}

/// Releases and roots by cluster, read at most once per [`TTL`] and
/// cluster; and the manifest digest of each bundle version a desired state
/// names, read once.
pub struct ReleaseCache {
    cache: ClusterCache<Arc<Channel>>,
    /// (name, version, size of the encoded bundle) → manifest digest.
    /// name@version is immutable; the size guards against a version
    /// deleted and published again with other content. One insert or
    /// lookup at a time, whole after a panic: locked with [`lock`].
    digests: Mutex<HashMap<(String, String, usize), Digest>>,
}

impl Default for ReleaseCache {
    fn default() -> Self {
        Self::new(TTL)
    }
}

impl ReleaseCache {
    pub fn new(ttl: Duration) -> Self {
        ReleaseCache {
            cache: ClusterCache::new(ttl),
            digests: Mutex::new(HashMap::new()),
        }
    }

    /// The cluster's releases and roots, read from the store when older
    /// than the TTL; a read that finds them changed tells the cluster's
    /// streams on `hub` to look again.
    pub async fn get(
        &self,
        store: &(impl ReleaseStore + NodeStore + ?Sized),
        hub: &Hub,
        cluster: &str,
    ) -> Result<Arc<Channel>> {
        match self.cache.lookup(cluster).await {
            Lookup::Fresh(v) => Ok(v),
            Lookup::Read(fill) => read(fill.slot(), store, hub, cluster).await,
        }
    }

    /// Forgets the cluster's entry (it was just changed here).
    pub fn invalidate(&self, cluster: &str) {
        self.cache.invalidate(cluster);
    }

    /// Reads again every cluster held, telling the streams of each that
    /// changed (what other replicas wrote).
    pub async fn refresh(&self, store: &(impl ReleaseStore + NodeStore + ?Sized), hub: &Hub) {
        for (cluster, slot) in self.cache.held() {
            let fill = slot.fill().await;
            if let Err(e) = read(fill.slot(), store, hub, &cluster).await {
                tracing::warn!(cluster = %cluster, error = %e, "read releases");
            }
        }
    }

    /// The manifest digest of `name@version` whose stored encoding is
    /// `size` bytes (`None`: not published any more).
    pub async fn manifest_digest(
        &self,
        store: &(impl BundleStore + ?Sized),
        name: &str,
        version: &str,
        size: usize,
    ) -> Result<Option<Digest>> {
        let key = (name.to_string(), version.to_string(), size);
        let cached = lock(&self.digests).get(&key).copied();
        if let Some(d) = cached {
            return Ok(Some(d));
        }
        let Some(row) = store.get_bundle(name, version).await? else {
            return Ok(None);
        };
        let key = (name.to_string(), version.to_string(), row.bundle.encoded().len());
        lock(&self.digests).insert(key.clone(), row.manifest_digest);
        Ok((key.2 == size).then_some(row.manifest_digest))
    }
}

/// Tells the streams of `cluster`'s nodes on this replica to look again.
pub async fn notify_cluster(store: &(impl NodeStore + ?Sized), hub: &Hub, cluster: &str) -> Result<()> {
    for n in store.list_nodes(Some(cluster)).await? {
        hub.notify(&n.name);
    }
    Ok(())
}

/// Reads the cluster into `slot` (its fill lock held). With an entry
/// held, only the head release and the roots are read; the releases are
/// read again only when those changed. When the store cannot be read, what
/// is held is kept (and read again next time).
async fn read(
    slot: &Slot<Arc<Channel>>,
    store: &(impl ReleaseStore + NodeStore + ?Sized),
    hub: &Hub,
    cluster: &str,
) -> Result<Arc<Channel>> {
    let old = slot.current();
    // Ok(kept entry) when nothing changed, Err(new channel) otherwise.
    let read = async {
        let roots = store.list_roots(cluster).await?;
        let roots: Vec<pb::SignedRoot> = roots.iter().map(|r| r.root.wire().clone()).collect();
        if let Some(o) = &old {
            let head = store.list_releases(cluster, 1).await?;
            let head = head.first().map(|r| (r.release.version(), r.release.digest()));
            if (head, roots.len()) == o.head() {
                return Ok(Ok(o.clone()));
            }
        }
        let releases = store.list_releases(cluster, CACHED_RELEASES).await?;
        Ok::<_, crate::store::StoreError>(Err(Channel {
            releases: releases.into_iter().map(|r| r.release).collect(),
            roots,
        }))
    }
    .await;
    let new = match read {
        // Unchanged: the entry is kept, since streams tell a change by a
        // new entry (`Arc::ptr_eq`).
        Ok(Ok(kept)) => {
            slot.set(kept.clone());
            return Ok(kept);
        }
        Ok(Err(c)) => (Arc::new(c), old.is_some()),
        Err(e) => {
            return match old {
                Some(o) => {
                    tracing::warn!(cluster = %cluster, error = %e, "read releases; using the last ones read");
                    Ok(o)
                }
                None => Err(e),
            };
        }
    };
    let (new, changed) = new;
    slot.set(new.clone());
    if changed {
        tracing::info!(cluster = %cluster, release = ?new.releases.first().map(StoredRelease::version), roots = new.roots.len(), "releases changed");
        notify_cluster(store, hub, cluster).await?;
    }
    Ok(new)
}

/// Every [`TTL`], on every replica: reads again the releases of the
/// clusters whose agents this replica serves ([`ReleaseCache::refresh`]).
pub async fn run(
    cache: Arc<ReleaseCache>,
    store: Arc<impl ReleaseStore + NodeStore + ?Sized>,
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
        cache.refresh(&*store, &hub).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lks_proto::release::{Release, ReleasedBundle, SignedRelease};

    use super::*;
    use crate::store::{ClusterStore, NewCluster, ReleaseStore, SqliteStore};

    fn release(version: u64, bundles: &[(&str, &str, Digest)]) -> StoredRelease {
        StoredRelease::new(SignedRelease::sign(
            Release {
                channel: "a".into(),
                version,
                expires_at_ms: 1,
                bundles: bundles
                    .iter()
                    .map(|(n, v, d)| {
                        (
                            n.to_string(),
                            ReleasedBundle {
                                version: v.to_string(),
                                manifest_digest: *d,
                            },
                        )
                    })
                    .collect::<BTreeMap<_, _>>(),
            },
            &[],
        ))
    }

    #[test]
    fn a_node_gets_the_highest_release_that_admits_its_bundles() {
        let (d1, d2) = (Digest::of(b"k1"), Digest::of(b"k2"));
        let c = Channel {
            releases: vec![
                release(3, &[("k", "2", d2)]),
                release(2, &[("k", "1", d1)]),
                release(1, &[("k", "1", d1)]),
            ],
            roots: Vec::new(),
        };
        let on = |v: &str, d: Digest| vec![("k".to_string(), v.to_string(), d)];
        assert_eq!(c.release_for(&on("2", d2)).unwrap().version(), 3);
        assert_eq!(c.release_for(&on("1", d1)).unwrap().version(), 2);
        assert_eq!(
            c.release_for(&on("1", d2)).unwrap().version(),
            3,
            "none admits a wrong digest: the highest"
        );
        assert_eq!(c.release_for(&[]).unwrap().version(), 3);
        assert!(Channel::default().release_for(&on("1", d1)).is_none());
    }

    #[tokio::test]
    async fn releases_are_cached_until_invalidated_or_refreshed() {
        let store = SqliteStore::open_in_memory().unwrap();
        store.create_cluster(NewCluster::new("a", 1)).await.unwrap();
        let hub = Hub::default();
        let cache = ReleaseCache::new(Duration::from_secs(3600));
        assert!(cache.get(&store, &hub, "a").await.unwrap().releases.is_empty());
        store.put_release(release(1, &[]), 1).await.unwrap();
        assert!(
            cache.get(&store, &hub, "a").await.unwrap().releases.is_empty(),
            "within the TTL the entry stands"
        );
        cache.refresh(&store, &hub).await;
        assert_eq!(cache.get(&store, &hub, "a").await.unwrap().releases.len(), 1);
        let before = cache.get(&store, &hub, "a").await.unwrap();
        cache.refresh(&store, &hub).await;
        assert!(
            Arc::ptr_eq(&before, &cache.get(&store, &hub, "a").await.unwrap()),
            "an unchanged read keeps the entry"
        );
        store.put_release(release(2, &[]), 1).await.unwrap();
        cache.invalidate("a");
        assert_eq!(
            cache.get(&store, &hub, "a").await.unwrap().releases[0].version(),
            2
        );
    }
}
