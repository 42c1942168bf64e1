//! The rollout a load generator starts and follows (`--rollout`): the
//! bundle it publishes, one rollout per cluster, the fan-out and
//! generations each simulated agent saw ([`Tracker`]), and with
//! `--kill-mid-rollout` the kill and the agents' way back.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use lks_proto::adminconf::AdminConf;
use lks_proto::pb;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::args::{Args, SETTLE, cluster_names};
use crate::report::{FailoverReport, Summary, auth, summarise};
use crate::sim::{self, tls_channel};

/// How long before its mark a kill may have happened (another process's,
/// told by SIGUSR1): see [`Tracker::mark_kill`].
const KILL_NOTICE_SLACK: Duration = Duration::from_secs(2);

/// What the rollout and hold loops read from the simulated agents.
pub struct Watch<'a> {
    pub stats: &'a Arc<sim::Stats>,
    pub held: &'a Arc<sim::Held>,
    pub desired_rx: &'a mut mpsc::Receiver<sim::Desired>,
    pub back_rx: &'a mut mpsc::UnboundedReceiver<sim::Back>,
}

pub struct RolloutResult {
    pub seconds: Option<f64>,
    pub fanout: Summary,
    /// The first admin call → the last rollout stored.
    pub started_seconds: Option<f64>,
}

/// Follows what the simulated agents received: the rollout's fan-out, each
/// bundle version's generation per agent (assigned twice?), and after a
/// kill, each agent's way back.
pub struct Tracker {
    n: usize,
    /// `NAME@VERSION` of the rollout and when it started.
    want: Option<(String, Instant)>,
    seen: Vec<Option<f64>>,
    have: usize,
    /// Per agent: each bundle version and the generation it first came in.
    generations: Vec<Vec<(String, u64)>>,
    pub twice: Vec<bool>,
    pub killed_at: Option<Instant>,
    back_after: Vec<Option<f64>>,
    /// Filled in by the process that killed.
    fo: FailoverReport,
    rollout_done: Option<Instant>,
}

impl Tracker {
    pub fn new(n: usize) -> Self {
        Tracker {
            n,
            want: None,
            seen: vec![None; n],
            have: 0,
            generations: vec![Vec::new(); n],
            twice: vec![false; n],
            killed_at: None,
            back_after: vec![None; n],
            fo: FailoverReport::default(),
            rollout_done: None,
        }
    }

    pub fn drain(&mut self, w: &mut Watch<'_>) {
        while let Ok(d) = w.desired_rx.try_recv() {
            for b in &d.bundles {
                let gens = &mut self.generations[d.agent];
                match gens.iter().find(|(v, _)| v == b) {
                    None => gens.push((b.clone(), d.generation)),
                    Some((_, g)) if *g != d.generation => self.twice[d.agent] = true,
                    Some(_) => {}
                }
            }
            if let Some((want, t0)) = &self.want
                && d.bundles.contains(want)
                && self.seen[d.agent].is_none()
            {
                self.seen[d.agent] = Some(d.at.saturating_duration_since(*t0).as_secs_f64() * 1e3);
                self.have += 1;
            }
        }
        while let Ok(b) = w.back_rx.try_recv() {
            // An agent a survivor moved on (a rebalance) was not displaced
            // by the kill: its way back is not the failover's.
            if let Some(k) = self.killed_at
                && b.session_started >= k
                && !b.after_move
                && self.back_after[b.agent].is_none()
            {
                self.back_after[b.agent] = Some(b.at.duration_since(k).as_secs_f64() * 1e3);
            }
        }
    }

    /// From now on, failures count as the failover's.
    /// Marks the kill (this process's, or another's told by SIGUSR1). An
    /// agent whose stream ended up to [`KILL_NOTICE_SLACK`] before and is
    /// not up again counts as held where it was: a process hears of
    /// another's kill after the signal, and its agents on the killed
    /// server may have noticed first (under load, the difference made a
    /// 300-agent test count 145 of 150 held at the kill).
    pub fn mark_kill(&mut self, w: &Watch<'_>) {
        self.fo.held_before = w.held.snapshot_at_kill(KILL_NOTICE_SLACK);
        self.fo.moving_at_kill = w.held.moving();
        w.stats.phase.store(1, Ordering::Relaxed);
        self.killed_at = Some(Instant::now());
    }

    fn all_back(&self, w: &Watch<'_>) -> bool {
        self.killed_at.is_some() && w.held.total() == self.n as i64
    }

