//! The rollout controller: the one task that moves rollouts.
//!
//! Every change to a rollout goes through it — operator verbs arrive as
//! commands, node reports, connections and deletions as pokes, offline
//! deadlines on a tick — so decisions are serialised. Each decision
//! ([`rollout::step`], [`rollout::apply_verb`]) is stored in one store
//! transaction (node desired states, generations, rollout and node states,
//! events) before any agent hears of it; the changed nodes are then told
//! through the hub. All progression state is in the store, so after a
//! restart — even a kill -9 — the controller carries on from the stored
//! rollouts: a node assigned before the crash is not assigned again, and
//! the batch limit counts it until it reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lks_kube::work::{Attempt, KubeWork};
use lks_proto::manifest::Needs;
use lks_proto::sync::lock;
use lks_rollout::ages::StateAges;
use lks_rollout::{self as rollout, Clock, Decision, NodeView, Verb};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::store::{
    KubeStep, NewRollout, NodeState, RolloutCommit, RolloutRow, RolloutState, Store, StoreError,
};
use crate::windows;

/// How often rollouts are re-examined without a trigger (offline deadlines).
const TICK: Duration = Duration::from_secs(1);
/// How often the leader looks for cordons lksadmin made that no active
/// rollout owns (`KubeWork::repair`).
const CORDON_REPAIR: Duration = Duration::from_secs(30);
/// Operator commands queued for the controller.
const QUEUE: usize = 64;
/// Steps taken for one rollout per trigger; one normally reaches a fixed point.
const MAX_STEPS: usize = 3;
/// Rollouts driven side by side in one pass.
const DRIVEN_AT_ONCE: usize = 16;
/// Tries of an operator verb that lost a race with another replica.
const VERB_ATTEMPTS: usize = 5;

type Reply = oneshot::Sender<Result<RolloutRow, CommandError>>;

/// Why the controller did not carry out an operator command.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("the rollout controller is not running (the server is shutting down); retry")]
    Gone,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("rollout {id} does not exist")]
    NoRollout { id: String },
    /// The verb does not apply to the rollout as it stands.
    #[error(transparent)]
    Verb(#[from] rollout::VerbError),
}

enum Command {
    Start { rollout: Box<NewRollout>, reply: Reply },
    Verb { id: String, verb: Verb, reply: Reply },
}

/// How handlers talk to the controller.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Command>,
}

/// The controller's end of the command queue, handed to [`run`].
pub struct Inbox(mpsc::Receiver<Command>);

pub fn channel() -> (Handle, Inbox) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Handle { tx }, Inbox(rx))
}

impl Handle {
    async fn ask(
        &self,
        cmd: Command,
        rx: oneshot::Receiver<Result<RolloutRow, CommandError>>,
    ) -> Result<RolloutRow, CommandError> {
        self.tx.send(cmd).await.map_err(|_| CommandError::Gone)?;
        rx.await.map_err(|_| CommandError::Gone)?
    }

    /// Records a new rollout and starts its first batch; returns it as it
    /// stands after that first decision.
    pub async fn start(&self, rollout: NewRollout) -> Result<RolloutRow, CommandError> {
        let (reply, rx) = oneshot::channel();
        self.ask(
            Command::Start {
                rollout: Box::new(rollout),
                reply,
            },
            rx,
        )
        .await
    }

    /// Applies an operator verb; returns the rollout after it took effect.
    pub async fn verb(&self, id: &str, verb: Verb) -> Result<RolloutRow, CommandError> {
        let (reply, rx) = oneshot::channel();
        self.ask(
            Command::Verb {
                id: id.to_string(),
                verb,
                reply,
            },
            rx,
        )
        .await
    }
}

