//! `lks-control-server`: parses flags, sets up logging and signals, runs the
//! server — or, with `migrate`, moves a single server's data dir onto etcd;
//! with `backup` and `restore`, archives an installation and makes a data
//! dir from an archive.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use lks_blobs::{BlobChoice, S3Config, s3};
use lks_control_server::migrate::MigrateConfig;
use lks_control_server::server::{StoreChoice, raise_nofile_limit};
use lks_control_server::store::EtcdConfig;
use lks_control_server::{Config, run};
use lks_proto::duration::parse_duration;
use lks_proto::report::one_line;
use tokio_util::sync::CancellationToken;

/// lksadmin control server: enrols nodes, stores bundles, drives rollouts.
#[derive(Parser)]
#[command(
    name = "lks-control-server",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: Args,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Moves a single server's data dir (SQLite) onto etcd, so that it can
    /// run as replicas without re-enrolling a node. Stop the server first.
    Migrate(MigrateArgs),
    /// Writes a consistent archive of a running (or stopped) installation:
    /// state, CA and keys, audit trail, releases and the blob manifest.
    Backup(BackupArgs),
    /// Restores an archive `backup` wrote: a new data dir, or an empty
    /// etcd prefix (an archive of `backup --store etcd`).
    Restore(RestoreArgs),
}

/// `backup`: what to archive and where the archive goes.
#[derive(clap::Args)]
struct BackupArgs {
    /// The server's --data-dir (with --store sqlite); only read.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The archive to write (mode 0600: it holds the CA key); never
    /// overwritten.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Include the bytes of every blob a bundle serves, not only their
    /// digests.
    #[arg(long)]
    with_blobs: bool,
    /// Where the installation's state lives: `sqlite` (--data-dir) or
    /// `etcd` (every key under --etcd-prefix, read at one revision).
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    #[command(flatten)]
    etcd: EtcdFlags,
    /// With --store etcd: the replicas' key file, to prove a sealed CA
    /// opens (without it a sealed identity is archived as stored).
    #[arg(long, value_name = "FILE")]
    encryption_key_file: Option<PathBuf>,
    #[command(flatten)]
    blobs: BlobFlags,
    /// With --store etcd: the replicas' --etcd-max-blob-size.
    #[arg(long, default_value_t = lks_blobs::DEFAULT_MAX_BLOB)]
    etcd_max_blob_size: u64,
}

/// `restore`: the archive and where it goes (a new data dir, or an empty
/// etcd prefix).
#[derive(clap::Args)]
struct RestoreArgs {
    /// An archive `lks-control-server backup` wrote.
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// The data dir to create (--store sqlite); must be absent or empty.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// `sqlite` (a new data dir) or `etcd` (an empty --etcd-prefix; the
    /// archive must come from `backup --store etcd`).
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    #[command(flatten)]
    etcd: EtcdFlags,
    /// With --store etcd: where the archive's blobs go (etcd, the default,
    /// or s3://BUCKET/PREFIX with the --s3-* flags).
    #[command(flatten)]
    blobs: BlobFlags,
    /// With --store etcd: the replicas' --etcd-max-blob-size.
    #[arg(long, default_value_t = lks_blobs::DEFAULT_MAX_BLOB)]
    etcd_max_blob_size: u64,
}

