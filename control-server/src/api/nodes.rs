//! The admin API's nodes: listing them (with each node's newest
//! certificates), one node, deleting one, holding and releasing it, and
//! asking it to retry a failed bundle or to reboot; `node_pb` is the view
//! `lksctl` shows.

use std::collections::HashMap;
use std::sync::Arc;

use lks_kube::nodes::{absent_pb, unreachable_pb};
use lks_kube::tenant::TenantApis;
use lks_proto::pb;
use tonic::{Response, Status};

use super::clusters;
use crate::clock::now_ms;
use crate::hub::Hub;
use crate::ops::{certs, node};
use crate::store::{LockAt, NodeReboot, NodeRow, NodeTrust, RebootMode, RebootState, Store};

crate::context::shared_view! {
    /// What the node handlers use: the store, and whom to tell when a node
    /// is held, released, deleted or asked to retry (its stream, the rollout
    /// controller).
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        rollouts_changed: Arc<tokio::sync::Notify>,
        /// For each node's Node object in its tenant cluster.
        tenants: Arc<TenantApis>,
        /// The reboot gates' answers, for the reason a node waits.
        reboot_gates: Arc<crate::rebootgates::Gates>,
    }
}

/// `ListNodes`: a cluster's nodes (or every node) with their newest certificates.
pub(super) async fn list(
    s: &Deps,
    req: pb::ListNodesRequest,
) -> Result<Response<pb::ListNodesResponse>, Status> {
    let cluster = req.cluster;
    let rows = node::list(s.store.as_ref(), &cluster).await?;
    // Each node's newest certificate per bundle and path, so `node
    // list` can say which nodes hold expired ones.
    let now = now_ms();
    let mut certs = certs::newest_by_node(s.store.as_ref(), &cluster).await?;
    let mut locks = reboot_locks(s, &rows).await;
    let mut nodes: Vec<pb::Node> = rows
        .into_iter()
        .map(|n| {
            let mine = certs.remove(&n.name).unwrap_or_default();
            let mine = mine.into_iter().map(|c| clusters::cert_pb(c, now)).collect();
            let reboot_lock = locks.remove(&n.name);
            pb::Node {
                certificates: mine,
                reboot_lock,
                ..node_pb(s, n)
            }
        })
        .collect();
    add_kube(s, &mut nodes).await;
    Ok(Response::new(pb::ListNodesResponse { nodes }))
}

/// Each node's Node object in its tenant cluster (by name), for clusters
/// with a kubeconfig; one tenant API read per cluster at most.
async fn add_kube(s: &Deps, nodes: &mut [pb::Node]) {
    let mut clusters: Vec<String> = nodes.iter().map(|n| n.cluster.clone()).collect();
    clusters.sort();
    clusters.dedup();
    let mut seen = HashMap::new();
    for c in clusters {
        if let Some(read) = s.tenants.nodes(&c).await {
            seen.insert(c, read);
        }
    }
    for n in nodes {
        n.kube = match seen.get(&n.cluster) {
            None => None,
            Some(Ok(objs)) => Some(objs.get(&n.name).map_or_else(absent_pb, |k| k.to_pb())),
            Some(Err(why)) => Some(unreachable_pb(&why.to_string())),
        };
    }
}

/// `GetNode`: one node with its certificates.
pub(super) async fn get(s: &Deps, req: pb::GetNodeRequest) -> Result<Response<pb::Node>, Status> {
    let row = node::get(s.store.as_ref(), &req.name).await?;
    let certificates = clusters::node_certs(s.store.as_ref(), &row.cluster, &row.name, now_ms()).await?;
    let mut node = [pb::Node {
        certificates,
        ..node_pb(s, row)
    }];
    add_kube(s, &mut node).await;
    let [mut node] = node;
    node.reboot_lock = reboot_lock(s, &node.cluster, &node.name).await;
    Ok(Response::new(node))
}

/// Where `name` stands with its cluster's reboot lock, if the lock is
/// about it; `None` too when it cannot be read (the rest of `node get`
/// stands).
async fn reboot_lock(s: &Deps, cluster: &str, name: &str) -> Option<pb::RebootNodeState> {
    lock_lines(s, cluster)
        .await
        .into_iter()
        .find(|l| l.name == name)
        .map(lock_pb)
}