/// What the controller uses of the server, handed over by
/// [`crate::server`] (not the whole [`crate::context::Shared`], which holds
/// this controller's own [`Handle`]).
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn Store>,
    /// Who is connected (a rollout's views) and whom to tell of a change.
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// True while this replica drives rollouts (always, on SQLite).
    pub leader: watch::Receiver<bool>,
    /// Poked when a node reports, connects or is deleted.
    pub rollouts_changed: Arc<Notify>,
    /// Bumped whenever a rollout changed, for `WatchRollout` streams.
    pub rollout_updates: watch::Sender<u64>,
    /// Drains, Ready gates and cordons in the tenant clusters.
    pub kube: Arc<KubeWork>,
    pub cancel: CancellationToken,
}

struct Controller {
    s: Deps,
    since_ms: i64,
    /// `bundle@version` → the agent features it needs (bundles are
    /// immutable, so this never goes stale). One insert or lookup at a
    /// time, whole after a panic: locked with [`lock`].
    needs: std::sync::Mutex<HashMap<String, Needs>>,
    /// How long rollouts have been in their states (`/metrics`); what a
    /// panic mid-pass could leave is an age the next pass sets again, so
    /// it is locked with [`lock`] too, not left unwritten from then on.
    ages: std::sync::Mutex<StateAges>,
}

/// Runs the controller until shutdown.
pub async fn run(s: Deps, inbox: Inbox) {
    let mut c = Controller {
        s: s.clone(),
        since_ms: now_ms(),
        needs: Default::default(),
        ages: Default::default(),
    };
    let mut leader = s.leader.clone();
    // On SQLite nobody sends: this server always leads.
    let mut leader_fixed = false;
    let mut rx = inbox.0;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut repair = tokio::time::interval(CORDON_REPAIR);
    repair.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            cmd = rx.recv() => match cmd {
                Some(cmd) => c.handle(cmd).await,
                None => return,
            },
            _ = s.rollouts_changed.notified() => c.drive_all().await,
            // The first tick is immediate: rollouts stored before a restart
            // carry on at once.
            _ = tick.tick() => c.drive_all().await,
            _ = repair.tick() => c.repair_cordons().await,
            r = leader.changed(), if !leader_fixed => {
                if r.is_err() {
                    leader_fixed = true;
                    continue;
                }
                if *leader.borrow_and_update() {
                    // Offline deadlines count from when this replica took over.
                    c.since_ms = now_ms();
                    c.drive_all().await;
                } else {
                    // The next leader carries each drain on from the store.
                    s.kube.drop_all();
                }
            }
        }
    }
}

/// Nodes of a rollout that a newer rollout of the same cluster and bundle
/// includes, by the newest such rollout: they are that rollout's business.
type Claims = HashMap<String, String>;

/// For each rollout of `rows` (oldest first), the nodes newer rollouts of
/// its cluster and bundle include. Only a completed rollout catching up
/// deferred or held nodes can have newer ones (an active rollout is the
/// newest of its bundle), so only those get a copy — once per tick.
fn claims(rows: &[RolloutRow]) -> Vec<Claims> {
    let mut out = vec![Claims::new(); rows.len()];
    let mut newer: HashMap<(&str, &str), Claims> = HashMap::new();
    for (i, r) in rows.iter().enumerate().rev() {
        let seen = newer.entry((r.cluster.as_str(), r.bundle.as_str())).or_default();
        if r.state == RolloutState::Completed && !seen.is_empty() {
            out[i] = seen.clone();
        }
        for n in &r.nodes {
            seen.entry(n.name.clone()).or_insert_with(|| r.id.clone());
        }
    }
    out
}

impl Controller {
    /// Now, and the maintenance windows of `cluster`. Windows were checked
    /// when they were set; one that no longer parses (a time zone this
    /// build lacks) closes the cluster rather than open it.
    async fn clock(&self, cluster: &str) -> Result<Clock, StoreError> {
        let specs = self
            .s
            .store
            .get_cluster(cluster)
            .await?
            .map(|c| c.maintenance_windows)
            .unwrap_or_default();
        let (windows, windows_unreadable) = match windows::parse_all(&specs) {
            Ok(w) => (w, false),
            Err(e) => {
                tracing::warn!(cluster, error = %e, "maintenance window no longer valid; no node starts");
                (Vec::new(), true)
            }
        };
        Ok(Clock {
            now_ms: now_ms(),
            since_ms: self.since_ms,
            windows,
            windows_unreadable,
        })
    }

