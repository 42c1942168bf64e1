//! The plan driver: on the replica that drives rollouts, every second,
//! each live release plan is stepped (`lks_rollout::plan::step`) over its
//! clusters' rollouts as the store holds them. A decision is stored on the
//! plan's revision first — so a lost race (another replica that believed it
//! led, an operator verb) stores nothing and is decided again next pass —
//! and only then carried out: a cluster's rollout started by
//! `ops::start` with the request ID `plan:NAME:CLUSTER` (idempotent: a
//! start repeated after a crash returns the same rollout), pauses, resumes,
//! aborts and rollbacks through the rollout controller's verbs. A start
//! the server refuses (a precondition of that cluster) fails that cluster,
//! against the budget.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lks_rollout::plan::{self, PlanAction, PlanDecision, RolloutSeen};
use lks_rollout::{Policy, Verb, counts};
use prost::Message as _;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::controller;
use crate::metrics::Metrics;
use crate::ops::OpError;
use crate::ops::plan::plan_event;
use crate::ops::start::{self, StartRollout};
use crate::store::{PlanClusterState, PlanRow, PlanState, Store, StoreError};

/// How often plans are stepped.
const TICK: Duration = Duration::from_secs(1);
/// Steps of one plan per pass; one normally reaches a fixed point.
const MAX_STEPS: usize = 3;
/// How often a pass that starts many clusters reads the plan again, to stop
/// at an operator's pause or abort.
const RECHECK: Duration = Duration::from_millis(250);

/// What the driver uses of the server.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn Store>,
    /// The rollout controller: starts and verbs.
    pub rollouts: controller::Handle,
    pub metrics: Arc<Metrics>,
    /// True while this replica drives rollouts (and plans).
    pub leader: watch::Receiver<bool>,
    pub cancel: CancellationToken,
}

/// Runs the driver until shutdown.
pub async fn run(d: Deps) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut known = Known::new();
    loop {
        tokio::select! {
            _ = d.cancel.cancelled() => return,
            _ = tick.tick() => drive_all(&d, &mut known).await,
        }
    }
}

/// The plans as the last pass left them, by name, each at its revision: a
/// plan whose revision did not change is not read again (a finished plan
/// of a thousand clusters is a 200 KiB record).
type Known = BTreeMap<String, PlanRow>;

async fn drive_all(d: &Deps, known: &mut Known) {
    if !*d.leader.borrow() {
        d.metrics.set_plans(None);
        known.clear();
        return;
    }
    let plans = match plans_now(d.store.as_ref(), known).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "list plans");
            return;
        }
    };
    let mut seen = Vec::with_capacity(plans.len());
    for p in plans {
        let p = if plan::needs_driving(&p) {
            let name = p.name.clone();
            match drive(d, p.clone()).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(plan = %name, error = %e, "drive plan");
                    p
                }
            }
        } else {
            p
        };
        seen.push((p.state, overdue(&p, now_ms())));
        known.insert(p.name.clone(), p);
    }
    d.metrics.set_plans(Some(&seen));
}

/// Every plan as stored now, by name: the revisions are listed, and only
/// the plans `known` does not hold at their revision are read (`known` is
/// emptied; the caller puts back what it drove).
async fn plans_now(store: &dyn Store, known: &mut Known) -> Result<Vec<PlanRow>, StoreError> {
    let revisions = store.plan_revisions().await?;
    let mut was = std::mem::take(known);
    let mut out = Vec::with_capacity(revisions.len());
    for (name, revision) in revisions {
        match was.remove(&name) {
            Some(p) if p.revision == revision => out.push(p),
            _ => {
                // Deleted since it was listed: gone from this pass too.
                if let Some(p) = store.get_plan(&name).await? {
                    out.push(p);
                }
            }
        }
    }
    Ok(out)
}

/// Whether `p` has been under way (running, paused or halted) longer than
/// its `--alert-after`.
pub fn overdue(p: &PlanRow, now_ms: i64) -> bool {
    p.alert_after_ms > 0
        && matches!(
            p.state,
            PlanState::Running | PlanState::Paused | PlanState::Halted
        )
        && now_ms.saturating_sub(p.created_at_ms) > i64::try_from(p.alert_after_ms).unwrap_or(i64::MAX)
}

