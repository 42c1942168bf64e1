//! Wiring: data dir, PKI, store, blob store, the gRPC server (agent and admin
//! APIs, health, reflection) on one TLS port, metrics, background tasks, and
//! graceful shutdown.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lks_pki::PkiError;
use lks_pki::clusterca::ClusterCas;
use lks_pki::seal::SealError;
use lks_proto::pb;
use lks_proto::pb::admin_service_server::AdminServiceServer;
use lks_proto::pb::agent_service_server::AgentServiceServer;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;

use crate::adminconf::AdminConfError;
use crate::admission::{HandshakeLimits, Handshakes, OpenGate};
use crate::api::{AdminApi, AgentApi};
use crate::context::Shared;
use crate::controller;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::packages::{AgentPackages, PackageError, PackageLayer};
use crate::ratelimit::RateLimiter;
use crate::replicas;
use crate::store::{EtcdConfig, StoreError};
use lks_blobs::{BlobChoice, BlobError, Blobs};

mod open;
mod tasks;

use open::{Opened, certificate_names, open_blobs, open_store, preflight, write_first_admin_conf};
use tasks::{Feeds, serve_fleetlock, serve_metrics, spawn_tasks};

/// How long audit records are kept unless `--audit-retention` says.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);
/// Enrolment rate per peer IP: tokens per second and burst.
const ENROLL_RATE: f64 = 5.0;
const ENROLL_BURST: f64 = 20.0;

/// Everything `lks-control-server` is told on its command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the FleetLock listener (plain HTTP); off if not given.
    pub fleetlock_listen: Option<SocketAddr>,
    /// Serve FleetLock over TLS with the server's own certificate.
    pub fleetlock_tls: bool,
    pub advertise_address: Option<String>,
    pub node_cert_ttl: Duration,
    /// How long shutdown waits for streams and tasks to finish.
    pub shutdown_grace: Duration,
    /// How often the server pings each agent stream.
    pub ping_interval: Duration,
    /// Agent `.deb` files offered to new VMs over HTTPS (one per architecture).
    pub agent_packages: Vec<PathBuf>,
    /// How long one agent package download may take (then it is cut).
    pub agent_package_deadline: Duration,
    /// Where state lives.
    pub store: StoreChoice,
    /// Key that seals private keys kept in etcd.
    pub encryption_key_file: Option<PathBuf>,
    /// Extra DNS names or IP addresses for this replica's serving certificate.
    pub tls_sans: Vec<String>,
    /// TTL of this replica's etcd lease: how long a dead replica's nodes
    /// still show connected and how long until another replica leads.
    pub lease_ttl: Duration,
    /// Where blobs are durable (`--blob-store`).
    pub blob_store: BlobChoice,
    /// Largest blob kept in etcd (`--blob-store etcd`).
    pub etcd_max_blob: u64,
    /// How often the leader collects blobs no bundle version references
    /// (`None`: never).
    pub blob_gc_interval: Option<Duration>,
    /// How long an unreferenced blob is kept after a publish claimed it
    /// (longer than any publish takes).
    pub blob_gc_grace: Duration,
    /// How long audit records are kept (`None`: forever).
    pub audit_retention: Option<Duration>,
    /// How often the leader makes the binary deltas it lacks (`None`:
    /// never; none are offered then).
    pub delta_interval: Option<Duration>,
    /// Bounds of the delta maker.
    pub delta_limits: lks_blobs::delta::Limits,
    /// How often a replica compares its load with the others' and moves
    /// agents if it holds clearly more than its share (`None`: never).
    pub rebalance_interval: Option<Duration>,
    /// URLs join lines name instead of the replicas' own addresses (a load
    /// balancer agents outside kube0 can reach).
    pub join_urls: Vec<String>,
    /// TLS handshakes at once, and how long a connection may wait for one.
    pub handshakes: HandshakeLimits,
    /// `Connect` streams being opened at once before more are refused
    /// with a retry hint.
    pub max_streams_opening: usize,
}

/// The store behind the server.
#[derive(Clone, Debug)]
pub enum StoreChoice {
    /// SQLite in the data dir: one server.
    Sqlite,
    /// etcd shared by several replicas.
    Etcd(EtcdConfig),
}

