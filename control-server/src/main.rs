//! `lks-control-server`: parses flags, sets up logging and signals, runs the
//! server.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use lks_control_server::{Config, run, server::raise_nofile_limit};
use lks_proto::duration::parse_duration;
use tokio_util::sync::CancellationToken;

/// lksadmin control server: enrols nodes, stores bundles, drives rollouts.
#[derive(Parser)]
#[command(name = "lks-control-server", version)]
struct Args {
    /// Directory for the CA, admin.conf, the database and blobs.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address of the gRPC (TLS) port for agents and lksctl.
    #[arg(long, default_value = "0.0.0.0:7443")]
    listen: SocketAddr,
    /// Address for /metrics and /healthz (plain HTTP); off if not given.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Host name or IP address agents dial; goes into the serving
    /// certificate, admin.conf and join commands.
    #[arg(long)]
    advertise_address: Option<String>,
    /// Validity of node certificates.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    node_cert_ttl: Duration,
    /// Where state lives.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    /// etcd endpoints, comma-separated (with --store etcd).
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// An agent .deb (lksadmin-agent_<version>_<arch>.deb) to offer new VMs
    /// at https://HOST:PORT/v1/agent-package/<arch>, where `lksctl token
    /// create --cloud-init` user-data downloads it; once per architecture.
    #[arg(long, value_name = "FILE")]
    agent_package: Vec<PathBuf>,
    /// How often each agent stream is pinged.
    #[arg(long, default_value = "30s", value_parser = parse_duration, hide = true)]
    ping_interval: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    /// SQLite in the data dir (one server).
    Sqlite,
    /// etcd shared by several servers.
    Etcd,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.store == StoreKind::Etcd {
        eprintln!("error: --store etcd is not supported by this build yet; use --store sqlite (the default)");
        return std::process::ExitCode::from(2);
    }
    if !args.etcd_endpoints.is_empty() {
        eprintln!("error: --etcd-endpoints needs --store etcd");
        return std::process::ExitCode::from(2);
    }
    if args.ping_interval.is_zero() {
        eprintln!("error: --ping-interval must be longer than zero");
        return std::process::ExitCode::from(2);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    raise_nofile_limit();

    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        signals.cancel();
    });

    let mut cfg = Config::new(args.data_dir, args.listen);
    cfg.metrics_listen = args.metrics_listen;
    cfg.advertise_address = args.advertise_address;
    cfg.node_cert_ttl = args.node_cert_ttl;
    cfg.ping_interval = args.ping_interval;
    cfg.agent_packages = args.agent_package;
    match run(cfg, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
