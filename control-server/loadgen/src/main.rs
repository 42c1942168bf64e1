//! `lks-loadgen`: simulates many agents against a running control server,
//! for benchmarks (BENCHMARKS.md). Each simulated agent makes its own key,
//! enrols with its own CSR, and holds its own mTLS connection with a real
//! `Connect` stream: Hello, heartbeats, pongs, and a status report that
//! acknowledges every desired state as applied (so rollouts progress).
//!
//! With `--rollout` it publishes a file-less bundle, starts a rollout to all
//! simulated agents and measures the fan-out (rollout start → each agent has
//! the new desired state) and the time to completion.
//!
//! `--baseline` measures the same connection pattern against an idle
//! in-process tonic server (tonic-health `Watch`, mTLS), so a report always
//! comes with the cost of TLS + HTTP/2 + one stream and nothing of ours.
//!
//! `--servers` spreads the agents over several replicas of one control
//! plane (agent i enrols with and connects to the (i mod n)-th), while the
//! admin calls (cluster, token, publish, rollout) go to admin.conf's server.
//!
//! `--kill-mid-rollout PID,…` (issue [scale-out]) is failover under load:
//! once `--kill-at` of the agents have the rollout's desired state, the
//! processes named (the leading replica, an etcd member…) are killed with
//! SIGKILL; the agents reconnect as `lksadmin-agent` does (the next server
//! of `--servers`, or the one a replica names); admin calls move to the
//! next server when theirs fails. The report has what each server held
//! before and after, the time until every dropped agent was back, the time
//! until the rollout completed, auth errors, and agents that were sent the
//! new version in more than one generation (assigned twice).
//!
//! One process holds at most as many agents as it may open files (20,000
//! on the benchmark machine, a hard limit it cannot raise), so a larger
//! fleet is several processes on one cluster: the one that rolls out waits
//! for `--rollout-after-nodes` connected nodes, and names the others with
//! `--notify-at-kill`; they get SIGUSR1 at the kill and measure their
//! agents' way back from then. SIGTERM ends a `--hold` early (the report
//! is still written).
//!
//! `--storm` (issue [perf] item 2) starts the server itself from the
//! command after `--`, connects the agents, stops the server (SIGTERM, or
//! SIGKILL with `--storm-kill`) and starts it again on the same data dir
//! and port. Every agent reconnects as `lksadmin-agent` does (sim.rs); the
//! report has the time until all have their desired state again, attempts
//! per agent and every error by class.
//!
//! An enrolment the server refuses with "try again" (`FailedPrecondition`:
//! on etcd, concurrent enrolments conflict on shared documents), or
//! rate-limits (`ResourceExhausted`, after the server's retry hint and the
//! agent's join backoff), is retried up to [`ENROL_ATTEMPTS`] times; the
//! retries are counted in the report. A progress line goes to stderr every
//! second.
//!
//! On loopback each agent gets its own 127.x.y.z source address by default,
//! as a fleet of VMs has (`--no-spread-source-ips` turns it off); from one
//! address the per-IP enrolment rate limit of the server would dominate
//! the measurement.

#![forbid(unsafe_code)]

mod args;
mod baseline;
mod plan;
mod report;
mod rollout;
mod sim;
mod storm;

use args::{Args, SETTLE, cluster_names};
use baseline::baseline;
use report::*;
use rollout::{Tracker, Watch, rollout};
use sim::{source_ip, spread, tls_channel};

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use futures::StreamExt;
use lks_proto::adminconf::AdminConf;
use lks_proto::backoff::{Backoff, retry_hint};
use lks_proto::pb;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use lks_proto::pb::agent_service_client::AgentServiceClient;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::Channel;

/// Attempts per agent at an enrolment refused with "try again".
const ENROL_ATTEMPTS: u32 = 20;

fn main() {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("error: {}", lks_proto::report::one_line(&*e).replace('\n', " "));
        std::process::exit(1);
    }
}

/// One simulated agent's credentials.
struct Creds {
    name: String,
    /// The cluster it enrolled in.
    cluster: String,
    cert_pem: String,
    key_pem: String,
}