/// Running the server (no subcommand).
#[derive(clap::Args)]
struct Args {
    /// Directory for the CA, admin.conf, the database and blobs.
    #[arg(long, required = true)]
    data_dir: Option<PathBuf>,
    /// Address of the gRPC (TLS) port for agents and lksctl.
    #[arg(long, default_value = "0.0.0.0:7443")]
    listen: SocketAddr,
    /// Address for /metrics and /healthz (plain HTTP); off if not given.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Address for FleetLock (Zincati's reboot slots, plain HTTP, no
    /// credential: reach it only from the tenant network); off if not given.
    #[arg(long)]
    fleetlock_listen: Option<SocketAddr>,
    /// Serve --fleetlock-listen over TLS with the server's certificate.
    #[arg(long, requires = "fleetlock_listen")]
    fleetlock_tls: bool,
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
    #[command(flatten)]
    etcd: EtcdFlags,
    /// 32 random bytes, base64: private keys kept in etcd are encrypted with
    /// it (AES-256-GCM). Create one with `head -c 32 /dev/urandom | base64`.
    #[arg(long, value_name = "FILE")]
    encryption_key_file: Option<PathBuf>,
    /// How long this replica's etcd lease lives without renewal: a dead
    /// replica's nodes show disconnected, and another replica drives
    /// rollouts, after at most this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_ttl: Duration,
    #[command(flatten)]
    blobs: BlobFlags,
    /// How often the leading replica deletes blobs no bundle version
    /// references (after `lksctl bundle delete`); `off` never does.
    #[arg(long, default_value = "10m", value_name = "DURATION|off")]
    blob_gc_interval: String,
    /// How often the leading replica makes the binary deltas it lacks
    /// (patches from earlier versions' files, offered to agents that hold
    /// them); `off` makes none, and none are offered.
    #[arg(long, default_value = "30s", value_name = "DURATION|off")]
    delta_interval: String,
    /// Largest file a delta is made for, in bytes (making one holds about
    /// 6× the file in memory, on one core).
    #[arg(long, default_value_t = lks_blobs::delta::DEFAULT_MAX_FILE_SIZE, value_name = "BYTES")]
    delta_max_file_size: u64,
    /// How many earlier contents of a file (the latest first) a delta is
    /// made from; 0 makes none.
    #[arg(long, default_value_t = lks_blobs::delta::DEFAULT_BASES, value_name = "N")]
    delta_bases: usize,
    /// The patches' format: `bsdiff4-zstd` (bsdiff 4's sections in zstd
    /// frames: a node applies one several times faster) or `bsdiff4` (the
    /// only one agents from before `bsdiff4-zstd` apply; they fetch whole
    /// files when offered the other).
    #[arg(long, default_value = lks_proto::delta::ZSTD_ALGORITHM, value_parser = clap::builder::PossibleValuesParser::new(lks_proto::delta::ALGORITHMS), value_name = "ALGORITHM")]
    delta_algorithm: String,
    /// The share of a file (percent) a delta must be estimated to save: a
    /// cheap estimate (both files read once) of how much of the file the
    /// earlier version supplies skips pairs below it; 0 makes no estimate.
    #[arg(long, default_value_t = lks_blobs::delta::DEFAULT_MIN_SAVING, value_parser = clap::value_parser!(u8).range(0..=100), value_name = "PERCENT")]
    delta_min_saving: u8,
    /// Memory the deltas made at once may need together, in bytes (each
    /// about 5× the earlier file plus 2× the new one); a pair needing more
    /// alone is skipped.
    #[arg(long, default_value_t = lks_blobs::delta::DEFAULT_MAX_MEMORY, value_parser = clap::value_parser!(u64).range(1..), value_name = "BYTES")]
    delta_max_memory: u64,
    /// Deltas made at once, each on a thread at the lowest CPU priority.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64), value_name = "N")]
    delta_jobs: u64,
    /// How long audit records (`lksctl audit`) are kept; `forever` keeps
    /// every record. The leading replica drops older ones hourly.
    #[arg(long, default_value = "365d", value_name = "DURATION|forever")]
    audit_retention: String,
    /// How often a replica (--store etcd) compares how many agents it holds
    /// with the others and, when clearly above its share, asks a few to
    /// reconnect to the least loaded replica; `off` never does.
    #[arg(long, default_value = "10s", value_name = "DURATION|off")]
    rebalance_interval: String,
    /// How long a blob no bundle references is kept after a publish last
    /// relied on it; must exceed the longest publish.
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    blob_gc_grace: Duration,
    /// Largest file a bundle may carry without a mirror URL when its bytes
    /// are kept in etcd (--blob-store etcd), in bytes.
    #[arg(long, default_value_t = lks_blobs::DEFAULT_MAX_BLOB)]
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
    /// How long one agent package download may take; a slower client is
    /// cut off, so that slow or stalled clients cannot hold every download
    /// slot (64).
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    agent_package_deadline: Duration,
    /// TLS handshakes the server runs at once; further accepted
    /// connections wait their turn, first come first served [default: 64
    /// per core].
    #[arg(long, value_name = "N")]
    max_tls_handshakes: Option<usize>,
    /// How long an accepted connection may wait for its TLS handshake to
    /// start; one that waited longer is closed unhandshaken (its client has
    /// likely given up). Keep it under the clients' connect timeout (20 s).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    tls_handshake_queue_timeout: Duration,
    /// How long one TLS handshake may take once started; a slower or
    /// silent client is cut off.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    tls_handshake_timeout: Duration,
    /// Connect streams being opened (authorised, Hello stored, first
    /// desired state sent) at once; a Connect that finds no room within 10 s
    /// is refused with `unavailable` and a retry hint.
    #[arg(long, default_value_t = lks_control_server::admission::MAX_STREAMS_OPENING, value_name = "N", hide = true)]
    max_streams_opening: usize,
    /// How often each agent stream is pinged.
    #[arg(long, default_value = "30s", value_parser = parse_duration, hide = true)]
    ping_interval: Duration,
}

