//! The admin API's release plans: creating one (decoded here, expanded by
//! `ops::plan`), reading and listing them with where each cluster stands,
//! and the verbs.

use std::collections::BTreeMap;
use std::sync::Arc;

use lks_proto::labels::selector_matches;
use lks_proto::pb;
use lks_rollout::Policy;
use lks_rollout::plan::{PlanVerb, RolloutSeen, cluster_state_at, group_state_at, rollout_ids};
use serde_json::json;
use tonic::{Response, Status};

use super::audit::Entry;
use crate::clock::now_ms;
use crate::ops::OpError;
use crate::ops::plan::{self as ops_plan, CreatePlan};
use crate::ops::start::StartError;
use crate::plans::{overdue, rollouts_seen};
use crate::store::{ClusterRow, NodeRow, OnHalt, PlanClusterState, PlanRow, Store};
use crate::windows;

crate::context::shared_view! {
    /// What the plan handlers use: the store.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
    }
}

/// A cluster as a plan shows it: its windows now, its matching nodes held
/// and connected.
#[derive(Default)]
struct Facts {
    windows: Vec<String>,
    open: bool,
    next_ms: i64,
    held: u32,
    connected: u32,
}

async fn facts(s: &Deps, p: &PlanRow) -> Result<BTreeMap<String, Facts>, Status> {
    let store = s.store.as_ref();
    let clusters: Vec<ClusterRow> = store.list_clusters().await.map_err(OpError::from)?;
    let nodes: Vec<NodeRow> = store.list_nodes(None).await.map_err(OpError::from)?;
    let now = now_ms();
    let mut out: BTreeMap<String, Facts> = BTreeMap::new();
    for c in clusters {
        let parsed = windows::parse_all(&c.maintenance_windows).unwrap_or_default();
        let open = windows::is_open(&parsed, now);
        out.insert(
            c.name.clone(),
            Facts {
                open,
                next_ms: if open {
                    0
                } else {
                    windows::next_open(&parsed, now).unwrap_or(0)
                },
                windows: c.maintenance_windows,
                ..Facts::default()
            },
        );
    }
    for n in nodes.iter().filter(|n| selector_matches(&p.selector, &n.labels)) {
        if let Some(f) = out.get_mut(&n.cluster) {
            f.held += u32::from(n.hold.is_some());
            f.connected += u32::from(n.connected);
        }
    }
    Ok(out)
}

/// The plan as the API shows it at `now`, with its rollouts' progress and
/// its clusters' facts when known.
fn plan_pb(
    p: &PlanRow,
    seen: &BTreeMap<String, RolloutSeen>,
    facts: &BTreeMap<String, Facts>,
    now: i64,
) -> pb::Plan {
    let groups = p
        .groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let state = group_state_at(p, gi, now);
            pb::PlanGroup {
                name: g.name.clone(),
                selector: g.selector.clone(),
                state: state.to_string(),
                soak_until_ms: if state == "soaking" {
                    g.done_at_ms
                        .saturating_add(i64::try_from(p.soak_ms).unwrap_or(i64::MAX))
                } else {
                    0
                },
                clusters: g
                    .clusters
                    .iter()
                    .map(|c| {
                        let r = seen.get(&c.rollout_id);
                        let f = facts.get(&c.name);
                        pb::PlanCluster {
                            name: c.name.clone(),
                            state: cluster_state_at(p, gi, c, now).to_string(),
                            rollout_id: c.rollout_id.clone(),
                            message: c.message.clone(),
                            nodes: c.nodes,
                            total: r.map_or(0, |r| r.total),
                            updated: r.map_or(0, |r| r.updated),
                            failed: r.map_or(0, |r| r.failed),
                            rollout_state: r.map(|r| r.state.as_str().to_string()).unwrap_or_default(),
                            maintenance_windows: f.map(|f| f.windows.clone()).unwrap_or_default(),
                            window_open: f.is_some_and(|f| f.open),
                            next_window_ms: f.map_or(0, |f| f.next_ms),
                            held: f.map_or(0, |f| f.held),
                            connected: f.map_or(0, |f| f.connected),
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    pb::Plan {
        name: p.name.clone(),
        bundle: p.bundle.clone(),
        version: p.version.clone(),
        state: p.state.as_str().to_string(),
        message: p.message.clone(),
        groups,
        soak_seconds: p.soak_ms / 1000,
        max_clusters_in_flight: p.max_in_flight,
        failure_budget: p.failure_budget,
        on_halt: p.on_halt.as_str().to_string(),
        alert_after_seconds: p.alert_after_ms / 1000,
        failures: p.failures,
        budget_used: p.budget_used(),
        created_at_ms: p.created_at_ms,
        updated_at_ms: p.updated_at_ms,
        state_since_ms: p.state_since_ms,
        started_by: p.started_by.clone(),
        selector: p.selector.clone().into_iter().collect(),
        in_flight: u32::try_from(
            p.clusters()
                .filter(|c| c.state == PlanClusterState::Running)
                .count(),
        )
        .unwrap_or(u32::MAX),
        overdue: overdue(p, now),
        dry_run: p.revision == 0,
    }
}

/// `CreatePlan`: the request decoded (the rollout part by the one policy
/// conversion), the plan expanded and stored by `ops::plan`.
pub(super) async fn create(
    s: &Deps,
    r: pb::CreatePlanRequest,
    who: String,
) -> Result<Response<pb::Plan>, Status> {
    let rollout = r.rollout.unwrap_or_default();
    let selector = crate::ops::labels::check("selector", &rollout.selector).map_err(OpError::from)?;
    let policy = Policy::try_from(&rollout).map_err(|e| OpError::from(StartError::from(e)))?;
    let on_halt = match pb::PlanOnHalt::try_from(r.on_halt) {
        Ok(pb::PlanOnHalt::Finish) => OnHalt::Finish,
        Ok(pb::PlanOnHalt::Pause) => OnHalt::Pause,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "on_halt {} is unknown; use pause or finish",
                r.on_halt
            )));
        }
    };
    let asked = CreatePlan {
        name: r.name,
        bundle: r.bundle,
        version: r.version,
        selector,
        groups: r.groups.into_iter().map(|g| (g.name, g.selector)).collect(),
        soak: std::time::Duration::from_secs(r.soak_seconds),
        max_in_flight: r.max_clusters_in_flight,
        failure_budget: r.failure_budget,
        on_halt,
        alert_after: std::time::Duration::from_secs(r.alert_after_seconds),
        policy,
        dry_run: r.dry_run,
        started_by: who,
    };
    let row = ops_plan::create(s.store.as_ref(), asked, now_ms()).await?;
    let facts = facts(s, &row).await?;
    Ok(Response::new(plan_pb(&row, &BTreeMap::new(), &facts, now_ms())))
}

