//! Declared `LksRollout`s → the server's rollouts (issue [kube-front],
//! item 2). An `LksRollout` a user (or Argo CD, Flux) created:
//! - is started once: `StartRollout` carries the request ID
//!   `kube:<object UID>`, so a start repeated after a crash (before the
//!   status kept the rollout's ID) returns the rollout the first one
//!   started; `spec.rollbackOf: ID` rolls that rollout back instead;
//! - a start the server refuses (bundle not yet published, cluster not yet
//!   created, a bad option) is `Ready=False`, reason `Refused`, with the
//!   server's line, and is tried again every `--retry-interval` (30 s) and at once when the
//!   spec changes — so a rollout applied with its LksCluster from one Git
//!   commit starts once the cluster exists;
//! - once started, only `spec.paused` may change (pauses and resumes it);
//!   another change is `Ready=False`, reason `SpecChanged`, and is not
//!   carried out: a different rollout is a new LksRollout;
//! - deleting it while it runs or is paused aborts it (finalizer).
//!
//! Its status is the server's rollout (phase, counts, `Progressing`,
//! `Completed`, `Failed`) plus `Ready`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use lks_proto::pb;
use tonic::Code;

use crate::admin::Admin;
use crate::clusters::digest16;
use crate::conditions::{self, condition};
use crate::crd::{Condition, LksRollout, LksRolloutSpec, LksRolloutStatus};
use crate::mirror;
use crate::object::{set_finalizer, write_status};
use crate::policy::{self, SpecError};

/// The finalizer of a declared `LksRollout`.
pub const FINALIZER: &str = "lksadmin.io/rollout";
/// The request ID prefix of rollouts the controller starts.
pub const REQUEST_PREFIX: &str = "kube:";

/// The request ID of an LksRollout's start.
pub fn request_id(uid: &str) -> String {
    format!("{REQUEST_PREFIX}{uid}")
}

/// The `StartRolloutRequest` a spec stands for.
pub fn start_request(spec: &LksRolloutSpec, uid: &str) -> Result<pb::StartRolloutRequest, SpecError> {
    let (bundle, version) = spec
        .bundle
        .split_once('@')
        .filter(|(n, v)| !n.is_empty() && !v.is_empty())
        .ok_or_else(|| SpecError::Bundle(spec.bundle.clone()))?;
    Ok(pb::StartRolloutRequest {
        cluster: spec.cluster.clone(),
        bundle: bundle.to_string(),
        version: version.to_string(),
        selector: spec.selector.clone().into_iter().collect(),
        request_id: request_id(uid),
        ..policy::policy(spec)?.to_request()
    })
}

/// The digest of what a started rollout may not change: the spec without
/// `paused`.
pub fn spec_digest(spec: &LksRolloutSpec) -> String {
    let fixed = LksRolloutSpec {
        paused: false,
        ..spec.clone()
    };
    digest16(serde_json::to_string(&fixed).unwrap_or_default().as_bytes())
}

/// Whether `r` is a rollout the controller started for an LksRollout.
pub fn declared(r: &pb::Rollout) -> bool {
    r.request_id.starts_with(REQUEST_PREFIX)
}

