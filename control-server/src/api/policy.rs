//! The admin API's rollout-policy half: maintenance windows of clusters,
//! holds of nodes, and the policy options of a rollout start, checked and
//! turned into store rows; and the rollout as the API shows it.

use std::time::Duration;

use lks_proto::labels::{Labels, selector_matches};
use lks_proto::pb;
use tonic::Status;

use super::invalid;
use crate::rollout::counts;
use crate::store::{
    ClusterRow, ClusterStore, DrainPolicy, DrainTimeout, EventRow, NodeState, NodeStore, OfflinePolicy,
    RolloutPolicy, RolloutRow, RolloutState,
};
use crate::windows;

/// Windows per cluster; more is a mistake, not a schedule.
pub const MAX_WINDOWS: usize = 32;
/// Longest canary soak and batch interval.
const MAX_PAUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest hold reason.
const MAX_REASON: usize = 512;

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
    }
}

/// Checks a `SetCluster` request: the windows to store, in canonical form.
pub fn check_windows(r: &pb::SetClusterRequest) -> Result<Vec<String>, Status> {
    if r.clear_maintenance_windows && !r.maintenance_windows.is_empty() {
        return Err(invalid("give maintenance windows or clear them, not both"));
    }
    if !r.clear_maintenance_windows && r.maintenance_windows.is_empty() {
        return Err(invalid(
            "nothing to set: give --maintenance-window (repeatable) or --no-maintenance-window",
        ));
    }
    if r.maintenance_windows.len() > MAX_WINDOWS {
        return Err(invalid(format!(
            "{} maintenance windows; the limit is {MAX_WINDOWS}",
            r.maintenance_windows.len()
        )));
    }
    let parsed = windows::parse_all(&r.maintenance_windows).map_err(invalid)?;
    Ok(parsed.iter().map(|w| w.to_string()).collect())
}

/// Sets or clears the (checked) windows of a cluster, recorded with the
/// admin's name.
pub async fn set_windows(
    store: &(impl ClusterStore + ?Sized),
    name: &str,
    windows: Vec<String>,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, Status> {
    let event = EventRow::windows_set(name, &windows, admin, now_ms);
    store
        .set_cluster_windows(name, windows, event)
        .await
        .map_err(crate::authz::store_status)
}

/// Checks a hold reason.
pub fn check_reason(reason: &str) -> Result<(), Status> {
    if reason.len() > MAX_REASON {
        return Err(invalid(format!(
            "hold reason is {} bytes; the limit is {MAX_REASON}",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(invalid("hold reason must be one line of printable text"));
    }
    Ok(())
}

fn pause(what: &str, secs: u64) -> Result<u64, Status> {
    let d = Duration::from_secs(secs);
    if d > MAX_PAUSE {
        return Err(invalid(format!("{what} is longer than the limit of 7 days")));
    }
    Ok(d.as_millis() as u64)
}

/// The policy of a rollout start, checked. `matched` counts the nodes the
/// selector matches now, which a canary count may not exceed.
pub fn policy(r: &pb::StartRolloutRequest, matched: usize) -> Result<RolloutPolicy, Status> {
    let offline = match r.offline.as_str() {
        "" => OfflinePolicy::Defer,
        s => OfflinePolicy::parse(s).ok_or_else(|| {
            invalid(format!(
                "offline policy {s:?} is unknown; use \"defer\" or \"wait\""
            ))
        })?,
    };
    if r.canary as usize > matched {
        return Err(invalid(format!(
            "--canary {} is more than the {matched} node(s) the rollout matches",
            r.canary
        )));
    }
    if r.canary == 0 && r.canary_soak_seconds > 0 {
        return Err(invalid("a canary soak needs --canary N"));
    }
    let mut seed = [0u8; 8];
    let _ = getrandom::getrandom(&mut seed);
    Ok(RolloutPolicy {
        offline,
        canary: r.canary,
        canary_soak_ms: pause("canary soak", r.canary_soak_seconds)?,
        canary_seed: u64::from_le_bytes(seed),
        batch_interval_ms: pause("batch interval", r.batch_interval_seconds)?,
        ignore_windows: r.ignore_windows,
        drain: None,
        request_id: r.request_id.clone(),
    })
}

/// Longest `--drain-timeout` and `--ready-timeout`.
const MAX_KUBE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// How a rollout drains, from its request and its cluster's default:
/// `None` when it does not. Draining needs the cluster's kubeconfig.
pub fn drain_policy(
    r: &pb::StartRolloutRequest,
    cluster: &ClusterRow,
) -> Result<Option<DrainPolicy>, Status> {
    let drain = r.drain.unwrap_or(cluster.kube.drain);
    let tuned = r.drain_timeout_seconds > 0
        || r.ready_timeout_seconds > 0
        || r.drain_delete_local_data
        || !r.on_drain_timeout.is_empty()
        || !r.kubelet_version.is_empty();
    if !drain {
        if tuned {
            return Err(invalid(
                "--drain-timeout, --ready-timeout, --drain-delete-local-data, --on-drain-timeout and \
                 --kubelet-version need --drain",
            ));
        }
        return Ok(None);
    }
    if !cluster.kube.kubeconfig {
        return Err(Status::failed_precondition(format!(
            "cluster {0} has no kubeconfig, so its nodes cannot be drained: give it one with \
             `lksctl cluster set {0} --kubeconfig FILE` (packaging/kubernetes/tenant/README.md)",
            cluster.name
        )));
    }
    let wait = |what: &str, secs: u64, default_ms: u64| -> Result<u64, Status> {
        if secs == 0 {
            return Ok(default_ms);
        }
        let d = Duration::from_secs(secs);
        if d > MAX_KUBE_WAIT {
            return Err(invalid(format!("{what} is longer than the limit of 24h")));
        }
        Ok(secs.saturating_mul(1000))
    };
    let on_timeout = match r.on_drain_timeout.as_str() {
        "" => DrainTimeout::Fail,
        s => DrainTimeout::parse(s).ok_or_else(|| {
            invalid(format!(
                "--on-drain-timeout {s:?} is unknown; use \"fail\" or \"skip\""
            ))
        })?,
    };
    let v = &r.kubelet_version;
    if !v.is_empty()
        && (v.len() > 64 || !v.starts_with('v') || v.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(invalid(format!(
            "--kubelet-version {v:?} is not a version like v1.37.2"
        )));
    }
    Ok(Some(DrainPolicy {
        timeout_ms: wait(
            "--drain-timeout",
            r.drain_timeout_seconds,
            DrainPolicy::DEFAULT_TIMEOUT_MS,
        )?,
        ready_timeout_ms: wait(
            "--ready-timeout",
            r.ready_timeout_seconds,
            DrainPolicy::DEFAULT_READY_TIMEOUT_MS,
        )?,
        delete_local_data: r.drain_delete_local_data,
        on_timeout,
        kubelet_version: v.clone(),
    }))
}

/// Nodes of `cluster` the selector matches now.
pub async fn matched_nodes(
    store: &(impl NodeStore + ?Sized),
    cluster: &str,
    selector: &Labels,
) -> Result<usize, Status> {
    let nodes = store
        .list_nodes(Some(cluster))
        .await
        .map_err(crate::authz::store_status)?;
    Ok(nodes
        .iter()
        .filter(|n| selector_matches(selector, &n.labels))
        .count())
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
