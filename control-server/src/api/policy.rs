//! The admin API's rollout-policy views: a cluster with its maintenance
//! windows, and the rollout, as the API shows them. (A rollout start's
//! policy options are checked by `ops::start`, a node's hold by
//! `ops::node`.)

use lks_proto::pb;

use crate::store::{ClusterRow, NodeState, RolloutRow, RolloutState};
use crate::windows;
use lks_rollout::counts;

/// A cluster as the API shows it, with whether a window is open at `now_ms`.
pub fn cluster_pb(c: ClusterRow, now_ms: i64) -> pb::Cluster {
    let parsed = windows::parse_all(&c.maintenance_windows).unwrap_or_default();
    let open = windows::is_open(&parsed, now_ms);
    let next = if open {
        0
    } else {
        windows::next_open(&parsed, now_ms).unwrap_or(0)
    };
    pb::Cluster {
        peer_sharing: crate::peers::peer_pb(c.peer),
        name: c.name,
        created_at_ms: c.created_at_ms,
        node_count: c.node_count,
        maintenance_windows: c.maintenance_windows,
        window_open: open,
        next_window_ms: next,
        window_closes_ms: windows::closes_at(&parsed, now_ms).unwrap_or(0),
        has_ca: c.ca_cert_pem.is_some(),
        ca_cert_hash: c
            .ca_cert_pem
            .as_deref()
            .and_then(|p| lks_proto::identity::pem_certs(p).ok())
            .and_then(|d| d.first().and_then(|d| lks_proto::identity::ca_cert_hash(d).ok()))
            .map(|h| h.to_string())
            .unwrap_or_default(),
        api_server: c.api_server.unwrap_or_default(),
        has_kubeconfig: c.kube.kubeconfig,
        drain: c.kube.drain,
        kube_probe: String::new(),
        labels: c.labels.into_iter().collect(),
        reboots: Some(super::reboots::policy_pb(&c.reboots)),
    }
}

fn rollout_state_pb(s: RolloutState) -> pb::RolloutState {
    match s {
        RolloutState::Running => pb::RolloutState::Running,
        RolloutState::Paused => pb::RolloutState::Paused,
        RolloutState::Completed => pb::RolloutState::Completed,
        RolloutState::Failed => pb::RolloutState::Failed,
        RolloutState::Aborted => pb::RolloutState::Aborted,
        RolloutState::RolledBack => pb::RolloutState::RolledBack,
        RolloutState::RollingBack => pb::RolloutState::RollingBack,
    }
}

/// Where the canary phase stands.
fn canary_phase(r: &RolloutRow) -> (&'static str, i64) {
    let p = &r.policy;
    if p.canary == 0 {
        return ("", 0);
    }
    if r.pacing.canaries_passed {
        return ("passed", 0);
    }
    if !r.nodes.iter().any(|n| n.canary) {
        return ("picking", 0);
    }
    if r.pacing.canaries_committed_at_ms == 0 {
        return ("applying", 0);
    }
    let until = r
        .pacing
        .canaries_committed_at_ms
        .saturating_add(i64::try_from(p.canary_soak_ms).unwrap_or(i64::MAX));
    ("soaking", until)
}

pub fn rollout_pb(r: &RolloutRow) -> pb::Rollout {
    let c = counts(r);
    let (phase, soak_until) = canary_phase(r);
    pb::Rollout {
        id: r.id.clone(),
        cluster: r.cluster.clone(),
        bundle: r.bundle.clone(),
        version: r.version.clone(),
        selector: r.selector.clone().into_iter().collect(),
        batch_size: r.batch_size,
        failure_threshold: r.failure_threshold,
        state: rollout_state_pb(r.state) as i32,
        total: c.total,
        updated: c.updated,
        failed: c.failed,
        pending: c.pending,
        applying: c.applying,
        nodes: r
            .nodes
            .iter()
            .map(|n| pb::RolloutNode {
                name: n.name.clone(),
                previous_version: n.previous_version.clone(),
                state: n.state.as_str().to_string(),
                message: n.message.clone(),
                canary: n.canary,
                kube_step: n.kube.as_str().to_string(),
                kube_since_ms: if n.kube.owns_cordon() { n.kube_since_ms } else { 0 },
            })
            .collect(),
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        message: r.message.clone(),
        deferred: c.deferred,
        held: c.held,
        waiting_for_window: r.pacing.waiting_for_window,
        next_window_ms: if r.pacing.waiting_for_window {
            r.pacing.next_window_ms
        } else {
            0
        },
        offline: r.policy.offline.as_str().to_string(),
        canary: r.policy.canary,
        canary_soak_seconds: r.policy.canary_soak_ms / 1000,
        batch_interval_seconds: r.policy.batch_interval_ms / 1000,
        ignore_windows: r.policy.ignore_windows,
        skipped: c.skipped,
        rolled_back: c.rolled_back,
        canary_phase: phase.to_string(),
        canary_soak_until_ms: soak_until,
        next_batch_at_ms: if r.state.is_active() && r.nodes.iter().any(|n| n.state == NodeState::Waiting) {
            r.pacing.next_batch_at_ms
        } else {
            0
        },
        drain: r.policy.drain.as_ref().map(|d| pb::RolloutDrain {
            timeout_seconds: d.timeout_ms / 1000,
            ready_timeout_seconds: d.ready_timeout_ms / 1000,
            delete_local_data: d.delete_local_data,
            on_timeout: d.on_timeout.as_str().to_string(),
            kubelet_version: d.kubelet_version.clone(),
        }),
        request_id: r.policy.request_id.clone(),
        // Filled by GetRollout, ListRollouts and WatchRollout
        // (`add_fetched_by_nodes`), which read the nodes.
        fetched_from_server: 0,
        fetched_as_delta: 0,
        fetched_from_peers: 0,
    }
}

/// What the nodes of rollout `p` that hold its version report having
/// fetched for it, added into `p` (issue [delta]: patches against whole
/// files, as `rollout status -o json` shows them).
pub fn add_fetched_by_nodes(p: &mut pb::Rollout, nodes: &[crate::store::NodeRow]) {
    let mine: std::collections::HashSet<&str> = p.nodes.iter().map(|n| n.name.as_str()).collect();
    for n in nodes.iter().filter(|n| mine.contains(n.name.as_str())) {
        if let Some(a) = n.actual.get(&p.bundle).filter(|a| a.version == p.version) {
            p.fetched_from_server += a.fetched_from_server;
            p.fetched_as_delta += a.fetched_as_delta;
            p.fetched_from_peers += a.fetched_from_peers;
        }
    }
}
