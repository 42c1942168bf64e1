//! The rollout controller's work in the tenant clusters: one task per
//! node step that needs the tenant API — a drain, a Ready gate — whose
//! answer the controller reads as a [`KubeFact`] (the rollout decisions'
//! input, `lks-rollout`'s) when it steps the
//! rollout; lifting a cordon once a turn is over; and the repair that lifts
//! any cordon lksadmin made that no active rollout owns any more (a leader
//! killed mid-drain, an abort while the tenant API was down).
//!
//! Tasks are keyed by [`Attempt`]: rollout, node, step and when the step
//! began, so an answer is never taken for a later attempt (a drain stopped
//! by a pause and begun again on resume is a new attempt). Only the leader
//! runs them: on losing the lead every task stops and no cordon is lifted,
//! so the next leader resumes each drain where the store says it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::drain::{self, Cordon, DrainOutcome, ReadyCheck};
use crate::tenant::TenantApis;
use lks_proto::sync::lock;
use lks_rollout::KubeFact;
use lks_store::clock::now_ms;
use lks_store::{DrainPolicy, EventRow, EventStore, KubeStep, RolloutStore};

/// How often a Ready gate asks the tenant API.
const READY_POLL: Duration = Duration::from_secs(1);
/// Wait between tries while the tenant API cannot be reached.
const RETRY: Duration = Duration::from_secs(2);

/// One step of one node's turn.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attempt {
    pub rollout: String,
    pub node: String,
    pub step: KubeStep,
    pub since_ms: i64,
}

struct Task {
    cancel: CancellationToken,
    fact: Arc<Mutex<Option<KubeFact>>>,
}

/// The tasks of every draining rollout this replica drives.
pub struct KubeWork {
    tenants: Arc<TenantApis>,
    /// Whose cordon one is (the repair).
    rollouts: Arc<dyn RolloutStore>,
    /// Where a lifted cordon is recorded.
    events: Arc<dyn EventStore>,
    /// Poked when a task has an answer: the controller steps again.
    poke: Arc<Notify>,
    /// Every section under it (and under a task's `fact`) is one map
    /// update (insert, retain, clear) or one slot write, none of which a
    /// panic leaves half done: locked with [`lock`], which keeps the tasks
    /// (an empty map in their place would leave them running, uncancelled).
    tasks: Mutex<HashMap<Attempt, Task>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl KubeWork {
    pub fn new(
        tenants: Arc<TenantApis>,
        rollouts: Arc<dyn RolloutStore>,
        events: Arc<dyn EventStore>,
        poke: Arc<Notify>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        KubeWork {
            tenants,
            rollouts,
            events,
            poke,
            tasks: Mutex::default(),
            tracker,
            cancel,
        }
    }

    /// The answers for `rollout`'s steps in `wanted` (by node), starting a
    /// task for each step that has none and stopping this rollout's tasks
    /// for steps no longer wanted.
    pub fn facts(
        &self,
        cluster: &str,
        rollout: &str,
        policy: &DrainPolicy,
        wanted: Vec<Attempt>,
    ) -> HashMap<String, KubeFact> {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|a, t| {
            let keep = a.rollout != rollout || wanted.contains(a);
            if !keep {
                t.cancel.cancel();
            }
            keep
        });
        let mut out = HashMap::new();
        for a in wanted {
            let t = tasks
                .entry(a.clone())
                .or_insert_with(|| self.spawn(cluster, policy, &a));
            if let Some(f) = lock(&t.fact).clone() {
                out.insert(a.node.clone(), f);
            }
        }
        out
    }

    fn spawn(&self, cluster: &str, policy: &DrainPolicy, a: &Attempt) -> Task {
        let cancel = self.cancel.child_token();
        let fact = Arc::new(Mutex::new(None));
        let job = Job {
            tenants: self.tenants.clone(),
            poke: self.poke.clone(),
            cluster: cluster.to_string(),
            attempt: a.clone(),
            policy: policy.clone(),
            cancel: cancel.clone(),
            fact: fact.clone(),
        };
        match a.step {
            KubeStep::Draining => {
                self.tracker.spawn(job.drain());
            }
            KubeStep::Readying => {
                self.tracker.spawn(job.ready());
            }
            KubeStep::Upgrading | KubeStep::None => {}
        }
        Task { cancel, fact }
    }

    /// Stops every task, lifting no cordon: this replica no longer leads,
    /// and the next leader carries each turn on from the store.
    pub fn drop_all(&self) {
        let mut tasks = lock(&self.tasks);
        for t in tasks.values() {
            t.cancel.cancel();
        }
        tasks.clear();
    }