    async fn handle(&self, cmd: Command) {
        match cmd {
            Command::Start { rollout, reply } => {
                let r = self.start(*rollout).await;
                let _ = reply.send(r);
            }
            Command::Verb { id, verb, reply } => {
                let r = self.verb(&id, verb).await;
                let _ = reply.send(r);
            }
        }
    }

    /// Only the elected replica advances rollouts; the others store
    /// operator commands and leave the driving to it (etcd tells it).
    fn leads(&self) -> bool {
        *self.s.leader.borrow()
    }

    async fn start(&self, new: NewRollout) -> Result<RolloutRow, CommandError> {
        let row = self.s.store.start_rollout(new).await?;
        self.s.metrics.rollout_event("rollout_started");
        tracing::info!(
            rollout = %row.id, cluster = %row.cluster, bundle = %row.bundle, version = %row.version,
            nodes = row.nodes.len(), batch_size = row.batch_size, "rollout started"
        );
        self.s.rollout_updates.send_modify(|v| *v += 1);
        let row = if self.leads() {
            self.drive(row, &Claims::new()).await?
        } else {
            row
        };
        self.count_active().await;
        Ok(row)
    }

    async fn verb(&self, id: &str, verb: Verb) -> Result<RolloutRow, CommandError> {
        // Another replica (the leader) may commit between our read and our
        // write; the store refuses the stale decision and we decide again.
        let mut attempt = 0;
        let row = loop {
            attempt += 1;
            let row = self
                .s
                .store
                .get_rollout(id)
                .await?
                .ok_or_else(|| CommandError::NoRollout { id: id.to_string() })?;
            let d = rollout::apply_verb(&row, verb, now_ms())?;
            match self.commit(&row, d).await {
                Ok(row) => break row,
                Err(StoreError::Conflict(_)) if attempt < VERB_ATTEMPTS => continue,
                Err(e) => return Err(e.into()),
            }
        };
        // An operator verb acts on an active rollout, the newest of its
        // bundle in its cluster, or rolls one back (which starts no
        // deferred node): no newer rollout claims its nodes.
        let row = if self.leads() {
            self.drive(row, &Claims::new()).await?
        } else {
            row
        };
        self.count_active().await;
        Ok(row)
    }

    /// The agent features `r`'s bundle needs.
    async fn needs(&self, r: &RolloutRow) -> Result<Needs, StoreError> {
        let id = format!("{}@{}", r.bundle, r.version);
        let cached = lock(&self.needs).get(&id).cloned();
        if let Some(n) = cached {
            return Ok(n);
        }
        let Some(row) = self.s.store.get_bundle(&r.bundle, &r.version).await? else {
            return Ok(Needs::default());
        };
        let needs = Needs::of(row.bundle.manifest());
        lock(&self.needs).insert(id, needs.clone());
        Ok(needs)
    }

    /// The tenant cluster's answers for the steps of `r`'s nodes that
    /// need it (their tasks started, or stopped when no longer wanted).
    fn kube_facts(&self, r: &RolloutRow) -> HashMap<String, rollout::KubeFact> {
        let Some(policy) = &r.policy.drain else {
            return HashMap::new();
        };
        let wanted = r
            .nodes
            .iter()
            .filter(|n| {
                n.state == NodeState::Applying && matches!(n.kube, KubeStep::Draining | KubeStep::Readying)
            })
            .map(|n| Attempt {
                rollout: r.id.clone(),
                node: n.name.clone(),
                step: n.kube,
                since_ms: n.kube_since_ms,
            })
            .collect();
        self.s.kube.facts(&r.cluster, &r.id, policy, wanted)
    }