/// Where etcd is and how to reach it.
#[derive(clap::Args)]
struct EtcdFlags {
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
}

/// `migrate`: the single server's data dir and where it goes, or the
/// blobs of an etcd installation and the bucket they go to.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("from").required(true).args(["from_sqlite", "blobs_from_etcd"]))]
struct MigrateArgs {
    /// The stopped SQLite server's --data-dir; only read.
    #[arg(long, value_name = "DIR")]
    from_sqlite: Option<PathBuf>,
    /// Copy the blobs an etcd installation keeps in etcd into the bucket
    /// of --blob-store s3://… (replicas may keep running).
    #[arg(long)]
    blobs_from_etcd: bool,
    /// With --blobs-from-etcd, once every replica runs with --blob-store
    /// s3://…: delete the copied blobs from etcd.
    #[arg(long, requires = "blobs_from_etcd")]
    delete_from_etcd: bool,
    /// Where the installation goes (only etcd).
    #[arg(long, value_enum)]
    store: StoreKind,
    #[command(flatten)]
    etcd: EtcdFlags,
    /// Encrypts the private keys stored in etcd (give the replicas the same
    /// file); see the server's flag of the same name.
    #[arg(long, value_name = "FILE")]
    encryption_key_file: Option<PathBuf>,
    #[command(flatten)]
    blobs: BlobFlags,
    /// Largest served file copied into etcd (--blob-store etcd), in bytes;
    /// give the replicas the same value. No limit with s3://….
    #[arg(long, default_value_t = lks_blobs::DEFAULT_MAX_BLOB)]
    etcd_max_blob_size: u64,
}

/// Where blob bytes are durable, and how to reach an S3 bucket.
#[derive(clap::Args)]
struct BlobFlags {
    /// Where the bytes of served files are durable: `local` (the data dir;
    /// the default with --store sqlite), `etcd` (in chunks, at most
    /// --etcd-max-blob-size each; the default with --store etcd) or
    /// `s3://BUCKET[/PREFIX]` (an S3-compatible object store, no size cap).
    #[arg(long, value_name = "local|etcd|s3://BUCKET/PREFIX")]
    blob_store: Option<String>,
    /// URL of the S3-compatible endpoint (Ceph RGW, MinIO, …); AWS itself
    /// if not given.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// Region the requests are signed for.
    #[arg(long, value_name = "REGION", default_value = "us-east-1")]
    s3_region: String,
    /// `path` (ENDPOINT/BUCKET/KEY, what most S3-compatible servers
    /// expect) or `virtual` (BUCKET.ENDPOINT/KEY).
    #[arg(long, value_enum, default_value = "path")]
    s3_addressing: Addressing,
    /// An AWS shared-credentials file (`[default]` with
    /// aws_access_key_id and aws_secret_access_key), mode 0600; without
    /// it, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment.
    #[arg(long, value_name = "FILE")]
    s3_credentials_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) to trust for --s3-endpoint besides the
    /// system's.
    #[arg(long, value_name = "FILE")]
    s3_ca_cert: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Addressing {
    Path,
    Virtual,
}

