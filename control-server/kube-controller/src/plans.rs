//! Declared `LksPlan`s → the server's release plans (issue [fleet-plans],
//! item 3), as declared `LksRollout`s are rollouts:
//! - created once: the plan's name is the object's, so a create repeated
//!   after a crash answers ALREADY_EXISTS and the plan that exists is
//!   followed (a plan of that name made with lksctl is adopted);
//! - a create the server refuses is `Ready=False`, reason `Refused`, with
//!   its line, tried again every `--retry-interval` and when the spec
//!   changes;
//! - once created, only `spec.paused` may change (pauses and resumes the
//!   plan); another change is `Ready=False`, reason `SpecChanged`;
//! - deleting it while the plan runs, is paused or halted aborts it
//!   (finalizer).
//!
//! Its status mirrors `lksctl plan status`: the state, each group's and
//! cluster's state and rollout ID, plus `Ready` and, as an `LksRollout`'s,
//! `Progressing`, `Completed` and `Failed`.

use std::sync::Arc;
use std::time::Duration;

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
use crate::crd::{Condition, LksPlan, LksPlanSpec, LksPlanStatus, PlanClusterStatus, PlanGroupStatus};
use crate::mirror::rfc3339_ms;
use crate::object::write_status;
use crate::policy::{self, SpecError, choice, secs};

/// The finalizer of an `LksPlan`.
pub const FINALIZER: &str = "lksadmin.io/plan";

fn whole_secs(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| d.as_secs())
}

/// The `CreatePlanRequest` an `LksPlan` named `name` stands for.
pub fn create_request(name: &str, spec: &LksPlanSpec) -> Result<pb::CreatePlanRequest, SpecError> {
    let (bundle, version) = spec
        .bundle
        .split_once('@')
        .filter(|(n, v)| !n.is_empty() && !v.is_empty())
        .ok_or_else(|| SpecError::Bundle(spec.bundle.clone()))?;
    let r = &spec.rollout;
    let rollout = pb::StartRolloutRequest {
        selector: r.selector.clone().into_iter().collect(),
        ..policy::policy(&r.policy)?.to_request()
    };
    Ok(pb::CreatePlanRequest {
        name: name.to_string(),
        bundle: bundle.to_string(),
        version: version.to_string(),
        groups: spec
            .groups
            .iter()
            .map(|g| pb::PlanGroupSpec {
                name: g.name.clone(),
                selector: g.selector.clone(),
            })
            .collect(),
        soak_seconds: whole_secs(secs("spec.soak", &spec.soak)?),
        max_clusters_in_flight: spec.max_clusters_in_flight.unwrap_or(0),
        failure_budget: spec.failure_budget.unwrap_or(0),
        on_halt: choice("onHalt", &spec.on_halt)?.unwrap_or(pb::PlanOnHalt::Pause) as i32,
        alert_after_seconds: whole_secs(secs("spec.alertAfter", &spec.alert_after)?),
        rollout: Some(rollout),
        dry_run: false,
    })
}

/// The digest of what a created plan may not change: the spec without
/// `paused`.
pub fn spec_digest(spec: &LksPlanSpec) -> String {
    let fixed = LksPlanSpec {
        paused: false,
        ..spec.clone()
    };
    digest16(serde_json::to_string(&fixed).unwrap_or_default().as_bytes())
}

/// The verb that brings the plan's pause to what the spec says.
pub fn pause_verb(spec: &LksPlanSpec, p: &pb::Plan) -> Option<bool> {
    match (spec.paused, p.state.as_str()) {
        (true, "running") => Some(true),
        (false, "paused") => Some(false),
        _ => None,
    }
}

/// The status fields that mirror the server's plan.
pub fn mirror(p: &pb::Plan, status: &LksPlanStatus) -> LksPlanStatus {
    LksPlanStatus {
        state: p.state.clone(),
        message: p.message.clone(),
        in_flight: p.in_flight,
        failures: p.failures,
        budget_used: p.budget_used,
        overdue: p.overdue,
        groups: p
            .groups
            .iter()
            .map(|g| PlanGroupStatus {
                name: g.name.clone(),
                state: g.state.clone(),
                soak_until: rfc3339_ms(g.soak_until_ms).unwrap_or_default(),
                clusters: g
                    .clusters
                    .iter()
                    .map(|c| PlanClusterStatus {
                        name: c.name.clone(),
                        state: c.state.clone(),
                        rollout_id: c.rollout_id.clone(),
                        message: c.message.clone(),
                        total: c.total,
                        updated: c.updated,
                        failed: c.failed,
                    })
                    .collect(),
            })
            .collect(),
        ..status.clone()
    }
}