/// `GetPlan`: the plan with its rollouts' progress and its clusters' facts.
pub(super) async fn get(s: &Deps, r: pb::PlanRef) -> Result<Response<pb::Plan>, Status> {
    let row = ops_plan::get(s.store.as_ref(), &r.name).await?;
    let seen = rollouts_seen(s.store.as_ref(), rollout_ids(&row))
        .await
        .map_err(OpError::from)?;
    let facts = facts(s, &row).await?;
    Ok(Response::new(plan_pb(&row, &seen, &facts, now_ms())))
}

/// `ListPlans`: every plan as stored (no rollout read).
pub(super) async fn list(s: &Deps) -> Result<Response<pb::ListPlansResponse>, Status> {
    let rows = s.store.list_plans().await.map_err(OpError::from)?;
    let now = now_ms();
    let none = BTreeMap::new();
    Ok(Response::new(pb::ListPlansResponse {
        plans: rows
            .iter()
            .map(|p| plan_pb(p, &none, &BTreeMap::new(), now))
            .collect(),
    }))
}

/// `PausePlan`, `ResumePlan`, `AbortPlan`, `RollbackPlan`.
pub(super) async fn verb(
    s: &Deps,
    r: pb::PlanRef,
    verb: PlanVerb,
    who: &str,
) -> Result<Response<pb::Plan>, Status> {
    let row = ops_plan::verb(s.store.as_ref(), &r.name, verb, who, now_ms()).await?;
    let seen = rollouts_seen(s.store.as_ref(), rollout_ids(&row))
        .await
        .map_err(OpError::from)?;
    Ok(Response::new(plan_pb(&row, &seen, &BTreeMap::new(), now_ms())))
}

/// What a `CreatePlan` records in the audit trail.
pub(super) fn audit_create(r: &pb::CreatePlanRequest) -> Entry {
    Entry {
        target: r.name.clone(),
        args: json!({
            "bundle": format!("{}@{}", r.bundle, r.version),
            "groups": r.groups.iter().map(|g| format!("{}={}", g.name, g.selector)).collect::<Vec<_>>(),
            "soak_seconds": r.soak_seconds,
            "max_clusters_in_flight": r.max_clusters_in_flight,
            "failure_budget": r.failure_budget,
            "dry_run": r.dry_run,
        }),
    }
}

/// What a plan verb records.
pub(super) fn audit_ref(r: &pb::PlanRef) -> Entry {
    Entry {
        target: r.name.clone(),
        args: json!({}),
    }
}