/// How the rollouts `ids` stand, by ID (a rollout not stored is absent):
/// the driver reads those it follows (`plan::rollouts_to_follow`), `plan
/// status` every one the plan started (`plan::rollout_ids`).
pub async fn rollouts_seen(
    store: &dyn Store,
    ids: Vec<String>,
) -> Result<BTreeMap<String, RolloutSeen>, StoreError> {
    let mut out = BTreeMap::new();
    for id in ids {
        if let Some(r) = store.get_rollout(&id).await? {
            let c = counts(&r);
            out.insert(
                id,
                RolloutSeen {
                    state: r.state,
                    total: c.total,
                    updated: c.updated,
                    failed: c.failed,
                    message: r.message.clone(),
                },
            );
        }
    }
    Ok(out)
}

/// Steps `p` until nothing changes; returns it as stored last.
async fn drive(d: &Deps, mut p: PlanRow) -> Result<PlanRow, StoreError> {
    for _ in 0..MAX_STEPS {
        let seen = rollouts_seen(d.store.as_ref(), plan::rollouts_to_follow(&p)).await?;
        let now = now_ms();
        let Some(decision) = plan::step(&p, &seen, now) else {
            break;
        };
        p = match commit(d, decision, now).await {
            Ok(p) => p,
            // Someone wrote the plan meanwhile: decided again next pass.
            Err(StoreError::Conflict(_)) => return Ok(p),
            Err(e) => return Err(e),
        };
    }
    Ok(p)
}

/// Stores a decision, then carries out its actions. A pass that starts
/// many clusters (`--max-clusters-in-flight` in the hundreds) takes seconds:
/// the plan is read again every [`RECHECK`] between its starts, and once an
/// operator paused or aborted it, the starts not yet made are left. They are
/// stored as running with no rollout, which the next pass puts back to
/// waiting (`plan::step`), as after a crash of the driver.
async fn commit(d: &Deps, dec: PlanDecision, now: i64) -> Result<PlanRow, StoreError> {
    let events = dec
        .notes
        .iter()
        .map(|n| plan_event(&dec.plan, n.kind, &n.cluster, n.message.clone(), now))
        .collect();
    let before = dec.plan.state;
    let mut p = d.store.update_plan(dec.plan, events).await?;
    if p.state != before {
        tracing::info!(plan = %p.name, state = p.state.as_str(), "plan state changed");
    }
    let starts = dec
        .actions
        .iter()
        .filter(|a| matches!(a, PlanAction::Start { .. }))
        .count();
    let (mut made, mut checked) = (0, tokio::time::Instant::now());
    for a in dec.actions {
        if matches!(a, PlanAction::Start { .. }) {
            if checked.elapsed() >= RECHECK {
                checked = tokio::time::Instant::now();
                if let Some(now) = stopped(d, &p).await? {
                    tracing::info!(
                        plan = %p.name,
                        state = now.state.as_str(),
                        started = made,
                        left = starts - made,
                        "plan: stopped mid-pass by the operator; the starts left go back to waiting"
                    );
                    return Ok(now);
                }
            }
            made += 1;
        }
        if let Err(why) = act(d, &p, &a).await {
            p = refused(d, p, &a, why).await?;
        }
    }
    Ok(p)
}

/// The plan as stored now, if it no longer runs (an operator's pause or
/// abort since `p` was stored).
async fn stopped(d: &Deps, p: &PlanRow) -> Result<Option<PlanRow>, StoreError> {
    Ok(d.store
        .get_plan(&p.name)
        .await?
        .filter(|now| now.state != PlanState::Running))
}

/// Why an action was not carried out: for good (the cluster records it),
/// or for now (tried again next pass).
enum Refusal {
    Final(String),
    Later,
}

async fn act(d: &Deps, p: &PlanRow, a: &PlanAction) -> Result<(), Refusal> {
    let (id, verb) = match a {
        PlanAction::Start { cluster, .. } => return start_cluster(d, p, cluster).await,
        PlanAction::Pause { rollout_id } => (rollout_id, Verb::Pause),
        PlanAction::Resume { rollout_id } => (rollout_id, Verb::Resume),
        PlanAction::Abort { rollout_id } => (rollout_id, Verb::Abort),
        PlanAction::Rollback { rollout_id } => (rollout_id, Verb::Rollback),
    };
    match d.rollouts.verb(id, verb).await {
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::warn!(plan = %p.name, rollout = %id, ?verb, error = %e, "plan: rollout verb");
            match (verb, e) {
                (_, controller::CommandError::Store(_) | controller::CommandError::Gone) => {
                    Err(Refusal::Later)
                }
                (Verb::Rollback, e) => Err(Refusal::Final(e.to_string())),
                // A pause, resume or abort that no longer applies (the
                // rollout ended meanwhile): the next step sees why.
                _ => Ok(()),
            }
        }
    }
}

