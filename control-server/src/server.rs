//! Wiring: data dir, PKI, store, blob store, the gRPC server (agent and admin
//! APIs, health, reflection) on one TLS port, metrics, background tasks, and
//! graceful shutdown.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lks_proto::pb;
use lks_proto::pb::admin_service_server::AdminServiceServer;
use lks_proto::pb::agent_service_server::AgentServiceServer;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;

use crate::adminconf::{AdminConf, AdminConfError, AdminConfFile};
use crate::admission::{HandshakeLimits, Handshakes, OpenGate};
use crate::api::{AdminApi, AgentApi};
use crate::blobs::{BlobChoice, BlobError, BlobStore, Blobs, EtcdChunks, LocalBlobs, LocalDirStore, S3Store};
use crate::context::Shared;
use crate::controller;
use crate::hub::Hub;
use crate::metrics::{self, Metrics};
use crate::packages::{AgentPackages, PackageError, PackageLayer};
use crate::pki::clusterca::ClusterCas;
use crate::pki::seal::{SealError, SealKey};
use crate::pki::{Pki, PkiError};
use crate::ratelimit::RateLimiter;
use crate::replicas;
use crate::store::{EtcdConfig, EtcdStore, NodeStatusStore, SqliteStore, Store, StoreError};

/// How long audit records are kept unless `--audit-retention` says.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);
/// How often the leader drops audit records past their retention.
const AUDIT_SWEEP: Duration = Duration::from_secs(3600);

/// How often buffered heartbeats are written to the store.
const HEARTBEAT_FLUSH: Duration = Duration::from_secs(5);
/// Enrolment rate per peer IP: tokens per second and burst.
const ENROLL_RATE: f64 = 5.0;
const ENROLL_BURST: f64 = 20.0;

/// Everything `lks-control-server` is told on its command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
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
    pub delta_limits: crate::blobs::delta::Limits,
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
            etcd_max_blob: crate::blobs::DEFAULT_MAX_BLOB,
            blob_gc_interval: Some(crate::blobs::gc::DEFAULT_INTERVAL),
            blob_gc_grace: crate::blobs::gc::DEFAULT_GRACE,
            audit_retention: Some(DEFAULT_AUDIT_RETENTION),
            delta_interval: Some(crate::blobs::delta::DEFAULT_INTERVAL),
            delta_limits: crate::blobs::delta::Limits::default(),
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

/// Runs the control server until `shutdown` fires.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), ServerError> {
    // Only ring is compiled in; installing it explicitly keeps rustls from
    // guessing. An error means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let package_candidates = preflight(&cfg).await?;
    let data_dir = cfg.data_dir.clone();
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
    let host = advertise_host(&cfg, local);
    let names = certificate_names(&cfg, &host);
    let server_url = format!("https://{}:{}", url_host(&host), local.port());
    let Opened {
        store,
        etcd,
        pki,
        seal,
    } = open_store(&cfg, &data_dir, &names).await?;
    let known = write_first_admin_conf(&data_dir, &server_url, &pki, etcd.as_ref()).await?;
    tracing::info!(ca_cert_hash = %pki.ca_hash(), server = %server_url, "control server identity");

    let local_blobs = LocalBlobs::open(&data_dir.join("blobs"))?;
    let durable = durable_blobs(&cfg, &etcd, &local_blobs)?;
    tracing::info!(blob_store = %durable.describe(), "blob store");
    let agent_packages = Arc::new(AgentPackages::import(package_candidates, &local_blobs).await?);
    let blobs = Blobs::new(local_blobs, durable);

    let cancel = shutdown.child_token();
    let (rollout_updates, _) = watch::channel(0);
    let (rollouts, rollout_inbox) = controller::channel();
    let (leader_tx, leader) = watch::channel(etcd.is_none());
    let (servers_tx, servers) = watch::channel(known);
    let seal = seal.map(Arc::new);
    let aad_prefix = etcd.as_ref().map_or("", |e| e.prefix());
    let cluster_cas = ClusterCas::new(store.clone(), seal.clone(), aad_prefix);
    let tenants = crate::kube::tenant::TenantApis::new(store.clone(), seal, aad_prefix);
    let shared = Arc::new(Shared {
        cluster_cas: Arc::new(cluster_cas),
        tenants: Arc::new(tenants),
        store,
        leader,
        servers,
        join_urls: cfg.join_urls.clone(),
        blobs: Arc::new(blobs),
        agent_packages,
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
        server_url,
        node_cert_ttl: cfg.node_cert_ttl,
        ping_interval: cfg.ping_interval,
        cancel: cancel.clone(),
        tasks: TaskTracker::new(),
        tracker: Arc::new(crate::tracker::Tracker::default()),
    });

    if let Some(addr) = cfg.metrics_listen {
        let l = metrics::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        tracing::info!(addr = %l.local_addr().unwrap_or(addr), "serving /metrics and /healthz");
        shared
            .tasks
            .spawn(metrics::serve(l, shared.metrics.clone(), cancel.clone()));
        shared.tasks.spawn(metrics::probe::run(
            shared.store.clone(),
            shared.blobs.clone(),
            shared.metrics.clone(),
            cancel.clone(),
        ));
    }
    spawn_tasks(&shared, &cfg, etcd.as_ref(), leader_tx, servers_tx, rollout_inbox);

    let result = serve(&shared, &cfg, listener, local).await;
    shut_down(&shared, &cfg).await;
    result
}