/// `Progressing`, `Completed` and `Failed` for a plan's state, as an
/// `LksRollout` has them for its rollout's (so one health check reads
/// both): progressing while running or rolling back, `Paused` while
/// paused; failed when halted, aborted or rolled back.
pub fn state_conditions(state: &str, generation: i64) -> [Condition; 3] {
    let (progressing, why) = match state {
        "running" => (true, "Running"),
        "rolling_back" => (true, "RollingBack"),
        "paused" => (false, "Paused"),
        _ => (false, "Ended"),
    };
    let failed = match state {
        "halted" => Some("Halted"),
        "aborted" => Some("Aborted"),
        "rolled_back" => Some("RolledBack"),
        _ => None,
    };
    let done = state == "completed";
    let msg = format!("plan {state}");
    [
        condition("Progressing", progressing, why, &msg, generation),
        condition(
            "Completed",
            done,
            if done { "Completed" } else { "NotCompleted" },
            &msg,
            generation,
        ),
        condition(
            "Failed",
            failed.is_some(),
            failed.unwrap_or("NotFailed"),
            &msg,
            generation,
        ),
    ]
}

/// Reconciles one `LksPlan`: its finalizer, the create, the pause and the
/// status; on deletion, the abort.
pub async fn reconcile(obj: Arc<LksPlan>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let api: Api<LksPlan> = Api::all(ctx.kube.clone());
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

/// The plan `name` as the server has it; `None`: it has none.
async fn get_plan(ctx: &Ctx, name: &str) -> Result<Option<pb::Plan>, Error> {
    let req = pb::PlanRef {
        name: name.to_string(),
    };
    match ctx.admin.call(|mut a| async move { a.get_plan(req).await }).await {
        Ok(p) => Ok(Some(p)),
        Err(CallError::Status(s)) if s.code() == Code::NotFound => Ok(None),
        Err(e) => Err(Error::admin(format!("read plan {name}"), e)),
    }
}

/// Why the plan was not created: the line the status shows.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// The server's line, without gRPC's framing.
    #[error("{}", .0.message())]
    Refused(#[source] tonic::Status),
}

/// Creates the plan; ALREADY_EXISTS (a create repeated) is the plan that
/// exists.
async fn create(ctx: &Ctx, obj: &LksPlan, name: &str) -> Result<Result<pb::Plan, CreateError>, Error> {
    let req = match create_request(name, &obj.spec) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e.into())),
    };
    match ctx
        .admin
        .call(|mut a| async move { a.create_plan(req).await })
        .await
    {
        Ok(p) => Ok(Ok(p)),
        Err(CallError::Status(s)) if s.code() == Code::AlreadyExists => match get_plan(ctx, name).await? {
            Some(p) => Ok(Ok(p)),
            None => Ok(Err(CreateError::Refused(s))),
        },
        Err(CallError::Status(s)) if !connection_lost(s.code()) => Ok(Err(CreateError::Refused(s))),
        Err(e) => Err(Error::admin(format!("create plan {name}"), e)),
    }
}

async fn apply(ctx: &Ctx, api: &Api<LksPlan>, obj: &LksPlan) -> Result<Action, Error> {
    let name = obj.name_any();
    let uid = obj.uid().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or(0);
    let old = obj.status.clone().unwrap_or_default();
    let now = conditions::now();
    let again = Action::requeue(ctx.interval);
    let mut status = LksPlanStatus {
        observed_generation: generation,
        ..old.clone()
    };
    let mut plan = get_plan(ctx, &name).await?;
    if plan.is_none() {
        if !ctx.attempts().due(&uid, generation) {
            return Ok(again);
        }
        ctx.attempts().tried(&uid, generation);
        match create(ctx, obj, &name).await? {
            Ok(p) => {
                tracing::info!(plan = %name, "plan created for LksPlan");
                ctx.attempts().forget(&uid);
                plan = Some(p);
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::warn!(plan = %name, message = %msg, "LksPlan not created");
                status.message = msg.clone();
                let c = condition("Ready", false, "Refused", &msg, generation);
                conditions::set(&mut status.conditions, c, &now);
                write_status(api, &name, &old, &status).await?;
                return Ok(Action::requeue(ctx.retry.max(ctx.interval)));
            }
        }
    }
    let Some(mut p) = plan else {
        return Ok(again);
    };
    if status.started_spec_digest.is_empty() {
        status.started_spec_digest = spec_digest(&obj.spec);
    }
    let ready = if status.started_spec_digest != spec_digest(&obj.spec) {
        let msg = format!(
            "only spec.paused can change once plan {name} is created; this change is not carried out \
             (a different plan is a new LksPlan)"
        );
        condition("Ready", false, "SpecChanged", &msg, generation)
    } else {
        condition("Ready", true, "Created", &format!("plan {name}"), generation)
    };
    follow_paused(ctx, obj, &mut p).await?;
    status = mirror(&p, &status);
    conditions::set(&mut status.conditions, ready, &now);
    for c in state_conditions(&p.state, generation) {
        conditions::set(&mut status.conditions, c, &now);
    }
    write_status(api, &name, &old, &status).await?;
    Ok(again)
}