    pub fn failover(&mut self, k: Instant, args: &Args, w: &Watch<'_>) -> FailoverReport {
        let (dropped, errors) = (w.stats.counts(1, true), w.stats.counts(1, false));
        let back: Vec<f64> = self.back_after.iter().flatten().copied().collect();
        let everyone = w.held.total() == self.n as i64;
        FailoverReport {
            killed_pids: args.kill_mid_rollout.clone(),
            held_after: w.held.snapshot(),
            reconnected: back.len(),
            all_back_seconds: everyone.then(|| back.iter().copied().fold(0.0, f64::max) / 1e3),
            back_after: summarise(back),
            rollout_done_after_kill_seconds: self
                .rollout_done
                .map(|d| d.saturating_duration_since(k).as_secs_f64()),
            auth_errors: auth(&dropped) + auth(&errors),
            dropped,
            errors,
            moved_by_server: w.stats.moved[1].load(Ordering::Relaxed),
            ..std::mem::take(&mut self.fo)
        }
    }
}

/// The bundle the rollout publishes: `files` small distinct files.
fn rollout_bundle(name: &str, files: usize) -> Vec<pb::PublishBundleRequest> {
    let contents: Vec<Vec<u8>> = (0..files)
        .map(|k| format!("{name} file {k}\n").into_bytes())
        .collect();
    let manifest = pb::Manifest {
        name: name.to_string(),
        version: "1".into(),
        files: contents
            .iter()
            .enumerate()
            .map(|(k, c)| pb::FileEntry {
                chunk_size: 0,
                chunk_digests: Vec::new(),
                path: format!("/etc/lks-loadgen/{name}/f{k}.conf"),
                digest: lks_proto::digest::Digest::of(c).to_string(),
                size: c.len() as u64,
                mode: 0o644,
                url: String::new(),
                arch: String::new(),
            })
            .collect(),
        ..Default::default()
    };
    let header = pb::PublishBundleRequest {
        msg: Some(pb::publish_bundle_request::Msg::Header(pb::SignedBundle {
            manifest: Some(manifest),
            ..Default::default()
        })),
    };
    std::iter::once(header)
        .chain(contents.into_iter().map(|c| pb::PublishBundleRequest {
            msg: Some(pb::publish_bundle_request::Msg::Chunk(pb::FileChunk {
                digest: lks_proto::digest::Digest::of(&c).to_string(),
                data: c,
            })),
        }))
        .collect()
}