impl Config {
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Self {
        Config {
            data_dir,
            listen,
            metrics_listen: None,
            fleetlock_listen: None,
            fleetlock_tls: false,
            advertise_address: None,
            node_cert_ttl: Duration::from_secs(24 * 3600),
            shutdown_grace: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            agent_packages: Vec::new(),
            agent_package_deadline: crate::packages::DOWNLOAD_DEADLINE,
            store: StoreChoice::Sqlite,
            encryption_key_file: None,
            tls_sans: Vec::new(),
            lease_ttl: Duration::from_secs(10),
            blob_store: BlobChoice::Default,
            etcd_max_blob: lks_blobs::DEFAULT_MAX_BLOB,
            blob_gc_interval: Some(lks_blobs::gc::DEFAULT_INTERVAL),
            blob_gc_grace: lks_blobs::gc::DEFAULT_GRACE,
            audit_retention: Some(DEFAULT_AUDIT_RETENTION),
            delta_interval: Some(lks_blobs::delta::DEFAULT_INTERVAL),
            delta_limits: lks_blobs::delta::Limits::default(),
            rebalance_interval: Some(crate::rebalance::DEFAULT_INTERVAL),
            join_urls: Vec::new(),
            handshakes: HandshakeLimits::default(),
            max_streams_opening: crate::admission::MAX_STREAMS_OPENING,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("create data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("set up PKI: {0}")]
    Pki(#[from] PkiError),
    #[error("open store: {0}")]
    Store(#[from] StoreError),
    #[error("open blob store: {0}")]
    Blobs(#[from] BlobError),
    /// The blob store's check at start failed; the error names the store.
    #[error("{0}")]
    BlobStore(BlobError),
    #[error("write admin.conf: {0}")]
    AdminConf(#[from] AdminConfError),
    #[error("{0}")]
    AgentPackage(#[from] PackageError),
    #[error("{0}")]
    Seal(#[from] SealError),
    #[error("shared identity in etcd: {0}")]
    Identity(#[from] replicas::IdentityError),
    #[error("{0}")]
    Usage(String),
    #[error("configure TLS: {0}")]
    Tls(lks_proto::tls::TlsSetupError),
    #[error("gRPC server: {0}")]
    Serve(String),
}

/// Raises the soft open-file limit to the hard one: every agent stream is a
/// socket.
pub fn raise_nofile_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised open-file limit"),
            Err(e) => tracing::warn!(error = %e, "could not raise open-file limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read open-file limit"),
    }
}

/// The host name agents are told to dial.
fn advertise_host(cfg: &Config, local: SocketAddr) -> String {
    if let Some(a) = &cfg.advertise_address {
        return a.trim_start_matches('[').trim_end_matches(']').to_string();
    }
    if !local.ip().is_unspecified() {
        return local.ip().to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn url_host(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]"),
        _ => host.to_string(),
    }
}

/// How long to wait before accepting again after an accept failed for lack
/// of resources.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// True for accept errors that say the process or the system is out of
/// descriptors or memory: they last until something is closed or freed.
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
    )
}

/// Accepted connections (no Nagle). At its open-file limit the listener
/// stays readable while every accept fails, so retrying at once would spin
/// a core (tonic's `TcpIncoming` does): the loop waits [`ACCEPT_BACKOFF`]
/// instead, says so once, and says again when it accepts. The connections
/// already open are untouched, and the ones waiting in the backlog are
/// taken as soon as descriptors are free. Other accept errors (a peer gone
/// before it was accepted) only affect that peer.
fn accept_loop(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    futures::stream::unfold((listener, false), |(listener, mut starved)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if starved {
                        tracing::info!("accepting connections again");
                    }
                    let _ = stream.set_nodelay(true);
                    return Some((Ok(stream), (listener, false)));
                }
                Err(e) if out_of_resources(&e) => {
                    if !starved {
                        tracing::warn!(
                            error = %e,
                            "cannot accept new connections (raise the open-file limit?); keeping the open ones and retrying"
                        );
                        starved = true;
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                Err(e) => tracing::debug!(error = %e, "accept failed"),
            }
        }
    })
}

/// Runs the control server until `shutdown` fires: opens the store (and
/// the identity it holds), opens the blobs, spawns the background tasks,
/// serves, and shuts down.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), ServerError> {
    // Only ring is compiled in; installing it explicitly keeps rustls from
    // guessing. An error means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let package_candidates = preflight(&cfg).await?;
    let (listener, local) = bind(&cfg).await?;
    let host = advertise_host(&cfg, local);
    let server_url = format!("https://{}:{}", url_host(&host), local.port());
    let opened = open_store(&cfg, &cfg.data_dir, &certificate_names(&cfg, &host)).await?;
    let known = write_first_admin_conf(&cfg.data_dir, &server_url, &opened.pki, opened.etcd.as_ref()).await?;
    tracing::info!(ca_cert_hash = %opened.pki.ca_hash(), server = %server_url, "control server identity");
    let (blobs, agent_packages) = open_blobs(&cfg, opened.etcd.as_ref(), package_candidates).await?;

    let etcd = opened.etcd.clone();
    let (shared, feeds) = share(
        &cfg,
        opened,
        Opening {
            blobs,
            agent_packages,
            known,
            server_url,
        },
        shutdown.child_token(),
    );
    if let Some(addr) = cfg.metrics_listen {
        serve_metrics(&shared, addr).await?;
    }
    if let Some(addr) = cfg.fleetlock_listen {
        serve_fleetlock(&shared, addr, cfg.fleetlock_tls).await?;
    }
    spawn_tasks(&shared, &cfg, etcd.as_ref(), feeds);

    let result = serve(&shared, &cfg, listener, local).await;
    shut_down(&shared, &cfg).await;
    result
}

/// The gRPC port, bound: the listener and the address it took.
async fn bind(cfg: &Config) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: cfg.listen,
        source,
    })?;
    Ok((listener, local))
}

