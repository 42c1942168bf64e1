//! The reboot controller (issue [reboots]): on the leader only, as the
//! rollout controller, it steps every cluster's reboot lock
//! ([`lks_rollout::reboot::step`]) — the nodes as the store and the hub see
//! them, the tenant cluster's answers for each slot's drain and Ready gate
//! (the rollouts' [`KubeWork`], its cordons owned by `reboot:<cluster>`) —
//! and stores each decision only if the lock is still the revision it
//! read; then it sends the reboot requests (each recorded in the lock, so
//! a leader killed in between adopts the request rather than send another)
//! and lifts the cordons of released slots. Everything it knows is in the
//! store: a new leader carries on from the locks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lks_kube::work::{Attempt, KubeWork};
use lks_proto::manifest::FEATURE_REBOOT;
use lks_rollout::KubeFact;
use lks_rollout::gates::WaitKind;
use lks_rollout::reboot::{self, RebootClock, RebootDecision, RebootView};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::rebootgates::Gates;
use crate::store::{
    ClusterRow, DrainPolicy, DrainTimeout, KubeStep, LockAt, NodeRow, RebootMode, RebootPolicy, RebootStore,
    SlotPhase, Store, StoreError, facts_needed,
};

/// How often the locks are stepped without a trigger (timeouts, windows).
const TICK: Duration = Duration::from_secs(2);
/// Who a reboot request the lock sends is recorded as asked by.
const REQUESTER: &str = "the reboot lock";
/// Tries of a lock write that lost a race (another replica's verb).
const ATTEMPTS: usize = 5;

pub struct Deps {
    pub store: Arc<dyn Store>,
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// True while this replica leads (always, on SQLite).
    pub leader: watch::Receiver<bool>,
    /// Poked when a node reports or connects, or a drain answers.
    pub poke: Arc<Notify>,
    pub kube: Arc<KubeWork>,
    /// The reboot gates' answers.
    pub gates: Arc<Gates>,
    pub cancel: CancellationToken,
}

/// What the controller counts for `/metrics`.
#[derive(Default)]
pub struct Gauges {
    /// Slots held, every cluster (lost ones kept included).
    pub held: AtomicI64,
    /// Holders lost whose slot is kept.
    pub lost: AtomicI64,
}

/// One node as the lock sees it (`connected`: its stream is open here or
/// on another replica).
pub fn view_of(n: &NodeRow, connected: bool) -> RebootView {
    let feature = facts_needed(&n.facts_json)
        .map(|(f, _)| f.iter().any(|f| f == FEATURE_REBOOT))
        .unwrap_or(false);
    let r = n.reboot.as_ref();
    RebootView {
        connected,
        held: n.hold.is_some(),
        feature,
        boot_id: r.map(|r| r.boot_id.clone()).unwrap_or_default(),
        state: r.map(|r| r.state),
        reason: r.map(|r| r.reason.clone()).unwrap_or_default(),
        taken: r.map_or(0, |r| r.request),
        pending: n.reboot_request,
        labels: n.labels.clone(),
        kube: None,
        blocking_pods: None,
    }
}

/// The cluster as the step sees it at `now_ms`: its windows (one that no
/// longer parses closes it) and whether it has a tenant API.
pub fn clock_of(c: &ClusterRow, now_ms: i64) -> RebootClock {
    let (open, next) = match lks_proto::windows::parse_all(&c.maintenance_windows) {
        Ok(w) => (
            lks_proto::windows::is_open(&w, now_ms),
            lks_proto::windows::next_open(&w, now_ms).unwrap_or(0),
        ),
        Err(_) => (false, 0),
    };
    RebootClock {
        now_ms,
        window_open: open,
        next_window_ms: if open { 0 } else { next },
        tenant_api: c.kube.kubeconfig,
        alerts: None,
    }
}

/// The drain and Ready gate of a reboot slot: the rollouts' defaults, the
/// Ready gate bounded by the reboot timeout.
fn drain_policy(p: &RebootPolicy) -> DrainPolicy {
    DrainPolicy {
        timeout_ms: DrainPolicy::DEFAULT_TIMEOUT_MS.min(p.timeout_ms),
        ready_timeout_ms: p.timeout_ms,
        delete_local_data: false,
        on_timeout: DrainTimeout::Fail,
        kubelet_version: String::new(),
    }
}

/// Runs the controller until shutdown.
pub async fn run(d: Deps, gauges: Arc<Gauges>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = d.cancel.cancelled() => return,
            _ = tick.tick() => {}
            _ = d.poke.notified() => {}
        }
        if !*d.leader.borrow() {
            gauges.held.store(0, Ordering::Relaxed);
            gauges.lost.store(0, Ordering::Relaxed);
            d.metrics.set_reboot_waits(BTreeMap::new());
            continue;
        }
        if let Err(e) = pass(&d, &gauges).await {
            tracing::warn!(error = %e, "reboot lock pass");
        }
    }
}

