//! `lks-control-server`: parses flags, sets up logging and signals, runs the
//! server.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use lks_control_server::server::{StoreChoice, raise_nofile_limit};
use lks_control_server::store::EtcdConfig;
use lks_control_server::{Config, run};
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
    /// etcd endpoints, comma-separated (with --store etcd), e.g.
    /// https://etcd-0:2379,https://etcd-1:2379.
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// Key prefix every piece of state lives under in etcd.
    #[arg(long, default_value = "/lksadmin/v1/")]
    etcd_prefix: String,
    /// CA certificate (PEM) that signed etcd's serving certificates.
    #[arg(long, value_name = "FILE")]
    etcd_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd (with --etcd-key).
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for etcd (with --etcd-cert).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// 32 random bytes, base64: private keys kept in etcd are encrypted with
    /// it (AES-256-GCM). Create one with `head -c 32 /dev/urandom | base64`.
    #[arg(long, value_name = "FILE")]
    encryption_key_file: Option<PathBuf>,
    /// How long this replica's etcd lease lives without renewal: a dead
    /// replica's nodes show disconnected, and another replica drives
    /// rollouts, after at most this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_ttl: Duration,
    /// Largest file a bundle may carry without a mirror URL when the server
    /// runs on etcd (its bytes are kept in etcd), in bytes.
    #[arg(long, default_value_t = lks_control_server::blobsync::DEFAULT_MAX_BLOB)]
    etcd_max_blob_size: u64,
    /// Extra DNS name or IP address for the serving certificate (a load
    /// balancer or Service name in front of the replicas); repeatable.
    #[arg(long, value_name = "NAME")]
    tls_san: Vec<String>,
    /// URL join lines name instead of the replicas' own addresses, e.g. a
    /// load balancer in front of the replicas that tenant VMs can reach
    /// (its name belongs in --tls-san); repeatable, in order.
    #[arg(long, value_name = "URL")]
    join_url: Vec<String>,
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

/// The store the flags ask for, with etcd's TLS material read.
fn store_choice(args: &Args) -> Result<StoreChoice, String> {
    let etcd_flags = !args.etcd_endpoints.is_empty()
        || args.etcd_cacert.is_some()
        || args.etcd_cert.is_some()
        || args.etcd_prefix != "/lksadmin/v1/";
    if args.store == StoreKind::Sqlite {
        if etcd_flags {
            return Err(
                "--etcd-endpoints, --etcd-prefix, --etcd-cacert and --etcd-cert need --store etcd".into(),
            );
        }
        return Ok(StoreChoice::Sqlite);
    }
    if args.etcd_endpoints.is_empty() {
        return Err("--store etcd needs --etcd-endpoints URL[,URL…]".into());
    }
    for e in &args.etcd_endpoints {
        if !(e.starts_with("http://") || e.starts_with("https://")) || e.len() < 10 {
            return Err(format!(
                "--etcd-endpoints: {e:?} is not an http:// or https:// URL"
            ));
        }
    }
    if !args.etcd_prefix.starts_with('/') || args.etcd_prefix.contains("//") || args.etcd_prefix.len() < 2 {
        return Err(format!(
            "--etcd-prefix {:?} must be an absolute key prefix such as /lksadmin/v1/",
            args.etcd_prefix
        ));
    }
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("read {}: {e}", p.display()));
    let ca_pem = args.etcd_cacert.as_ref().map(read).transpose()?;
    let client_cert_pem = match (&args.etcd_cert, &args.etcd_key) {
        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
        _ => None,
    };
    Ok(StoreChoice::Etcd(EtcdConfig {
        endpoints: args.etcd_endpoints.clone(),
        prefix: args.etcd_prefix.clone(),
        ca_pem,
        client_cert_pem,
    }))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let store = match store_choice(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(u) = args
        .join_url
        .iter()
        .find(|u| !u.starts_with("https://") || u.contains(',') || u.len() < 9)
    {
        eprintln!("error: --join-url {u:?} is not one https:// URL");
        return std::process::ExitCode::from(2);
    }
    if args.lease_ttl < Duration::from_secs(2) {
        eprintln!("error: --lease-ttl must be at least 2s");
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
    cfg.store = store;
    cfg.encryption_key_file = args.encryption_key_file;
    cfg.tls_sans = args.tls_san;
    cfg.lease_ttl = args.lease_ttl;
    cfg.etcd_max_blob = args.etcd_max_blob_size;
    cfg.join_urls = args.join_url;
    match run(cfg, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