/// The verb that brings a started rollout's pause to what the spec says.
pub fn pause_verb(spec: &LksRolloutSpec, r: &pb::Rollout) -> Option<PauseVerb> {
    match (spec.paused, pb::RolloutState::try_from(r.state)) {
        (true, Ok(pb::RolloutState::Running)) => Some(PauseVerb::Pause),
        (false, Ok(pb::RolloutState::Paused)) => Some(PauseVerb::Resume),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseVerb {
    Pause,
    Resume,
}

/// Refused starts: when each object (by UID) was last tried, and at which
/// generation; one is tried again after `retry`, or at once when its spec
/// changed.
pub struct Attempts {
    retry: Duration,
    tried: HashMap<String, (Instant, i64)>,
}

impl Attempts {
    pub fn new(retry: Duration) -> Self {
        Attempts {
            retry,
            tried: HashMap::new(),
        }
    }

    fn due(&self, uid: &str, generation: i64) -> bool {
        self.tried
            .get(uid)
            .is_none_or(|(at, g)| *g != generation || at.elapsed() >= self.retry)
    }
}

/// Reconciles every declared LksRollout (those the controller did not
/// create as mirrors); returns how many it changed on the server.
pub async fn sync(
    kube: &kube::Client,
    admin: &mut Admin,
    rollouts: &[pb::Rollout],
    attempts: &mut Attempts,
    mirror_label: (&str, &str),
) -> anyhow::Result<usize> {
    let all: Api<LksRollout> = Api::all(kube.clone());
    let objs = all
        .list(&ListParams::default())
        .await
        .context("list LksRollouts")?
        .items;
    let mut changed = 0;
    for obj in objs
        .iter()
        .filter(|o| o.labels().get(mirror_label.0).map(String::as_str) != Some(mirror_label.1))
    {
        let ns = obj.namespace().unwrap_or_default();
        let api: Api<LksRollout> = Api::namespaced(kube.clone(), &ns);
        changed += reconcile(&api, admin, obj, rollouts, attempts)
            .await
            .with_context(|| format!("LksRollout {ns}/{}", obj.name_any()))?;
    }
    let live: std::collections::HashSet<String> = objs.iter().filter_map(|o| o.uid()).collect();
    attempts.tried.retain(|uid, _| live.contains(uid));
    Ok(changed)
}

async fn reconcile(
    api: &Api<LksRollout>,
    admin: &mut Admin,
    obj: &LksRollout,
    rollouts: &[pb::Rollout],
    attempts: &mut Attempts,
) -> anyhow::Result<usize> {
    let name = obj.name_any();
    let uid = obj.uid().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or(0);
    let old = obj.status.clone().unwrap_or_default();
    let now = conditions::now();
    let current = (!old.id.is_empty())
        .then(|| rollouts.iter().find(|r| r.id == old.id))
        .flatten();

    if obj.metadata.deletion_timestamp.is_some() {
        return on_deletion(api, admin, obj, current, &name).await;
    }
    if !obj.finalizers().iter().any(|f| f == FINALIZER) {
        set_finalizer(api, obj, FINALIZER, true).await?;
    }

    let mut status = old.clone();
    let mut changed = 0;
    let mut started_now = None;
    if current.is_none() {
        if !old.id.is_empty() {
            // Known once, gone now (a restored server).
            let msg = format!("rollout {} is not on the server (any more)", old.id);
            conditions::set(
                &mut status.conditions,
                condition("Ready", false, "Gone", &msg, generation),
                &now,
            );
            return write_status(api, &name, &old, &status).await.map(|_| 0);
        }
        if !attempts.due(&uid, generation) {
            return Ok(0);
        }
        attempts.tried.insert(uid.clone(), (Instant::now(), generation));
        match start(admin, obj, &uid, rollouts).await {
            Ok(r) => {
                tracing::info!(rollout = %r.id, lksrollout = %name, "rollout started for LksRollout");
                attempts.tried.remove(&uid);
                status.started_spec_digest = spec_digest(&obj.spec);
                changed += 1;
                started_now = Some(r);
            }
            Err(e) => {
                // The status carries the line: the error ends here.
                let msg = e.to_string();
                tracing::warn!(lksrollout = %name, message = %msg, "LksRollout not started");
                status.observed_generation = generation;
                status.message = msg.clone();
                conditions::set(
                    &mut status.conditions,
                    condition("Ready", false, "Refused", &msg, generation),
                    &now,
                );
                return write_status(api, &name, &old, &status).await.map(|_| 0);
            }
        }
    }
    let mut r = match started_now.as_ref().or(current) {
        Some(r) => r.clone(),
        None => return Ok(changed),
    };
    let ready = ready_condition(obj, &status, &r, generation);
    changed += follow_paused(admin, obj, &mut r).await?;
    let mirrored = mirror::rollout_status(&r, generation);
    let mut conds = status.conditions.clone();
    for c in mirrored.conditions.iter().cloned() {
        let keep_time = c.last_transition_time.clone();
        conditions::set(&mut conds, c, &keep_time);
    }
    conditions::set(&mut conds, ready, &now);
    status = LksRolloutStatus {
        started_spec_digest: status.started_spec_digest.clone(),
        conditions: conds,
        ..mirrored
    };
    write_status(api, &name, &old, &status).await?;
    Ok(changed)
}

/// A deleted LksRollout: aborts its rollout while it runs or is paused
/// (a rollback is left to finish), then lets the object go. Counts the
/// rollout as changed when there was one.
async fn on_deletion(
    api: &Api<LksRollout>,
    admin: &mut Admin,
    obj: &LksRollout,
    current: Option<&pb::Rollout>,
    name: &str,
) -> anyhow::Result<usize> {
    if let Some(r) = current.filter(|r| {
        obj.spec.rollback_of.is_none()
            && matches!(
                pb::RolloutState::try_from(r.state),
                Ok(pb::RolloutState::Running | pb::RolloutState::Paused)
            )
    }) {
        match admin.abort_rollout(pb::RolloutRef { id: r.id.clone() }).await {
            Ok(_) => {
                tracing::info!(rollout = %r.id, lksrollout = %name, "LksRollout deleted: rollout aborted")
            }
            // Ended meanwhile: nothing to abort.
            Err(e) if e.code() == Code::FailedPrecondition => {}
            Err(e) => return Err(e).with_context(|| format!("abort rollout {}", r.id)),
        }
    }
    if obj.finalizers().iter().any(|f| f == FINALIZER) {
        set_finalizer(api, obj, FINALIZER, false).await?;
    }
    Ok(usize::from(current.is_some()))
}

/// Asks the server for the LksRollout's rollout: a rollback of
/// `spec.rollbackOf`, or a new rollout; the refusal as one line.
async fn start(
    admin: &mut Admin,
    obj: &LksRollout,
    uid: &str,
    rollouts: &[pb::Rollout],
) -> Result<pb::Rollout, StartError> {
    match &obj.spec.rollback_of {
        Some(id) => rollback(admin, &obj.spec, id, rollouts).await,
        None => {
            let req = start_request(&obj.spec, uid)?;
            Ok(admin
                .start_rollout(req)
                .await
                .map_err(StartError::Refused)?
                .into_inner())
        }
    }
}

/// Why an LksRollout's rollout was not started: the one line its status
/// shows.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// The server's line, without gRPC's framing.
    #[error("{}", .0.message())]
    Refused(#[source] tonic::Status),
    #[error("spec.rollbackOf: rollout {0} does not exist")]
    NoSuchRollout(String),
    #[error(
        "spec.rollbackOf: rollout {id} is {named} on cluster {cluster}, not {bundle} on cluster {wanted}"
    )]
    NotThatRollout {
        id: String,
        named: String,
        cluster: String,
        bundle: String,
        wanted: String,
    },
}