/// The server agent `i` enrols with and connects to.
fn server_for(servers: &[String], i: usize) -> &str {
    &servers[i % servers.len()]
}

fn csr() -> Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    Ok((params.serialize_request(&key)?.pem()?, key.serialize_pem()))
}

async fn run(args: Args) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    raise_nofile();
    if args.agents == 0 {
        bail!("--agents must be at least 1");
    }
    if !(args.kill_at > 0.0 && args.kill_at <= 1.0) {
        bail!("--kill-at must be more than 0 and at most 1");
    }
    if args.storm && !args.kill_mid_rollout.is_empty() {
        bail!("--storm and --kill-mid-rollout do not go together");
    }
    let ours = cluster_names(&args);
    for (flag, named) in [("--fail-in", &args.fail_in), ("--slow-in", &args.slow_in)] {
        if let Some(c) = named.iter().find(|c| !ours.contains(c)) {
            bail!("{flag} {c}: not one of the load generator's clusters");
        }
    }
    if args.plan && !(1..=ours.len()).contains(&args.plan_groups) {
        bail!("--plan-groups must be 1 to {} (the clusters)", ours.len());
    }
    // Before anything else: SIGUSR1 must never find the default action
    // (terminate) in place.
    let mut sig = Signals::install()?;
    let report = if args.baseline {
        baseline(&args).await?
    } else {
        against_server(&args, &mut sig).await?
    };
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

/// The admin channel; right after the server was started it may not
/// listen yet, so that is retried for a while.
async fn admin_channel(conf: &AdminConf, just_started: bool) -> Result<Channel> {
    let t = Instant::now();
    loop {
        let r = tls_channel(
            &conf.server,
            &conf.ca_cert,
            Some((&conf.client_cert, &conf.client_key)),
            None,
        )
        .await;
        match r {
            Err(_) if just_started && t.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => return r,
        }
    }
}

