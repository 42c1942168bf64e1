//! Draining a node through its tenant API, and the Node `Ready` gate after
//! its upgrade — what `kubectl cordon`, `kubectl drain` and `kubectl wait
//! --for=condition=Ready` do, as the rollout controller needs it:
//!
//! - **cordon** sets `spec.unschedulable` and the [`CORDONED_BY`]
//!   annotation naming the rollout, in one patch guarded by the Node's
//!   resourceVersion. A Node an operator cordoned already is left as it is
//!   and not taken over: lksadmin lifts only cordons it made.
//! - **evict** every pod bound to the node through the Eviction API, which
//!   honours PodDisruptionBudgets: a refusal (HTTP 429) is retried with
//!   backoff, one request per pod per round. DaemonSet pods and mirror
//!   (static) pods are left, as `kubectl drain --ignore-daemonsets` does;
//!   pods with `hostPath` volumes (data on the node's own disk) are
//!   evicted only with `delete_local_data`; `emptyDir` is evicted (it is
//!   scratch space the pod's next home recreates). An evicted pod is
//!   waited for until it is gone.
//! - the drain is **bounded**: at its deadline it stops and says which
//!   pods remain and which budgets refused them ([`DrainOutcome::Blocked`]);
//!   it is never stuck.
//! - **uncordon** only a cordon this rollout made (the annotation says so).
//! - **ready**: the Node's `Ready` condition is `True` and, when the bundle
//!   names the kubelet version it installs, `status.nodeInfo.kubeletVersion`
//!   equals it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use crate::nodes::{CORDONED_BY, NodeKubeState, Readiness};

/// First wait between eviction rounds; doubled up to [`MAX_ROUND_WAIT`].
const FIRST_ROUND_WAIT: Duration = Duration::from_millis(500);
const MAX_ROUND_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("node {node}: {what}: {source}")]
    Api {
        node: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("node {0} has no Node object in the tenant cluster")]
    NoNode(String),
}

fn api_err<'a>(node: &'a str, what: &'static str) -> impl FnOnce(kube::Error) -> DrainError + 'a {
    move |source| DrainError::Api {
        node: node.to_string(),
        what,
        source,
    }
}

/// What `cordon` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cordon {
    /// Cordoned by this rollout (now, or before a restart).
    Ours,
    /// Someone else's cordon (an operator's, another rollout's): left as it
    /// is, and never lifted by this rollout.
    Theirs,
}

/// The Node named `node`, if the tenant cluster has one.
async fn get_node(client: &kube::Client, node: &str) -> Result<Option<Node>, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get_opt(node).await.map_err(api_err(node, "read the Node"))
}

/// Cordons `node` for `owner` (a rollout ID).
pub async fn cordon(client: &kube::Client, node: &str, owner: &str) -> Result<Cordon, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = get_node(client, node)
        .await?
        .ok_or_else(|| DrainError::NoNode(node.to_string()))?;
    let state = NodeKubeState::of(&n);
    if state.cordoned_by == owner {
        if !state.unschedulable {
            set_unschedulable(&nodes, &n, node, Some(owner)).await?;
        }
        return Ok(Cordon::Ours);
    }
    if state.unschedulable {
        return Ok(Cordon::Theirs);
    }
    set_unschedulable(&nodes, &n, node, Some(owner)).await?;
    Ok(Cordon::Ours)
}

/// Lifts `owner`'s cordon of `node`; `false` if the cordon is not
/// `owner`'s (or the Node is gone), which is left as it is.
pub async fn uncordon(client: &kube::Client, node: &str, owner: &str) -> Result<bool, DrainError> {
    let Some(n) = get_node(client, node).await? else {
        return Ok(false);
    };
    let nodes: Api<Node> = Api::all(client.clone());
    if NodeKubeState::of(&n).cordoned_by != owner {
        return Ok(false);
    }
    set_unschedulable(&nodes, &n, node, None).await?;
    Ok(true)
}

