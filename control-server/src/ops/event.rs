//! A node's events as the store keeps them: what the server and the
//! node's agent record about it (a certificate renewed or issued, a
//! bundle applied, a peer that served bad bytes), with the caller's free
//! text cut to bounded sizes. Recording is best effort: a store that
//! fails is logged, never the caller's failure.

use lks_proto::identity::NodeIdentity;

use crate::store::{EventRow, EventStore};

/// Longest free-text field (messages, facts) kept from an agent.
pub const MAX_TEXT: usize = 4096;

/// `s` cut to at most `max` bytes, on a character boundary: how free text
/// from a caller (an agent's messages and facts, a refusal in the audit
/// trail) is bounded before it is stored.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What happened to a node, as an event names it.
pub struct NodeEvent<'a> {
    pub kind: &'a str,
    pub bundle: &'a str,
    pub version: &'a str,
    pub message: String,
    pub at_ms: i64,
}

/// Records `e` for the node `id`; a store failure is only logged.
pub async fn record(store: &(impl EventStore + ?Sized), id: &NodeIdentity, e: NodeEvent<'_>) {
    let row = EventRow {
        id: 0,
        at_ms: e.at_ms,
        cluster: id.cluster.clone(),
        node: id.node.clone(),
        rollout_id: String::new(),
        kind: clip(e.kind, 64).to_string(),
        bundle: clip(e.bundle, 64).to_string(),
        version: clip(e.version, 128).to_string(),
        message: clip(&e.message, MAX_TEXT).to_string(),
    };
    if let Err(e) = store.add_event(row).await {
        tracing::warn!(error = %e, "record event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{ClusterStore, EventFilter, NewCluster};

    #[test]
    fn clip_respects_char_boundaries() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abc", 9), "abc");
    }

    #[tokio::test]
    async fn an_event_is_stored_for_its_node_with_its_text_clipped() {
        let store = SqliteStore::open_in_memory().unwrap();
        store.create_cluster(NewCluster::new("a", 0)).await.unwrap();
        let id = NodeIdentity::new("a", "n1").unwrap();
        let e = NodeEvent {
            kind: &"k".repeat(70),
            bundle: "b",
            version: "1",
            message: "é".repeat(MAX_TEXT),
            at_ms: 7,
        };
        record(&store, &id, e).await;
        let rows = store
            .list_events(EventFilter {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        let [row] = rows.as_slice() else {
            panic!("{rows:?}")
        };
        assert_eq!(
            (row.cluster.as_str(), row.node.as_str(), row.at_ms),
            ("a", "n1", 7)
        );
        assert_eq!((row.kind.len(), row.bundle.as_str()), (64, "b"));
        assert_eq!(row.message, "é".repeat(MAX_TEXT / 2));
    }
}
