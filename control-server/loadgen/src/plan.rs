//! `--rollout --plan`: the rollouts started by one release plan over the
//! load generator's clusters (`CreatePlan`, groups of consecutive clusters
//! by name) instead of one `StartRollout` each, followed until the plan
//! completed; then when its last cluster rollout was stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures::StreamExt;
use lks_proto::pb;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use tonic::transport::Channel;

/// How often the plan is read while it runs (`ListPlans`: the plan as
/// stored, no rollout read, so the reading costs the server little).
const POLL: Duration = Duration::from_millis(250);

/// One plan to create and follow.
pub struct PlanRun {
    pub admin: AdminServiceClient<Channel>,
    /// The plan's name, and the bundle's (version 1).
    pub name: String,
    pub clusters: Vec<String>,
    /// Groups: the clusters in this many consecutive slices.
    pub groups: usize,
    pub in_flight: u32,
    /// Each cluster's rollout policy (its cluster is ignored).
    pub rollout: pb::StartRolloutRequest,
    /// Set at the end: the newest `created_at` of the plan's rollouts (ms).
    pub last_start_ms: Arc<AtomicI64>,
}

/// `clusters` in `n` consecutive slices, as plan groups `g0`, `g1`, … by name.
pub fn groups(clusters: &[String], n: usize) -> Vec<pb::PlanGroupSpec> {
    let n = n.clamp(1, clusters.len().max(1));
    (0..n)
        .map(|k| {
            let (a, b) = (k * clusters.len() / n, (k + 1) * clusters.len() / n);
            pb::PlanGroupSpec {
                name: format!("g{k}"),
                selector: clusters[a..b].join(","),
            }
        })
        .collect()
}

/// Creates the plan and follows it; sends when it completed (and the admin
/// client) or why it did not.
pub async fn follow(
    mut p: PlanRun,
    done: tokio::sync::oneshot::Sender<Result<(Instant, AdminServiceClient<Channel>)>>,
) {
    let r = run(&mut p).await;
    let _ = done.send(r.map(|at| (at, p.admin)));
}

async fn run(p: &mut PlanRun) -> Result<Instant> {
    p.admin = p.admin.clone().max_decoding_message_size(64 << 20);
    p.admin
        .create_plan(pb::CreatePlanRequest {
            name: p.name.clone(),
            bundle: p.name.clone(),
            version: "1".into(),
            groups: groups(&p.clusters, p.groups),
            max_clusters_in_flight: p.in_flight,
            failure_budget: 1,
            rollout: Some(p.rollout.clone()),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow!("create plan {}: {}", p.name, s.message()))?;
    let (at, plan) = loop {
        let plans = p
            .admin
            .list_plans(pb::ListPlansRequest {})
            .await
            .map_err(|s| anyhow!("list plans: {}", s.message()))?
            .into_inner()
            .plans;
        let plan = plans
            .into_iter()
            .find(|x| x.name == p.name)
            .ok_or_else(|| anyhow!("plan {} is gone", p.name))?;
        match plan.state.as_str() {
            "completed" => break (Instant::now(), plan),
            "running" => {}
            s => bail!("plan {} is {s}: {}", p.name, plan.message),
        }
        tokio::time::sleep(POLL).await;
    };
    let clusters: Vec<&pb::PlanCluster> = plan.groups.iter().flat_map(|g| &g.clusters).collect();
    if let Some(c) = clusters.iter().find(|c| c.state != "completed") {
        bail!(
            "plan {}: cluster {} is {}: {}",
            p.name,
            c.name,
            c.state,
            c.message
        );
    }
    // When each rollout was stored (the server's clock), read after the end.
    let ids: Vec<String> = clusters.iter().map(|c| c.rollout_id.clone()).collect();
    let created: Vec<Result<i64>> = futures::stream::iter(ids)
        .map(|id| {
            let mut admin = p.admin.clone();
            async move {
                admin
                    .get_rollout(pb::RolloutRef { id: id.clone() })
                    .await
                    .map(|r| r.into_inner().created_at_ms)
                    .map_err(|s| anyhow!("rollout {id}: {}", s.message()))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for c in created {
        p.last_start_ms.fetch_max(c?, Ordering::Relaxed);
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_consecutive_slices_in_order() {
        let cs: Vec<String> = (0..7).map(|k| format!("c-{k}")).collect();
        let g = groups(&cs, 3);
        let sel: Vec<&str> = g.iter().map(|g| g.selector.as_str()).collect();
        assert_eq!(sel, ["c-0,c-1", "c-2,c-3", "c-4,c-5,c-6"]);
        assert_eq!(g[2].name, "g2");
        assert_eq!(groups(&cs, 1)[0].selector, cs.join(","));
        assert_eq!(groups(&cs, 99).len(), 7, "at most one group per cluster");
    }
}