/// Sets `spec.unschedulable` and the annotation (`Some(owner)`), or clears
/// both (`None`), guarded by the resourceVersion read: a concurrent change
/// makes the patch fail (409) rather than be overwritten.
async fn set_unschedulable(
    nodes: &Api<Node>,
    n: &Node,
    node: &str,
    owner: Option<&str>,
) -> Result<(), DrainError> {
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": { CORDONED_BY: owner },
        },
        "spec": { "unschedulable": owner.is_some() },
    });
    let what = if owner.is_some() { "cordon" } else { "uncordon" };
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err(node, what))?;
    Ok(())
}

/// What a drain does with one of the node's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodPlan {
    /// Evict it.
    Evict,
    /// Left on the node: a DaemonSet's pod or a mirror (static) pod.
    Leave(&'static str),
    /// Not evicted without `delete_local_data`: it keeps data on the node.
    LocalData,
    /// Finished or already being deleted: only waited for.
    Gone,
}

/// What a drain does with `pod`.
pub fn plan(pod: &Pod, delete_local_data: bool) -> PodPlan {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
    {
        return PodPlan::Leave("mirror pod");
    }
    if meta.owner_references.as_ref().is_some_and(|o| {
        o.iter()
            .any(|r| r.controller == Some(true) && r.kind == "DaemonSet")
    }) {
        return PodPlan::Leave("DaemonSet pod");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if meta.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded") | Some("Failed")) {
        return PodPlan::Gone;
    }
    let host_path = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.host_path.is_some()));
    if host_path && !delete_local_data {
        return PodPlan::LocalData;
    }
    PodPlan::Evict
}

fn pod_name(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// No pod to evict is left on the node.
    Drained { evicted: usize, left: usize },
    /// The deadline passed: these pods remain, refused by these budgets
    /// (`namespace/name`), or kept for their local data.
    Blocked {
        pods: Vec<String>,
        budgets: Vec<String>,
        local_data: Vec<String>,
    },
    /// Stopped from outside (pause, abort, shutdown, leadership lost).
    Cancelled,
}

impl DrainOutcome {
    /// The one line an operator reads, e.g. "drain-blocked: 2 pods remain
    /// (work/web-1, work/web-2), refused by PodDisruptionBudget work/web".
    pub fn describe(&self, timeout: Duration) -> String {
        match self {
            DrainOutcome::Drained { evicted, left } => {
                format!("drained: {evicted} pods evicted, {left} left (DaemonSet or mirror pods)")
            }
            DrainOutcome::Blocked {
                pods,
                budgets,
                local_data,
            } => {
                let count = match pods.len() {
                    1 => "1 pod remains".to_string(),
                    n => format!("{n} pods remain"),
                };
                let mut m = format!(
                    "drain-blocked after {}: {count} ({})",
                    lks_proto::duration::format_duration(timeout),
                    pods.join(", ")
                );
                if !budgets.is_empty() {
                    m.push_str(&format!(
                        ", refused by PodDisruptionBudget {}",
                        budgets.join(", ")
                    ));
                }
                if !local_data.is_empty() {
                    m.push_str(&format!(
                        "; {} keep local data (hostPath): --drain-delete-local-data evicts them",
                        local_data.join(", ")
                    ));
                }
                m
            }
            DrainOutcome::Cancelled => "drain stopped".into(),
        }
    }
}

