//! Who is connected, and how a change reaches them.
//!
//! Each node with an open `Connect` stream has a `watch` channel: a change to
//! its desired state bumps the value, and the stream's task re-reads the
//! store and sends the newest state. Notifying never blocks and never queues
//! — a slow agent simply sees one coalesced change — so fan-out to thousands
//! of streams cannot be held up by the slowest one. Heartbeats only touch an
//! in-memory map that a background task flushes to the store in batches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lks_proto::sync::lock;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

struct Conn {
    id: u64,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
    state: Arc<ConnState>,
}

/// What the hub and the stream's task both see of one stream.
#[derive(Default)]
struct ConnState {
    /// Set when the replica asks the stream to move (one slot written:
    /// whole after a panic, locked with [`lock`]).
    moved: Mutex<Option<String>>,
    /// The stream had its Hello and first desired state: it may be asked
    /// to move. One still opening is not (it would count the move as a
    /// failed attempt, not a move).
    serving: AtomicBool,
}

/// What a stream task holds while it serves one node.
pub struct Registration {
    pub id: u64,
    pub changed: watch::Receiver<u64>,
    /// Fires when the node is deleted, a newer stream of the same node
    /// replaces this one, or the replica asks it to move ([`Hub::ask_to_move`]).
    pub cancel: CancellationToken,
    state: Arc<ConnState>,
}

impl Registration {
    /// The replica URL this stream was asked to move to ("" if none was
    /// named), when its cancellation was a move.
    pub fn moved_to(&self) -> Option<String> {
        lock(&self.state.moved).clone()
    }

    /// The stream is open (Hello taken, first desired state sent): from now
    /// on a rebalance may pick it ([`Hub::some_serving`]).
    pub fn serving(&self) {
        self.state.serving.store(true, Ordering::Relaxed);
    }
}

/// Every section under `conns` and `seen` is one map insert, remove,
/// lookup or drain, whole after a panic: they are locked with
/// [`lock`], which keeps their data rather than losing every stream.
#[derive(Default)]
pub struct Hub {
    next_id: AtomicU64,
    conns: Mutex<HashMap<String, Conn>>,
    seen: Mutex<HashMap<String, i64>>,
}

impl Hub {
    /// Registers a new stream for `node`, ending any older one.
    pub fn register(&self, node: &str) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = watch::channel(0);
        let cancel = CancellationToken::new();
        let state = Arc::new(ConnState::default());
        let old = lock(&self.conns).insert(
            node.to_string(),
            Conn {
                id,
                changed: tx,
                cancel: cancel.clone(),
                state: state.clone(),
            },
        );
        if let Some(old) = old {
            old.cancel.cancel();
        }
        Registration {
            id,
            changed: rx,
            cancel,
            state,
        }
    }

    /// Removes the stream `id` of `node`; true if it was still the current one.
    pub fn unregister(&self, node: &str, id: u64) -> bool {
        let mut c = lock(&self.conns);
        if c.get(node).is_some_and(|conn| conn.id == id) {
            c.remove(node);
            true
        } else {
            false
        }
    }

    /// Tells `node`'s stream (if any) that its desired state changed.
    pub fn notify(&self, node: &str) {
        if let Some(conn) = lock(&self.conns).get(node) {
            conn.changed.send_modify(|v| *v += 1);
        }
    }

    /// Tells every stream to re-read its desired state (after a gap in the
    /// etcd watch); each sends only if its generation moved.
    pub fn notify_all(&self) {
        for conn in lock(&self.conns).values() {
            conn.changed.send_modify(|v| *v += 1);
        }
    }

    /// Ends `node`'s stream (if any), e.g. because the node was deleted.
    pub fn kick(&self, node: &str) {
        let removed = lock(&self.conns).remove(node);
        if let Some(conn) = removed {
            conn.cancel.cancel();
        }
    }

    /// Ends `node`'s stream asking the agent to reconnect to `to` (a
    /// replica URL; "" lets it pick): this replica holds more than its
    /// share. False if it has no stream here.
    pub fn ask_to_move(&self, node: &str, to: &str) -> bool {
        let Some(conn) = lock(&self.conns).remove(node) else {
            return false;
        };
        *lock(&conn.state.moved) = Some(to.to_string());
        conn.cancel.cancel();
        true
    }

    /// Up to `n` nodes whose streams are open ([`Registration::serving`]),
    /// in no particular order.
    pub fn some_serving(&self, n: usize) -> Vec<String> {
        lock(&self.conns)
            .iter()
            .filter(|(_, conn)| conn.state.serving.load(Ordering::Relaxed))
            .map(|(node, _)| node.clone())
            .take(n)
            .collect()
    }

    pub fn is_connected(&self, node: &str) -> bool {
        lock(&self.conns).contains_key(node)
    }

    pub fn connected(&self) -> usize {
        lock(&self.conns).len()
    }

    /// Notes that `node` was heard from at `now_ms`.
    pub fn heard(&self, node: &str, now_ms: i64) {
        lock(&self.seen).insert(node.to_string(), now_ms);
    }

    /// Last time `node` was heard from that is not flushed yet.
    pub fn last_heard(&self, node: &str) -> Option<i64> {
        lock(&self.seen).get(node).copied()
    }

    /// Takes the heartbeats gathered since the last flush.
    pub fn take_heard(&self) -> Vec<(String, i64)> {
        lock(&self.seen).drain().collect()
    }

    /// Ends every stream (shutdown).
    pub fn close_all(&self) {
        for (_, conn) in lock(&self.conns).drain() {
            conn.cancel.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn newest_stream_wins_and_notifications_coalesce() {
        let hub = Hub::default();
        let old = hub.register("n1");
        let mut new = hub.register("n1");
        assert!(old.cancel.is_cancelled(), "a second stream replaces the first");
        assert!(
            !hub.unregister("n1", old.id),
            "the old stream must not unregister the new one"
        );
        for _ in 0..100 {
            hub.notify("n1");
        }
        new.changed.changed().await.unwrap();
        assert_eq!(*new.changed.borrow_and_update(), 100);
        assert!(!new.changed.has_changed().unwrap());
        assert_eq!(new.moved_to(), None);
        hub.kick("n1");
        assert!(new.cancel.is_cancelled());
        assert_eq!(new.moved_to(), None, "a kick is no move");
        assert_eq!(hub.connected(), 0);
        hub.notify("nobody");
    }

    #[test]
    fn a_move_names_where_to() {
        let hub = Hub::default();
        let a = hub.register("a");
        let b = hub.register("b");
        let _opening = hub.register("c");
        assert!(hub.some_serving(5).is_empty(), "none is open yet");
        a.serving();
        b.serving();
        let mut open = hub.some_serving(5);
        open.sort();
        assert_eq!(open, ["a", "b"], "c is still opening");
        assert!(hub.ask_to_move("a", "https://r2:7443"));
        assert!(a.cancel.is_cancelled());
        assert_eq!(a.moved_to().as_deref(), Some("https://r2:7443"));
        assert!(!hub.ask_to_move("a", ""), "gone already");
        assert_eq!(hub.some_serving(5), ["b"]);
    }

    #[test]
    fn heartbeats_batch() {
        let hub = Hub::default();
        hub.heard("a", 1);
        hub.heard("a", 2);
        hub.heard("b", 3);
        let mut v = hub.take_heard();
        v.sort();
        assert_eq!(v, vec![("a".to_string(), 2), ("b".to_string(), 3)]);
        assert!(hub.take_heard().is_empty());
    }
}