/// `--blob-store` and the `--s3-*` flags, with credentials and CA read.
fn blob_choice(f: &BlobFlags) -> anyhow::Result<BlobChoice> {
    let s3_flags = f.s3_endpoint.is_some()
        || f.s3_credentials_file.is_some()
        || f.s3_ca_cert.is_some()
        || f.s3_region != "us-east-1"
        || f.s3_addressing != Addressing::Path;
    let url = match f.blob_store.as_deref() {
        None | Some("local") | Some("etcd") if s3_flags => {
            anyhow::bail!(
                "--s3-endpoint, --s3-region, --s3-addressing, --s3-credentials-file and \
                        --s3-ca-cert need --blob-store s3://BUCKET/PREFIX"
            );
        }
        None => return Ok(BlobChoice::Default),
        Some("local") => return Ok(BlobChoice::Local),
        Some("etcd") => return Ok(BlobChoice::Etcd),
        Some(url) => url,
    };
    let (bucket, prefix) = s3::parse_url(url)?;
    if let Some(e) = &f.s3_endpoint {
        S3Config::check_endpoint(e)?;
    }
    let (access_key_id, secret_access_key, session_token) =
        s3::credentials(f.s3_credentials_file.as_deref())?;
    let ca_cert_pem = f.s3_ca_cert.as_deref().map(S3Config::read_ca).transpose()?;
    Ok(BlobChoice::S3(S3Config {
        bucket,
        prefix,
        endpoint: f.s3_endpoint.clone(),
        region: f.s3_region.clone(),
        virtual_hosted: f.s3_addressing == Addressing::Virtual,
        access_key_id,
        secret_access_key,
        session_token,
        ca_cert_pem,
    }))
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    /// SQLite in the data dir (one server).
    Sqlite,
    /// etcd shared by several servers.
    Etcd,
}

/// The store the flags ask for, with etcd's TLS material read.
/// The value of flags that parsed; else `None`, the one-line error printed
/// (the caller exits 2).
fn flag_error<T>(r: anyhow::Result<T>) -> Option<T> {
    r.map_err(|e| eprintln!("error: {}", one_line(&*e))).ok()
}

fn store_choice(store: StoreKind, etcd: &EtcdFlags) -> anyhow::Result<StoreChoice> {
    let etcd_flags = !etcd.etcd_endpoints.is_empty()
        || etcd.etcd_cacert.is_some()
        || etcd.etcd_cert.is_some()
        || etcd.etcd_prefix != "/lksadmin/v1/";
    if store == StoreKind::Sqlite {
        if etcd_flags {
            anyhow::bail!("--etcd-endpoints, --etcd-prefix, --etcd-cacert and --etcd-cert need --store etcd");
        }
        return Ok(StoreChoice::Sqlite);
    }
    if etcd.etcd_endpoints.is_empty() {
        anyhow::bail!("--store etcd needs --etcd-endpoints URL[,URL…]");
    }
    for e in &etcd.etcd_endpoints {
        if !(e.starts_with("http://") || e.starts_with("https://")) || e.len() < 10 {
            anyhow::bail!("--etcd-endpoints: {e:?} is not an http:// or https:// URL");
        }
    }
    if !etcd.etcd_prefix.starts_with('/') || etcd.etcd_prefix.contains("//") || etcd.etcd_prefix.len() < 2 {
        anyhow::bail!(
            "--etcd-prefix {:?} must be an absolute key prefix such as /lksadmin/v1/",
            etcd.etcd_prefix
        );
    }
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()));
    let ca_pem = etcd.etcd_cacert.as_ref().map(read).transpose()?;
    let client_cert_pem = match (&etcd.etcd_cert, &etcd.etcd_key) {
        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
        _ => None,
    };
    Ok(StoreChoice::Etcd(EtcdConfig {
        endpoints: etcd.etcd_endpoints.clone(),
        prefix: etcd.etcd_prefix.clone(),
        ca_pem,
        client_cert_pem,
    }))
}

