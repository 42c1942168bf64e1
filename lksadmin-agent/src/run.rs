//! `lksadmin-agent run`: the daemon.
//!
//! The engine gets a thread (and a current-thread runtime) of its own, since
//! it does blocking file I/O and may run long steps; the connection, the
//! certificate renewal and the systemd watchdog run as tasks of the main
//! runtime. They talk over bounded channels: desired state as a `watch`
//! (only the latest matters), status snapshots as a `watch`, events and
//! commands as bounded `mpsc`s. `READY=1` goes out as soon as the local
//! state is loaded and any interrupted transaction is settled — the server
//! is never waited for, and the last known desired state keeps being
//! enforced while it is unreachable.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lks_proto::BundleState;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::apply::desired::Desired;
use crate::apply::drift::DriftWatcher;
use crate::apply::engine::{Engine, EngineConfig, EngineError, Reporter, StatusSnapshot};
use crate::apply::runner::ProcessRunner;
use crate::apply::source::SourceError;
use crate::apply::state;
use crate::clock::SystemClock;
use crate::config::{ConfigError, StateDir};
use crate::link::channel::SharedChannel;
use crate::link::connection::{Connection, EngineCmd, Received};
use crate::link::renew;
use crate::link::source::NetSource;
use crate::link::status_file::ConnStatusFile;
use crate::node::notify;
use crate::node::reboot::Reboots;

pub const DEFAULT_HEAL_INTERVAL: Duration = Duration::from_secs(60);
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often bundles waiting for blobs (or a transient failure) are retried.
const RETRY_INTERVAL: Duration = Duration::from_secs(15);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// After a drift notification, how long to wait for the burst of writes
/// (an editor's save, a package upgrade) to end before healing once.
const DRIFT_SETTLE: Duration = Duration::from_millis(500);
/// Least time between two heals woken by inotify, so that a process that
/// keeps rewriting a managed file is answered at a bounded rate (each
/// repair is an event sent to the server).
const DRIFT_MIN_GAP: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub state_dir: PathBuf,
    /// Overrides the root stored by `join`.
    pub root: Option<PathBuf>,
    pub heal_interval: Duration,
    /// `--peer-listen`: where to listen for peers (and what to tell the
    /// server) instead of all addresses on the cluster's peer port.
    pub peer_listen: Option<std::net::SocketAddr>,
    /// How the node learns it needs a reboot, and reboots.
    pub reboot: crate::node::reboot::RebootSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("build the blob source: {0}")]
    Source(#[from] SourceError),
    #[error("start the engine: {0}")]
    Thread(String),
    #[error(transparent)]
    Reboot(#[from] crate::node::reboot::RebootError),
}

/// Why `run` returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Asked to stop (SIGTERM, Ctrl-C).
    Stopped,
    /// A self-update is staged: exit with [`crate::apply::selfupdate::HANDOVER_EXIT`]
    /// for the guard to switch binaries.
    HandOver,
}

