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
    /// Set when the replica asks the stream to move.
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
        self.state.moved.lock().ok().and_then(|m| m.clone())
    }

    /// The stream is open (Hello taken, first desired state sent): from now
    /// on a rebalance may pick it ([`Hub::some_serving`]).
    pub fn serving(&self) {
        self.state.serving.store(true, Ordering::Relaxed);
    }
}

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
        if let Ok(mut c) = self.conns.lock()
            && let Some(old) = c.insert(
                node.to_string(),
                Conn {
                    id,
                    changed: tx,
                    cancel: cancel.clone(),
                    state: state.clone(),
                },
            )
        {
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
        let Ok(mut c) = self.conns.lock() else {
            return false;
        };
        if c.get(node).is_some_and(|conn| conn.id == id) {
            c.remove(node);
            true
        } else {
            false
        }
    }

    /// Tells `node`'s stream (if any) that its desired state changed.
    pub fn notify(&self, node: &str) {
        if let Ok(c) = self.conns.lock()
            && let Some(conn) = c.get(node)
        {
            conn.changed.send_modify(|v| *v += 1);
        }
    }

    /// Tells every stream to re-read its desired state (after a gap in the
    /// etcd watch); each sends only if its generation moved.
    pub fn notify_all(&self) {
        if let Ok(c) = self.conns.lock() {
            for conn in c.values() {
                conn.changed.send_modify(|v| *v += 1);
            }
        }
    }

    /// Ends `node`'s stream (if any), e.g. because the node was deleted.
    pub fn kick(&self, node: &str) {
        if let Ok(mut c) = self.conns.lock()
            && let Some(conn) = c.remove(node)
        {
            conn.cancel.cancel();
        }
    }

    /// Ends `node`'s stream asking the agent to reconnect to `to` (a
    /// replica URL; "" lets it pick): this replica holds more than its
    /// share. False if it has no stream here.
    pub fn ask_to_move(&self, node: &str, to: &str) -> bool {
        let Ok(mut c) = self.conns.lock() else {
            return false;
        };
        let Some(conn) = c.remove(node) else {
            return false;
        };
        if let Ok(mut m) = conn.state.moved.lock() {
            *m = Some(to.to_string());
        }
        conn.cancel.cancel();
        true
    }

    /// Up to `n` nodes whose streams are open ([`Registration::serving`]),
    /// in no particular order.
    pub fn some_serving(&self, n: usize) -> Vec<String> {
        self.conns
            .lock()
            .map(|c| {
                c.iter()
                    .filter(|(_, conn)| conn.state.serving.load(Ordering::Relaxed))
                    .map(|(node, _)| node.clone())
                    .take(n)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn is_connected(&self, node: &str) -> bool {
        self.conns.lock().is_ok_and(|c| c.contains_key(node))
    }

    pub fn connected(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    /// Notes that `node` was heard from at `now_ms`.
    pub fn heard(&self, node: &str, now_ms: i64) {
        if let Ok(mut s) = self.seen.lock() {
            s.insert(node.to_string(), now_ms);
        }
    }

    /// Last time `node` was heard from that is not flushed yet.
    pub fn last_heard(&self, node: &str) -> Option<i64> {
        self.seen.lock().ok().and_then(|s| s.get(node).copied())
    }

    /// Takes the heartbeats gathered since the last flush.
    pub fn take_heard(&self) -> Vec<(String, i64)> {
        self.seen
            .lock()
            .map(|mut s| s.drain().collect())
            .unwrap_or_default()
    }

    /// Ends every stream (shutdown).
    pub fn close_all(&self) {
        if let Ok(mut c) = self.conns.lock() {
            for (_, conn) in c.drain() {
                conn.cancel.cancel();
            }
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