/// `migrate`: prints the summary, or one error line.
async fn migrate(args: MigrateArgs) -> ExitCode {
    if args.store != StoreKind::Etcd {
        eprintln!("error: migrate moves a SQLite data dir onto etcd: give --store etcd");
        return ExitCode::from(2);
    }
    let Some(StoreChoice::Etcd(etcd)) = flag_error(store_choice(args.store, &args.etcd)) else {
        return ExitCode::from(2);
    };
    let Some(blob_store) = flag_error(blob_choice(&args.blobs)) else {
        return ExitCode::from(2);
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(from) = args.from_sqlite else {
        let BlobChoice::S3(s3) = blob_store else {
            eprintln!(
                "error: --blobs-from-etcd moves blobs into a bucket: give --blob-store s3://BUCKET/PREFIX"
            );
            return ExitCode::from(2);
        };
        let now = lks_control_server::clock::now_ms();
        return summary_or_error(
            lks_control_server::migrate::blobs::migrate_blobs(&etcd, &s3, args.delete_from_etcd, now).await,
        );
    };
    let cfg = MigrateConfig {
        blob_store,
        from,
        etcd,
        encryption_key_file: args.encryption_key_file,
        max_blob: args.etcd_max_blob_size,
    };
    summary_or_error(lks_control_server::migrate::migrate(&cfg).await)
}

/// `backup`: prints what the archive holds and its SHA-256, or one error line.
async fn backup(args: BackupArgs) -> ExitCode {
    let Some(store) = flag_error(store_choice(args.store, &args.etcd)) else {
        return ExitCode::from(2);
    };
    let Some(blob_store) = flag_error(blob_choice(&args.blobs)) else {
        return ExitCode::from(2);
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let done = match store {
        StoreChoice::Etcd(etcd) => {
            if args.data_dir.is_some() {
                eprintln!("error: backup --store etcd reads etcd, not a data dir: drop --data-dir");
                return ExitCode::from(2);
            }
            let cfg = lks_control_server::backup::EtcdBackupConfig {
                etcd,
                out: args.out,
                with_blobs: args.with_blobs,
                blob_store,
                encryption_key_file: args.encryption_key_file,
                max_blob: args.etcd_max_blob_size,
            };
            lks_control_server::backup::backup_etcd(&cfg).await
        }
        StoreChoice::Sqlite => {
            let Some(data_dir) = args.data_dir else {
                eprintln!("error: backup --store sqlite needs --data-dir DIR (the server's data dir)");
                return ExitCode::from(2);
            };
            if args.encryption_key_file.is_some() {
                eprintln!("error: --encryption-key-file needs --store etcd");
                return ExitCode::from(2);
            }
            let cfg = lks_control_server::backup::BackupConfig {
                data_dir,
                out: args.out,
                with_blobs: args.with_blobs,
                blob_store,
            };
            lks_control_server::backup::backup_sqlite(&cfg).await
        }
    };
    match done {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// `restore`: prints what was restored, or one line per problem (the last
/// saying that nothing was restored).
async fn restore(args: RestoreArgs) -> ExitCode {
    let Some(store) = flag_error(store_choice(args.store, &args.etcd)) else {
        return ExitCode::from(2);
    };
    let Some(blob_store) = flag_error(blob_choice(&args.blobs)) else {
        return ExitCode::from(2);
    };
    let (done, left) = match store {
        StoreChoice::Etcd(etcd) => {
            if args.data_dir.is_some() {
                eprintln!("error: restore --store etcd writes into etcd, not a data dir: drop --data-dir");
                return ExitCode::from(2);
            }
            let _ = rustls::crypto::ring::default_provider().install_default();
            let left = format!("{} left as it was", etcd.prefix);
            let cfg = lks_control_server::backup::EtcdRestoreConfig {
                from: args.from,
                etcd,
                blob_store,
                max_blob: args.etcd_max_blob_size,
            };
            let done = lks_control_server::backup::restore_etcd(&cfg)
                .await
                .map(|s| s.to_string());
            (done, left)
        }
        StoreChoice::Sqlite => {
            let Some(data_dir) = args.data_dir else {
                eprintln!(
                    "error: restore needs --data-dir DIR (a new data dir), or --store etcd and its flags"
                );
                return ExitCode::from(2);
            };
            if args.blobs.blob_store.is_some() {
                eprintln!("error: --blob-store needs --store etcd (a data dir's blobs go into DIR/blobs)");
                return ExitCode::from(2);
            }
            let left = format!("{} left as it was", data_dir.display());
            let cfg = lks_control_server::backup::RestoreConfig {
                from: args.from,
                data_dir,
            };
            (
                lks_control_server::backup::restore(&cfg).map(|s| s.to_string()),
                left,
            )
        }
    };
    match done {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let lines = e.lines();
            for (i, line) in lines.iter().enumerate() {
                if i + 1 == lines.len() {
                    eprintln!("error: {line}; nothing was restored ({left})");
                } else {
                    eprintln!("error: {line}");
                }
            }
            ExitCode::FAILURE
        }
    }
}

/// A `DURATION|off` flag: `Some(None)` for off; `None` (the error said) if
/// it is neither.
fn interval_or_off(flag: &str, v: &str) -> Option<Option<Duration>> {
    match v {
        "off" => Some(None),
        d => match parse_duration(d) {
            Ok(d) if !d.is_zero() => Some(Some(d)),
            _ => {
                eprintln!("error: {flag} {d:?}: expected a duration such as 10s, or off");
                None
            }
        },
    }
}

/// A migration's summary on stdout, or its error as one line.
fn summary_or_error<T: std::fmt::Display, E: std::fmt::Display>(r: Result<T, E>) -> ExitCode {
    match r {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line, whatever the layers below put in their messages.
            eprintln!("error: {}", e.to_string().replace('\n', "; "));
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: clap's message without the usage and hints after it.
            let text = e.to_string();
            let msg: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let msg = msg.join(" ");
            eprintln!(
                "error: {} (see `lks-control-server --help`)",
                msg.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::Migrate(m)) => return migrate(m).await,
        Some(Command::Backup(b)) => return backup(b).await,
        Some(Command::Restore(r)) => return restore(r).await,
        None => {}
    }
    let Some(cfg) = config(cli.run) else {
        return ExitCode::from(2);
    };
    init_tracing();
    raise_nofile_limit();

    let shutdown = CancellationToken::new();
    cancel_on_signals(shutdown.clone());
    match run(cfg, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The server's configuration from its flags; `None` (the error said) if
/// one is out of range.
fn config(args: Args) -> Option<Config> {
    let Some(data_dir) = args.data_dir else {
        eprintln!("error: --data-dir is required");
        return None;
    };
    let store = flag_error(store_choice(args.store, &args.etcd))?;
    let blob_store = flag_error(blob_choice(&args.blobs))?;
    if let Some(u) = args
        .join_url
        .iter()
        .find(|u| !u.starts_with("https://") || u.contains(',') || u.len() < 9)
    {
        eprintln!("error: --join-url {u:?} is not one https:// URL");
        return None;
    }
    if args.lease_ttl < Duration::from_secs(2) {
        eprintln!("error: --lease-ttl must be at least 2s");
        return None;
    }
    if args.max_tls_handshakes == Some(0) || args.max_streams_opening == 0 {
        eprintln!("error: --max-tls-handshakes and --max-streams-opening must be at least 1");
        return None;
    }
    if args.tls_handshake_queue_timeout.is_zero() || args.tls_handshake_timeout.is_zero() {
        eprintln!(
            "error: --tls-handshake-queue-timeout and --tls-handshake-timeout must be longer than zero"
        );
        return None;
    }
    let (Some(blob_gc_interval), Some(rebalance_interval), Some(delta_interval)) = (
        interval_or_off("--blob-gc-interval", &args.blob_gc_interval),
        interval_or_off("--rebalance-interval", &args.rebalance_interval),
        interval_or_off("--delta-interval", &args.delta_interval),
    ) else {
        return None;
    };
    let audit_retention = match args.audit_retention.as_str() {
        "forever" => None,
        d => match parse_duration(d) {
            Ok(d) if !d.is_zero() => Some(d),
            _ => {
                eprintln!("error: --audit-retention {d:?}: expected a duration such as 365d, or forever");
                return None;
            }
        },
    };
    if args.ping_interval.is_zero() {
        eprintln!("error: --ping-interval must be longer than zero");
        return None;
    }
    let mut cfg = Config::new(data_dir, args.listen);
    cfg.metrics_listen = args.metrics_listen;
    cfg.fleetlock_listen = args.fleetlock_listen;
    cfg.fleetlock_tls = args.fleetlock_tls;
    cfg.advertise_address = args.advertise_address;
    cfg.node_cert_ttl = args.node_cert_ttl;
    cfg.ping_interval = args.ping_interval;
    cfg.agent_packages = args.agent_package;
    cfg.agent_package_deadline = args.agent_package_deadline;
    cfg.store = store;
    cfg.encryption_key_file = args.encryption_key_file;
    cfg.tls_sans = args.tls_san;
    cfg.lease_ttl = args.lease_ttl;
    cfg.etcd_max_blob = args.etcd_max_blob_size;
    cfg.blob_store = blob_store;
    cfg.blob_gc_interval = blob_gc_interval;
    cfg.blob_gc_grace = args.blob_gc_grace;
    cfg.audit_retention = audit_retention;
    cfg.delta_interval = delta_interval;
    cfg.delta_limits = lks_blobs::delta::Limits {
        max_file_size: args.delta_max_file_size,
        bases: args.delta_bases,
        algorithm: lks_proto::delta::ALGORITHMS
            .into_iter()
            .find(|a| *a == args.delta_algorithm)
            .unwrap_or(lks_proto::delta::ZSTD_ALGORITHM),
        min_saving: args.delta_min_saving,
        max_memory: args.delta_max_memory,
        jobs: usize::try_from(args.delta_jobs).unwrap_or(1),
    };
    cfg.rebalance_interval = rebalance_interval;
    cfg.join_urls = args.join_url;
    cfg.handshakes = lks_control_server::admission::HandshakeLimits {
        max_in_progress: args
            .max_tls_handshakes
            .unwrap_or_else(lks_control_server::admission::default_max_handshakes),
        handshake_timeout: args.tls_handshake_timeout,
        queue_timeout: args.tls_handshake_queue_timeout,
    };
    cfg.max_streams_opening = args.max_streams_opening;
    Some(cfg)
}

/// Logs to stderr, `RUST_LOG` or info.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            // object_store logs each retry of a request at info: a start
            // refused for an unreachable --s3-endpoint would print three
            // such lines before its one error line.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,object_store=warn")),
        )
        .init();
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
fn cancel_on_signals(shutdown: CancellationToken) {
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
        shutdown.cancel();
    });
}