/// What is checked before anything is created: the `--agent-package`
/// files (their candidates returned), the blob bucket, and the data dir
/// (created owner-only: it holds the CA key and admin credentials).
async fn preflight(cfg: &Config) -> Result<Vec<crate::packages::Candidate>, ServerError> {
    // Bad --agent-package files are refused before anything is created.
    let package_candidates = crate::packages::inspect_all(&cfg.agent_packages)?;
    // So is a blob store that cannot be used: wrong endpoint, credentials
    // or bucket. One line names it.
    if let BlobChoice::S3(c) = &cfg.blob_store {
        let s = S3Store::new(c).map_err(ServerError::BlobStore)?;
        s.check().await.map_err(ServerError::BlobStore)?;
    }
    let data_dir = &cfg.data_dir;
    // The data dir holds the CA key and admin credentials: owner only.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(|source| ServerError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
    Ok(package_candidates)
}

/// Writes `admin.conf` naming every replica known now (rewritten as
/// replicas come and go); returns their URLs, this server's first.
async fn write_first_admin_conf(
    data_dir: &std::path::Path,
    server_url: &str,
    pki: &Pki,
    etcd: Option<&EtcdStore>,
) -> Result<Vec<String>, ServerError> {
    let conf = AdminConf {
        server: server_url.to_string(),
        ca_cert: pki.ca_pem().to_string(),
        client_cert: pki.admin_cert_pem.clone(),
        client_key: pki.admin_key_pem.clone(),
    };
    let conf_path = data_dir.join("admin.conf");
    // Every replica known now; rewritten as replicas come and go.
    let known = match etcd {
        Some(e) => replicas::replica_urls(e, server_url).await?,
        None => vec![server_url.to_string()],
    };
    write_admin_conf(&conf_path, &conf, &known)?;
    Ok(known)
}

/// The names the serving certificate carries: the advertised host,
/// localhost, 127.0.0.1 and every `--tls-san`, each once.
fn certificate_names(cfg: &Config, host: &str) -> Vec<String> {
    let mut names = vec![host.to_string()];
    for n in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    for n in &cfg.tls_sans {
        if !names.iter().any(|x| x == n) {
            names.push(n.clone());
        }
    }
    names
}

/// The store and the identity it goes with.
struct Opened {
    store: Arc<dyn Store>,
    /// Set with `--store etcd`: this replica's handle on the region.
    etcd: Option<EtcdStore>,
    pki: Pki,
    seal: Option<SealKey>,
}

/// Opens the store (SQLite in the data dir, or etcd) and loads or creates
/// the control plane's identity (the data dir's `pki/`, or etcd's).
async fn open_store(
    cfg: &Config,
    data_dir: &std::path::Path,
    names: &[String],
) -> Result<Opened, ServerError> {
    Ok(match &cfg.store {
        StoreChoice::Sqlite => {
            if cfg.encryption_key_file.is_some() {
                return Err(ServerError::Usage(
                    "--encryption-key-file applies to keys kept in etcd (--store etcd); \
                     with SQLite the keys stay in the data dir, readable by its owner only"
                        .into(),
                ));
            }
            let pki = Pki::load_or_create(&data_dir.join("pki"), names)?;
            let store = SqliteStore::open(&data_dir.join("state.db"))?;
            store.mark_all_disconnected().await?;
            Opened {
                store: Arc::new(store),
                etcd: None,
                pki,
                seal: None,
            }
        }
        StoreChoice::Etcd(ecfg) => {
            let seal = cfg
                .encryption_key_file
                .as_deref()
                .map(SealKey::load)
                .transpose()?;
            let mut id = [0u8; 8];
            let _ = getrandom::getrandom(&mut id);
            let replica = hex::encode(id);
            let store = EtcdStore::connect(ecfg, &replica).await?;
            let identity = replicas::load_or_create_identity(&store, seal.as_ref()).await?;
            let pki = Pki::from_shared(&identity, names)?;
            tracing::info!(replica = %replica, prefix = store.prefix(), endpoints = %ecfg.endpoints.join(","), "store: etcd");
            Opened {
                store: Arc::new(store.clone()),
                etcd: Some(store),
                pki,
                seal,
            }
        }
    })
}

