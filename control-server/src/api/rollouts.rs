//! The admin API's rollouts: starting one (decoded here, started by
//! `ops::start`), reading and watching them, and the operator verbs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lks_proto::labels::Labels;
use lks_proto::pb;
use lks_rollout::{Verb, counts};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status};

use super::{BoxStream, policy, rollout_pb};
use crate::authz::store_status;
use crate::controller;
use crate::ops::OpError;
use crate::ops::start::{self, StartError, StartRollout};
use crate::ops::verb;
use crate::store::{RolloutRow, Store};

crate::context::shared_view! {
    /// What the rollout handlers use: the store, the controller's command
    /// queue, the change signal `WatchRollout` follows, and the tasks that
    /// stream a watch.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        /// The tenant APIs, for the API server's version a start's
        /// `--kubelet-version` is checked against.
        tenants: Arc<lks_kube::tenant::TenantApis>,
        /// The rollout controller's command queue.
        rollouts: controller::Handle,
        rollout_updates: tokio::sync::watch::Sender<u64>,
        cancel: tokio_util::sync::CancellationToken,
        tasks: tokio_util::task::TaskTracker,
    }
}

/// `StartRollout`: the request decoded, the rollout started by
/// `ops::start` (which checks every precondition before it is stored).
pub(super) async fn start(
    s: &Deps,
    r: pb::StartRolloutRequest,
    who: String,
) -> Result<Response<pb::Rollout>, Status> {
    let selector =
        start::check_names(&r.cluster, &r.bundle, &r.version, &r.selector).map_err(OpError::from)?;
    let policy = lks_rollout::Policy::try_from(&r).map_err(|e| OpError::from(StartError::from(e)))?;
    let mut warnings = Vec::new();
    let api_version = if r.kubelet_version.is_empty() {
        None
    } else {
        match s.tenants.server_version(&r.cluster, VERSION_TIMEOUT).await {
            Ok(v) => v,
            Err(e) => {
                warnings.push(format!(
                    "the tenant API server's version could not be read ({e}): the kubelet version skew was not checked"
                ));
                None
            }
        }
    };
    let mut request = start_request(r, selector, policy, who);
    request.tenant_api_version = api_version;
    let started = start::start(s.store.as_ref(), &s.rollouts, request).await?;
    warnings.extend(started.warnings);
    let mut answer = Response::new(rollout_pb(&started.row));
    for w in warnings {
        tracing::warn!(rollout = %started.row.id, "{w}");
        // As kube-apiserver's `Warning` header: lksctl prints each one.
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(w.as_str()) {
            answer.metadata_mut().append(lks_proto::wire::WARNING_METADATA, v);
        }
    }
    Ok(answer)
}

/// How long a start waits for the tenant API server's version.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// A start as `ops::start` takes it.
fn start_request(
    r: pb::StartRolloutRequest,
    selector: Labels,
    policy: lks_rollout::Policy,
    who: String,
) -> StartRollout {
    StartRollout {
        cluster: r.cluster,
        bundle: r.bundle,
        version: r.version,
        selector,
        request_id: r.request_id,
        policy,
        tenant_api_version: None,
        started_by: who,
    }
}

/// How often a `WatchRollout` stream reads the cluster's nodes again for
/// what they fetched.
const FETCHED_EVERY: Duration = Duration::from_secs(2);

/// `WatchRollout`: the rollout each time it changes, until it ended and no node is applying.
pub(super) async fn watch(
    shared: &Arc<Deps>,
    req: pb::RolloutRef,
) -> Result<Response<BoxStream<pb::Rollout>>, Status> {
    let id = req.id;
    let first = load_rollout(shared, &id).await?;
    let (tx, rx) = mpsc::channel(4);
    let s = shared.clone();
    let mut updates = s.rollout_updates.subscribe();
    shared.tasks.spawn(async move {
        let mut last: Option<pb::Rollout> = None;
        let mut row = first;
        // What its nodes fetched (issue [delta]): the cluster's nodes read
        // at most every FETCHED_EVERY (a rollout's updates come faster),
        // and once more when it has ended.
        let mut fetched = (0, 0, 0);
        let mut fetched_at: Option<tokio::time::Instant> = None;
        loop {
            let mut p = rollout_pb(&row);
            let done = row.state.is_terminal() && counts(&row).applying == 0;
            if done || fetched_at.is_none_or(|t| t.elapsed() >= FETCHED_EVERY) {
                match nodes_of(&s, &row.cluster).await {
                    Ok(nodes) => {
                        let mut q = p.clone();
                        policy::add_fetched_by_nodes(&mut q, &nodes);
                        fetched = (q.fetched_from_server, q.fetched_as_delta, q.fetched_from_peers);
                        fetched_at = Some(tokio::time::Instant::now());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            (p.fetched_from_server, p.fetched_as_delta, p.fetched_from_peers) = fetched;
            if last.as_ref() != Some(&p) {
                if tx.send(Ok(p.clone())).await.is_err() {
                    return;
                }
                last = Some(p);
            }
            // An ended rollout may still have nodes finishing their
            // apply; the watch ends once none is left.
            if done {
                return;
            }
            tokio::select! {
                _ = s.cancel.cancelled() => return,
                _ = tx.closed() => return,
                _ = updates.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            row = match s.store.get_rollout(&row.id).await {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    let _ = tx.send(Err(store_status(e))).await;
                    return;
                }
            };
        }
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
}

/// `ListRollouts`.
pub(super) async fn list(
    s: &Deps,
    req: pb::ListRolloutsRequest,
) -> Result<Response<pb::ListRolloutsResponse>, Status> {
    let cluster = req.cluster;
    let rows = s
        .store
        .list_rollouts((!cluster.is_empty()).then_some(cluster.as_str()), false)
        .await
        .map_err(store_status)?;
    // What their nodes fetched: each cluster's nodes read once.
    let mut nodes: HashMap<String, Vec<crate::store::NodeRow>> = HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut p = rollout_pb(&r);
        if !nodes.contains_key(&r.cluster) {
            nodes.insert(r.cluster.clone(), nodes_of(s, &r.cluster).await?);
        }
        if let Some(n) = nodes.get(&r.cluster) {
            policy::add_fetched_by_nodes(&mut p, n);
        }
        out.push(p);
    }
    Ok(Response::new(pb::ListRolloutsResponse { rollouts: out }))
}

/// `RollbackRollout`: refused if a version it would return nodes to was
/// deleted (`ops::verb::rollback`).
pub(super) async fn rollback(s: &Deps, req: pb::RolloutRef) -> Result<Response<pb::Rollout>, Status> {
    let row = verb::rollback(s.store.as_ref(), &s.rollouts, &req.id).await?;
    Ok(Response::new(rollout_pb(&row)))
}

/// An operator verb, carried out by the rollout controller.
pub(super) async fn verb(s: &Deps, id: String, verb: Verb) -> Result<Response<pb::Rollout>, Status> {
    let row = verb::apply(&s.rollouts, &id, verb).await?;
    Ok(Response::new(rollout_pb(&row)))
}

/// The nodes of `cluster` (what they report holding), for a rollout's
/// fetched bytes.
pub(super) async fn nodes_of(s: &Deps, cluster: &str) -> Result<Vec<crate::store::NodeRow>, Status> {
    s.store.list_nodes(Some(cluster)).await.map_err(store_status)
}

pub(super) async fn load_rollout(s: &Deps, id: &str) -> Result<RolloutRow, Status> {
    Ok(verb::load(s.store.as_ref(), id).await?)
}