/// `Ready`: started, or refusing a spec changed since (only `spec.paused`
/// can change once the rollout started).
fn ready_condition(
    obj: &LksRollout,
    status: &LksRolloutStatus,
    r: &pb::Rollout,
    generation: i64,
) -> Condition {
    if !status.started_spec_digest.is_empty() && status.started_spec_digest != spec_digest(&obj.spec) {
        return condition(
            "Ready",
            false,
            "SpecChanged",
            &format!(
                "only spec.paused can change once rollout {} started; this change is not carried out \
                 (a different rollout is a new LksRollout)",
                r.id
            ),
            generation,
        );
    }
    condition("Ready", true, "Started", &format!("rollout {}", r.id), generation)
}

/// Pauses or resumes the rollout as `spec.paused` says, `r` as the
/// server then has it; 1 if it did.
async fn follow_paused(admin: &mut Admin, obj: &LksRollout, r: &mut pb::Rollout) -> anyhow::Result<usize> {
    let Some(v) = pause_verb(&obj.spec, r) else {
        return Ok(0);
    };
    let id = pb::RolloutRef { id: r.id.clone() };
    let answer = match v {
        PauseVerb::Pause => admin.pause_rollout(id).await,
        PauseVerb::Resume => admin.resume_rollout(id).await,
    };
    match answer {
        Ok(a) => {
            *r = a.into_inner();
            tracing::info!(rollout = %r.id, ?v, "rollout paused/resumed as its LksRollout says");
            Ok(1)
        }
        // The rollout moved on (ended, or paused/resumed meanwhile):
        // the next pass sees it as it is.
        Err(e) if e.code() == Code::FailedPrecondition => Ok(0),
        Err(e) => Err(e).with_context(|| format!("{v:?} rollout {}", r.id)),
    }
}

