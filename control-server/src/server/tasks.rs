//! The server's background tasks, spawned once at start and stopped with
//! the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Config, ServerError};
use crate::context::Shared;
use crate::controller;
use crate::metrics;
use crate::replicas;
use crate::store::EtcdStore;
use lks_blobs::BlobChoice;

/// How often the leader drops audit records past their retention.
const AUDIT_SWEEP: Duration = Duration::from_secs(3600);

/// How often buffered heartbeats are written to the store.
const HEARTBEAT_FLUSH: Duration = Duration::from_secs(5);

/// The ends of the shared state's channels that the background tasks
/// feed: leadership and the replicas (etcd's lease and watch), and the
/// rollout controller's command queue.
pub(super) struct Feeds {
    pub(super) leader_tx: watch::Sender<bool>,
    pub(super) servers_tx: watch::Sender<Vec<String>>,
    pub(super) rollout_inbox: controller::Inbox,
}

/// `--metrics-listen`: `/metrics` and `/healthz` served, and the store and
/// blob store probed for them.
pub(super) async fn serve_metrics(shared: &Arc<Shared>, addr: SocketAddr) -> Result<(), ServerError> {
    let l = metrics::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    tracing::info!(addr = %l.local_addr().unwrap_or(addr), "serving /metrics and /healthz");
    let cancel = shared.cancel.clone();
    shared
        .tasks
        .spawn(metrics::serve(l, shared.metrics.clone(), cancel.clone()));
    shared.tasks.spawn(metrics::probe::run(
        shared.store.clone(),
        shared.blobs.clone(),
        shared.metrics.clone(),
        cancel,
    ));
    Ok(())
}

/// Binds the FleetLock listener (a bad address fails start-up) and serves it.
pub(super) async fn serve_fleetlock(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    tls: bool,
) -> Result<(), ServerError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let tls = if tls {
        let pki = &shared.pki;
        let c = crate::fleetlock::tls_config(&pki.server_chain_pem, &pki.server_key_pem, pki.ca_pem())
            .map_err(ServerError::Tls)?;
        Some(c)
    } else {
        None
    };
    let what = if tls.is_some() {
        "TLS, the server's certificate"
    } else {
        "plain HTTP"
    };
    tracing::info!(addr = %l.local_addr().unwrap_or(addr), "serving FleetLock ({what}) at /c/CLUSTER/");
    shared.tasks.spawn(crate::fleetlock::serve(
        l,
        shared.store.clone(),
        shared.metrics.clone(),
        shared.reboot_gates.clone(),
        tls,
        shared.cancel.clone(),
        crate::fleetlock::MAX_CONNECTIONS,
    ));
    Ok(())
}

/// The server's background tasks: heartbeats, peers, releases,
/// blob GC, audit retention, deltas, the rollout controller, and with etcd
/// the lease, the watch and the rebalance.
pub(super) fn spawn_tasks(shared: &Arc<Shared>, cfg: &Config, etcd: Option<&EtcdStore>, feeds: Feeds) {
    let Feeds {
        leader_tx,
        servers_tx,
        rollout_inbox,
    } = feeds;
    let cancel = shared.cancel.clone();
    shared.tasks.spawn(flush_heartbeats(shared.clone()));
    shared.tasks.spawn(crate::peers::run(
        shared.peers.clone(),
        shared.store.clone(),
        shared.hub.clone(),
        cancel.clone(),
    ));
    shared.tasks.spawn(crate::releases::run(
        shared.releases.clone(),
        shared.store.clone(),
        shared.hub.clone(),
        cancel.clone(),
    ));
    if let Some(interval) = cfg.blob_gc_interval {
        let owner = etcd.map(|e| e.replica().to_string()).unwrap_or_default();
        let local_is_store = matches!(
            (&cfg.blob_store, &etcd),
            (BlobChoice::Default | BlobChoice::Local, None)
        );
        shared.tasks.spawn(collect_blobs(
            shared.clone(),
            owner,
            interval,
            cfg.blob_gc_grace,
            local_is_store,
        ));
    }
    if let Some(keep) = cfg.audit_retention {
        shared.tasks.spawn(sweep_audit(shared.clone(), keep));
    }
    if let Some(interval) = cfg.delta_interval {
        shared
            .tasks
            .spawn(make_deltas(shared.clone(), interval, cfg.delta_limits));
    }
    shared.tasks.spawn(crate::plans::run(crate::plans::Deps {
        store: shared.store.clone(),
        rollouts: shared.rollouts.clone(),
        metrics: shared.metrics.clone(),
        leader: shared.leader.clone(),
        cancel: cancel.clone(),
    }));
    // One set of tenant-API tasks for rollouts and reboots: the leader's
    // cordon repair sees both owners, and losing the lead stops both.
    let kube = Arc::new(lks_kube::work::KubeWork::new(
        shared.tenants.clone(),
        shared.store.clone(),
        shared.store.clone(),
        shared.rollouts_changed.clone(),
        shared.tasks.clone(),
        cancel.clone(),
    ));
    shared.tasks.spawn(controller::run(
        controller::Deps {
            store: shared.store.clone(),
            hub: shared.hub.clone(),
            metrics: shared.metrics.clone(),
            leader: shared.leader.clone(),
            rollouts_changed: shared.rollouts_changed.clone(),
            rollout_updates: shared.rollout_updates.clone(),
            kube: kube.clone(),
            cancel: cancel.clone(),
        },
        rollout_inbox,
    ));
    spawn_reboots(shared, kube);
    if let Some(e) = etcd {
        shared.tasks.spawn(replicas::run_lease(
            shared.clone(),
            e.clone(),
            shared.server_url.clone(),
            cfg.lease_ttl,
            leader_tx,
        ));
        shared
            .tasks
            .spawn(replicas::run_watch(shared.clone(), e.clone(), servers_tx));
        if let Some(every) = cfg.rebalance_interval {
            shared
                .tasks
                .spawn(crate::rebalance::run(shared.clone(), e.clone(), every));
        }
    } else {
        drop((leader_tx, servers_tx));
    }
}

