//! [`Policy`] ↔ `StartRolloutRequest`. The wire says "not given" with 0 and
//! "", and each choice twice: the typed field (`offline_policy`,
//! `drain_timeout_action`) and the string servers before it read
//! (`offline`, `on_drain_timeout`). A request is read with the typed field
//! winning when both are set, and written with both, so that a server
//! that knows only the string gets the same policy.

use std::time::Duration;

use lks_proto::pb;

use super::{DrainOptions, DrainTimeout, OfflinePolicy, Policy, PolicyError};

/// The typed wire form of an offline choice.
pub fn offline_pb(o: OfflinePolicy) -> pb::OfflinePolicy {
    match o {
        OfflinePolicy::Defer => pb::OfflinePolicy::Defer,
        OfflinePolicy::Wait => pb::OfflinePolicy::Wait,
    }
}

/// The typed wire form of a drain-timeout choice.
pub fn drain_timeout_pb(d: DrainTimeout) -> pb::DrainTimeoutAction {
    match d {
        DrainTimeout::Fail => pb::DrainTimeoutAction::Fail,
        DrainTimeout::Skip => pb::DrainTimeoutAction::Skip,
    }
}

/// The offline choice of a request: the typed field, else the string.
pub fn offline_of(r: &pb::StartRolloutRequest) -> Result<Option<OfflinePolicy>, PolicyError> {
    match pb::OfflinePolicy::try_from(r.offline_policy) {
        Ok(pb::OfflinePolicy::Defer) => Ok(Some(OfflinePolicy::Defer)),
        Ok(pb::OfflinePolicy::Wait) => Ok(Some(OfflinePolicy::Wait)),
        Ok(pb::OfflinePolicy::Unspecified) => match r.offline.as_str() {
            "" => Ok(None),
            s => OfflinePolicy::parse(s)
                .map(Some)
                .ok_or_else(|| PolicyError::UnknownOffline(s.to_string())),
        },
        Err(_) => Err(PolicyError::UnknownOfflineValue(r.offline_policy)),
    }
}

/// The drain-timeout choice of a request: the typed field, else the string.
pub fn on_drain_timeout_of(r: &pb::StartRolloutRequest) -> Result<Option<DrainTimeout>, PolicyError> {
    match pb::DrainTimeoutAction::try_from(r.drain_timeout_action) {
        Ok(pb::DrainTimeoutAction::Fail) => Ok(Some(DrainTimeout::Fail)),
        Ok(pb::DrainTimeoutAction::Skip) => Ok(Some(DrainTimeout::Skip)),
        Ok(pb::DrainTimeoutAction::Unspecified) => match r.on_drain_timeout.as_str() {
            "" => Ok(None),
            s => DrainTimeout::parse(s)
                .map(Some)
                .ok_or_else(|| PolicyError::UnknownDrainTimeout(s.to_string())),
        },
        Err(_) => Err(PolicyError::UnknownDrainTimeoutValue(r.drain_timeout_action)),
    }
}

fn given_secs(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

fn secs(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_secs())
}

impl TryFrom<&pb::StartRolloutRequest> for Policy {
    type Error = PolicyError;

    /// The policy a request asks for; only a choice nobody knows is
    /// refused here ([`Policy::validate`] checks the rest).
    fn try_from(r: &pb::StartRolloutRequest) -> Result<Self, PolicyError> {
        Ok(Policy {
            batch_size: (r.batch_size > 0).then_some(r.batch_size),
            failure_threshold: (r.failure_threshold > 0).then_some(r.failure_threshold),
            offline: offline_of(r)?,
            offline_deadline: given_secs(r.offline_deadline_seconds),
            canary: r.canary,
            // With canaries, 0 on the wire is no soak (as servers always
            // read it); without, any soak is refused by `validate`.
            canary_soak: if r.canary > 0 {
                Some(Duration::from_secs(r.canary_soak_seconds))
            } else {
                given_secs(r.canary_soak_seconds)
            },
            batch_interval: given_secs(r.batch_interval_seconds),
            ignore_windows: r.ignore_windows,
            drain: DrainOptions {
                enabled: r.drain,
                timeout: given_secs(r.drain_timeout_seconds),
                ready_timeout: given_secs(r.ready_timeout_seconds),
                delete_local_data: r.drain_delete_local_data,
                on_timeout: on_drain_timeout_of(r)?,
                kubelet_version: (!r.kubelet_version.is_empty()).then(|| r.kubelet_version.clone()),
            },
        })
    }
}

impl Policy {
    /// The request's policy fields (both forms of each choice); the caller
    /// fills in what the rollout targets: `StartRolloutRequest { cluster,
    /// bundle, version, selector, request_id, ..policy.to_request() }`.
    /// Durations go in whole seconds.
    pub fn to_request(&self) -> pb::StartRolloutRequest {
        let d = &self.drain;
        pb::StartRolloutRequest {
            batch_size: self.batch_size.unwrap_or(0),
            failure_threshold: self.failure_threshold.unwrap_or(0),
            offline_deadline_seconds: secs(self.offline_deadline),
            offline: self
                .offline
                .map(OfflinePolicy::as_str)
                .unwrap_or_default()
                .to_string(),
            offline_policy: self.offline.map_or(pb::OfflinePolicy::Unspecified, offline_pb) as i32,
            canary: self.canary,
            canary_soak_seconds: if self.canary > 0 {
                self.canary_soak().as_secs()
            } else {
                secs(self.canary_soak)
            },
            batch_interval_seconds: secs(self.batch_interval),
            ignore_windows: self.ignore_windows,
            drain: d.enabled,
            drain_timeout_seconds: secs(d.timeout),
            ready_timeout_seconds: secs(d.ready_timeout),
            drain_delete_local_data: d.delete_local_data,
            on_drain_timeout: d
                .on_timeout
                .map(DrainTimeout::as_str)
                .unwrap_or_default()
                .to_string(),
            drain_timeout_action: d
                .on_timeout
                .map_or(pb::DrainTimeoutAction::Unspecified, drain_timeout_pb)
                as i32,
            kubelet_version: d.kubelet_version.clone().unwrap_or_default(),
            ..Default::default()
        }
    }
}