/// What start-up opened besides the store, for [`share`].
struct Opening {
    blobs: Blobs,
    agent_packages: AgentPackages,
    /// Every replica's URL known at start (this one's first).
    known: Vec<String>,
    server_url: String,
}

/// What is shared (built once here) and the ends of its channels that the
/// background tasks feed.
fn share(cfg: &Config, opened: Opened, o: Opening, cancel: CancellationToken) -> (Arc<Shared>, Feeds) {
    let Opened {
        store,
        etcd,
        pki,
        seal,
    } = opened;
    let (rollout_updates, _) = watch::channel(0);
    let (rollouts, rollout_inbox) = controller::channel();
    let (leader_tx, leader) = watch::channel(etcd.is_none());
    let (servers_tx, servers) = watch::channel(o.known);
    let seal = seal.map(Arc::new);
    let cluster_cas = ClusterCas::new(store.clone(), seal.clone());
    let tenants = Arc::new(lks_kube::tenant::TenantApis::new(store.clone(), seal));
    let shared = Arc::new(Shared {
        cluster_cas: Arc::new(cluster_cas),
        reboot_gates: Arc::new(crate::rebootgates::Gates::new(tenants.clone())),
        tenants,
        store,
        leader,
        servers,
        join_urls: cfg.join_urls.clone(),
        blobs: Arc::new(o.blobs),
        agent_packages: Arc::new(o.agent_packages),
        pki: Arc::new(pki),
        hub: Arc::new(Hub::default()),
        peers: Arc::new(crate::peers::PeerCache::default()),
        releases: Arc::new(crate::releases::ReleaseCache::default()),
        metrics: Arc::new(Metrics::default()),
        limiter: Arc::new(RateLimiter::new(ENROLL_RATE, ENROLL_BURST)),
        opening: Arc::new(OpenGate::new(
            cfg.max_streams_opening,
            crate::admission::STREAM_OPEN_WAIT,
        )),
        issue_limiter: Arc::new(RateLimiter::new(0.1, 64.0)),
        rollouts_changed: Arc::new(Notify::new()),
        rollouts,
        rollout_updates,
        server_url: o.server_url,
        node_cert_ttl: cfg.node_cert_ttl,
        ping_interval: cfg.ping_interval,
        cancel,
        tasks: TaskTracker::new(),
        tracker: Arc::new(lks_tracker::Tracker::new(etcd.clone())),
    });
    let feeds = Feeds {
        leader_tx,
        servers_tx,
        rollout_inbox,
    };
    (shared, feeds)
}