/// Where blobs are kept for good (`--blob-store`; the default follows the
/// store).
fn durable_blobs(
    cfg: &Config,
    etcd: &Option<EtcdStore>,
    local_blobs: &LocalBlobs,
) -> Result<Arc<dyn BlobStore>, ServerError> {
    Ok(match (&cfg.blob_store, etcd) {
        (BlobChoice::S3(c), _) => Arc::new(S3Store::new(c).map_err(ServerError::BlobStore)?),
        (BlobChoice::Default | BlobChoice::Local, None) => {
            Arc::new(LocalDirStore::new(local_blobs.clone())) as Arc<dyn BlobStore>
        }
        (BlobChoice::Default | BlobChoice::Etcd, Some(e)) => {
            Arc::new(EtcdChunks::new(e.clone(), cfg.etcd_max_blob))
        }
        (BlobChoice::Local, Some(_)) => {
            return Err(ServerError::Usage(
                "--blob-store local keeps blobs on one replica's disk; with --store etcd use \
                 --blob-store etcd or s3://BUCKET/PREFIX"
                    .into(),
            ));
        }
        (BlobChoice::Etcd, None) => {
            return Err(ServerError::Usage("--blob-store etcd needs --store etcd".into()));
        }
    })
}

/// The server's background tasks: metrics, heartbeats, peers, releases,
/// blob GC, audit retention, deltas, the rollout controller, and with etcd
/// the lease, the watch and the rebalance.
fn spawn_tasks(
    shared: &Arc<Shared>,
    cfg: &Config,
    etcd: Option<&EtcdStore>,
    leader_tx: watch::Sender<bool>,
    servers_tx: watch::Sender<Vec<String>>,
    rollout_inbox: controller::Inbox,
) {
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
    shared.tasks.spawn(controller::run(
        controller::Deps {
            store: shared.store.clone(),
            hub: shared.hub.clone(),
            metrics: shared.metrics.clone(),
            leader: shared.leader.clone(),
            rollouts_changed: shared.rollouts_changed.clone(),
            rollout_updates: shared.rollout_updates.clone(),
            kube: Arc::new(crate::kube::work::KubeWork::new(
                shared.tenants.clone(),
                shared.store.clone(),
                shared.rollouts_changed.clone(),
                shared.tasks.clone(),
                cancel.clone(),
            )),
            cancel: cancel.clone(),
        },
        rollout_inbox,
    ));
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

/// Writes `admin.conf` (server, every replica, credentials) if it differs.
fn write_admin_conf(path: &std::path::Path, conf: &AdminConf, urls: &[String]) -> Result<(), AdminConfError> {
    let file = AdminConfFile {
        conf: conf.clone(),
        servers: if urls.len() > 1 { urls.to_vec() } else { Vec::new() },
    };
    if AdminConfFile::load(path).ok().as_ref() != Some(&file) {
        file.save(path)?;
        tracing::info!(path = %path.display(), replicas = urls.len(), "wrote admin.conf");
    }
    Ok(())
}

/// Writes buffered last-seen times every few seconds instead of once per
/// heartbeat.
/// Every `interval`: on the leading replica, one garbage-collector pass
/// over the blob store (blobs/gc.rs); on every replica, its local copies
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
            match crate::blobs::gc::collect(&s.blobs, &*s.store, &owner, grace, crate::clock::now_ms(), &keep)
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
            if let Err(e) = crate::blobs::gc::sweep_local(&s.blobs, &*s.store, &keep, grace).await {
                tracing::warn!(error = %e, "sweep of local blob copies failed");
            }
        }
    }
}

/// Every `interval`, on the leading replica: the binary deltas not made
/// yet (blobs/delta.rs), one at a time, off every request's path.
async fn make_deltas(s: Arc<Shared>, interval: Duration, limits: crate::blobs::delta::Limits) {
    let mut next = tokio::time::Instant::now() + interval;
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
            p = crate::blobs::delta::make_missing(&s.blobs, &s.store, limits, crate::clock::now_ms) => p,
        };
        match pass {
            Ok(p) => s.metrics.deltas_made(p.made, p.skipped),
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