/// `spec.rollbackOf`: the rollout rolled back (or already rolling back);
/// the spec's cluster and bundle must name that rollout's.
async fn rollback(
    admin: &mut Admin,
    spec: &LksRolloutSpec,
    id: &str,
    rollouts: &[pb::Rollout],
) -> Result<pb::Rollout, StartError> {
    let r = rollouts
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| StartError::NoSuchRollout(id.to_string()))?;
    let named = format!("{}@{}", r.bundle, r.version);
    if spec.cluster != r.cluster || spec.bundle != named {
        return Err(StartError::NotThatRollout {
            id: id.to_string(),
            named,
            cluster: r.cluster.clone(),
            bundle: spec.bundle.clone(),
            wanted: spec.cluster.clone(),
        });
    }
    if matches!(
        pb::RolloutState::try_from(r.state),
        Ok(pb::RolloutState::RollingBack | pb::RolloutState::RolledBack)
    ) {
        return Ok(r.clone());
    }
    admin
        .rollback_rollout(pb::RolloutRef { id: id.to_string() })
        .await
        .map(|a| a.into_inner())
        .map_err(StartError::Refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Canary, Drain};

    fn spec() -> LksRolloutSpec {
        LksRolloutSpec {
            cluster: "a".into(),
            bundle: "kubelet@1.37.2".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_spec_is_the_start_request_lksctl_would_send() {
        let mut s = spec();
        s.batch_size = Some(2);
        s.canary = Some(Canary {
            count: 1,
            soak: Some("90s".into()),
        });
        s.drain = Some(Drain {
            enabled: true,
            timeout: Some("5m".into()),
            on_timeout: Some("skip".into()),
            kubelet_version: Some("v1.37.2".into()),
            ..Default::default()
        });
        let r = start_request(&s, "u-1").unwrap();
        assert_eq!((r.bundle.as_str(), r.version.as_str()), ("kubelet", "1.37.2"));
        assert_eq!(r.batch_size, 2);
        assert_eq!((r.canary, r.canary_soak_seconds), (1, 90));
        assert_eq!(r.drain, Some(true));
        assert_eq!(r.drain_timeout_seconds, 300);
        assert_eq!(r.on_drain_timeout, "skip");
        assert_eq!(r.drain_timeout_action, pb::DrainTimeoutAction::Skip as i32);
        assert_eq!(r.request_id, "kube:u-1");
        let plain = start_request(&spec(), "u").unwrap();
        assert_eq!(plain.drain, None, "absent: the cluster's default");
        assert_eq!(plain.canary_soak_seconds, 0);
        s.canary.as_mut().unwrap().soak = None;
        assert_eq!(
            start_request(&s, "u").unwrap().canary_soak_seconds,
            600,
            "lksctl's default"
        );
    }

    #[test]
    fn a_bad_spec_is_one_line_naming_the_field() {
        let mut s = spec();
        s.bundle = "kubelet".into();
        assert_eq!(
            start_request(&s, "u").unwrap_err().to_string(),
            "spec.bundle \"kubelet\" is not NAME@VERSION"
        );
        let mut s = spec();
        s.batch_interval = Some("soon".into());
        let e = start_request(&s, "u").unwrap_err().to_string();
        assert!(e.starts_with("spec.batchInterval: "), "{e}");
        let mut s = spec();
        s.offline = Some("later".into());
        assert!(
            start_request(&s, "u")
                .unwrap_err()
                .to_string()
                .contains("use defer or wait")
        );
    }

    #[test]
    fn a_stored_spec_reads_and_digests_as_before_its_fields_were_typed() {
        // As an LksRollout stored by an earlier controller serializes: the
        // digest of a started spec must not move when the controller is upgraded.
        let stored = r#"{"cluster":"a","bundle":"k@1","offline":"wait","canary":{"count":1,"soak":"90s"},"batchInterval":"1800s","ignoreWindows":false,"drain":{"enabled":true,"timeout":"10m","onTimeout":"skip","deleteLocalData":false},"paused":false}"#;
        let s: LksRolloutSpec = serde_json::from_str(stored).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), stored);
        assert_eq!(spec_digest(&s), digest16(stored.as_bytes()));
    }

    #[test]
    fn only_paused_may_change_after_the_start() {
        let mut s = spec();
        let d = spec_digest(&s);
        s.paused = true;
        assert_eq!(spec_digest(&s), d);
        s.batch_size = Some(3);
        assert_ne!(spec_digest(&s), d);
    }

    #[test]
    fn pause_follows_the_spec() {
        let mut r = pb::Rollout {
            state: pb::RolloutState::Running as i32,
            ..Default::default()
        };
        let mut s = spec();
        assert_eq!(pause_verb(&s, &r), None);
        s.paused = true;
        assert_eq!(pause_verb(&s, &r), Some(PauseVerb::Pause));
        r.state = pb::RolloutState::Paused as i32;
        assert_eq!(pause_verb(&s, &r), None);
        s.paused = false;
        assert_eq!(pause_verb(&s, &r), Some(PauseVerb::Resume));
        r.state = pb::RolloutState::Completed as i32;
        assert_eq!(pause_verb(&s, &r), None, "an ended rollout is left alone");
    }

    #[test]
    fn a_refused_start_is_retried_later_or_when_the_spec_changes() {
        let retry = Duration::from_secs(30);
        let mut a = Attempts::new(retry);
        assert!(a.due("u", 1));
        a.tried.insert("u".into(), (Instant::now(), 1));
        assert!(!a.due("u", 1));
        assert!(a.due("u", 2));
        a.tried.insert("u".into(), (Instant::now() - retry, 1));
        assert!(a.due("u", 1));
    }
}