/// Every `interval`: on the leading replica, one garbage-collector pass
/// over the blob store (lks_blobs::gc); on every replica, its local copies
/// that nothing references. The first pass runs soon after start, so a
/// pass a crash interrupted is finished.
async fn collect_blobs(
    s: Arc<Shared>,
    owner: String,
    interval: Duration,
    grace: Duration,
    local_is_store: bool,
) {
    let mut next = tokio::time::Instant::now() + interval.min(Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = tokio::time::Instant::now() + interval;
        let keep = s.agent_packages.list().iter().map(|p| p.digest).collect();
        if *s.leader.borrow() {
            match lks_blobs::gc::collect(&s.blobs, &*s.store, &owner, grace, crate::clock::now_ms(), &keep)
                .await
            {
                Ok(pass) => {
                    s.metrics.blob_collected(&pass);
                    if pass.reclaimed > 0 {
                        tracing::info!(
                            reclaimed = pass.reclaimed,
                            reclaimed_bytes = pass.reclaimed_bytes,
                            held = pass.held,
                            held_bytes = pass.held_bytes,
                            "blob garbage collection"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "blob garbage collection failed; retrying next pass"),
            }
        }
        if !local_is_store {
            if let Err(e) = lks_blobs::gc::sweep_local(&s.blobs, &*s.store, &keep, grace).await {
                tracing::warn!(error = %e, "sweep of local blob copies failed");
            }
        }
    }
}

/// Every `interval`, on the leading replica: the binary deltas not made
/// yet (lks_blobs::delta), at most `limits.jobs` at once, off every
/// request's path.
async fn make_deltas(s: Arc<Shared>, interval: Duration, limits: lks_blobs::delta::Limits) {
    let mut next = tokio::time::Instant::now() + interval;
    let mut settled = lks_blobs::delta::Settled::default();
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = tokio::time::Instant::now() + interval;
        if !*s.leader.borrow() {
            continue;
        }
        let pass = tokio::select! {
            _ = s.cancel.cancelled() => return,
            p = lks_blobs::delta::make_missing(&s.blobs, &*s.store, limits, &mut settled, crate::clock::now_ms,
                |o| s.metrics.delta_outcome(&o)) => p,
        };
        match pass {
            Ok(p) => s.metrics.deltas_made(p.made, p.abandoned),
            Err(e) => tracing::warn!(error = %e, "making binary deltas failed; retrying next pass"),
        }
    }
}

/// Every hour (and a few seconds after start), on the leading replica:
/// drops the audit records older than `keep`.
async fn sweep_audit(s: Arc<Shared>, keep: Duration) {
    let mut next = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = tokio::time::Instant::now() + AUDIT_SWEEP;
        if !*s.leader.borrow() {
            continue;
        }
        let before = crate::clock::now_ms().saturating_sub(keep.as_millis() as i64);
        match s.store.prune_audit(before).await {
            Ok(0) => {}
            Ok(n) => {
                s.metrics.audit_pruned(n as u64);
                tracing::info!(dropped = n, "audit records past their retention dropped");
            }
            Err(e) => tracing::warn!(error = %e, "audit retention sweep failed; retrying next hour"),
        }
    }
}

/// Writes buffered last-seen times every few seconds instead of once per
/// heartbeat.
async fn flush_heartbeats(s: Arc<Shared>) {
    let mut tick = tokio::time::interval(HEARTBEAT_FLUSH);
    loop {
        tokio::select! {
            _ = s.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let seen = s.hub.take_heard();
        if let Err(e) = s.store.touch_nodes(seen).await {
            tracing::warn!(error = %e, "flush heartbeats");
        }
    }
}

/// The reboot controller (issue [reboots]), and its gauges on `/metrics`.
fn spawn_reboots(shared: &Arc<Shared>, kube: Arc<lks_kube::work::KubeWork>) {
    let gauges = Arc::new(crate::reboots::Gauges::default());
    let g = gauges.clone();
    shared.metrics.gauge(
        "lks_reboot_slots_held",
        "Slots of the clusters' reboot locks held (lost holders kept by the policy included).",
        move || g.held.load(std::sync::atomic::Ordering::Relaxed),
    );
    let g = gauges.clone();
    shared.metrics.gauge(
        "lks_reboot_lost_held",
        "Reboot-lost holders whose slot is kept (--on-reboot-timeout keep).",
        move || g.lost.load(std::sync::atomic::Ordering::Relaxed),
    );
    shared.tasks.spawn(crate::reboots::run(
        crate::reboots::Deps {
            store: shared.store.clone(),
            hub: shared.hub.clone(),
            metrics: shared.metrics.clone(),
            leader: shared.leader.clone(),
            poke: Arc::new(tokio::sync::Notify::new()),
            kube,
            gates: shared.reboot_gates.clone(),
            cancel: shared.cancel.clone(),
        },
        gauges,
    ));
}
