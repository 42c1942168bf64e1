//! What etcd takes and gives in one request: the largest response this
//! server reads (gRPC's 4 MiB default is too small for a region's node
//! ranges), and the bound on one rollout that keeps each of its decisions
//! under etcd's request limit.

use etcd_client::Client;

use super::{EventDoc, RolloutNodeDoc, TOUCHED};
use crate::store::{EventRow, RolloutNodeRow};

/// The largest request a rollout decision may make: etcd refuses one over
/// `--max-request-bytes` (1.5 MiB by default), less room for the rest of a
/// transaction (up to [`super::MAX_ASSIGN_PER_TXN`] desired-state documents, the
/// compares). See [`worst_decision_bytes`].
pub(super) const MAX_DECISION_BYTES: usize = (1536 - 128) * 1024;

/// The request a decision on a rollout of `nodes` makes when it changes
/// every node. A rollout is one document listing its nodes, rewritten
/// whole by every decision together with the decision's events (one per
/// node changed): each row as a started node has it and an event with a
/// 32-byte message. Calibrated on the measurement that found the limit: a
/// decision on a 10,000-node rollout (14-character names) was a 2,424,421
/// byte request (242 bytes per node), refused on every try while the
/// rollout stood still. Failure messages make a row longer, so a rollout
/// near the bound can still meet it.
pub(super) fn worst_decision_bytes(
    cluster: &str,
    bundle: &str,
    version: &str,
    nodes: &[RolloutNodeRow],
) -> usize {
    let message = "m".repeat(32);
    nodes
        .iter()
        .map(|n| {
            let row = RolloutNodeDoc {
                name: n.name.clone(),
                previous_version: n.previous_version.clone(),
                state: "applying".into(),
                message: String::new(),
                generation: u64::from(u32::MAX),
                turn_at_ms: 1_764_070_000_000,
                flags: TOUCHED,
            };
            let event = EventDoc::from_row(&EventRow {
                id: 0,
                at_ms: 1_764_070_000_000,
                cluster: cluster.to_string(),
                node: n.name.clone(),
                rollout_id: "0123456789ab".into(),
                kind: "node_started".into(),
                bundle: bundle.to_string(),
                version: version.to_string(),
                message: message.clone(),
            });
            // Each a JSON array element: a comma apiece.
            serde_json::to_vec(&row).map_or(0, |v| v.len())
                + serde_json::to_vec(&event).map_or(0, |v| v.len())
                + 2
        })
        .sum()
}

/// The largest response taken from etcd. The client's default, 4 MiB,
/// is gRPC's; etcd itself sends up to 2 GiB, and kube-apiserver takes as
/// much. A range of every node document passes 4 MiB at about 7,500 nodes
/// (the scale-out benchmark failed on it at 10,000), so the limit is far
/// above any range this server reads (30,000 nodes: ~16 MiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// A KV client of `client` that takes responses up to
/// [`MAX_RESPONSE_BYTES`].
pub fn kv_of(client: &Client) -> etcd_client::KvClient {
    client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// A watch client of `client` that takes responses up to
/// [`MAX_RESPONSE_BYTES`].
pub fn watch_of(client: &Client) -> etcd_client::WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}