/// Runs the agent until `cancel` fires or it hands over to a new binary.
pub async fn run(opts: RunOptions, cancel: CancellationToken) -> Result<RunEnd, RunError> {
    crate::fault::warn_if_set();
    let dirs = StateDir::new(&opts.state_dir);
    let cfg = dirs.load_config()?;
    let trusted = dirs.trusted_keys()?;
    let trust = open_trust(&dirs, &cfg, trusted.clone());
    let root = opts.root.clone().unwrap_or_else(|| cfg.root.clone());
    let channel = SharedChannel::default();
    let (status_tx, status_rx) = watch::channel(StatusSnapshot::default());
    let (events_tx, events_rx) = mpsc::channel(256);
    let peers = Arc::new(crate::link::peer::Shared::default());
    let swarm = Arc::new(crate::link::swarm::Swarm::new(
        peers.clone(),
        channel.clone(),
        dirs.clone(),
        cfg.cluster.clone(),
        events_tx.clone(),
    ));
    let source = Arc::new(NetSource::new(channel.clone())?.with_swarm(swarm.clone()));
    let (desired_tx, desired_rx) = watch::channel(None);
    let (cmd_tx, cmd_rx) = mpsc::channel(16);
    let reboots = Reboots::open(&dirs, &root, opts.reboot.clone())?;
    let engine = Engine::open(
        EngineConfig {
            state_dir: dirs.clone(),
            root,
            node: cfg.node_name.clone(),
            trusted,
            arch: crate::node::facts::architecture(),
        },
        source,
        Arc::new(ProcessRunner),
        Arc::new(SystemClock),
        Reporter::new(status_tx, events_tx),
    )?
    .with_issuer(crate::link::issuer::NetIssuer::new(channel.clone()))
    .with_trust(trust)
    .with_reboots(reboots.clone());

    let handover = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Stop {
        cancel: cancel.clone(),
        handover: handover.clone(),
    };
    let (engine_thread, ready_rx) =
        spawn_engine(engine, dirs.clone(), desired_rx, cmd_rx, opts.heal_interval, stop)?;

    tokio::select! {
        r = ready_rx => if r.is_err() {
            return Err(RunError::Thread("the engine stopped while loading the local state".into()));
        },
        _ = cancel.cancelled() => {}
    }
    notify::ready(&format!(
        "node {} of cluster {}: local state loaded",
        cfg.node_name, cfg.cluster
    ));
    tracing::info!(node = %cfg.node_name, cluster = %cfg.cluster, "agent started");

    let conn_file = Arc::new(ConnStatusFile::new(dirs.clone()));
    conn_file.update(|c| c.connected = false);
    let mut tasks = JoinSet::new();
    let (reboot_requests, requests_rx) = watch::channel(0u64);
    tasks.spawn(crate::node::reboot::follow(
        reboots.clone(),
        requests_rx,
        opts.heal_interval,
        cancel.clone(),
    ));
    tasks.spawn(follow_peer_sharing(
        crate::link::peer::PeerHost::new(dirs.clone(), cfg.cluster.clone(), peers, opts.peer_listen),
        swarm,
        desired_tx.subscribe(),
        cancel.clone(),
    ));
    tasks.spawn(
        Connection {
            dirs: dirs.clone(),
            servers: cfg.servers.clone(),
            channel: channel.clone(),
            status: status_rx,
            events: events_rx,
            desired: desired_tx,
            commands: cmd_tx,
            conn_file: conn_file.clone(),
            heartbeat: HEARTBEAT,
            peer_listen: opts.peer_listen,
            reboot: Some(reboots.subscribe()),
            reboot_requests,
        }
        .run(cancel.clone()),
    );
    tasks.spawn(renew::renewal_loop(dirs.clone(), channel, cancel.clone()));

    keep_alive(&cancel, &conn_file).await;
    notify::stopping();
    tracing::info!("stopping");
    shut_down(tasks, engine_thread, &conn_file).await;
    if handover.load(std::sync::atomic::Ordering::SeqCst) {
        return Ok(RunEnd::HandOver);
    }
    Ok(RunEnd::Stopped)
}

/// Opens the release trust and says at start whether it is required, and
/// refused.
fn open_trust(
    dirs: &StateDir,
    cfg: &crate::config::AgentConfig,
    trusted: Vec<lks_proto::sign::PublisherKey>,
) -> crate::apply::trust::Trust {
    let trust = crate::apply::trust::Trust::open(&dirs.trust(), &cfg.cluster, trusted, cfg.trust_threshold);
    if trust.is_on() {
        tracing::info!(threshold = cfg.trust_threshold, "signed release records required");
        let r = trust.report(crate::clock::now_ms());
        if r.state == crate::apply::trust::Condition::Refused.as_str() {
            tracing::error!("release trust: {}; applying no new versions", r.message);
        }
    }
    trust
}

/// Starts the engine on a thread (and current-thread runtime) of its own;
/// the receiver fires once the local state is loaded.
fn spawn_engine(
    engine: Engine,
    dirs: StateDir,
    desired_rx: watch::Receiver<Option<Received>>,
    cmd_rx: mpsc::Receiver<EngineCmd>,
    heal_interval: Duration,
    stop: Stop,
) -> Result<(std::thread::JoinHandle<()>, oneshot::Receiver<()>), RunError> {
    let (ready_tx, ready_rx) = oneshot::channel();
    let engine_thread = std::thread::Builder::new()
        .name("lks-engine".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("start the engine runtime: {e}");
                    return;
                }
            };
            rt.block_on(engine_loop(
                engine,
                dirs,
                desired_rx,
                cmd_rx,
                heal_interval,
                stop,
                ready_tx,
            ));
        })
        .map_err(|e| RunError::Thread(e.to_string()))?;
    Ok((engine_thread, ready_rx))
}

/// The main loop until `cancel`: the watchdog proves it keeps turning; the
/// status file is refreshed so `status` can tell a live agent from a dead
/// one.
async fn keep_alive(cancel: &CancellationToken, conn_file: &ConnStatusFile) {
    let watchdog = notify::watchdog_interval();
    let mut wd = tokio::time::interval(
        watchdog
            .unwrap_or(Duration::from_secs(5))
            .min(Duration::from_secs(5)),
    );
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = wd.tick() => {
                if watchdog.is_some() {
                    notify::watchdog();
                }
                conn_file.update(|_| {});
            }
        }
    }
}

