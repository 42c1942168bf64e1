//! The baseline the benchmarks compare against: the same connection
//! pattern against an idle tonic server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::{Certificate, Identity};

use crate::args::Args;
use crate::report::{Report, Summary, summarise};
use crate::sim::{source_ip, spread, tls_channel};

/// The same connection pattern against an idle tonic server: mTLS, one
/// server stream per client (tonic-health `Watch`), first message timed.
pub(crate) async fn baseline(args: &Args) -> Result<Report> {
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
    let spread = spread(args, std::slice::from_ref(&url));
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
        let local = source_ip(spread, i);
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
        rollouts_started_seconds: None,
        fanout: None,
        errors,
        assigned_twice: 0,
        auth_errors: 0,
        failed_attempts: Default::default(),
        dropped_streams: Default::default(),
        storm: None,
        failover: None,
    })
}
