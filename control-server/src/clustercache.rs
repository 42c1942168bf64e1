//! A value per cluster, as this replica last read it from the store: kept
//! for a TTL, filled by one read at a time per cluster, re-read on a timer.
//! What [`crate::peers`] (peer-sharing settings) and [`crate::releases`]
//! (signed releases and trust roots) hold for the desired states they send:
//! every push needs its cluster's value, and reading it per agent per push
//! would cost a store read per agent (10,000 at once after a `notify_all`).
//!
//! The cache knows nothing of what it holds: [`ClusterCache::lookup`]
//! answers the value while it is fresh, else a [`Fill`] — the cluster's
//! slot with its read lock held — with which the user reads the store,
//! puts the new value in the slot, and decides what a change means and
//! whom to tell. (A read passed in as an async closure would do, but the
//! futures of such closures cannot be shown `Send` to `tokio::spawn`
//! today.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lks_proto::sync::lock;

/// One cluster's entry.
pub struct Slot<V> {
    /// The value and when it was read (one slot written at a time, whole
    /// after a panic: locked with [`lock`]).
    value: Mutex<Option<(V, Instant)>>,
    /// Held while the value is read, so that streams needing it at once
    /// wait for one read instead of each making its own.
    fill: Arc<tokio::sync::Mutex<()>>,
}

impl<V> Default for Slot<V> {
    fn default() -> Self {
        Slot {
            value: Mutex::new(None),
            fill: Arc::default(),
        }
    }
}

/// A cluster's slot with its read lock held: read the store, then
/// [`Slot::set`] the value.
pub struct Fill<V> {
    slot: Arc<Slot<V>>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

impl<V> Fill<V> {
    pub fn slot(&self) -> &Slot<V> {
        &self.slot
    }
}

/// What [`ClusterCache::lookup`] found.
pub enum Lookup<V> {
    /// The value held, younger than the TTL (perhaps just read by the
    /// caller this one waited for).
    Fresh(V),
    /// None fresh: read it with the lock held.
    Read(Fill<V>),
}

impl<V: Clone> Slot<V> {
    /// The value held, however old.
    pub fn current(&self) -> Option<V> {
        lock(&self.value).as_ref().map(|(v, _)| v.clone())
    }

    /// Puts `v` in the slot, read now.
    pub fn set(&self, v: V) {
        *lock(&self.value) = Some((v, Instant::now()));
    }

    fn fresh(&self, ttl: Duration) -> Option<V> {
        lock(&self.value)
            .as_ref()
            .filter(|(_, at)| at.elapsed() < ttl)
            .map(|(v, _)| v.clone())
    }
}

/// Values by cluster, each read at most once per TTL.
pub struct ClusterCache<V> {
    ttl: Duration,
    /// One map insert, remove or walk at a time, whole after a panic:
    /// locked with [`lock`] (a poisoned map once made every read uncached).
    slots: Mutex<HashMap<String, Arc<Slot<V>>>>,
}

impl<V: Clone> ClusterCache<V> {
    pub fn new(ttl: Duration) -> Self {
        ClusterCache {
            ttl,
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, cluster: &str) -> Arc<Slot<V>> {
        let mut s = lock(&self.slots);
        // Looked up before an owned key is made: this runs per push.
        match s.get(cluster) {
            Some(slot) => slot.clone(),
            None => s.entry(cluster.to_string()).or_default().clone(),
        }
    }

    /// The cluster's value while younger than the TTL, else its slot to
    /// read into (one read at a time per cluster: a caller that waited for
    /// another's read gets its value).
    pub async fn lookup(&self, cluster: &str) -> Lookup<V> {
        let slot = self.slot(cluster);
        if let Some(v) = slot.fresh(self.ttl) {
            return Lookup::Fresh(v);
        }
        let lock = slot.fill.clone().lock_owned().await;
        match slot.fresh(self.ttl) {
            Some(v) => Lookup::Fresh(v),
            None => Lookup::Read(Fill { slot, _lock: lock }),
        }
    }

    /// Forgets the cluster's entry (it was just changed here): the next
    /// [`ClusterCache::get`] reads it. A read under way fills the entry
    /// dropped, not the next one.
    pub fn invalidate(&self, cluster: &str) {
        lock(&self.slots).remove(cluster);
    }

    /// Every cluster held, to read again one after another (what other
    /// replicas wrote); each slot's lock is taken as it comes.
    pub fn held(&self) -> Vec<(String, Arc<Slot<V>>)> {
        lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl<V> Slot<V> {
    /// Takes the slot's read lock (for a re-read of a held cluster).
    pub async fn fill(self: Arc<Self>) -> Fill<V> {
        let lock = self.fill.clone().lock_owned().await;
        Fill {
            slot: self,
            _lock: lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// What a user does: the fresh value, or a read (counted) into the slot.
    async fn get(cache: &ClusterCache<u32>, reads: &AtomicU32, cluster: &str) -> u32 {
        match cache.lookup(cluster).await {
            Lookup::Fresh(v) => v,
            Lookup::Read(fill) => {
                let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                fill.slot().set(n);
                n
            }
        }
    }

    #[tokio::test]
    async fn a_value_is_read_once_per_ttl_invalidated_and_refreshed() {
        let cache = ClusterCache::new(Duration::from_secs(60));
        let reads = AtomicU32::new(0);
        assert_eq!(get(&cache, &reads, "a").await, 1);
        assert_eq!(get(&cache, &reads, "a").await, 1, "held");
        assert_eq!(get(&cache, &reads, "b").await, 2, "per cluster");
        cache.invalidate("a");
        assert_eq!(get(&cache, &reads, "a").await, 3);
        let mut held: Vec<String> = Vec::new();
        for (cluster, slot) in cache.held() {
            let fill = slot.fill().await;
            assert!(fill.slot().current().is_some());
            fill.slot().set(100);
            held.push(cluster);
        }
        held.sort();
        assert_eq!(held, ["a", "b"]);
        assert_eq!(
            get(&cache, &reads, "a").await,
            100,
            "the value set by the re-read"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_old_value_is_read_again() {
        let cache = ClusterCache::new(Duration::ZERO);
        let reads = AtomicU32::new(0);
        get(&cache, &reads, "a").await;
        assert_eq!(get(&cache, &reads, "a").await, 2);
    }

    #[tokio::test]
    async fn callers_at_once_wait_for_one_read() {
        let cache = Arc::new(ClusterCache::new(Duration::from_secs(60)));
        let reads = Arc::new(AtomicU32::new(0));
        let first = match cache.lookup("a").await {
            Lookup::Read(fill) => fill,
            Lookup::Fresh(_) => panic!("nothing held yet"),
        };
        let waiter = {
            let (cache, reads) = (cache.clone(), reads.clone());
            tokio::spawn(async move { get(&cache, &reads, "a").await })
        };
        tokio::task::yield_now().await;
        first.slot().set(7);
        drop(first);
        assert_eq!(waiter.await.unwrap(), 7, "the waiter took the value read");
        assert_eq!(reads.load(Ordering::SeqCst), 0);
    }
}