async fn against_server(args: &Args, sig: &mut Signals) -> Result<Report> {
    let mut server = start_server(args).await?;
    let conf = AdminConf::load(&args.config).context("read admin.conf")?;
    let mut admin = AdminServiceClient::new(admin_channel(&conf, server.is_some()).await?);
    let tokens = create_tokens(args, &mut admin).await?;
    let run_id = &lks_proto::token::BootstrapToken::generate().id().to_string();
    let servers = if args.servers.is_empty() {
        vec![conf.server.clone()]
    } else {
        args.servers.clone()
    };
    let spread = spread(args, &servers);
    let sem = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let enrolled = enrol_all(args, &conf, &servers, &tokens, run_id, &sem).await;
    let creds = enrolled.creds;
    let mut errors = enrolled.errors;

    // Connect every agent and wait for its first desired state.
    let stats = Arc::new(sim::Stats::default());
    let held = Arc::new(sim::Held::new(servers.len()));
    let (back_tx, mut back_rx) = mpsc::unbounded_channel::<sim::Back>();
    let (desired_tx, mut desired_rx) = mpsc::channel::<sim::Desired>(creds.len().max(1) * 4);
    let urls = Arc::new(servers.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, c) in creds.iter().enumerate() {
        let agent = sim::Agent {
            i,
            urls: urls.clone(),
            ca: conf.ca_cert.clone(),
            cert: c.cert_pem.clone(),
            key: c.key_pem.clone(),
            first_server: args.first_agent + i,
            local: source_ip(spread, args.first_agent + i),
            stats: stats.clone(),
            held: held.clone(),
            back: back_tx.clone(),
            desired: desired_tx.clone(),
            stop: stop.clone(),
            fail: args.fail_in.contains(&c.cluster),
            slow: if args.slow_in.contains(&c.cluster) {
                Duration::from_millis(args.slow_ms)
            } else {
                Duration::ZERO
            },
        };
        let sem = sem.clone();
        tasks.spawn(async move {
            let permit = sem.acquire_owned().await?;
            agent.run(permit).await
        });
    }
    drop((back_tx, desired_tx));
    let (first_ms, connect_seconds) = first_messages(&stats, &mut back_rx, creds.len(), start).await;
    errors += creds.len() - first_ms.len();
    // With reconnects, a failed first attempt is retried, not lost: count it.
    errors += stats.failed_total(0) as usize;

    let storm_report = match server.as_mut() {
        Some(srv) => Some(storm::restart(args, srv, &stats, &mut back_rx, creds.len()).await?),
        None => None,
    };
    if server.is_some() {
        // The old admin connection went with the old process.
        admin = AdminServiceClient::new(admin_channel(&conf, true).await?);
    }

    // Optional rollout: fan-out and completion time (and, with
    // --kill-mid-rollout, the failover under it).
    let mut tracker = Tracker::new(creds.len());
    let mut w = Watch {
        stats: &stats,
        held: &held,
        desired_rx: &mut desired_rx,
        back_rx: &mut back_rx,
    };
    let (mut rollout_seconds, mut fanout, mut rollouts_started_seconds) = (None, None, None);
    if args.rollout {
        let r = rollout(args, &conf, &servers, &mut admin, run_id, &mut w, &mut tracker).await?;
        rollout_seconds = r.seconds;
        fanout = Some(r.fanout);
        rollouts_started_seconds = r.started_seconds;
    }
    hold(args, sig, &mut tracker, &mut w, creds.len()).await;
    let failover = tracker.killed_at.map(|k| tracker.failover(k, args, &w));
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    if !args.keep_nodes {
        errors += delete_nodes(&admin, &creds).await;
    }
    if let Some(mut srv) = server {
        srv.stop(false).await?;
    }
    Ok(Report {
        mode: "control-server",
        agents: args.agents,
        enrol_seconds: enrolled.seconds,
        enrol_per_second: enrolled.ms.len() as f64 / enrolled.seconds.max(1e-9),
        enrol: summarise(enrolled.ms),
        enrol_retries: enrolled.retries,
        connect_seconds,
        first_message: summarise(first_ms),
        rollout_seconds,
        rollouts_started_seconds,
        fanout,
        errors,
        assigned_twice: tracker.twice.iter().filter(|t| **t).count(),
        auth_errors: auth_total(&stats),
        failed_attempts: stats.counts(0, false),
        dropped_streams: stats.counts(0, true),
        storm: storm_report,
        failover,
    })
}

/// With `--storm`, the server from the command after `--`, started and
/// ready; without, none (and no such command).
async fn start_server(args: &Args) -> Result<Option<storm::ServerProc>> {
    if args.storm {
        let mut p = storm::ServerProc::start(&args.server_cmd, args.server_log.as_deref())?;
        p.wait_ready(&args.config).await?;
        Ok(Some(p))
    } else {
        if !args.server_cmd.is_empty() {
            bail!("a server command after `--` is only taken with --storm");
        }
        Ok(None)
    }
}

/// Each cluster (created unless it exists) and a join token for it.
async fn create_tokens(args: &Args, admin: &mut AdminServiceClient<Channel>) -> Result<Vec<String>> {
    let mut tokens = Vec::new();
    for cluster in cluster_names(args) {
        match admin
            .create_cluster(pb::CreateClusterRequest {
                name: cluster.clone(),
                ..Default::default()
            })
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => bail!("create cluster {cluster}: {}", s.message()),
        }
        let token = admin
            .create_token(pb::CreateTokenRequest {
                cluster: cluster.clone(),
                ttl_seconds: 3600,
                uses: 0,
                labels: Default::default(),
            })
            .await
            .map_err(|s| anyhow!("create token for {cluster}: {}", s.message()))?
            .into_inner()
            .token;
        tokens.push(token);
    }
    Ok(tokens)
}

/// What enrolling the agents gave: their credentials, how long each took,
/// the whole time, the retries, and the agents that failed.
struct Enrolled {
    creds: Vec<Creds>,
    ms: Vec<f64>,
    seconds: f64,
    retries: u64,
    errors: usize,
}