    async fn views(&self, r: &RolloutRow, claims: &Claims) -> Result<BTreeMap<String, NodeView>, StoreError> {
        let stored = self.s.store.rollout_views(&r.id).await?;
        let needs = self.needs(r).await?;
        let mut kube = self.kube_facts(r);
        Ok(stored
            .into_iter()
            .map(|(name, v)| {
                // A node that never connected is not judged: it announces
                // its features when it does, before its turn comes again.
                let facts = if needs.is_empty() {
                    None
                } else {
                    crate::store::facts_needed(&v.facts_json)
                };
                let unsupported = facts.and_then(|(features, arch)| needs.node_refusal(&features, arch));
                let view = NodeView {
                    unsupported,
                    desired: v.desired,
                    actual: v.actual,
                    connected: v.connected || self.s.hub.is_connected(&name),
                    last_seen_ms: v.last_seen_ms.max(self.s.hub.last_heard(&name).unwrap_or(0)),
                    held: v.held,
                    claimed_by: claims.get(&name).cloned(),
                    kube: kube.remove(&name),
                };
                (name, view)
            })
            .collect())
    }

    /// Stores one decision, then tells the nodes whose desired state changed.
    async fn commit(&self, before: &RolloutRow, d: Decision) -> Result<RolloutRow, StoreError> {
        let events = d.events(d.rollout.updated_at_ms);
        let kinds: Vec<String> = events.iter().map(|e| e.kind.clone()).collect();
        let (row, changed) = self
            .s
            .store
            .commit_rollout(RolloutCommit {
                rollout: d.rollout,
                assign: d.assign,
                target: d.target,
                events,
            })
            .await?;
        for n in &changed {
            self.s.hub.notify(n);
        }
        // A turn that owned its node's cordon and no longer does: lift it.
        for n in &row.nodes {
            let owned = before
                .nodes
                .iter()
                .any(|b| b.name == n.name && b.kube.owns_cordon());
            if owned && !n.kube.owns_cordon() {
                self.s.kube.release(&row.cluster, &row.id, &n.name);
            }
        }
        for k in &kinds {
            self.s.metrics.rollout_event(k);
        }
        lock(&self.ages).saw(&row, now_ms());
        if row.state != before.state {
            tracing::info!(rollout = %row.id, state = row.state.as_str(), message = %row.message, "rollout state changed");
        }
        if !changed.is_empty() {
            tracing::info!(rollout = %row.id, nodes = ?changed, "desired state changed");
        }
        self.s.rollout_updates.send_modify(|v| *v += 1);
        Ok(row)
    }

    /// Steps `r` until nothing changes.
    async fn drive(&self, mut r: RolloutRow, claims: &Claims) -> Result<RolloutRow, StoreError> {
        // The cluster's windows, read once per drive; the time, per step.
        let base = self.clock(&r.cluster).await?;
        for _ in 0..MAX_STEPS {
            let views = self.views(&r, claims).await?;
            let clock = Clock {
                now_ms: now_ms(),
                ..base.clone()
            };
            match rollout::step(&r, &views, clock) {
                None => break,
                Some(d) => r = self.commit(&r, d).await?,
            }
        }
        Ok(r)
    }

