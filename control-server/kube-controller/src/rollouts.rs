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

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use lks_proto::pb;
use tonic::Code;

use crate::admin::{CallError, connection_lost};
use crate::clusters::digest16;
use crate::conditions::{self, condition};
use crate::context::{Ctx, Error};
use crate::crd::{Condition, LksRollout, LksRolloutSpec, LksRolloutStatus};
use crate::mirror;
use crate::object::write_status;
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
        ..policy::policy(&spec.policy)?.to_request()
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

/// Reconciles one declared `LksRollout` (kube-rs' `Controller` calls it
/// for each object on its own, so one that fails holds up no other): its
/// finalizer ([`kube::runtime::finalizer`]), then the start, the pause
/// and the status; on deletion, the abort.
pub async fn reconcile(obj: Arc<LksRollout>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<LksRollout> = Api::namespaced(ctx.kube.clone(), &ns);
    let r = finalizer(&api, FINALIZER, obj.clone(), |event| async {
        match event {
            Event::Apply(o) => apply(&ctx, &api, &o).await,
            Event::Cleanup(o) => cleanup(&ctx, &o).await,
        }
    })
    .await
    .map_err(Error::from);
    ctx.done(obj.as_ref(), r)
}

/// The rollout `id` as the server has it: from the last poll's read,
/// unless this copy changed it since that read began (or the read does not
/// have it yet), then asked for. `None`: the server has no such rollout.
async fn rollout(ctx: &Ctx, id: &str) -> Result<Option<pb::Rollout>, Error> {
    let key = format!("rollout/{id}");
    if let Ok(read) = ctx.rollouts.get(ctx.interval).await
        && ctx.current(&key, read.at)
        && let Some(r) = read.items.get(id)
    {
        return Ok(Some(r.clone()));
    }
    let req = pb::RolloutRef { id: id.to_string() };
    match ctx
        .admin
        .call(|mut a| async move { a.get_rollout(req).await })
        .await
    {
        Ok(r) => Ok(Some(r)),
        Err(CallError::Status(s)) if s.code() == Code::NotFound => Ok(None),
        Err(e) => Err(Error::admin(format!("read rollout {id}"), e)),
    }
}

async fn apply(ctx: &Ctx, api: &Api<LksRollout>, obj: &LksRollout) -> Result<Action, Error> {
    let name = obj.name_any();
    let uid = obj.uid().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or(0);
    let old = obj.status.clone().unwrap_or_default();
    let now = conditions::now();
    // The next poll looks again; this is the fallback for a missed one.
    let again = Action::requeue(ctx.retry.max(ctx.interval));
    let current = match old.id.as_str() {
        "" => None,
        id => rollout(ctx, id).await?,
    };

    let mut status = old.clone();
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
            write_status(api, &name, &old, &status).await?;
            return Ok(again);
        }
        if !ctx.attempts().due(&uid, generation) {
            return Ok(again);
        }
        ctx.attempts().tried(&uid, generation);
        match start(ctx, obj, &uid).await? {
            Ok(r) => {
                tracing::info!(rollout = %r.id, lksrollout = %name, "rollout started for LksRollout");
                ctx.attempts().forget(&uid);
                ctx.acted(&format!("rollout/{}", r.id));
                status.started_spec_digest = spec_digest(&obj.spec);
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
                write_status(api, &name, &old, &status).await?;
                return Ok(again);
            }
        }
    }
    let Some(mut r) = started_now.or(current) else {
        return Ok(again);
    };
    let ready = ready_condition(obj, &status, &r, generation);
    follow_paused(ctx, obj, &mut r).await?;
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
    Ok(again)
}

/// A deleted LksRollout: aborts its rollout while it runs or is paused
/// (a rollback is left to finish); then the finalizer lets the object go.
async fn cleanup(ctx: &Ctx, obj: &LksRollout) -> Result<Action, Error> {
    let name = obj.name_any();
    let id = obj.status.as_ref().map(|s| s.id.clone()).unwrap_or_default();
    let current = match id.as_str() {
        "" => None,
        id => rollout(ctx, id).await?,
    };
    if let Some(r) = current.filter(|r| {
        obj.spec.rollback_of.is_none()
            && matches!(
                pb::RolloutState::try_from(r.state),
                Ok(pb::RolloutState::Running | pb::RolloutState::Paused)
            )
    }) {
        let req = pb::RolloutRef { id: r.id.clone() };
        match ctx
            .admin
            .call(|mut a| async move { a.abort_rollout(req).await })
            .await
        {
            Ok(_) => {
                ctx.acted(&format!("rollout/{}", r.id));
                tracing::info!(rollout = %r.id, lksrollout = %name, "LksRollout deleted: rollout aborted")
            }
            // Ended meanwhile: nothing to abort.
            Err(CallError::Status(s)) if s.code() == Code::FailedPrecondition => {}
            Err(e) => return Err(Error::admin(format!("abort rollout {}", r.id), e)),
        }
    }
    ctx.attempts().forget(&obj.uid().unwrap_or_default());
    Ok(Action::await_change())
}