/// Pauses or resumes the plan as `spec.paused` says.
async fn follow_paused(ctx: &Ctx, obj: &LksPlan, p: &mut pb::Plan) -> Result<(), Error> {
    let Some(pause) = pause_verb(&obj.spec, p) else {
        return Ok(());
    };
    let req = pb::PlanRef { name: p.name.clone() };
    let answer = if pause {
        ctx.admin
            .call(|mut a| async move { a.pause_plan(req).await })
            .await
    } else {
        ctx.admin
            .call(|mut a| async move { a.resume_plan(req).await })
            .await
    };
    match answer {
        Ok(a) => {
            *p = a;
            tracing::info!(plan = %p.name, pause, "plan paused/resumed as its LksPlan says");
            Ok(())
        }
        // The plan moved on meanwhile: the next reconcile sees it.
        Err(CallError::Status(s)) if s.code() == Code::FailedPrecondition => Ok(()),
        Err(e) => Err(Error::admin(format!("pause/resume plan {}", p.name), e)),
    }
}

/// A deleted `LksPlan`: aborts its plan while it runs, is paused or
/// halted; then the finalizer lets the object go.
async fn cleanup(ctx: &Ctx, obj: &LksPlan) -> Result<Action, Error> {
    let name = obj.name_any();
    if let Some(p) = get_plan(ctx, &name)
        .await?
        .filter(|p| matches!(p.state.as_str(), "running" | "paused" | "halted"))
    {
        let req = pb::PlanRef { name: p.name.clone() };
        match ctx
            .admin
            .call(|mut a| async move { a.abort_plan(req).await })
            .await
        {
            Ok(_) => tracing::info!(plan = %name, "LksPlan deleted: plan aborted"),
            Err(CallError::Status(s)) if matches!(s.code(), Code::FailedPrecondition | Code::NotFound) => {}
            Err(e) => return Err(Error::admin(format!("abort plan {name}"), e)),
        }
    }
    ctx.attempts().forget(&obj.uid().unwrap_or_default());
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Canary, PlanGroupSpec, PlanRollout, RolloutPolicySpec, SpecValue};

    fn spec() -> LksPlanSpec {
        LksPlanSpec {
            bundle: "kubelet@1.37.2".into(),
            groups: vec![
                PlanGroupSpec {
                    name: "canary".into(),
                    selector: "a".into(),
                },
                PlanGroupSpec {
                    name: "rest".into(),
                    selector: "*".into(),
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_spec_is_the_create_request_lksctl_would_send() {
        let mut s = spec();
        s.soak = Some(SpecValue::from("1h"));
        s.max_clusters_in_flight = Some(3);
        s.failure_budget = Some(2);
        s.on_halt = Some(SpecValue::from("finish"));
        s.alert_after = Some(SpecValue::from("12h"));
        s.rollout = PlanRollout {
            selector: [("role".to_string(), "worker".to_string())].into(),
            policy: RolloutPolicySpec {
                batch_size: Some(2),
                canary: Some(Canary {
                    count: 1,
                    soak: Some("90s".into()),
                }),
                ..Default::default()
            },
        };
        let r = create_request("fleet", &s).unwrap();
        assert_eq!(
            (r.name.as_str(), r.bundle.as_str(), r.version.as_str()),
            ("fleet", "kubelet", "1.37.2")
        );
        assert_eq!(r.groups.len(), 2);
        assert_eq!(
            (r.groups[1].name.as_str(), r.groups[1].selector.as_str()),
            ("rest", "*")
        );
        assert_eq!(r.soak_seconds, 3600);
        assert_eq!(r.max_clusters_in_flight, 3);
        assert_eq!(r.failure_budget, 2);
        assert_eq!(r.on_halt, pb::PlanOnHalt::Finish as i32);
        assert_eq!(r.alert_after_seconds, 12 * 3600);
        assert!(!r.dry_run);
        let ro = r.rollout.unwrap();
        assert_eq!(ro.selector.get("role").map(String::as_str), Some("worker"));
        assert_eq!(ro.batch_size, 2);
        assert_eq!(ro.canary, 1);

        // Absent: the server's defaults (0 on the wire).
        let r = create_request("fleet", &spec()).unwrap();
        assert_eq!(
            (r.soak_seconds, r.max_clusters_in_flight, r.failure_budget),
            (0, 0, 0)
        );
        assert_eq!(r.on_halt, pb::PlanOnHalt::Pause as i32);
    }

    #[test]
    fn a_spec_that_says_nothing_the_server_knows_is_refused_with_its_field() {
        let mut s = spec();
        s.bundle = "kubelet".into();
        assert_eq!(
            create_request("p", &s).unwrap_err().to_string(),
            "spec.bundle \"kubelet\" is not NAME@VERSION"
        );
        let mut s = spec();
        s.on_halt = Some(SpecValue::from("stop"));
        assert_eq!(
            create_request("p", &s).unwrap_err().to_string(),
            "spec.onHalt \"stop\" is unknown; use pause or finish"
        );
        let mut s = spec();
        s.soak = Some(SpecValue::from("later"));
        assert!(
            create_request("p", &s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.soak: ")
        );
    }

    #[test]
    fn paused_follows_the_spec_and_only_paused_may_change() {
        let running = pb::Plan {
            name: "p".into(),
            state: "running".into(),
            ..Default::default()
        };
        let mut s = spec();
        assert_eq!(pause_verb(&s, &running), None);
        s.paused = true;
        assert_eq!(pause_verb(&s, &running), Some(true));
        let paused = pb::Plan {
            state: "paused".into(),
            ..running.clone()
        };
        assert_eq!(pause_verb(&s, &paused), None);
        assert_eq!(pause_verb(&spec(), &paused), Some(false));
        assert_eq!(
            spec_digest(&s),
            spec_digest(&spec()),
            "paused is not in the digest"
        );
        s.failure_budget = Some(5);
        assert_ne!(spec_digest(&s), spec_digest(&spec()));
    }

    #[test]
    fn the_plans_state_is_the_conditions_an_lksrollout_has() {
        let on = |state: &str| -> Vec<(String, String)> {
            state_conditions(state, 1)
                .iter()
                .map(|c| (c.status.clone(), c.reason.clone()))
                .collect()
        };
        let t = |r: &str| ("True".to_string(), r.to_string());
        let f = |r: &str| ("False".to_string(), r.to_string());
        assert_eq!(on("running"), [t("Running"), f("NotCompleted"), f("NotFailed")]);
        assert_eq!(on("paused")[0], f("Paused"));
        assert_eq!(on("completed"), [f("Ended"), t("Completed"), f("NotFailed")]);
        assert_eq!(on("halted")[2], t("Halted"));
        assert_eq!(on("aborted")[2], t("Aborted"));
    }

    #[test]
    fn the_status_mirrors_the_plans_groups_and_clusters() {
        let p = pb::Plan {
            name: "p".into(),
            state: "running".into(),
            in_flight: 1,
            groups: vec![pb::PlanGroup {
                name: "canary".into(),
                state: "running".into(),
                clusters: vec![pb::PlanCluster {
                    name: "a".into(),
                    state: "running".into(),
                    rollout_id: "r1".into(),
                    total: 3,
                    updated: 1,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let old = LksPlanStatus {
            started_spec_digest: "d".into(),
            ..Default::default()
        };
        let s = mirror(&p, &old);
        assert_eq!((s.state.as_str(), s.in_flight), ("running", 1));
        assert_eq!(s.started_spec_digest, "d", "kept");
        let c = &s.groups[0].clusters[0];
        assert_eq!(
            (c.name.as_str(), c.rollout_id.as_str(), c.total, c.updated),
            ("a", "r1", 3, 1)
        );
    }
}