    /// `rollout`'s turn of `node` is over: lifts its cordon (only one it
    /// made), in the background; the repair retries one that fails.
    pub fn release(&self, cluster: &str, rollout: &str, node: &str) {
        let tenants = self.tenants.clone();
        let events = self.events.clone();
        let (cluster, rollout, node) = (cluster.to_string(), rollout.to_string(), node.to_string());
        self.tracker.spawn(async move {
            let client = match tenants.client(&cluster).await {
                Ok(Some((c, _))) => c,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%cluster, %node, %rollout, error = %e, "uncordon: tenant API; the repair retries");
                    return;
                }
            };
            match drain::uncordon(&client, &node, &rollout).await {
                Ok(true) => {
                    tracing::info!(%cluster, %node, %rollout, "uncordoned");
                    record(events.as_ref(), &cluster, &node, &rollout, "uncordoned", "cordon lifted".into()).await;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(%cluster, %node, %rollout, error = %e, "uncordon; the repair retries"),
            }
        });
    }

    /// Lifts every cordon lksadmin made in `cluster` that no active
    /// rollout (nor `also_owned`: node, owner — the reboot lock's) owns now (the rollout ended, or the node's turn is over),
    /// and records each. The tenant's Nodes as `node list` last read them.
    /// Returns the cordons left: owned by an active rollout, and stray ones
    /// it could not lift; `None` if the tenant's Nodes could not be read.
    pub async fn repair(
        &self,
        cluster: &str,
        also_owned: &(dyn Fn(&str, &str) -> bool + Sync),
    ) -> Option<Cordons> {
        let Some(Ok(nodes)) = self.tenants.nodes(cluster).await else {
            return None;
        };
        let mut left = Cordons::default();
        let mut owners: HashMap<String, Option<lks_store::RolloutRow>> = HashMap::new();
        for (node, state) in nodes.iter() {
            let id = &state.cordoned_by;
            if id.is_empty() {
                continue;
            }
            if also_owned(node, id) {
                left.owned += 1;
                continue;
            }
            if !owners.contains_key(id) {
                match self.rollouts.get_rollout(id).await {
                    Ok(r) => owners.insert(id.clone(), r),
                    Err(e) => {
                        tracing::warn!(%cluster, rollout = %id, error = %e, "cordon repair: read the rollout");
                        left.stray += 1;
                        continue;
                    }
                };
            }
            let owned = owners.get(id).and_then(Option::as_ref).is_some_and(|r| {
                r.state.is_active() && r.nodes.iter().any(|n| n.name == *node && n.kube.owns_cordon())
            });
            if owned {
                left.owned += 1;
            } else if !self.lift_stray(cluster, node, id).await {
                left.stray += 1;
            }
        }
        Some(left)
    }

    /// Lifts a cordon of rollout `id` no active rollout owns; false if it
    /// is still there.
    async fn lift_stray(&self, cluster: &str, node: &str, id: &str) -> bool {
        let client = match self.tenants.client(cluster).await {
            Ok(Some((c, _))) => c,
            _ => return false,
        };
        match drain::uncordon(&client, node, id).await {
            Ok(true) => {
                tracing::warn!(%cluster, %node, rollout = %id, "stray cordon lifted");
                let m = format!("stray cordon of rollout {id} lifted: no active rollout owns it");
                record(self.events.as_ref(), cluster, node, id, "cordon_repaired", m).await;
                true
            }
            // Not lksadmin's cordon (any more), or the node is gone.
            Ok(false) => true,
            Err(e) => {
                tracing::warn!(%cluster, %node, rollout = %id, error = %e, "cordon repair");
                false
            }
        }
    }
}

/// Cordons lksadmin holds in a tenant cluster after a repair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cordons {
    /// Owned by an active rollout's turn of the node.
    pub owned: u64,
    /// Owned by no active rollout, and the repair could not lift them.
    pub stray: u64,
}

async fn record(
    store: &(impl EventStore + ?Sized),
    cluster: &str,
    node: &str,
    rollout: &str,
    kind: &str,
    message: String,
) {
    let e = EventRow::tenant(cluster, node, rollout, kind, now_ms(), message);
    if let Err(err) = store.add_event(e).await {
        tracing::warn!(error = %err, "record event");
    }
}

/// One task's inputs.
struct Job {
    tenants: Arc<TenantApis>,
    poke: Arc<Notify>,
    cluster: String,
    attempt: Attempt,
    policy: DrainPolicy,
    cancel: CancellationToken,
    fact: Arc<Mutex<Option<KubeFact>>>,
}