/// Waits a bounded grace for the tasks and the engine thread, then marks
/// the agent gone in the status file.
async fn shut_down(
    mut tasks: JoinSet<()>,
    engine_thread: std::thread::JoinHandle<()>,
    conn_file: &ConnStatusFile,
) {
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    // The engine finishes the step it is in; a transaction cut short by the
    // grace period is settled from the journal on the next start.
    let joined = tokio::task::spawn_blocking(move || engine_thread.join());
    if tokio::time::timeout(SHUTDOWN_GRACE, joined).await.is_err() {
        tracing::warn!("the engine did not stop in time; its journal settles the rest on the next start");
    }
    conn_file.update(|c| {
        c.connected = false;
        c.pid = 0;
    });
}

/// Starts and stops peer sharing as the desired states say, and looks
/// again every minute (a renewed node certificate restarts the listener).
async fn follow_peer_sharing(
    mut host: crate::link::peer::PeerHost,
    swarm: Arc<crate::link::swarm::Swarm>,
    mut desired: watch::Receiver<Option<Received>>,
    cancel: CancellationToken,
) {
    let mut again = tokio::time::interval(Duration::from_secs(60));
    loop {
        let d = desired.borrow_and_update().clone();
        if let Some(Received { message: d, .. }) = d {
            swarm.set_on(d.peer_sharing.is_some());
            host.apply(&d).await;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = desired.changed() => if r.is_err() { break },
            _ = again.tick() => {}
        }
    }
    host.stop();
}

async fn engine_loop(
    mut engine: Engine,
    dirs: StateDir,
    mut desired_rx: watch::Receiver<Option<Received>>,
    mut cmd_rx: mpsc::Receiver<EngineCmd>,
    heal_interval: Duration,
    stop: Stop,
    ready: oneshot::Sender<()>,
) {
    let Stop { cancel, handover } = stop;
    let mut desired = settle_and_load(&mut engine, &dirs, ready).await;
    if let Some(d) = &desired {
        reconcile(&mut engine, d, false).await;
    }
    if handing_over(&engine, &handover, &cancel) {
        return;
    }
    let mut drift = open_drift_watcher();
    watch_managed(&mut drift, &engine);
    let mut last_drift_heal: Option<tokio::time::Instant> = None;
    let mut drift_heal_at: Option<tokio::time::Instant> = None;
    let start = tokio::time::Instant::now();
    let mut heal_tick = tokio::time::interval_at(start + heal_interval, heal_interval);
    let mut retry = tokio::time::interval_at(start + RETRY_INTERVAL, RETRY_INTERVAL);
    // When the current signed release expires: the node then reports a
    // stale release at once, also while idle or offline.
    let mut trust_at = engine.trust_wakeup().map(|d| tokio::time::Instant::now() + d);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = desired_rx.changed() => {
                if r.is_err() {
                    break;
                }
                let Some(Received { desired: d, .. }) = desired_rx.borrow_and_update().clone() else { continue };
                reconcile(&mut engine, &d, true).await;
                desired = Some(d);
            }
            Some(cmd) = cmd_rx.recv() => command(&mut engine, cmd, desired.as_deref()).await,
            _ = heal_tick.tick() => {
                heal(&mut engine).await;
                engine.refresh_trust();
                if let Some(d) = &desired {
                    reconcile(&mut engine, d, false).await;
                }
            }
            _ = retry.tick() => {
                if let Some(d) = &desired && needs_retry(&engine) {
                    reconcile(&mut engine, d, false).await;
                }
                if let Err(e) = engine.renew_due().await {
                    tracing::error!("renew certificates: {e}");
                }
            }
            // A change schedules a heal instead of waiting here, so new
            // desired states are not held up meanwhile.
            r = drift_changed(&mut drift), if drift_heal_at.is_none() => {
                drift_heal_at = schedule_drift_heal(r, &mut drift, last_drift_heal);
            }
            _ = sleep_until_some(trust_at) => {
                engine.refresh_trust();
            }
            _ = sleep_until_some(drift_heal_at) => {
                drift_heal_at = None;
                if let Some(w) = drift.as_mut() {
                    w.drain();
                }
                tracing::debug!("a managed file changed on disk: healing now");
                // Only a pass that repaired something counts for the gap:
                // the wake-up our own repair causes is free.
                if heal(&mut engine).await {
                    last_drift_heal = Some(tokio::time::Instant::now());
                }
            }
        }
        // Applies, removals and repairs change which directories matter.
        watch_managed(&mut drift, &engine);
        trust_at = engine.trust_wakeup().map(|d| tokio::time::Instant::now() + d);
        if handing_over(&engine, &handover, &cancel) {
            break;
        }
    }
}