/// Enrols every agent, `--concurrency` at once, with a progress line.
async fn enrol_all(
    args: &Args,
    conf: &AdminConf,
    servers: &[String],
    tokens: &[String],
    run_id: &str,
    sem: &Arc<Semaphore>,
) -> Enrolled {
    let spread = spread(args, servers);
    let start = Instant::now();
    let retries = Arc::new(AtomicU64::new(0));
    let enrolled = Arc::new(AtomicU64::new(0));
    let progress_stop = tokio_util::sync::CancellationToken::new();
    let progress = storm::progress(
        "enrolled",
        args.agents,
        enrolled.clone(),
        progress_stop.clone(),
        {
            let retries = retries.clone();
            move || retries.load(Ordering::Relaxed)
        },
    );
    let clusters = cluster_names(args);
    let results: Vec<Result<(Creds, f64)>> = futures::stream::iter(0..args.agents)
        .map(|i| {
            let k = (args.first_agent + i) % tokens.len();
            let (sem, token, cluster, url, ca, retries, enrolled) = (
                sem.clone(),
                tokens[k].clone(),
                clusters[k].clone(),
                server_for(servers, args.first_agent + i).to_string(),
                conf.ca_cert.clone(),
                retries.clone(),
                enrolled.clone(),
            );
            let name = format!("lg-{run_id}-{i}");
            let local = source_ip(spread, args.first_agent + i);
            async move {
                let _permit = sem.acquire_owned().await?;
                let t = Instant::now();
                let mut creds = enrol_one(i, name, token, &url, &ca, local, &retries).await?;
                creds.cluster = cluster;
                enrolled.fetch_add(1, Ordering::Relaxed);
                Ok((creds, t.elapsed().as_secs_f64() * 1e3))
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let seconds = start.elapsed().as_secs_f64();
    progress_stop.cancel();
    let _ = progress.await;
    let mut out = Enrolled {
        creds: Vec::new(),
        ms: Vec::new(),
        seconds,
        retries: 0,
        errors: 0,
    };
    for r in results {
        match r {
            Ok((c, ms)) => {
                out.creds.push(c);
                out.ms.push(ms);
            }
            Err(e) => {
                if out.errors == 0 {
                    eprintln!("first enrolment error: {e:#}");
                }
                out.errors += 1;
            }
        }
    }
    out.retries = retries.load(Ordering::Relaxed);
    out
}

/// Enrols agent `i` as `name`: a key and CSR, then `Enroll`, retried the
/// way `lksadmin-agent join` retries.
async fn enrol_one(
    i: usize,
    name: String,
    token: String,
    url: &str,
    ca: &str,
    local: Option<IpAddr>,
    retries: &AtomicU64,
) -> Result<Creds> {
    let (csr_pem, key_pem) = csr()?;
    let mut c = AgentServiceClient::new(tls_channel(url, ca, None, local).await?);
    // `lksadmin-agent join`'s policy for a rate-limited enrolment
    // (join.rs), at least the server's hint.
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut attempt = 1;
    let resp = loop {
        let r = c
            .enroll(pb::EnrollRequest {
                token: token.clone(),
                node_name: name.clone(),
                csr_pem: csr_pem.clone(),
                labels: Default::default(),
            })
            .await;
        match r {
            Ok(r) => break r.into_inner(),
            Err(s) if is_try_again(&s) && attempt < ENROL_ATTEMPTS => {
                retries.fetch_add(1, Ordering::Relaxed);
                // Spread the retries out: 10–40 ms, growing.
                let ms = 10 * u64::from(attempt.min(4)) + (i % 7) as u64 * 5;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                attempt += 1;
            }
            Err(s) if s.code() == tonic::Code::ResourceExhausted && attempt < ENROL_ATTEMPTS => {
                retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff.next_delay_with(retry_hint(&s))).await;
                attempt += 1;
            }
            Err(s) => bail!("enrol {name}: {}", s.message()),
        }
    };
    Ok(Creds {
        name,
        cluster: String::new(),
        cert_pem: resp.certificate_pem,
        key_pem,
    })
}

/// Waits (with a progress line, up to a deadline that grows with `n`) for
/// each of `n` agents' first desired state; how long each took, and the
/// seconds since `start` all that took.
async fn first_messages(
    stats: &Arc<sim::Stats>,
    back_rx: &mut mpsc::UnboundedReceiver<sim::Back>,
    n: usize,
    start: Instant,
) -> (Vec<f64>, f64) {
    let connected = Arc::new(AtomicU64::new(0));
    let progress_stop = tokio_util::sync::CancellationToken::new();
    let progress = storm::progress("connected", n, connected.clone(), progress_stop.clone(), {
        let stats = stats.clone();
        move || stats.failed_total(0)
    });
    let mut first_ms = Vec::new();
    let mut seen = vec![false; n];
    let deadline = tokio::time::sleep(Duration::from_secs(120 + n as u64 / 10));
    tokio::pin!(deadline);
    while first_ms.len() < n {
        tokio::select! {
            got = back_rx.recv() => match got {
                Some(b) => if !std::mem::replace(&mut seen[b.agent], true) {
                    first_ms.push(b.at.duration_since(b.session_started).as_secs_f64() * 1e3);
                    connected.fetch_add(1, Ordering::Relaxed);
                },
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
    let connect_seconds = start.elapsed().as_secs_f64();
    progress_stop.cancel();
    let _ = progress.await;
    (first_ms, connect_seconds)
}

/// Hold: every agent keeps its stream; SIGUSR1 says another process
/// killed something (measure the way back from now), SIGTERM ends the
/// hold early.
async fn hold(args: &Args, sig: &mut Signals, tracker: &mut Tracker, w: &mut Watch<'_>, n: usize) {
    let hold_end = Instant::now() + Duration::from_secs(args.hold);
    while Instant::now() < hold_end {
        tracker.drain(w);
        tokio::select! {
            _ = sig.usr1.recv() => if tracker.killed_at.is_none() {
                eprintln!("told of a kill (SIGUSR1)");
                tracker.mark_kill(w);
            },
            _ = sig.term.recv() => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    tracker.drain(w);
    // An agent a replica asked to move (it held more than its share) is
    // held by nobody for up to its retry hint (≤ 2 s) and a connect: let
    // those in flight land before the final count, or it reports agents
    // missing that are merely moving.
    if tracker.killed_at.is_some() {
        let settle = Instant::now() + SETTLE;
        while w.held.total() < n as i64 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tracker.drain(w);
        }
    }
}

/// Deletes the agents' nodes, 32 at once; how many deletes failed.
async fn delete_nodes(admin: &AdminServiceClient<Channel>, creds: &[Creds]) -> usize {
    let deletes: Vec<_> = futures::stream::iter(creds.iter().map(|c| c.name.clone()))
        .map(|name| {
            let mut admin = admin.clone();
            async move { admin.delete_node(pb::DeleteNodeRequest { name }).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    deletes.iter().filter(|r| r.is_err()).count()
}

fn auth_total(stats: &sim::Stats) -> u64 {
    (0..sim::PHASES)
        .map(|p| auth(&stats.counts(p, true)) + auth(&stats.counts(p, false)))
        .sum()
}

/// The signals a load generator process answers.
struct Signals {
    usr1: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            usr1: signal(SignalKind::user_defined1()).context("handle SIGUSR1")?,
            term: signal(SignalKind::terminate()).context("handle SIGTERM")?,
        })
    }
}

/// The server's "conflict, try again" refusal (not a refused token).
fn is_try_again(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::FailedPrecondition && s.message().contains("try again")
}

/// Each simulated agent holds a socket; lift the soft limit to the hard one.
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_spread_round_robin_over_the_servers() {
        let servers: Vec<String> = ["https://a:1", "https://b:2", "https://c:3"]
            .map(String::from)
            .into();
        let got: Vec<&str> = (0..7).map(|i| server_for(&servers, i)).collect();
        assert_eq!(
            got,
            [
                "https://a:1",
                "https://b:2",
                "https://c:3",
                "https://a:1",
                "https://b:2",
                "https://c:3",
                "https://a:1"
            ]
        );
        let one = vec!["https://only:1".to_string()];
        assert!((0..5).all(|i| server_for(&one, i) == "https://only:1"));
    }
}