impl Job {
    fn answer(&self, f: KubeFact) {
        let changed = {
            let mut g = lock(&self.fact);
            let changed = g.as_ref() != Some(&f);
            if changed {
                *g = Some(f);
            }
            changed
        };
        if changed {
            self.poke.notify_one();
        }
    }

    /// Waits `d` unless cancelled; false if cancelled.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Time left of the drain's deadline (which counts from when the step
    /// began, across leader changes).
    fn left(&self) -> Duration {
        let deadline = self
            .attempt
            .since_ms
            .saturating_add(i64::try_from(self.policy.timeout_ms).unwrap_or(i64::MAX));
        Duration::from_millis(u64::try_from(deadline.saturating_sub(now_ms())).unwrap_or(0))
    }

    /// Cordons and drains the node; answers Drained or Blocked. Errors of
    /// the tenant API are retried until the deadline.
    async fn drain(self) {
        let a = &self.attempt;
        let timeout = Duration::from_millis(self.policy.timeout_ms);
        let mut last_error = String::new();
        loop {
            if self.cancel.is_cancelled() {
                return;
            }
            if self.left().is_zero() {
                let why = if last_error.is_empty() {
                    format!(
                        "drain-blocked after {}",
                        lks_proto::duration::format_duration(timeout)
                    )
                } else {
                    format!("drain-blocked: {last_error}")
                };
                return self.answer(KubeFact::Blocked(why));
            }
            let client = match self.tenants.client(&self.cluster).await {
                Ok(Some((c, _))) => c,
                Ok(None) => {
                    return self.answer(KubeFact::Blocked(format!(
                        "drain-blocked: cluster {} has no kubeconfig any more",
                        self.cluster
                    )));
                }
                Err(e) => {
                    last_error = e.to_string();
                    if !self.sleep(RETRY).await {
                        return;
                    }
                    continue;
                }
            };
            match drain::cordon(&client, &a.node, &a.rollout).await {
                Ok(Cordon::Ours | Cordon::Theirs) => {}
                Err(drain::DrainError::NoNode(_)) => {
                    return self.answer(KubeFact::Blocked(format!(
                        "drain-blocked: the tenant cluster has no Node {}",
                        a.node
                    )));
                }
                Err(e) => {
                    last_error = e.to_string();
                    if !self.sleep(RETRY).await {
                        return;
                    }
                    continue;
                }
            }
            match drain::drain(
                &client,
                &a.node,
                self.left(),
                self.policy.delete_local_data,
                &self.cancel,
            )
            .await
            {
                Ok(DrainOutcome::Cancelled) => return,
                Ok(o @ DrainOutcome::Drained { .. }) => {
                    return self.answer(KubeFact::Drained(o.describe(timeout)));
                }
                Ok(o @ DrainOutcome::Blocked { .. }) => {
                    return self.answer(KubeFact::Blocked(o.describe(timeout)));
                }
                Err(e) => {
                    last_error = e.to_string();
                    if !self.sleep(RETRY).await {
                        return;
                    }
                }
            }
        }
    }

    /// Asks whether the Node is Ready until it is (or the task is
    /// stopped); the step applies the timeout. A task nobody stops (its
    /// rollout no longer driven) ends a minute after the timeout.
    async fn ready(self) {
        let want = (!self.policy.kubelet_version.is_empty()).then_some(self.policy.kubelet_version.as_str());
        let give_up = self
            .attempt
            .since_ms
            .saturating_add(i64::try_from(self.policy.ready_timeout_ms).unwrap_or(i64::MAX))
            .saturating_add(60_000);
        while now_ms() < give_up {
            let answer = match self.tenants.client(&self.cluster).await {
                Ok(Some((client, _))) => match drain::ready(&client, &self.attempt.node, want).await {
                    Ok(ReadyCheck::Ready) => KubeFact::Ready,
                    Ok(ReadyCheck::NotYet(why)) => KubeFact::NotReady(why),
                    Err(e) => KubeFact::NotReady(format!("tenant API: {e}")),
                },
                Ok(None) => {
                    KubeFact::NotReady(format!("cluster {} has no kubeconfig any more", self.cluster))
                }
                Err(e) => KubeFact::NotReady(e.to_string()),
            };
            let done = answer == KubeFact::Ready;
            self.answer(answer);
            if done || !self.sleep(READY_POLL).await {
                return;
            }
        }
    }
}
