//! The admin API's event log: `ListEvents`, newest first, filtered by
//! cluster, node or rollout.

use lks_proto::pb;
use tonic::{Response, Status};

use crate::authz::store_status;
use crate::store::{EventFilter, EventStore};

const MAX_EVENT_LIMIT: u32 = 10_000;

/// `ListEvents`: at most `MAX_EVENT_LIMIT` events matching the filter.
pub(super) async fn list(
    store: &(impl EventStore + ?Sized),
    r: pb::ListEventsRequest,
) -> Result<Response<pb::ListEventsResponse>, Status> {
    let opt = |s: String| (!s.is_empty()).then_some(s);
    let rows = store
        .list_events(EventFilter {
            cluster: opt(r.cluster),
            node: opt(r.node),
            rollout_id: opt(r.rollout_id),
            limit: r.limit.min(MAX_EVENT_LIMIT),
        })
        .await
        .map_err(store_status)?;
    Ok(Response::new(pb::ListEventsResponse {
        events: rows
            .into_iter()
            .map(|e| pb::Event {
                id: e.id,
                at_ms: e.at_ms,
                cluster: e.cluster,
                node: e.node,
                rollout_id: e.rollout_id,
                kind: e.kind,
                bundle: e.bundle,
                version: e.version,
                message: e.message,
            })
            .collect(),
    }))
}