/// Steps the lock of every cluster that reboots or still has holders.
async fn pass(d: &Deps, gauges: &Gauges) -> Result<(), StoreError> {
    let locks: HashMap<String, LockAt> = d.store.reboot_locks().await?.into_iter().collect();
    let (mut held, mut lost) = (0, 0);
    let mut waits = BTreeMap::new();
    for c in d.store.list_clusters().await? {
        let at = locks.get(&c.name).cloned().unwrap_or_default();
        let busy = !at.lock.slots.is_empty() || at.lock.run.as_ref().is_some_and(|r| r.state.is_active());
        if c.reboots.mode == RebootMode::Off && !busy {
            continue;
        }
        match drive(d, &c, at).await {
            Ok((after, waiting)) => {
                held += after.lock.slots.len() as i64;
                lost += after.lock.slots.iter().filter(|s| s.phase.is_lost()).count() as i64;
                waits.insert(c.name.clone(), waiting);
            }
            Err(e) => tracing::warn!(cluster = %c.name, error = %e, "reboot lock"),
        }
    }
    gauges.held.store(held, Ordering::Relaxed);
    gauges.lost.store(lost, Ordering::Relaxed);
    d.metrics.set_reboot_waits(waits);
    Ok(())
}

/// The cluster's nodes as the lock sees them, with the tenant cluster's
/// answers for the slots that drain or wait for Ready.
async fn views(d: &Deps, c: &ClusterRow, at: &LockAt) -> Result<BTreeMap<String, RebootView>, StoreError> {
    let owner = reboot::owner(&c.name);
    let wanted: Vec<Attempt> = at
        .lock
        .slots
        .iter()
        .filter_map(|s| {
            let step = match s.phase {
                SlotPhase::Draining if s.drained => KubeStep::Draining,
                SlotPhase::Readying if s.drained => KubeStep::Readying,
                _ => return None,
            };
            Some(Attempt {
                rollout: owner.clone(),
                node: s.node.clone(),
                step,
                since_ms: s.since_ms,
            })
        })
        .collect();
    let mut facts: HashMap<String, KubeFact> = if c.kube.kubeconfig || !wanted.is_empty() {
        d.kube.facts(&c.name, &owner, &drain_policy(&c.reboots), wanted)
    } else {
        HashMap::new()
    };
    Ok(d.store
        .list_nodes(Some(&c.name))
        .await?
        .into_iter()
        .map(|n| {
            let mut v = view_of(&n, n.connected || d.hub.is_connected(&n.name));
            v.kube = facts.remove(&n.name);
            (n.name, v)
        })
        .collect())
}

/// Steps `c`'s lock once, stores the decision and carries it out; the lock
/// as it stands after, and how many nodes wait for a slot by why (after
/// the decision, on the answers it was made on).
async fn drive(
    d: &Deps,
    c: &ClusterRow,
    at: LockAt,
) -> Result<(LockAt, BTreeMap<WaitKind, u64>), StoreError> {
    let mut views = views(d, c, &at).await?;
    let mut clock = clock_of(c, now_ms());
    d.gates.fill(c, &at.lock, &mut views, &mut clock).await;
    let Some(decision) = reboot::step(&c.reboots, &at.lock, &views, &clock) else {
        let waiting = reboot::waiting(&c.reboots, &at.lock, &views, &clock);
        return Ok((at, waiting));
    };
    let waiting = reboot::waiting(&c.reboots, &decision.lock, &views, &clock);
    step_taken(d, c, at, decision, clock.now_ms)
        .await
        .map(|at| (at, waiting))
}

/// Stores `decision` on `at`'s revision and carries it out.
async fn step_taken(
    d: &Deps,
    c: &ClusterRow,
    at: LockAt,
    decision: RebootDecision,
    now: i64,
) -> Result<LockAt, StoreError> {
    let events = decision.events(&c.name, now);
    let Some(revision) = d
        .store
        .put_reboot_lock(&c.name, &decision.lock, at.revision, events)
        .await?
    else {
        // Another replica's verb came first: the next pass decides again.
        return Ok(at);
    };
    for (node, kind, message) in &decision.notes {
        tracing::info!(cluster = %c.name, node = %node, kind, message = %message, "reboot lock");
    }
    if decision.lost > 0 {
        d.metrics.reboots_lost(&c.name, u64::from(decision.lost));
    }
    let owner = reboot::owner(&c.name);
    for n in &decision.uncordon {
        d.kube.release(&c.name, &owner, n);
    }
    let at = LockAt {
        lock: decision.lock.clone(),
        revision,
    };
    send_requests(d, c, at, &decision).await
}

/// Sends the reboot requests the decision names and records each in its
/// slot (a lock write of its own, retried on a race).
async fn send_requests(
    d: &Deps,
    c: &ClusterRow,
    mut at: LockAt,
    dec: &RebootDecision,
) -> Result<LockAt, StoreError> {
    for node in &dec.request {
        let Some(id) = d.store.request_reboot(node, REQUESTER, now_ms()).await? else {
            continue;
        };
        d.hub.notify(node);
        tracing::info!(cluster = %c.name, node = %node, request = id, "reboot requested by the lock");
        for _ in 0..ATTEMPTS {
            let mut lock = at.lock.clone();
            let Some(slot) = lock.slots.iter_mut().find(|s| s.node == *node) else {
                break;
            };
            slot.request = id;
            match d
                .store
                .put_reboot_lock(&c.name, &lock, at.revision, Vec::new())
                .await?
            {
                Some(revision) => {
                    at = LockAt { lock, revision };
                    break;
                }
                None => at = d.store.reboot_lock(&c.name).await?,
            }
        }
    }
    Ok(at)
}

/// The nodes whose cordon the lock of `cluster` owns now: what the cordon
/// repair must leave.
pub async fn cordons(store: &(impl RebootStore + ?Sized), cluster: &str) -> Result<Vec<String>, StoreError> {
    Ok(store
        .reboot_lock(cluster)
        .await?
        .lock
        .slots
        .into_iter()
        .filter(|s| s.drained)
        .map(|s| s.node)
        .collect())
}