/// A call that did not start the rollout: the server's refusal (the
/// spec's: it goes into the status), or no answer at all (an error: the
/// object is tried again).
fn refusal(e: CallError) -> Result<StartError, Error> {
    match e {
        CallError::Status(s) if !connection_lost(s.code()) => Ok(StartError::Refused(s)),
        e => Err(Error::admin("start the rollout", e)),
    }
}

/// Asks the server for the LksRollout's rollout: a rollback of
/// `spec.rollbackOf`, or a new rollout; the refusal as one line.
async fn start(ctx: &Ctx, obj: &LksRollout, uid: &str) -> Result<Result<pb::Rollout, StartError>, Error> {
    match &obj.spec.rollback_of {
        Some(id) => rollback(ctx, &obj.spec, id).await,
        None => {
            let req = match start_request(&obj.spec, uid) {
                Ok(r) => r,
                Err(e) => return Ok(Err(e.into())),
            };
            match ctx
                .admin
                .call(|mut a| async move { a.start_rollout(req).await })
                .await
            {
                Ok(r) => Ok(Ok(r)),
                Err(e) => refusal(e).map(Err),
            }
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
/// server then has it.
async fn follow_paused(ctx: &Ctx, obj: &LksRollout, r: &mut pb::Rollout) -> Result<(), Error> {
    let Some(v) = pause_verb(&obj.spec, r) else {
        return Ok(());
    };
    let id = pb::RolloutRef { id: r.id.clone() };
    let answer = match v {
        PauseVerb::Pause => {
            ctx.admin
                .call(|mut a| async move { a.pause_rollout(id).await })
                .await
        }
        PauseVerb::Resume => {
            ctx.admin
                .call(|mut a| async move { a.resume_rollout(id).await })
                .await
        }
    };
    match answer {
        Ok(a) => {
            *r = a;
            ctx.acted(&format!("rollout/{}", r.id));
            tracing::info!(rollout = %r.id, ?v, "rollout paused/resumed as its LksRollout says");
            Ok(())
        }
        // The rollout moved on (ended, or paused/resumed meanwhile):
        // the next reconcile sees it as it is.
        Err(CallError::Status(s)) if s.code() == Code::FailedPrecondition => Ok(()),
        Err(e) => Err(Error::admin(format!("{v:?} rollout {}", r.id), e)),
    }
}

/// `spec.rollbackOf`: the rollout rolled back (or already rolling back);
/// the spec's cluster and bundle must name that rollout's.
async fn rollback(
    ctx: &Ctx,
    spec: &LksRolloutSpec,
    id: &str,
) -> Result<Result<pb::Rollout, StartError>, Error> {
    let Some(r) = rollout(ctx, id).await? else {
        return Ok(Err(StartError::NoSuchRollout(id.to_string())));
    };
    let named = format!("{}@{}", r.bundle, r.version);
    if spec.cluster != r.cluster || spec.bundle != named {
        return Ok(Err(StartError::NotThatRollout {
            id: id.to_string(),
            named,
            cluster: r.cluster.clone(),
            bundle: spec.bundle.clone(),
            wanted: spec.cluster.clone(),
        }));
    }
    if matches!(
        pb::RolloutState::try_from(r.state),
        Ok(pb::RolloutState::RollingBack | pb::RolloutState::RolledBack)
    ) {
        return Ok(Ok(r));
    }
    let req = pb::RolloutRef { id: id.to_string() };
    match ctx
        .admin
        .call(|mut a| async move { a.rollback_rollout(req).await })
        .await
    {
        Ok(r) => Ok(Ok(r)),
        Err(e) => refusal(e).map(Err),
    }
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
        s.policy.batch_size = Some(2);
        s.policy.canary = Some(Canary {
            count: 1,
            soak: Some("90s".into()),
        });
        s.policy.drain = Some(Drain {
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
        s.policy.canary.as_mut().unwrap().soak = None;
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
        s.policy.batch_interval = Some("soon".into());
        let e = start_request(&s, "u").unwrap_err().to_string();
        assert!(e.starts_with("spec.batchInterval: "), "{e}");
        let mut s = spec();
        s.policy.offline = Some("later".into());
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
        s.policy.batch_size = Some(3);
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
}