/// Why a plan's stored rollout policy does not read back.
#[derive(Debug, thiserror::Error)]
enum PolicyReadError {
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    #[error("{0}")]
    Policy(#[from] lks_rollout::policy::PolicyError),
}

/// The rollout policy a plan stored (a `StartRolloutRequest`'s bytes).
fn read_policy(bytes: &[u8]) -> Result<Policy, PolicyReadError> {
    let req = lks_proto::pb::StartRolloutRequest::decode(bytes)?;
    Ok(Policy::try_from(&req)?)
}

async fn start_cluster(d: &Deps, p: &PlanRow, cluster: &str) -> Result<(), Refusal> {
    let policy = read_policy(&p.policy)
        .map_err(|e| Refusal::Final(format!("the plan's rollout policy does not read back: {e}")))?;
    let r = StartRollout {
        cluster: cluster.to_string(),
        bundle: p.bundle.clone(),
        version: p.version.clone(),
        selector: p.selector.clone(),
        request_id: plan::request_id(&p.name, cluster),
        policy,
        tenant_api_version: None,
        started_by: format!("plan {} ({})", p.name, p.started_by),
    };
    match start::start(d.store.as_ref(), &d.rollouts, r).await {
        Ok(s) => {
            tracing::info!(plan = %p.name, cluster, rollout = %s.row.id, "plan: cluster rollout started");
            Ok(())
        }
        Err(OpError::Store(e)) => {
            tracing::warn!(plan = %p.name, cluster, error = %e, "plan: start rollout");
            Err(Refusal::Later)
        }
        Err(OpError::Controller(controller::CommandError::Gone)) => Err(Refusal::Later),
        Err(e) => Err(Refusal::Final(e.to_string())),
    }
}

/// Records on the plan that `a` was refused for good: a start fails its
/// cluster (against the budget), a rollback leaves it as it is, said so.
async fn refused(d: &Deps, p: PlanRow, a: &PlanAction, why: Refusal) -> Result<PlanRow, StoreError> {
    let Refusal::Final(why) = why else { return Ok(p) };
    let (target, state, text, kind) = match a {
        PlanAction::Start { cluster, .. } => (
            cluster.as_str(),
            PlanClusterState::Failed,
            format!("not started: {why}"),
            "plan_cluster_failed",
        ),
        PlanAction::Rollback { rollout_id } => (
            rollout_id.as_str(),
            PlanClusterState::Skipped,
            format!("not rolled back: {why}"),
            "plan_cluster_skipped",
        ),
        _ => return Ok(p),
    };
    let mut next = p.clone();
    let now = now_ms();
    let Some(c) = next
        .groups
        .iter_mut()
        .flat_map(|g| g.clusters.iter_mut())
        .find(|c| c.name == target || c.rollout_id == target)
    else {
        return Ok(p);
    };
    c.state = state;
    c.message = text.clone();
    c.ended_at_ms = now;
    let cluster = c.name.clone();
    if state == PlanClusterState::Failed {
        next.failures += 1;
    }
    tracing::warn!(plan = %p.name, cluster = %cluster, "{text}");
    let event = plan_event(&next, kind, &cluster, text, now);
    d.store.update_plan(next, vec![event]).await
}

#[cfg(test)]
mod tests {
    use lks_store::conformance::plan;
    use lks_store::{EventRow, PlanStore as _};
    use lks_store_sqlite::SqliteStore;

    use super::*;

    fn created() -> EventRow {
        plan_event(&plan("x"), "plan_created", "", String::new(), 5)
    }

    #[tokio::test]
    async fn a_plan_is_read_again_only_once_its_revision_moved() {
        let s = SqliteStore::open_in_memory().unwrap();
        let a = s.create_plan(plan("a"), created()).await.unwrap();
        s.create_plan(plan("b"), created()).await.unwrap();
        let mut known = Known::new();
        let first = plans_now(&s, &mut known).await.unwrap();
        assert_eq!(
            first.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(known.is_empty(), "taken: the caller puts back what it drove");

        // What the driver kept is used as long as the revision stands: a
        // mark put on the copy shows it was not read again.
        for mut p in first {
            p.message = "the copy".into();
            known.insert(p.name.clone(), p);
        }
        let again = plans_now(&s, &mut known).await.unwrap();
        assert!(again.iter().all(|p| p.message == "the copy"), "{again:?}");

        // A write moves a's revision: a is read again, b is not.
        let mut next = a.clone();
        next.message = "changed".into();
        let stored = s.update_plan(next, Vec::new()).await.unwrap();
        known.extend(again.into_iter().map(|p| (p.name.clone(), p)));
        let third = plans_now(&s, &mut known).await.unwrap();
        assert_eq!(third[0], stored);
        assert_eq!(third[1].message, "the copy");
    }
}
