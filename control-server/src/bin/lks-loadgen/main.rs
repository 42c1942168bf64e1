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
//! An enrolment the server refuses with "try again" (`FailedPrecondition`:
//! on etcd, concurrent enrolments conflict on shared documents) is retried
//! up to [`ENROL_ATTEMPTS`] times; the retries are counted in the report.
//!
//! On loopback, `--spread-source-ips` gives each agent its own 127.x.y.z
//! source address, as a fleet of VMs would have; without it the per-IP
//! enrolment rate limit of the server dominates the measurement.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use futures::StreamExt;
use lks_control_server::adminconf::AdminConf;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use lks_proto::pb::agent_service_client::AgentServiceClient;
use lks_proto::pb::{self, agent_message, server_message};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Attempts per agent at an enrolment refused with "try again".
const ENROL_ATTEMPTS: u32 = 20;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Simulate many lksadmin agents against a running control server"
)]
struct Args {
    /// admin.conf of the server under test.
    #[arg(long, env = "LKSCTL_CONFIG", default_value = "admin.conf")]
    config: PathBuf,
    /// Cluster to enrol the simulated agents into (created if missing).
    #[arg(long)]
    cluster: String,
    /// Number of simulated agents.
    #[arg(long)]
    agents: usize,
    /// Replicas to spread the agents over, comma-separated (agent i uses
    /// the (i mod n)-th); default: admin.conf's server.
    #[arg(long, value_delimiter = ',', value_name = "URL")]
    servers: Vec<String>,
    /// Seconds to keep every stream open after all agents connected.
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// Agents enrolling or connecting at the same time.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give each agent its own 127.x.y.z source address (loopback servers only).
    #[arg(long)]
    spread_source_ips: bool,
    /// Publish a file-less bundle and roll it out to all simulated agents.
    #[arg(long)]
    rollout: bool,
    /// Batch size of that rollout (default: all agents at once).
    #[arg(long)]
    batch_size: Option<u32>,
    /// Measure an idle in-process tonic server instead (no control server needed).
    #[arg(long)]
    baseline: bool,
    /// Keep the enrolled nodes instead of deleting them at the end.
    #[arg(long)]
    keep_nodes: bool,
    /// Output format: text or json.
    #[arg(short = 'o', long, default_value = "text")]
    output: String,
}

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
        eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}

