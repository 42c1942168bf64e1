//! The admin API's event log: `ListEvents`, newest first, filtered by
//! cluster, node or rollout.

use lks_proto::pb;
use tonic::{Response, Status};

use crate::ops::logs;
use crate::store::{EventFilter, EventStore};

/// `ListEvents`: at most `ops::logs::MAX_EVENT_LIMIT` events matching the filter.
pub(super) async fn list(
    store: &(impl EventStore + ?Sized),
    r: pb::ListEventsRequest,
) -> Result<Response<pb::ListEventsResponse>, Status> {
    let opt = |s: String| (!s.is_empty()).then_some(s);
    let filter = EventFilter {
        cluster: opt(r.cluster),
        node: opt(r.node),
        rollout_id: opt(r.rollout_id),
        limit: r.limit,
    };
    let rows = logs::events(store, filter).await?;
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