/// Waits until the cluster has `total` connected nodes (other load
/// generator processes' agents too), taking what the agents receive.
async fn wait_for_nodes(
    args: &Args,
    admin: &AdminServiceClient<Channel>,
    total: usize,
    w: &mut Watch<'_>,
    tracker: &mut Tracker,
) -> Result<()> {
    // 30,000 nodes are a few MiB of listing.
    let mut admin = admin.clone().max_decoding_message_size(256 << 20);
    let limit = Instant::now() + Duration::from_secs(args.rollout_timeout);
    loop {
        let ours = cluster_names(args);
        let nodes = admin
            .list_nodes(pb::ListNodesRequest {
                cluster: if ours.len() == 1 {
                    ours[0].clone()
                } else {
                    String::new()
                },
            })
            .await
            .map_err(|s| anyhow!("list nodes: {}", s.message()))?
            .into_inner()
            .nodes;
        let up = nodes
            .iter()
            .filter(|n| n.connected && ours.contains(&n.cluster))
            .count();
        if up >= total {
            return Ok(());
        }
        if Instant::now() >= limit {
            bail!(
                "only {up} of {total} nodes connected after {} s",
                args.rollout_timeout
            );
        }
        eprintln!("waiting for nodes: {up}/{total} connected");
        for _ in 0..20 {
            tracker.drain(w);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Publishes, starts a rollout to every node of the cluster and follows it
/// to the end; with --kill-mid-rollout, kills mid-way and follows the
/// agents back.
pub async fn rollout(
    args: &Args,
    conf: &AdminConf,
    servers: &[String],
    admin: &mut AdminServiceClient<Channel>,
    run_id: &str,
    w: &mut Watch<'_>,
    tracker: &mut Tracker,
) -> Result<RolloutResult> {
    let n = tracker.n;
    let nodes = args.rollout_after_nodes.unwrap_or(n).max(n);
    if args.rollout_after_nodes.is_some() {
        wait_for_nodes(args, admin, nodes, w, tracker).await?;
    }
    let bundle = format!("lg-{run_id}");
    admin
        .publish_bundle(futures::stream::iter(rollout_bundle(&bundle, args.files)))
        .await
        .map_err(|s| anyhow!("publish {bundle}@1: {}", s.message()))?;
    tracker.drain(w);
    let t0 = Instant::now();
    let t0_ms = wall_ms();
    let clusters = cluster_names(args);
    // The benchmark marks the start of its cost window at this line.
    note(&format!(
        "starting {} rollouts of {bundle}@1{}",
        clusters.len(),
        if args.plan { " through one plan" } else { "" }
    ));
    // A cluster's share of the nodes (rounded up): its batch size and
    // failure threshold, so each rollout starts all its nodes at once.
    let per_cluster = nodes.div_ceil(clusters.len()) as u32;
    let starts: Vec<pb::StartRolloutRequest> = clusters
        .iter()
        .map(|cluster| pb::StartRolloutRequest {
            cluster: cluster.clone(),
            bundle: bundle.clone(),
            version: "1".into(),
            batch_size: args.batch_size.unwrap_or(per_cluster),
            failure_threshold: per_cluster,
            ..Default::default()
        })
        .collect();
    tracker.want = Some((format!("{bundle}@1"), t0));
    let failing_over = !args.kill_mid_rollout.is_empty();
    let kill_when = ((n as f64 * args.kill_at).ceil() as usize).clamp(1, n);
    // The rollouts are started and followed by a task of their own, so
    // that admin calls (one per rollout, each slow under load: a start reads
    // every node) never hold up the kill.
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let retries = Arc::new(AtomicU64::new(0));
    let last_start_ms = Arc::new(AtomicI64::new(0));
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let follower = if args.plan {
        let run = crate::plan::PlanRun {
            admin: admin.clone(),
            name: bundle.clone(),
            in_flight: args
                .plan_in_flight
                .unwrap_or(u32::try_from(clusters.len()).unwrap_or(u32::MAX)),
            groups: args.plan_groups,
            rollout: starts.first().cloned().unwrap_or_default(),
            clusters,
            last_start_ms: last_start_ms.clone(),
        };
        tokio::spawn(crate::plan::follow(run, done_tx))
    } else {
        tokio::spawn(follow_rollouts(
            Follow {
                admin: admin.clone(),
                starts,
                ids: Vec::new(),
                servers: servers.to_vec(),
                conf: conf.clone(),
                killed: killed.clone(),
                retries: retries.clone(),
                failing_over,
                last_start_ms: last_start_ms.clone(),
            },
            done_tx,
        ))
    };
    let limit = Instant::now() + Duration::from_secs(args.rollout_timeout);
    loop {
        tracker.drain(w);
        if failing_over && tracker.killed_at.is_none() && tracker.have >= kill_when {
            kill_mid_rollout(args, tracker, w, t0, &killed)?;
        }
        if tracker.rollout_done.is_none() {
            match done_rx.try_recv() {
                Ok(Ok((at, a))) => {
                    tracker.rollout_done = Some(at);
                    *admin = a;
                    eprintln!(
                        "rollout completed in {:.2} s",
                        at.duration_since(t0).as_secs_f64()
                    );
                }
                Ok(Err(e)) => return Err(e),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => bail!("the rollout follower ended"),
            }
        }
        // Done: the rollouts ended, the agents are back, and every agent
        // of ours has said it holds the version. A rollout may end before
        // an agent that was away (the failover) has its desired state, so
        // that last part is waited for up to SETTLE after the end.
        if let Some(done) = tracker.rollout_done
            && (!failing_over || tracker.all_back(w))
            && (tracker.have >= n || done.elapsed() >= SETTLE)
        {
            break;
        }
        if Instant::now() >= limit {
            follower.abort();
            if tracker.rollout_done.is_none() {
                bail!("the rollouts did not complete within {} s", args.rollout_timeout);
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracker.drain(w);
    tracker.fo.admin_retries = retries.load(Ordering::Relaxed);
    let last = last_start_ms.load(Ordering::Relaxed);
    Ok(RolloutResult {
        seconds: tracker.rollout_done.map(|d| d.duration_since(t0).as_secs_f64()),
        fanout: summarise(tracker.seen.iter().flatten().copied().collect()),
        started_seconds: (last > 0).then(|| (last - t0_ms) as f64 / 1e3),
    })
}

/// `--kill-mid-rollout`: kills the processes named, tells those named by
/// `--notify-at-kill`, and marks the moment for the failover report.
fn kill_mid_rollout(
    args: &Args,
    tracker: &mut Tracker,
    w: &Watch<'_>,
    t0: Instant,
    killed: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    tracker.mark_kill(w);
    use nix::sys::signal::{Signal, kill};
    for &pid in &args.kill_mid_rollout {
        kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL)
            .with_context(|| format!("kill process {pid}"))?;
    }
    for &pid in &args.notify_at_kill {
        kill(nix::unistd::Pid::from_raw(pid), Signal::SIGUSR1)
            .with_context(|| format!("tell process {pid} of the kill"))?;
    }
    killed.store(true, Ordering::Relaxed);
    eprintln!(
        "killed {:?} with {}/{} agents holding the new version",
        args.kill_mid_rollout, tracker.have, tracker.n
    );
    tracker.fo.killed_after_seconds = Some(t0.elapsed().as_secs_f64());
    tracker.fo.had_it_at_kill = Some(tracker.have);
    Ok(())
}

/// What the task following the rollouts needs.
struct Follow {
    admin: AdminServiceClient<Channel>,
    /// The rollouts to start, then the ones still running.
    starts: Vec<pb::StartRolloutRequest>,
    ids: Vec<String>,
    servers: Vec<String>,
    conf: AdminConf,
    /// Set once the processes are killed: from then on a failed status
    /// call moves to the next server.
    killed: Arc<std::sync::atomic::AtomicBool>,
    retries: Arc<AtomicU64>,
    failing_over: bool,
    /// The newest `created_at` of the rollouts started (ms).
    last_start_ms: Arc<AtomicI64>,
}

impl Follow {
    /// Admin calls go to the next of --servers from now on.
    async fn next_server(&mut self, next: &mut usize, why: &tonic::Status) {
        let url = &self.servers[*next % self.servers.len()];
        *next += 1;
        note(&format!("admin call: {}; asking {url}", why.message()));
        if let Ok(ch) = tls_channel(
            url,
            &self.conf.ca_cert,
            Some((&self.conf.client_cert, &self.conf.client_key)),
            None,
        )
        .await
        {
            self.admin = AdminServiceClient::new(ch);
        }
    }
}

/// Starts the rollouts, then polls them until all completed (when, and the
/// admin client that saw it), or one ended otherwise, or a status call
/// failed before a kill.
async fn follow_rollouts(
    mut f: Follow,
    done: tokio::sync::oneshot::Sender<Result<(Instant, AdminServiceClient<Channel>)>>,
) {
    let mut next_server = 0;
    for req in std::mem::take(&mut f.starts) {
        let cluster = req.cluster.clone();
        loop {
            match f.admin.start_rollout(req.clone()).await {
                Ok(r) => {
                    let r = r.into_inner();
                    f.last_start_ms.fetch_max(r.created_at_ms, Ordering::Relaxed);
                    f.ids.push(r.id);
                    break;
                }
                // Killed meanwhile: the server, or its etcd member, may be
                // gone ("unavailable; retry"), nothing was started: again,
                // through the next server.
                Err(s)
                    if f.failing_over
                        && f.killed.load(Ordering::Relaxed)
                        && s.code() == tonic::Code::Unavailable =>
                {
                    f.retries.fetch_add(1, Ordering::Relaxed);
                    f.next_server(&mut next_server, &s).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => {
                    let _ = done.send(Err(anyhow!("start rollout in {cluster}: {}", s.message())));
                    return;
                }
            }
        }
    }
    // One status call per rollout per round; with many, fewer rounds.
    let pause = Duration::from_millis(if f.ids.len() > 1 { 500 } else { 50 });
    let r = loop {
        match running_rollouts(&mut f.admin, &mut f.ids).await {
            Ok(()) if f.ids.is_empty() => break Ok(Instant::now()),
            Ok(()) => {}
            Err(Poll::Ended(e)) => break Err(e),
            Err(Poll::Failed(s)) if f.failing_over && f.killed.load(Ordering::Relaxed) => {
                // The server went with the kill, or etcd is electing a
                // leader: the next server.
                f.retries.fetch_add(1, Ordering::Relaxed);
                f.next_server(&mut next_server, &s).await;
            }
            Err(Poll::Failed(s)) => break Err(anyhow!("rollout status: {}", s.message())),
        }
        tokio::time::sleep(pause).await;
    };
    let _ = done.send(r.map(|at| (at, f.admin)));
}

/// Why following the rollouts stopped.
enum Poll {
    /// A rollout ended other than completed.
    Ended(anyhow::Error),
    /// A status call failed.
    Failed(tonic::Status),
}

/// Drops the rollouts of `ids` that completed; an error if one ended
/// otherwise.
async fn running_rollouts(
    admin: &mut AdminServiceClient<Channel>,
    ids: &mut Vec<String>,
) -> Result<(), Poll> {
    let mut still = Vec::new();
    for id in ids.iter() {
        let r = admin
            .get_rollout(pb::RolloutRef { id: id.clone() })
            .await
            .map_err(Poll::Failed)?
            .into_inner();
        match pb::RolloutState::try_from(r.state) {
            Ok(pb::RolloutState::Running) => still.push(id.clone()),
            Ok(pb::RolloutState::Completed) => {}
            state => {
                return Err(Poll::Ended(anyhow!(
                    "rollout {id} ended {state:?}: {}",
                    r.message
                )));
            }
        }
    }
    *ids = still;
    Ok(())
}

/// Now on the wall clock, in ms since the Unix epoch: the server's clock
/// on the same machine.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A progress note on stderr (the load generator has no tracing).
fn note(msg: &str) {
    eprintln!("{msg}");
}