/// Latencies in milliseconds, summarised.
#[derive(serde::Serialize, Default)]
struct Summary {
    count: usize,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

fn summarise(mut v: Vec<f64>) -> Summary {
    if v.is_empty() {
        return Summary::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Summary {
        count: v.len(),
        p50_ms: at(0.5),
        p90_ms: at(0.9),
        p99_ms: at(0.99),
        max_ms: v[v.len() - 1],
    }
}

#[derive(serde::Serialize)]
struct Report {
    mode: &'static str,
    agents: usize,
    enrol_seconds: f64,
    enrol_per_second: f64,
    enrol: Summary,
    /// Enrolments refused with "try again" and retried.
    enrol_retries: u64,
    connect_seconds: f64,
    /// Connection start → first desired state (baseline: first Watch message).
    first_message: Summary,
    rollout_seconds: Option<f64>,
    /// Rollout start → agent holds the new desired state.
    fanout: Option<Summary>,
    errors: usize,
}

/// One simulated agent's credentials.
struct Creds {
    name: String,
    cert_pem: String,
    key_pem: String,
}

/// The server agent `i` enrols with and connects to.
fn server_for(servers: &[String], i: usize) -> &str {
    &servers[i % servers.len()]
}

fn source_ip(spread: bool, i: usize) -> Option<IpAddr> {
    // 127.1.0.0/16 upwards: avoids 127.0.0.1, which the server itself uses.
    spread.then(|| {
        IpAddr::V4(Ipv4Addr::new(
            127,
            1 + (i / 65_000) as u8,
            ((i / 250) % 260) as u8,
            (i % 250 + 2) as u8,
        ))
    })
}

async fn tls_channel(
    url: &str,
    ca_pem: &str,
    id: Option<(&str, &str)>,
    local: Option<IpAddr>,
) -> Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = id {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(url.to_string())?
        .tls_config(tls)?
        .local_address(local)
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("connect to {url}"))
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
    let report = if args.baseline {
        baseline(&args).await?
    } else {
        against_server(&args).await?
    };
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

async fn against_server(args: &Args) -> Result<Report> {
    let conf = AdminConf::load(&args.config).map_err(|e| anyhow!("read admin.conf: {e}"))?;
    let admin_ch = tls_channel(
        &conf.server,
        &conf.ca_cert,
        Some((&conf.client_cert, &conf.client_key)),
        None,
    )
    .await?;
    let mut admin = AdminServiceClient::new(admin_ch);
    match admin
        .create_cluster(pb::CreateClusterRequest {
            name: args.cluster.clone(),
            ..Default::default()
        })
        .await
    {
        Ok(_) => {}
        Err(s) if s.code() == tonic::Code::AlreadyExists => {}
        Err(s) => bail!("create cluster {}: {}", args.cluster, s.message()),
    }
    let token = admin
        .create_token(pb::CreateTokenRequest {
            cluster: args.cluster.clone(),
            ttl_seconds: 3600,
            uses: 0,
            labels: Default::default(),
        })
        .await
        .map_err(|s| anyhow!("create token: {}", s.message()))?
        .into_inner()
        .token;
    let run_id = &lks_proto::token::BootstrapToken::generate().id().to_string();
    let servers = if args.servers.is_empty() {
        vec![conf.server.clone()]
    } else {
        args.servers.clone()
    };

    // Enrol.
    let sem = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let start = Instant::now();
    let retries = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let results: Vec<Result<(Creds, f64)>> = futures::stream::iter(0..args.agents)
        .map(|i| {
            let (sem, token, url, ca, retries) = (
                sem.clone(),
                token.clone(),
                server_for(&servers, i).to_string(),
                conf.ca_cert.clone(),
                retries.clone(),
            );
            let name = format!("lg-{run_id}-{i}");
            let local = source_ip(args.spread_source_ips, i);
            async move {
                let _permit = sem.acquire_owned().await?;
                let t = Instant::now();
                let (csr_pem, key_pem) = csr()?;
                let mut c = AgentServiceClient::new(tls_channel(&url, &ca, None, local).await?);
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
                            retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            // Spread the retries out: 10–40 ms, growing.
                            let ms = 10 * u64::from(attempt.min(4)) + (i % 7) as u64 * 5;
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            attempt += 1;
                        }
                        Err(s) => bail!("enrol {name}: {}", s.message()),
                    }
                };
                Ok((
                    Creds {
                        name,
                        cert_pem: resp.certificate_pem,
                        key_pem,
                    },
                    t.elapsed().as_secs_f64() * 1e3,
                ))
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let enrol_seconds = start.elapsed().as_secs_f64();
    let mut errors = 0;
    let mut creds = Vec::new();
    let mut enrol_ms = Vec::new();
    for r in results {
        match r {
            Ok((c, ms)) => {
                creds.push(c);
                enrol_ms.push(ms);
            }
            Err(e) => {
                if errors == 0 {
                    eprintln!("first enrolment error: {e:#}");
                }
                errors += 1;
            }
        }
    }

    // Connect every agent and wait for its first desired state.
    let (first_tx, mut first_rx) = mpsc::channel::<(usize, f64)>(creds.len().max(1));
    let (desired_tx, mut desired_rx) = mpsc::channel::<(usize, Instant, Vec<String>)>(creds.len().max(1) * 4);
    let stop = tokio_util::sync::CancellationToken::new();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, c) in creds.iter().enumerate() {
        let (sem, url, ca) = (
            sem.clone(),
            server_for(&servers, i).to_string(),
            conf.ca_cert.clone(),
        );
        let (cert, key) = (c.cert_pem.clone(), c.key_pem.clone());
        let (first_tx, desired_tx, stop) = (first_tx.clone(), desired_tx.clone(), stop.clone());
        let local = source_ip(args.spread_source_ips, i);
        tasks.spawn(async move {
            let permit = sem.acquire_owned().await?;
            let t = Instant::now();
            let ch = tls_channel(&url, &ca, Some((&cert, &key)), local).await?;
            simulate_agent(i, ch, t, permit, first_tx, desired_tx, stop).await
        });
    }
    drop((first_tx, desired_tx));
    let mut first_ms = Vec::new();
    let deadline = tokio::time::sleep(Duration::from_secs(120 + creds.len() as u64 / 10));
    tokio::pin!(deadline);
    while first_ms.len() < creds.len() {
        tokio::select! {
            got = first_rx.recv() => match got {
                Some((_, ms)) => first_ms.push(ms),
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
    let connect_seconds = start.elapsed().as_secs_f64();
    errors += creds.len() - first_ms.len();

    // Optional rollout: fan-out and completion time.
    let (mut rollout_seconds, mut fanout) = (None, None);
    if args.rollout {
        let bundle = format!("lg-{run_id}");
        let manifest = pb::Manifest {
            name: bundle.clone(),
            version: "1".into(),
            ..Default::default()
        };
        let header = pb::PublishBundleRequest {
            msg: Some(pb::publish_bundle_request::Msg::Header(pb::SignedBundle {
                manifest: Some(manifest),
                ..Default::default()
            })),
        };
        admin
            .publish_bundle(futures::stream::iter([header]))
            .await
            .map_err(|s| anyhow!("publish {bundle}@1: {}", s.message()))?;
        while desired_rx.try_recv().is_ok() {}
        let t0 = Instant::now();
        let id = admin
            .start_rollout(pb::StartRolloutRequest {
                cluster: args.cluster.clone(),
                bundle: bundle.clone(),
                version: "1".into(),
                batch_size: args.batch_size.unwrap_or(creds.len() as u32),
                failure_threshold: creds.len() as u32,
                ..Default::default()
            })
            .await
            .map_err(|s| anyhow!("start rollout: {}", s.message()))?
            .into_inner()
            .id;
        let mut seen = vec![None::<f64>; creds.len()];
        let mut done = None;
        let limit = Instant::now() + Duration::from_secs(300);
        while done.is_none() && Instant::now() < limit {
            while let Ok((i, at, bundles)) = desired_rx.try_recv() {
                if seen[i].is_none() && bundles.contains(&bundle) {
                    seen[i] = Some(at.saturating_duration_since(t0).as_secs_f64() * 1e3);
                }
            }
            let r = admin
                .get_rollout(pb::RolloutRef { id: id.clone() })
                .await
                .map_err(|s| anyhow!("rollout status: {}", s.message()))?
                .into_inner();
            if !matches!(pb::RolloutState::try_from(r.state), Ok(pb::RolloutState::Running)) {
                done = Some(t0.elapsed().as_secs_f64());
                if !matches!(
                    pb::RolloutState::try_from(r.state),
                    Ok(pb::RolloutState::Completed)
                ) {
                    bail!(
                        "rollout {id} ended {:?}: {}",
                        pb::RolloutState::try_from(r.state),
                        r.message
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while let Ok((i, at, bundles)) = desired_rx.try_recv() {
            if seen[i].is_none() && bundles.contains(&bundle) {
                seen[i] = Some(at.saturating_duration_since(t0).as_secs_f64() * 1e3);
            }
        }
        rollout_seconds = done;
        fanout = Some(summarise(seen.into_iter().flatten().collect()));
    }

    tokio::time::sleep(Duration::from_secs(args.hold)).await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    if !args.keep_nodes {
        let deletes: Vec<_> = futures::stream::iter(creds.iter().map(|c| c.name.clone()))
            .map(|name| {
                let mut admin = admin.clone();
                async move { admin.delete_node(pb::DeleteNodeRequest { name }).await }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        errors += deletes.iter().filter(|r| r.is_err()).count();
    }
    Ok(Report {
        mode: "control-server",
        agents: args.agents,
        enrol_seconds,
        enrol_per_second: enrol_ms.len() as f64 / enrol_seconds.max(1e-9),
        enrol: summarise(enrol_ms),
        enrol_retries: retries.load(std::sync::atomic::Ordering::Relaxed),
        connect_seconds,
        first_message: summarise(first_ms),
        rollout_seconds,
        fanout,
        errors,
    })
}

/// The server's "conflict, try again" refusal (not a refused token).
fn is_try_again(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::FailedPrecondition && s.message().contains("try again")
}

/// One agent's stream: Hello, then answer pings, acknowledge desired states
/// as applied, heartbeat every 10 s, until `stop`.
async fn simulate_agent(
    i: usize,
    ch: Channel,
    started: Instant,
    permit: tokio::sync::OwnedSemaphorePermit,
    first_tx: mpsc::Sender<(usize, f64)>,
    desired_tx: mpsc::Sender<(usize, Instant, Vec<String>)>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<()> {
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(8);
    let send = |m| pb::AgentMessage { msg: Some(m) };
    tx.send(send(agent_message::Msg::Hello(pb::Hello {
        agent_version: "lks-loadgen".into(),
        facts: Some(pb::NodeFacts {
            hostname: format!("loadgen-{i}"),
            ..Default::default()
        }),
        ..Default::default()
    })))
    .await?;
    let mut inbound = AgentServiceClient::new(ch)
        .connect(ReceiverStream::new(rx))
        .await?
        .into_inner();
    // Taken on the first desired state; dropping the sender tells the
    // collector this agent is done connecting.
    let mut first_tx = Some(first_tx);
    let mut permit = Some(permit);
    let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
    let mut seq = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = heartbeat.tick() => {
                seq += 1;
                let _ = tx.try_send(send(agent_message::Msg::Heartbeat(pb::Heartbeat { seq })));
            }
            msg = inbound.message() => match msg?.and_then(|m| m.msg) {
                None => return Ok(()),
                Some(server_message::Msg::Desired(d)) => {
                    let at = Instant::now();
                    if let Some(first) = first_tx.take() {
                        permit.take();
                        let _ = first.send((i, at.duration_since(started).as_secs_f64() * 1e3)).await;
                    }
                    let names: Vec<String> = d.bundles.iter().filter_map(|b| b.manifest.as_ref().map(|m| m.name.clone())).collect();
                    let statuses = d.bundles.iter().filter_map(|b| b.manifest.as_ref()).map(|m| pb::BundleStatus {
                        name: m.name.clone(),
                        version: m.version.clone(),
                        state: pb::BundleState::Applied as i32,
                        ..Default::default()
                    }).collect();
                    let _ = desired_tx.try_send((i, at, names));
                    tx.send(send(agent_message::Msg::Status(pb::StatusReport { generation: d.generation, bundles: statuses }))).await?;
                }
                Some(server_message::Msg::Ping(p)) => {
                    let _ = tx.try_send(send(agent_message::Msg::Pong(pb::Pong { nonce: p.nonce })));
                }
                Some(server_message::Msg::Command(_)) => {}
            }
        }
    }
}

/// The same connection pattern against an idle tonic server: mTLS, one
/// server stream per client (tonic-health `Watch`), first message timed.
async fn baseline(args: &Args) -> Result<Report> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate()?;
    let server_cert =
        CertificateParams::new(vec!["localhost".to_string()])?.signed_by(&server_key, &issuer)?;

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(Identity::from_pem(server_cert.pem(), server_key.serialize_pem()))
        .client_ca_root(Certificate::from_pem(&ca_pem));
    let server = tonic::transport::Server::builder()
        .tls_config(tls)?
        .add_service(health)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);

    // Client certificates are made up front: the measurement is the
    // connection, as it is for the agents (whose keys exist before `run`).
    let mut clients = Vec::with_capacity(args.agents);
    for _ in 0..args.agents {
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(Vec::<String>::new())?.signed_by(&key, &issuer)?;
        clients.push((cert.pem(), key.serialize_pem()));
    }
    let url = format!("https://localhost:{}", addr.port());
    let sem = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let stop = tokio_util::sync::CancellationToken::new();
    let (first_tx, mut first_rx) = mpsc::channel::<f64>(args.agents);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (cert, key)) in clients.into_iter().enumerate() {
        let (sem, url, ca, stop, first_tx) = (
            sem.clone(),
            url.clone(),
            ca_pem.clone(),
            stop.clone(),
            first_tx.clone(),
        );
        let local = source_ip(args.spread_source_ips, i);
        tasks.spawn(async move {
            let permit = sem.acquire_owned().await?;
            let t = Instant::now();
            let ch = tls_channel(&url, &ca, Some((&cert, &key)), local).await?;
            let mut c = tonic_health::pb::health_client::HealthClient::new(ch);
            let mut s = c
                .watch(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await?
                .into_inner();
            s.message().await?;
            first_tx.send(t.elapsed().as_secs_f64() * 1e3).await?;
            // Dropping the sender tells the collector this client is done.
            drop(first_tx);
            drop(permit);
            // Hold the stream open, as an agent does.
            stop.cancelled().await;
            Ok::<_, anyhow::Error>(())
        });
    }
    drop(first_tx);
    let mut first_ms = Vec::with_capacity(args.agents);
    while let Some(ms) = first_rx.recv().await {
        first_ms.push(ms);
    }
    let connect_seconds = start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(args.hold)).await;
    stop.cancel();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        if !matches!(r, Ok(Ok(()))) {
            errors += 1;
        }
    }
    server.abort();
    Ok(Report {
        mode: "baseline-tonic-health",
        agents: args.agents,
        enrol_seconds: 0.0,
        enrol_per_second: 0.0,
        enrol: Summary::default(),
        enrol_retries: 0,
        connect_seconds,
        first_message: summarise(first_ms),
        rollout_seconds: None,
        fanout: None,
        errors,
    })
}

fn print_text(r: &Report) {
    let s = |x: &Summary| {
        format!(
            "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
            x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, x.count
        )
    };
    println!("mode:            {}", r.mode);
    println!("agents:          {}", r.agents);
    if r.mode == "control-server" {
        println!(
            "enrolment:       {:.2} s, {:.0}/s; {} ({} retried)",
            r.enrol_seconds,
            r.enrol_per_second,
            s(&r.enrol),
            r.enrol_retries
        );
    }
    println!("connect (all):   {:.2} s", r.connect_seconds);
    println!("first message:   {}", s(&r.first_message));
    if let (Some(t), Some(f)) = (r.rollout_seconds, &r.fanout) {
        println!("rollout:         completed in {t:.2} s; fan-out {}", s(f));
    }
    println!("errors:          {}", r.errors);
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
