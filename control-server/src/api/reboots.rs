//! The admin API's coordinated reboots (issue [reboots]): a rolling
//! reboot's start and verbs, and a cluster's reboot status; the policy is
//! `SetCluster`'s. The lock itself is stepped by the leader's reboot
//! controller (every 2 s).

use std::sync::Arc;

use lks_proto::pb;
use tonic::{Response, Status};

use crate::clock::now_ms;
use crate::hub::Hub;
use crate::ops::reboot::{self, RunVerb};
use crate::store::{RebootMode, RebootPolicy, RebootTimeout, Store};

crate::context::shared_view! {
    /// What the reboot handlers use: the store, and who is connected.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        /// The reboot gates' answers, for the reason a node waits.
        reboot_gates: Arc<crate::rebootgates::Gates>,
    }
}

pub fn mode_pb(m: RebootMode) -> pb::RebootMode {
    match m {
        RebootMode::Off => pb::RebootMode::Off,
        RebootMode::Manual => pb::RebootMode::Manual,
        RebootMode::Auto => pb::RebootMode::Auto,
    }
}

/// The mode a request names; `None` when it names none.
pub fn mode_of(m: i32) -> Option<RebootMode> {
    match pb::RebootMode::try_from(m).ok()? {
        pb::RebootMode::Unspecified => None,
        pb::RebootMode::Off => Some(RebootMode::Off),
        pb::RebootMode::Manual => Some(RebootMode::Manual),
        pb::RebootMode::Auto => Some(RebootMode::Auto),
    }
}

/// The timeout policy a request names; `None` when it names none.
pub fn on_timeout_of(m: i32) -> Option<RebootTimeout> {
    match pb::RebootTimeoutPolicy::try_from(m).ok()? {
        pb::RebootTimeoutPolicy::Unspecified => None,
        pb::RebootTimeoutPolicy::Free => Some(RebootTimeout::Free),
        pb::RebootTimeoutPolicy::Keep => Some(RebootTimeout::Keep),
    }
}

pub fn policy_pb(p: &RebootPolicy) -> pb::RebootPolicy {
    pb::RebootPolicy {
        mode: mode_pb(p.mode) as i32,
        max_concurrent: p.max_concurrent,
        timeout_ms: p.timeout_ms,
        on_timeout: match p.on_timeout {
            RebootTimeout::Free => pb::RebootTimeoutPolicy::Free,
            RebootTimeout::Keep => pb::RebootTimeoutPolicy::Keep,
        } as i32,
        alert_gate: p.alert_gate.as_ref().map(|g| pb::RebootAlertGate {
            url: g.url.clone(),
            filter: g.filter.clone(),
        }),
        blocking_pod_selector: p.blocking_pod_selector.clone(),
    }
}

async fn answer(s: &Deps, cluster: &str) -> Result<Response<pb::RebootsStatus>, Status> {
    let connected = |n: &crate::store::NodeRow| n.connected || s.hub.is_connected(&n.name);
    let st = reboot::status(s.store.as_ref(), cluster, connected, &s.reboot_gates, now_ms()).await?;
    let run = st.lock.run.as_ref();
    Ok(Response::new(pb::RebootsStatus {
        cluster: st.cluster.name.clone(),
        policy: Some(policy_pb(&st.cluster.reboots)),
        run_state: run.map(|r| r.state.as_str().to_string()).unwrap_or_default(),
        selector: run
            .map(|r| r.selector.clone().into_iter().collect())
            .unwrap_or_default(),
        started_ms: run.map_or(0, |r| r.started_ms),
        started_by: run.map(|r| r.started_by.clone()).unwrap_or_default(),
        slots_taken: st.lock.slots.len() as u32,
        window_open: st.clock.window_open,
        next_window_ms: st.clock.next_window_ms,
        nodes: st
            .nodes
            .into_iter()
            .map(|n| pb::RebootNodeState {
                name: n.name,
                state: n.state.to_string(),
                message: n.message,
                since_ms: n.since_ms,
            })
            .collect(),
    }))
}

/// `StartReboots`.
pub(super) async fn start(
    s: &Deps,
    r: pb::StartRebootsRequest,
    who: String,
) -> Result<Response<pb::RebootsStatus>, Status> {
    lks_proto::names::validate_cluster_name(&r.cluster).map_err(super::invalid)?;
    let selector = r.selector.into_iter().collect();
    reboot::start(s.store.as_ref(), &r.cluster, selector, &who, now_ms()).await?;
    tracing::info!(cluster = %r.cluster, admin = %who, "rolling reboot started");
    answer(s, &r.cluster).await
}

/// `GetReboots`.
pub(super) async fn get(s: &Deps, r: pb::GetRebootsRequest) -> Result<Response<pb::RebootsStatus>, Status> {
    lks_proto::names::validate_cluster_name(&r.cluster).map_err(super::invalid)?;
    answer(s, &r.cluster).await
}

/// `SetRebootRun`: pause, resume or abort.
pub(super) async fn set_run(
    s: &Deps,
    r: pb::SetRebootRunRequest,
    who: String,
) -> Result<Response<pb::RebootsStatus>, Status> {
    lks_proto::names::validate_cluster_name(&r.cluster).map_err(super::invalid)?;
    let verb = match pb::RebootRunVerb::try_from(r.verb) {
        Ok(pb::RebootRunVerb::Pause) => RunVerb::Pause,
        Ok(pb::RebootRunVerb::Resume) => RunVerb::Resume,
        Ok(pb::RebootRunVerb::Abort) => RunVerb::Abort,
        _ => return Err(Status::invalid_argument("verb: one of pause, resume, abort")),
    };
    reboot::run_verb(s.store.as_ref(), &r.cluster, verb, &who, now_ms()).await?;
    tracing::info!(cluster = %r.cluster, admin = %who, ?verb, "rolling reboot changed");
    answer(s, &r.cluster).await
}