/// Evicts every pod bound to `node` that [`plan`] says to, until none is
/// left, `timeout` passes, or `cancel` fires. One list of the node's pods
/// and at most one eviction per remaining pod each round, one after
/// another; rounds wait 0.5 s, doubling to 5 s while nothing changes (no
/// pod evicted, none gone).
///
/// Not side by side: every eviction under one budget writes that budget's
/// status; concurrent ones conflict and the API server retries them 500 ms
/// later (`EvictionsRetry`), so ten at once took longer than ten in turn,
/// and one ran out of tries (504) (BENCHMARKS.md, "Drain around a node's
/// turn").
pub async fn drain(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
    delete_local_data: bool,
    cancel: &CancellationToken,
) -> Result<DrainOutcome, DrainError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let start = Instant::now();
    let mut wait = FIRST_ROUND_WAIT;
    let mut evicted: BTreeSet<String> = BTreeSet::new();
    let mut before = usize::MAX;
    loop {
        let list = pods
            .list(&on_node)
            .await
            .map_err(api_err(node, "list its pods"))?;
        let mut remaining = Vec::new();
        let mut refused = Vec::new();
        let mut local_data = Vec::new();
        let mut left = 0;
        let mut progress = false;
        for p in &list.items {
            let name = pod_name(p);
            match plan(p, delete_local_data) {
                PodPlan::Leave(_) => left += 1,
                PodPlan::Gone => remaining.push(name),
                PodPlan::LocalData => {
                    local_data.push(name.clone());
                    remaining.push(name);
                }
                PodPlan::Evict => {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                    let pod = p.metadata.name.clone().unwrap_or_default();
                    match api.evict(&pod, &EvictParams::default()).await {
                        Ok(_) => {
                            progress |= evicted.insert(name.clone());
                        }
                        Err(kube::Error::Api(s)) if s.code == 429 => refused.push(p.clone()),
                        Err(kube::Error::Api(s)) if s.code == 404 => continue,
                        Err(e) => return Err(api_err(node, "evict a pod")(e)),
                    }
                    remaining.push(name);
                }
            }
        }
        // Pods going (their kubelets confirming evictions) is progress too:
        // the next round comes as soon, rather than backing off meanwhile.
        progress |= remaining.len() < before;
        before = remaining.len();
        if remaining.is_empty() {
            return Ok(DrainOutcome::Drained {
                evicted: evicted.len(),
                left,
            });
        }
        if start.elapsed() >= timeout {
            let budgets = refusing_budgets(client, &refused).await;
            return Ok(DrainOutcome::Blocked {
                pods: remaining,
                budgets,
                local_data,
            });
        }
        wait = if progress {
            FIRST_ROUND_WAIT
        } else {
            (wait * 2).min(MAX_ROUND_WAIT)
        };
        let left_time = timeout.saturating_sub(start.elapsed());
        tokio::select! {
            _ = cancel.cancelled() => return Ok(DrainOutcome::Cancelled),
            _ = tokio::time::sleep(wait.min(left_time)) => {}
        }
    }
}

/// The budgets (`namespace/name`) whose selectors match pods an eviction
/// was refused for; empty if they cannot be listed.
async fn refusing_budgets(client: &kube::Client, refused: &[Pod]) -> Vec<String> {
    let mut out = BTreeSet::new();
    let namespaces: BTreeSet<&str> = refused
        .iter()
        .filter_map(|p| p.metadata.namespace.as_deref())
        .collect();
    for ns in namespaces {
        let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for pdb in &list.items {
            let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
            let matches = refused.iter().any(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && selector.is_some_and(|s| selects(s, p.metadata.labels.as_ref()))
            });
            if matches {
                out.insert(format!(
                    "{ns}/{}",
                    pdb.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    out.into_iter().collect()
}

/// Whether a label selector selects a pod with `labels`; an empty
/// selector selects every pod (policy/v1).
pub fn selects(s: &LabelSelector, labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    let by_label = s
        .match_labels
        .as_ref()
        .is_none_or(|m| m.iter().all(|(k, v)| get(k) == Some(v)));
    let by_expr = s.match_expressions.as_ref().is_none_or(|es| {
        es.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => get(&e.key).is_some(),
                "DoesNotExist" => get(&e.key).is_none(),
                _ => false,
            }
        })
    });
    by_label && by_expr
}

/// The Ready gate's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadyCheck {
    Ready,
    /// Not yet, and why (for the timeout's message).
    NotYet(String),
}

/// Whether `node` is `Ready` (and runs `kubelet_version`, when given).
pub async fn ready(
    client: &kube::Client,
    node: &str,
    kubelet_version: Option<&str>,
) -> Result<ReadyCheck, DrainError> {
    let Some(n) = get_node(client, node).await? else {
        return Ok(ReadyCheck::NotYet("no Node object in the tenant cluster".into()));
    };
    Ok(readiness(&NodeKubeState::of(&n), kubelet_version))
}