/// Settles what a restart interrupted (a transaction, a self-update),
/// publishes the status, says the engine is ready, and loads the last
/// desired state.
async fn settle_and_load(
    engine: &mut Engine,
    dirs: &StateDir,
    ready: oneshot::Sender<()>,
) -> Option<Arc<Desired>> {
    if let Err(e) = engine.recover().await {
        tracing::error!("settle the interrupted transaction: {e}");
    }
    if let Err(e) = engine.resume_self_update().await {
        tracing::error!("pick up the self-update in progress: {e}");
    }
    engine.publish_now();
    let _ = ready.send(());
    match state::load_desired(&dirs.desired()) {
        Ok(d) => d.map(Arc::new),
        Err(e) => {
            tracing::error!("load the last desired state: {e}");
            None
        }
    }
}

/// Heals on inotify where it works; the periodic pass runs either way.
fn open_drift_watcher() -> Option<DriftWatcher> {
    match DriftWatcher::new() {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("inotify unavailable ({e}): drift is repaired by the periodic pass only");
            None
        }
    }
}

/// A command from the connection.
async fn command(engine: &mut Engine, cmd: EngineCmd, desired: Option<&Desired>) {
    match cmd {
        EngineCmd::HealNow => {
            heal(engine).await;
        }
        EngineCmd::Connected => {
            // A new agent on trial has now reconnected: its Hello is in,
            // and the status this commit publishes follows.
            if engine.on_trial()
                && let Err(e) = engine.commit_self_update()
            {
                tracing::error!("commit the self-update: {e}");
            }
            if let Some(d) = desired
                && needs_retry(engine)
            {
                reconcile(engine, d, false).await;
            }
        }
    }
}

/// When to heal after a managed file changed: once the burst of writes
/// has settled, and not sooner than [`DRIFT_MIN_GAP`] after the last
/// drift heal. A failed watcher is dropped (`None` then).
fn schedule_drift_heal(
    changed: std::io::Result<()>,
    drift: &mut Option<DriftWatcher>,
    last_drift_heal: Option<tokio::time::Instant>,
) -> Option<tokio::time::Instant> {
    match changed {
        Ok(()) => {
            let settled = tokio::time::Instant::now() + DRIFT_SETTLE;
            let gap = last_drift_heal.map_or(settled, |t| t + DRIFT_MIN_GAP);
            Some(settled.max(gap))
        }
        Err(e) => {
            tracing::warn!("inotify failed ({e}): drift is repaired by the periodic pass only");
            *drift = None;
            None
        }
    }
}

/// How the engine stops the agent: when asked to, or to hand over.
struct Stop {
    cancel: CancellationToken,
    handover: Arc<std::sync::atomic::AtomicBool>,
}

/// True (and the whole agent told to stop) once a self-update is staged.
fn handing_over(engine: &Engine, flag: &std::sync::atomic::AtomicBool, cancel: &CancellationToken) -> bool {
    if !engine.handover_requested() {
        return false;
    }
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
    cancel.cancel();
    true
}

/// Never resolves for `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Never resolves without a watcher.
async fn drift_changed(drift: &mut Option<DriftWatcher>) -> std::io::Result<()> {
    match drift {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

fn watch_managed(drift: &mut Option<DriftWatcher>, engine: &Engine) {
    let Some(w) = drift.as_mut() else { return };
    for (dir, e) in w.set_files(engine.managed_files()) {
        // A missing directory is drift itself; the heal pass recreates it.
        tracing::debug!(dir = %dir.display(), "cannot watch for drift ({e}); the periodic pass covers it");
    }
}

async fn reconcile(engine: &mut Engine, d: &Desired, store: bool) {
    let r = if store {
        engine.accept_desired(d).await
    } else {
        engine.reconcile(d).await
    };
    if let Err(e) = r {
        tracing::error!("apply desired state generation {}: {e}", d.generation);
    }
    notify::status(&summary(engine));
    crate::node::memory::trim();
}

/// One heal pass; true if it repaired (or tried to repair) something.
async fn heal(engine: &mut Engine) -> bool {
    let r = engine.heal().await;
    crate::node::memory::trim();
    match r {
        Ok(r) if !r.repaired.is_empty() => {
            tracing::info!("self-heal restored {}", r.repaired.join(", "));
            true
        }
        Ok(r) => {
            tracing::debug!("self-heal: every managed file is intact");
            !r.failed.is_empty()
        }
        Err(e) => {
            tracing::error!("self-heal: {e}");
            true
        }
    }
}

fn needs_retry(engine: &Engine) -> bool {
    let now = crate::clock::now_ms();
    engine.state().bundles.values().any(|r| {
        matches!(r.status.state, BundleState::Pending | BundleState::Applying)
            || (r.status.state == BundleState::Failed && r.sticky.is_none())
            // The crash-loop guard's wait is over.
            || (r.retry_at_ms > 0 && now >= r.retry_at_ms)
    })
}

fn summary(engine: &Engine) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in engine.state().bundles.values() {
        *counts.entry(r.status.state.as_str()).or_default() += 1;
    }
    if counts.is_empty() {
        return "no bundles".into();
    }
    let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!("bundles: {}", parts.join(", "))
}