    async fn drive_all(&self) {
        if !self.leads() {
            self.publish_ages(None);
            return;
        }
        let rows = match self.s.store.rollouts_to_drive().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "list rollouts to drive");
                return;
            }
        };
        let claims = claims(&rows);
        // Rollouts are independent decisions (each commit is checked
        // against what it read, a node in two rollouts included), so they
        // are driven side by side: a region's many clusters each rolling
        // out do not wait for each other's store round trips.
        // Each rollout as it stands after its drive (as read if that failed).
        let driven: Vec<RolloutRow> = futures::stream::iter(rows.into_iter().zip(claims))
            .map(|(r, claims)| async move {
                let read = r.clone();
                match self.drive(r, &claims).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(rollout = %read.id, error = %e, "drive rollout");
                        read
                    }
                }
            })
            .buffer_unordered(DRIVEN_AT_ONCE)
            .collect()
            .await;
        self.s
            .metrics
            .set_active_rollouts(driven.iter().filter(|r| r.state.is_active()).count());
        self.publish_ages(Some(&driven));
    }

    /// Hands `/metrics` the rollouts worth watching after a pass over
    /// `driven`; `None`: this replica does not drive rollouts, so none.
    fn publish_ages(&self, driven: Option<&[RolloutRow]>) {
        let mut a = lock(&self.ages);
        match driven {
            Some(rows) => a.pass(rows, now_ms()),
            None => a.clear(),
        }
        self.s.metrics.set_rollouts(a.snapshot());
    }

    /// Lifts cordons lksadmin made that no active rollout owns, in every
    /// cluster with a kubeconfig (leader only).
    /// The cordons left are counted for `/metrics`, over the clusters whose
    /// Nodes could be read.
    async fn repair_cordons(&self) {
        if !self.leads() {
            self.s.metrics.set_cordoned(0, 0);
            return;
        }
        let clusters = match self.s.store.list_clusters().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cordon repair: list clusters");
                return;
            }
        };
        let (mut owned, mut stray) = (0, 0);
        for c in clusters.iter().filter(|c| c.kube.kubeconfig) {
            // The reboot lock's cordons are the lock's business.
            let rebooting = match crate::reboots::cordons(&*self.s.store, &c.name).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(cluster = %c.name, error = %e, "cordon repair: read the reboot lock");
                    continue;
                }
            };
            let owner = lks_rollout::reboot::owner(&c.name);
            let reboot_owned = |node: &str, id: &str| id == owner && rebooting.iter().any(|n| n == node);
            if let Some(left) = self.s.kube.repair(&c.name, &reboot_owned).await {
                owned += left.owned;
                stray += left.stray;
            }
        }
        self.s.metrics.set_cordoned(owned, stray);
    }

    async fn count_active(&self) {
        match self.s.store.list_rollouts(None, true).await {
            Ok(r) => self.s.metrics.set_active_rollouts(r.len()),
            Err(e) => tracing::warn!(error = %e, "count active rollouts"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RolloutNodeRow;

    fn row(id: &str, bundle: &str, state: RolloutState, nodes: &[&str]) -> RolloutRow {
        RolloutRow {
            id: id.into(),
            cluster: "c".into(),
            bundle: bundle.into(),
            version: "1".into(),
            selector: Default::default(),
            batch_size: 1,
            failure_threshold: 1,
            offline_deadline_ms: 1,
            state,
            nodes: nodes.iter().map(|n| RolloutNodeRow::waiting(n, "")).collect(),
            created_at_ms: 0,
            updated_at_ms: 0,
            message: String::new(),
            revision: 0,
            previous_target: None,
            policy: Default::default(),
            pacing: Default::default(),
        }
    }

    #[test]
    fn a_completed_rollout_sees_the_nodes_newer_rollouts_of_its_bundle_took() {
        let rows = [
            row("old", "k", RolloutState::Completed, &["a", "b"]),
            row("other", "z", RolloutState::Completed, &["a"]),
            row("mid", "k", RolloutState::Completed, &["b"]),
            row("new", "k", RolloutState::Running, &["a"]),
        ];
        let c = claims(&rows);
        assert_eq!(c[0].get("a").map(String::as_str), Some("new"));
        assert_eq!(c[0].get("b").map(String::as_str), Some("mid"));
        assert!(c[1].is_empty(), "another bundle claims nothing");
        assert_eq!(c[2].get("a").map(String::as_str), Some("new"));
        assert!(!c[2].contains_key("b"), "a rollout does not claim its own nodes");
        assert!(c[3].is_empty(), "the newest rollout has no claims");
    }
}