/// The Ready gate on a Node's state.
pub fn readiness(s: &NodeKubeState, kubelet_version: Option<&str>) -> ReadyCheck {
    if s.ready != Readiness::Ready {
        return ReadyCheck::NotYet(format!("the Node is {}", s.ready.as_str()));
    }
    match kubelet_version {
        Some(want) if s.kubelet_version != want => ReadyCheck::NotYet(format!(
            "the kubelet reports {}, not {want}",
            if s.kubelet_version.is_empty() {
                "no version"
            } else {
                &s.kubelet_version
            }
        )),
        _ => ReadyCheck::Ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn daemonset_and_mirror_pods_stay_hostpath_needs_the_flag_emptydir_goes() {
        let ds = pod(serde_json::json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}}));
        assert_eq!(plan(&ds, true), PodPlan::Leave("DaemonSet pod"));
        let mirror = pod(serde_json::json!({"metadata": {"name": "p",
            "annotations": {"kubernetes.io/config.mirror": "x"}}}));
        assert_eq!(plan(&mirror, true), PodPlan::Leave("mirror pod"));
        let rs = pod(serde_json::json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": true}]},
            "spec": {"containers": [], "volumes": [{"name": "s", "emptyDir": {}}]}}));
        assert_eq!(plan(&rs, false), PodPlan::Evict);
        let host = pod(serde_json::json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "volumes": [{"name": "h", "hostPath": {"path": "/data"}}]}}));
        assert_eq!(plan(&host, false), PodPlan::LocalData);
        assert_eq!(plan(&host, true), PodPlan::Evict);
        let done = pod(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}));
        assert_eq!(plan(&done, false), PodPlan::Gone);
        let leaving =
            pod(serde_json::json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert_eq!(plan(&leaving, false), PodPlan::Gone);
    }

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let labels: std::collections::BTreeMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".into(), "a".into()),
        ]
        .into();
        let s = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(&s(serde_json::json!({})), Some(&labels)));
        assert!(selects(
            &s(serde_json::json!({"matchLabels": {"app": "web"}})),
            Some(&labels)
        ));
        assert!(!selects(
            &s(serde_json::json!({"matchLabels": {"app": "db"}})),
            Some(&labels)
        ));
        assert!(!selects(
            &s(serde_json::json!({"matchLabels": {"app": "web"}})),
            None
        ));
        let expr = |op: &str, values: &[&str]| {
            s(serde_json::json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]}))
        };
        assert!(selects(&expr("In", &["a", "b"]), Some(&labels)));
        assert!(!selects(&expr("NotIn", &["a"]), Some(&labels)));
        assert!(selects(&expr("Exists", &[]), Some(&labels)));
        assert!(!selects(&expr("DoesNotExist", &[]), Some(&labels)));
        assert!(!selects(&expr("Bogus", &[]), Some(&labels)));
    }

    #[test]
    fn the_ready_gate_wants_ready_and_the_declared_kubelet() {
        let mut s = NodeKubeState {
            ready: Readiness::Ready,
            unschedulable: true,
            kubelet_version: "v1.37.1".into(),
            ready_since_ms: 0,
            cordoned_by: String::new(),
        };
        assert_eq!(readiness(&s, None), ReadyCheck::Ready);
        assert_eq!(
            readiness(&s, Some("v1.37.2")),
            ReadyCheck::NotYet("the kubelet reports v1.37.1, not v1.37.2".into())
        );
        s.kubelet_version = "v1.37.2".into();
        assert_eq!(readiness(&s, Some("v1.37.2")), ReadyCheck::Ready);
        s.ready = Readiness::NotReady;
        assert_eq!(
            readiness(&s, None),
            ReadyCheck::NotYet("the Node is NotReady".into())
        );
    }

    #[test]
    fn a_blocked_drain_names_the_pods_and_the_budget() {
        let o = DrainOutcome::Blocked {
            pods: vec!["work/web-1".into()],
            budgets: vec!["work/web".into()],
            local_data: vec![],
        };
        assert_eq!(
            o.describe(Duration::from_secs(600)),
            "drain-blocked after 10m: 1 pod remains (work/web-1), refused by PodDisruptionBudget work/web"
        );
    }
}