/// Serves gRPC (agents and admins, health, reflection, agent packages)
/// over TLS on `listener` until the server is cancelled, then gives open
/// connections `--shutdown-grace` to end.
async fn serve(
    shared: &Arc<Shared>,
    cfg: &Config,
    listener: TcpListener,
    local: SocketAddr,
) -> Result<(), ServerError> {
    let cancel = shared.cancel.clone();
    let tls = crate::tlsaccept::server_config(
        &shared.pki.server_chain_pem,
        &shared.pki.server_key_pem,
        shared.pki.ca_pem(),
    )
    .map_err(ServerError::Tls)?;
    let handshakes = Handshakes::new(cfg.handshakes);
    {
        let h = handshakes.clone();
        shared.metrics.gauge(
            "lks_tls_handshakes_in_progress",
            "TLS handshakes running (at most --max-tls-handshakes).",
            move || h.in_progress() as i64,
        );
        let s = Arc::downgrade(shared);
        shared.metrics.gauge(
            "lks_streams_opening",
            "Connect streams between the call and their first desired state.",
            move || s.upgrade().map_or(0, |s| s.opening.opening() as i64),
        );
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServiceServer<AgentApi>>()
        .await;
    health_reporter
        .set_serving::<AdminServiceServer<AdminApi>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Serve(e.to_string()))?;

    let router = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .http2_max_header_list_size(lks_proto::wire::MAX_HEADER_LIST)
        // GET /v1/agent-package/ARCH (packages.rs); everything else is gRPC.
        .layer(PackageLayer::new(
            shared.agent_packages.clone(),
            shared.metrics.clone(),
            cfg.agent_package_deadline,
        ))
        // A request that does not decode is the client's fault (wire.rs).
        .layer(lks_proto::wire::MalformedRequestLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(
            AgentServiceServer::new(AgentApi::new(shared))
                .max_decoding_message_size(lks_proto::wire::MAX_MESSAGE),
        )
        .add_service(
            AdminServiceServer::new(AdminApi::new(shared))
                .max_decoding_message_size(lks_proto::wire::MAX_MESSAGE),
        );
    tracing::info!(
        addr = %local,
        max_tls_handshakes = cfg.handshakes.max_in_progress,
        "serving gRPC"
    );

    let incoming = Box::pin(crate::tlsaccept::incoming(
        accept_loop(listener),
        tls,
        handshakes,
        shared.metrics.clone(),
        cancel.clone(),
    ));
    let server_cancel = cancel.clone();
    let serve = router.serve_with_incoming_shutdown(incoming, async move { server_cancel.cancelled().await });
    tokio::pin!(serve);
    tokio::select! {
        r = &mut serve => r.map_err(|e| ServerError::Serve(e.to_string())),
        _ = cancel.cancelled() => {
            tracing::info!("shutting down");
            shared.hub.close_all();
            match tokio::time::timeout(cfg.shutdown_grace, &mut serve).await {
                Ok(r) => r.map_err(|e| ServerError::Serve(e.to_string())),
                Err(_) => {
                    tracing::warn!(grace = ?cfg.shutdown_grace, "connections still open after the grace period; closing them");
                    Ok(())
                }
            }
        }
    }
}

/// After serving: background tasks stopped (within the grace), heartbeats
/// flushed, every node marked disconnected, admission totals logged.
async fn shut_down(shared: &Arc<Shared>, cfg: &Config) {
    shared.cancel.cancel();
    shared.tasks.close();
    if tokio::time::timeout(cfg.shutdown_grace, shared.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks still running after the grace period");
    }
    let seen = shared.hub.take_heard();
    if let Err(e) = shared.store.touch_nodes(seen).await {
        tracing::warn!(error = %e, "flush heartbeats at shutdown");
    }
    if let Err(e) = shared.store.mark_all_disconnected().await {
        tracing::warn!(error = %e, "mark nodes disconnected at shutdown");
    }
    let ([ok, shed, timeout, failed], connect_shed) = shared.metrics.admission_totals();
    tracing::info!(
        tls_ok = ok,
        tls_shed = shed,
        tls_timeout = timeout,
        tls_failed = failed,
        connect_shed,
        "stopped"
    );
}