/// Where each node of `rows` stands with its cluster's reboot lock, as
/// `node get` says it: each cluster's lock read once (a few clusters at a
/// time), never once a node. A cluster whose lock can say nothing (reboots
/// off, no slot, run or past reboot: the default) costs a point read.
async fn reboot_locks(s: &Deps, rows: &[NodeRow]) -> HashMap<String, pb::RebootNodeState> {
    use futures::StreamExt;
    /// Clusters read at once.
    const AT_ONCE: usize = 8;
    let mut clusters: Vec<&str> = rows.iter().map(|n| n.cluster.as_str()).collect();
    clusters.sort_unstable();
    clusters.dedup();
    let store = s.store.as_ref();
    let locks: Result<HashMap<String, LockAt>, _> = match clusters.as_slice() {
        [] => return HashMap::new(),
        [one] => store
            .reboot_lock(one)
            .await
            .map(|at| HashMap::from([(one.to_string(), at)])),
        _ => store.reboot_locks().await.map(|l| l.into_iter().collect()),
    };
    let locks = locks.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "node list: the reboot locks");
        HashMap::new()
    });
    let reads: Vec<_> = clusters
        .into_iter()
        .map(|c| {
            let quiet = locks.get(c).is_none_or(|at| {
                at.lock.slots.is_empty() && at.lock.run.is_none() && at.lock.last.is_empty()
            });
            async move {
                if quiet
                    && let Ok(Some(row)) = store.get_cluster(c).await
                    && row.reboots.mode == RebootMode::Off
                {
                    return Vec::new();
                }
                lock_lines(s, c).await
            }
        })
        .collect();
    let mut out = HashMap::new();
    let mut lines = futures::stream::iter(reads).buffered(AT_ONCE);
    while let Some(lines) = lines.next().await {
        for l in lines {
            // A node's first line is the one `node get` shows.
            out.entry(l.name.clone()).or_insert_with(|| lock_pb(l));
        }
    }
    out
}

/// The lines of `cluster`'s `reboot status` (every node its lock is
/// about): what `node get` and `node list` show of each node. Empty when
/// they cannot be read.
async fn lock_lines(s: &Deps, cluster: &str) -> Vec<lks_rollout::reboot::NodeLine> {
    let connected = |n: &NodeRow| n.connected || s.hub.is_connected(&n.name);
    match crate::ops::reboot::status(s.store.as_ref(), cluster, connected, &s.reboot_gates, now_ms()).await {
        Ok(st) => st.nodes,
        Err(e) => {
            tracing::warn!(%cluster, error = %e, "the reboot lock");
            Vec::new()
        }
    }
}

fn lock_pb(l: lks_rollout::reboot::NodeLine) -> pb::RebootNodeState {
    pb::RebootNodeState {
        name: l.name,
        state: l.state.to_string(),
        message: l.message,
        since_ms: l.since_ms,
    }
}

/// `DeleteNode`: its certificate stops working and its stream is closed.
pub(super) async fn delete(
    s: &Deps,
    req: pb::DeleteNodeRequest,
) -> Result<Response<pb::DeleteNodeResponse>, Status> {
    let name = req.name;
    node::delete(s.store.as_ref(), &name).await?;
    s.hub.kick(&name);
    s.rollouts_changed.notify_one();
    tracing::info!(node = %name, "node deleted; its certificate no longer works");
    Ok(Response::new(pb::DeleteNodeResponse {}))
}

/// `RetryNode`: a failed bundle (or every one) is tried again.
pub(super) async fn retry(
    s: &Deps,
    r: pb::RetryNodeRequest,
    who: String,
) -> Result<Response<pb::RetryNodeResponse>, Status> {
    let bundles = node::retry(s.store.as_ref(), &r.name, &r.bundle, &who, now_ms()).await?;
    s.hub.notify(&r.name);
    tracing::info!(node = %r.name, admin = %who, ?bundles, "retry requested");
    Ok(Response::new(pb::RetryNodeResponse { bundles }))
}

/// `RebootNode`: the node is asked to reboot (its desired state carries the
/// request).
pub(super) async fn reboot(
    s: &Deps,
    r: pb::RebootNodeRequest,
    who: String,
) -> Result<Response<pb::RebootNodeResponse>, Status> {
    let connected = |n: &NodeRow| n.connected || s.hub.is_connected(&n.name);
    let request = node::reboot(s.store.as_ref(), &r.name, connected, &who, now_ms()).await?;
    s.hub.notify(&r.name);
    tracing::info!(node = %r.name, admin = %who, request, "reboot requested");
    Ok(Response::new(pb::RebootNodeResponse { request }))
}

/// Holds (`Some(reason)`) or releases a node; answers the node as it is now.
pub(super) async fn set_hold(
    s: &Deps,
    name: &str,
    hold: Option<String>,
    who: &str,
) -> Result<Response<pb::Node>, Status> {
    let held = hold.is_some();
    let row = node::set_hold(s.store.as_ref(), name, hold, who, now_ms()).await?;
    tracing::info!(node = %name, admin = %who, held, "node hold changed");
    // A released node may catch up now.
    s.rollouts_changed.notify_one();
    Ok(Response::new(node_pb(s, row)))
}

