//! The connections to peers: one per peer, shared by the pieces and
//! watches of every fetch running, and closed [`IDLE_CLOSE`] after the last
//! fetch ended. A node of a large cluster takes pieces from a dozen peers
//! per rollout, others each time; kept for the agent's life, those
//! connections (a socket and TLS and HTTP/2 state on both ends) would
//! pile up with every rollout on every node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;

use super::lock;

/// How long connections to peers stay open after the last fetch ended: the
/// next file of the same apply, or its retry, finds them open.
pub(super) const IDLE_CLOSE: Duration = Duration::from_secs(30);

type Key = (String, SocketAddr);

#[derive(Default)]
pub(super) struct PeerConns {
    open: Mutex<HashMap<Key, Channel>>,
    /// Fetches running.
    running: AtomicUsize,
    /// Bumped each time a fetch starts or the last one ends: a close
    /// scheduled for one idle spell does not close those of the next.
    spell: AtomicU64,
}

/// Held by a running fetch; the last one dropped schedules the close.
pub(super) struct Fetching(Arc<PeerConns>);

impl PeerConns {
    /// A fetch starts: connections stay open until it ends.
    pub(super) fn fetching(self: &Arc<Self>) -> Fetching {
        self.running.fetch_add(1, Ordering::SeqCst);
        self.spell.fetch_add(1, Ordering::SeqCst);
        Fetching(self.clone())
    }

    pub(super) fn get(&self, key: &Key) -> Option<Channel> {
        lock(&self.open).get(key).cloned()
    }

    pub(super) fn insert(&self, key: Key, ch: Channel) {
        lock(&self.open).insert(key, ch);
    }

    /// Forgets one peer's connection (it failed): the next piece dials
    /// again.
    pub(super) fn forget(&self, key: &Key) {
        lock(&self.open).remove(key);
    }

    /// Closes every connection (pieces in flight keep theirs until they
    /// end: a request holds its own handle).
    pub(super) fn close_all(&self) {
        lock(&self.open).clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.open).len()
    }

    /// Closes them if no fetch ran since `spell` began.
    fn close_if_idle(&self, spell: u64) {
        let mut open = lock(&self.open);
        if self.running.load(Ordering::SeqCst) == 0 && self.spell.load(Ordering::SeqCst) == spell {
            if !open.is_empty() {
                tracing::debug!(
                    peers = open.len(),
                    "peer sharing: connections to peers closed, idle"
                );
            }
            open.clear();
        }
    }
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let conns = &self.0;
        if conns.running.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let spell = conns.spell.fetch_add(1, Ordering::SeqCst) + 1;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let conns = conns.clone();
                rt.spawn(async move {
                    tokio::time::sleep(IDLE_CLOSE).await;
                    conns.close_if_idle(spell);
                });
            }
            Err(_) => conns.close_if_idle(spell),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> Channel {
        tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy()
    }

    fn key(n: &str) -> Key {
        (n.to_string(), "127.0.0.1:9".parse().unwrap())
    }

    /// Lets the spawned close run, if its time has come.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn connections_close_a_while_after_the_last_fetch_ends() {
        let conns = Arc::new(PeerConns::default());
        let a = conns.fetching();
        let b = conns.fetching();
        conns.insert(key("w1"), channel());
        conns.insert(key("w2"), channel());
        drop(a);
        tokio::time::sleep(IDLE_CLOSE * 2).await;
        settle().await;
        assert_eq!(conns.len(), 2, "another fetch still runs");
        drop(b);
        tokio::time::sleep(IDLE_CLOSE - Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(conns.len(), 2, "kept for the next file of the apply");
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(conns.len(), 0);
        assert!(conns.get(&key("w1")).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_started_meanwhile_keeps_them_open_until_it_ends() {
        let conns = Arc::new(PeerConns::default());
        drop(conns.fetching());
        conns.insert(key("w1"), channel());
        tokio::time::sleep(IDLE_CLOSE / 2).await;
        let next = conns.fetching();
        drop(conns.fetching());
        tokio::time::sleep(IDLE_CLOSE * 2).await;
        settle().await;
        assert!(conns.get(&key("w1")).is_some(), "a fetch runs: not closed");
        drop(next);
        tokio::time::sleep(IDLE_CLOSE + Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(conns.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_counts_from_the_last_fetch_that_ended() {
        let conns = Arc::new(PeerConns::default());
        drop(conns.fetching());
        conns.insert(key("w1"), channel());
        tokio::time::sleep(IDLE_CLOSE / 2).await;
        drop(conns.fetching());
        tokio::time::sleep(IDLE_CLOSE / 2 + Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(conns.len(), 1, "the first fetch's close is not the second's");
        tokio::time::sleep(IDLE_CLOSE / 2).await;
        settle().await;
        assert_eq!(conns.len(), 0);
    }

    #[test]
    fn without_a_runtime_the_last_fetch_closes_them_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let conns = Arc::new(PeerConns::default());
        let f = conns.fetching();
        conns.insert(key("w1"), rt.block_on(async { channel() }));
        drop(f);
        assert_eq!(conns.len(), 0);
    }

    #[tokio::test]
    async fn a_failed_peer_is_forgotten_and_all_close_when_sharing_stops() {
        let conns = Arc::new(PeerConns::default());
        let _f = conns.fetching();
        conns.insert(key("w1"), channel());
        conns.insert(key("w2"), channel());
        conns.forget(&key("w1"));
        assert!(conns.get(&key("w1")).is_none());
        assert!(conns.get(&key("w2")).is_some());
        conns.close_all();
        assert_eq!(conns.len(), 0);
    }
}