pub(super) fn node_pb(s: &Deps, n: NodeRow) -> pb::Node {
    let mut bundles = Vec::new();
    for (name, version) in &n.desired {
        match n.actual.get(name) {
            Some(a) if a.version == *version => bundles.push(pb::BundleStatus {
                name: name.clone(),
                version: version.clone(),
                state: pb::BundleState::from(a.state) as i32,
                message: a.message.clone(),
                updated_at_ms: a.updated_at_ms,
                fetched_from_server: a.fetched_from_server,
                fetched_from_peers: a.fetched_from_peers,
                fetched_as_delta: a.fetched_as_delta,
            }),
            _ => bundles.push(pb::BundleStatus {
                name: name.clone(),
                version: version.clone(),
                state: pb::BundleState::Pending as i32,
                message: String::new(),
                updated_at_ms: 0,
                fetched_from_server: 0,
                fetched_from_peers: 0,
                fetched_as_delta: 0,
            }),
        }
    }
    // Held but no longer desired: shown as reported until the node removes it.
    for (name, a) in n.actual.iter().filter(|(name, _)| !n.desired.contains_key(*name)) {
        bundles.push(pb::BundleStatus {
            name: name.clone(),
            version: a.version.clone(),
            state: pb::BundleState::from(a.state) as i32,
            message: a.message.clone(),
            updated_at_ms: a.updated_at_ms,
            fetched_from_server: a.fetched_from_server,
            fetched_from_peers: a.fetched_from_peers,
            fetched_as_delta: a.fetched_as_delta,
        });
    }
    let facts: serde_json::Value = serde_json::from_str(&n.facts_json).unwrap_or_default();
    let strings = |k: &str| -> Vec<String> {
        facts[k]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let text = |k: &str| {
        facts
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let num = |k: &str| {
        facts
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_default()
    };
    // Here, or (on etcd) on a live replica.
    let connected = n.connected || s.hub.is_connected(&n.name);
    let last_seen_ms = n.last_seen_ms.max(s.hub.last_heard(&n.name).unwrap_or(0));
    pb::Node {
        name: n.name,
        cluster: n.cluster,
        labels: n.labels.into_iter().collect(),
        connected,
        last_seen_ms,
        bundles,
        facts: (!n.facts_json.is_empty()).then(|| pb::NodeFactsView {
            hostname: text("hostname"),
            os: text("os"),
            kernel: text("kernel"),
            arch: text("arch"),
            architecture: text("architecture"),
            cpus: num("cpus") as u32,
            memory_bytes: num("memory_bytes"),
            agent_version: text("agent_version"),
            addresses: strings("addresses"),
            features: strings("features"),
            boot_id: text("boot_id"),
        }),
        certificate_serial: n.cert_serial,
        enrolled_at_ms: n.enrolled_at_ms,
        held: n.hold.is_some(),
        hold_reason: n.hold.unwrap_or_default(),
        certificates: Vec::new(),
        trust: n.trust.map(|t| trust_pb(&t)),
        kube: None,
        reboot: reboot_pb(n.reboot.as_ref(), n.reboot_request),
        reboot_request: n.reboot_request,
        reboot_lock: None,
    }
}

/// A node's reported reboot state as `ListNodes` shows it: a request it has
/// not taken on yet (above the one it reported) is "rebooting" already.
pub(super) fn reboot_pb(r: Option<&NodeReboot>, request: u64) -> Option<pb::RebootStatus> {
    let r = r?;
    let pending = request > r.request && r.state != RebootState::Rebooting;
    Some(pb::RebootStatus {
        state: if pending {
            RebootState::Rebooting.as_str()
        } else {
            r.state.as_str()
        }
        .into(),
        reason: if pending {
            format!("request {request} sent")
        } else {
            r.reason.clone()
        },
        since_ms: r.since_ms,
        boot_id: r.boot_id.clone(),
        request: r.request,
    })
}

/// A node's reported release trust as `ListNodes` shows it.
pub(super) fn trust_pb(t: &NodeTrust) -> pb::TrustStatus {
    pb::TrustStatus {
        enabled: t.enabled,
        state: t.state.map(|s| s.as_str().to_string()).unwrap_or_default(),
        message: t.message.clone(),
        release_version: t.release_version,
        release_expires_at_ms: t.release_expires_at_ms,
        root_version: t.root_version,
    }
}
