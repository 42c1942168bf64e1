//! `lksctl`: the operator CLI for the lksadmin control server.
//!
//! Every error is one line on stderr (`error: …`) and a non-zero exit.

#![forbid(unsafe_code)]

/// `print!` for lksctl's output: a reader that stops reading (`lksctl node
/// list | head -1`, `| grep -q`) ends lksctl quietly with status 0 instead
/// of a panic.
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*)) };
}

/// `println!` for lksctl's output; see [`out!`].
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

mod audit;
mod bundle;
mod client;
mod cloudinit;
mod cluster;
mod console;
mod mirror;
mod output;
mod release;
mod rollout;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use lks_proto::duration::parse_duration;
use lks_proto::labels::{Labels, parse_labels};
use lks_proto::names::{parse_bundle_ref, validate_cluster_name, validate_node_name};
use lks_proto::pb;
use lks_proto::report::one_line;

use bundle::BundleCmd;
use client::{Client, status};
use lks_proto::windows;
use output::Format;

/// Operator CLI for the lksadmin control server.
#[derive(Parser)]
#[command(name = "lksctl", version)]
struct Cli {
    /// admin.conf written by lks-control-server [default: $LKSCTL_CONFIG, then ./admin.conf]
    #[arg(long, global = true, env = "LKSCTL_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Tenant clusters.
    Cluster {
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
    },
    /// Bootstrap tokens that enrol nodes.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Signed, versioned file bundles.
    Bundle {
        #[command(subcommand)]
        cmd: BundleCmd,
    },
    /// Moving a bundle version onto a cluster's nodes.
    Rollout {
        #[command(subcommand)]
        cmd: rollout::RolloutCmd,
    },
    /// Enrolled nodes.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// What happened: enrolments, rollouts, node reports.
    Event {
        #[command(subcommand)]
        cmd: EventCmd,
    },
    /// Who did what: every admin call that changed state or was refused
    /// trying to, with the credential that made it. Oldest first.
    Audit(audit::AuditArgs),
    /// Signed release records: which bundle versions a cluster's nodes may
    /// apply, until when (nodes with --trust-threshold check them).
    Release {
        #[command(subcommand)]
        cmd: release::ReleaseCmd,
    },
    /// Trust-root rotations: the publisher keys a cluster's nodes trust.
    Root {
        #[command(subcommand)]
        cmd: release::RootCmd,
    },
    /// Serve the operator console: live pages of the fleet in a browser,
    /// through the admin API with this admin.conf.
    Console {
        /// Address to serve on; anything but loopback is reachable by others
        /// (a warning says so).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Open the console in the desktop's browser (xdg-open).
        #[arg(long)]
        open: bool,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a bootstrap token and print the join command.
    Create {
        /// Tenant cluster.
        #[arg(long)]
        cluster: String,
        /// How long the token is valid.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        /// How many nodes may join with it (0: unlimited).
        #[arg(long, default_value_t = 0)]
        uses: u32,
        /// Labels given to every node enrolled with this token (k=v,…).
        #[arg(long, default_value = "")]
        labels: String,
        /// Print #cloud-config user-data that installs the agent, joins and starts it.
        #[arg(long)]
        cloud_init: bool,
        /// With --cloud-init: download the agent .deb from this http(s) URL and
        /// install it [default: the server's own package, downloaded over
        /// HTTPS and checked against the cluster CA; if the server offers
        /// none, --apt]
        #[arg(long, value_name = "URL", requires = "cloud_init", conflicts_with = "apt")]
        package_url: Option<String>,
        /// With --cloud-init: install lksadmin-agent from the apt repositories
        /// the image has configured (`packages:`)
        #[arg(long, requires = "cloud_init")]
        apt: bool,
        /// With --cloud-init: a publisher key the node trusts (PREFIX.pub;
        /// repeatable): it refuses bundles none of them signed
        #[arg(long = "trust-key", value_name = "FILE.pub", requires = "cloud_init")]
        trust_key: Vec<PathBuf>,
        /// With --cloud-init and --trust-key: the node requires signed
        /// releases, signed by this many of the keys (`lksctl release`)
        #[arg(long, value_name = "N", requires = "trust_key")]
        trust_threshold: Option<u32>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// List nodes.
    List {
        /// Only this tenant cluster.
        #[arg(long, default_value = "")]
        cluster: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Show one node.
    Get {
        name: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Delete a node and revoke its certificate (the name may join again).
    Delete { name: String },
    /// Hold a node: no rollout gives it a new desired state (it keeps repairing drift).
    Hold {
        name: String,
        /// Why, shown in `node get` and the event log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Release a held node: it catches up with the rollouts it missed.
    Unhold { name: String },
    /// Make a node try its desired version again: one it gave up on after
    /// crashing in a loop (or waits to retry with a backoff), or rolled back.
    Retry {
        name: String,
        /// Only this bundle [default: every bundle of the node].
        #[arg(long)]
        bundle: Option<String>,
    },
}

#[derive(Subcommand)]
enum EventCmd {
    /// List recent events, oldest first.
    List {
        /// Only this node.
        #[arg(long, default_value = "")]
        node: String,
        /// Only this tenant cluster.
        #[arg(long, default_value = "")]
        cluster: String,
        /// Only this rollout.
        #[arg(long, default_value = "")]
        rollout: String,
        /// At most this many events (0: server default).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap adds usage and hints after a blank line; keep the message
            // (which may span lines, e.g. a list of missing flags) on one line.
            let text = e.to_string();
            let msg = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let msg = msg.trim_start_matches("error: ");
            eprintln!("error: {msg} (see `lksctl --help`)");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&*e).replace('\n', " "));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = cli.config.unwrap_or_else(|| PathBuf::from("admin.conf"));
    match cli.cmd {
        // Commands that need no server.
        Cmd::Bundle {
            cmd: BundleCmd::Keygen { out },
        } => bundle::keygen(&out),
        Cmd::Console { listen, open } => console::run(&config, listen, open).await,
        Cmd::Release { cmd } if release::release_offline(&cmd) => {
            cmd.check()?;
            release::run_offline_release(cmd)
        }
        Cmd::Root { cmd } if release::root_offline(&cmd) => {
            cmd.check()?;
            release::run_offline_root(cmd)
        }
        cmd => {
            // Arguments are checked before dialling, so a typo fails fast.
            precheck(&cmd)?;
            let (mut c, url) = client::connect(&config).await?;
            dispatch(&mut c, &url, cmd).await
        }
    }
}

fn labels(flag: &str, s: &str) -> anyhow::Result<Labels> {
    parse_labels(s).with_context(|| flag.to_string())
}

/// The CA PEM the user-data hands to curl must be the CA the join line pins:
/// the first certificate's key hashes to `ca_cert_hash`.
fn check_ca_pem(pem: &str, ca_cert_hash: &str) -> anyhow::Result<()> {
    let hash = lks_proto::identity::pem_certs(pem).ok().and_then(|certs| {
        certs
            .first()
            .and_then(|der| lks_proto::identity::ca_cert_hash(der).ok())
    });
    match hash {
        Some(h) if h.to_string() == ca_cert_hash => Ok(()),
        Some(h) => bail!("the server's CA certificate hashes to {h}, not to its join line's {ca_cert_hash}"),
        None => bail!("the server returned no usable CA certificate to download its agent package with"),
    }
}

fn precheck(cmd: &Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Cluster { cmd } => {
            if let Some(name) = cmd.name() {
                validate_cluster_name(name)?;
            }
            if let cluster::ClusterCmd::Set(cluster::SetFlags {
                maintenance_window, ..
            }) = cmd
            {
                windows::parse_all(maintenance_window).context("--maintenance-window")?;
            }
            cmd.check()
        }
        Cmd::Token {
            cmd: TokenCmd::Create {
                cluster, labels: l, ..
            },
        } => {
            validate_cluster_name(cluster).context("--cluster")?;
            labels("--labels", l).map(|_| ())
        }
        Cmd::Rollout {
            cmd:
                rollout::RolloutCmd::Start {
                    cluster,
                    bundle,
                    selector,
                    ..
                },
        } => rollout::check_start(cluster, bundle, selector),
        Cmd::Bundle {
            cmd: BundleCmd::Get { bundle, .. } | BundleCmd::Delete { bundle, .. },
        } => parse_bundle_ref(bundle).map(|_| ()).map_err(anyhow::Error::from),
        Cmd::Node {
            cmd:
                NodeCmd::Get { name, .. }
                | NodeCmd::Delete { name }
                | NodeCmd::Hold { name, .. }
                | NodeCmd::Retry { name, .. }
                | NodeCmd::Unhold { name },
        } => validate_node_name(name).map_err(anyhow::Error::from),
        Cmd::Release { cmd } => cmd.check(),
        Cmd::Root { cmd } => cmd.check(),
        _ => Ok(()),
    }
}

fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn dispatch(c: &mut Client, url: &str, cmd: Cmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        // `run` serves the console before anything is dialled.
        Cmd::Console { .. } => bail!("lksctl console needs no connection made beforehand"),
        Cmd::Cluster { cmd } => cluster::run(c, url, cmd).await?,
        Cmd::Release { cmd } => release::run_release(c, url, cmd).await?,
        Cmd::Root { cmd } => release::run_root(c, url, cmd).await?,
        Cmd::Token { cmd } => token(c, url, cmd).await?,
        Cmd::Bundle { cmd } => bundle::run(c, url, cmd).await?,
        Cmd::Rollout { cmd } => rollout::run(c, url, cmd).await?,
        Cmd::Audit(a) => audit::run(c, url, a).await?,
        Cmd::Node { cmd } => node(c, url, cmd).await?,
        Cmd::Event {
            cmd:
                EventCmd::List {
                    node,
                    cluster,
                    rollout,
                    limit,
                    output,
                },
        } => {
            let r = c
                .list_events(pb::ListEventsRequest {
                    cluster,
                    node,
                    rollout_id: rollout,
                    limit,
                })
                .await
                .map_err(st)
                .context("list events")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.events.iter().map(output::event_json).collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::events_table(&r.events));
            }
        }
    }
    Ok(())
}

/// `lksctl token create`: the join line, as JSON, or as cloud-init
/// user-data.
async fn token(c: &mut Client, url: &str, cmd: TokenCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    let TokenCmd::Create {
        cluster,
        ttl,
        uses,
        labels: l,
        cloud_init,
        package_url,
        apt,
        trust_key,
        trust_threshold,
        output,
    } = cmd;
    if ttl.as_secs() == 0 {
        bail!("--ttl must be at least 1s");
    }
    let (trust_keys, trust_threshold) = trust_keys(&trust_key, trust_threshold)?;
    // Checked before the token exists, so a typo leaves no token behind.
    if let Some(url) = package_url.as_deref() {
        cloudinit::check_package_url(url)?;
    }
    let r = c
        .create_token(pb::CreateTokenRequest {
            cluster: cluster.clone(),
            ttl_seconds: ttl.as_secs(),
            uses,
            labels: labels("--labels", &l)?.into_iter().collect(),
        })
        .await
        .map_err(st)
        .with_context(|| format!("create token for cluster {cluster}"))?
        .into_inner();
    if output == Format::Json {
        print_json(&token_json(&r))?;
    } else if cloud_init {
        let text = user_data(
            &r,
            &cluster,
            package_url.as_deref(),
            apt,
            &trust_keys,
            trust_threshold,
        )?;
        out!("{text}");
    } else {
        outln!("{}", r.join_command);
    }
    Ok(())
}

/// The `--trust-key` files as distinct PEMs, and the `--trust-threshold`
/// checked against them (0: not given).
fn trust_keys(files: &[PathBuf], threshold: Option<u32>) -> anyhow::Result<(Vec<String>, u32)> {
    // Read before the token exists, so a bad key leaves no token behind.
    let mut trust_keys: Vec<String> = Vec::new();
    for p in files {
        let pem = lks_proto::sign::PublisherKey::from_file(p)
            .context("--trust-key")?
            .to_pem();
        if !trust_keys.contains(&pem) {
            trust_keys.push(pem);
        }
    }
    let trust_threshold = match threshold {
        None => 0,
        Some(n) if n == 0 || n as usize > trust_keys.len() => bail!(
            "--trust-threshold {n}: it must be between 1 and the number of distinct --trust-key files ({})",
            trust_keys.len()
        ),
        Some(n) => n,
    };
    Ok((trust_keys, trust_threshold))
}

/// `token create -o json`.
fn token_json(r: &pb::CreateTokenResponse) -> serde_json::Value {
    serde_json::json!({
        "token": r.token,
        "ca_cert_hash": r.ca_cert_hash,
        "server": r.server,
        "join_command": r.join_command,
        "expires_at": output::rfc3339_s(r.expires_at),
        "ca_cert_pem": r.ca_cert_pem,
        "agent_packages": r.agent_packages.iter().map(|p| serde_json::json!({
            "arch": p.arch,
            "version": p.version,
            "url": p.url,
            "digest": p.digest,
            "size": p.size,
            "file_name": p.file_name,
        })).collect::<Vec<_>>(),
    })
}

/// The cloud-init user-data that joins a node with the token `r`,
/// installing the agent from `--package-url`, apt, or the server.
fn user_data(
    r: &pb::CreateTokenResponse,
    cluster: &str,
    package_url: Option<&str>,
    apt: bool,
    trust_keys: &[String],
    trust_threshold: u32,
) -> anyhow::Result<String> {
    let offered = r
        .agent_packages
        .iter()
        .map(|p| format!("{} {}", p.arch, p.version))
        .collect::<Vec<_>>()
        .join(", ");
    let package = if let Some(url) = package_url {
        cloudinit::PackageSource::Url(url)
    } else if apt {
        cloudinit::PackageSource::Apt
    } else if r.agent_packages.is_empty() {
        eprintln!(
            "note: the server offers no agent package (lks-control-server --agent-package); \
             the user-data installs lksadmin-agent from the image's apt repositories"
        );
        cloudinit::PackageSource::Apt
    } else {
        check_ca_pem(&r.ca_cert_pem, &r.ca_cert_hash)?;
        cloudinit::PackageSource::Server {
            servers: &r.server,
            ca_pem: &r.ca_cert_pem,
            offered: &offered,
        }
    };
    let text = cloudinit::render(&cloudinit::UserData {
        cluster,
        join_command: &r.join_command,
        expires_at: &output::rfc3339_s(r.expires_at).unwrap_or_default(),
        package,
        trust_keys,
        trust_threshold,
    })?;
    Ok(text)
}

/// `lksctl node …`.
async fn node(c: &mut Client, url: &str, cmd: NodeCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        NodeCmd::List { cluster, output } => {
            let r = c
                .list_nodes(pb::ListNodesRequest { cluster })
                .await
                .map_err(st)
                .context("list nodes")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.nodes.iter().map(output::node_json).collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::nodes_table(&r.nodes));
            }
        }
        NodeCmd::Get { name, output } => {
            let n = c
                .get_node(pb::GetNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("get node {name}"))?
                .into_inner();
            if output == Format::Json {
                print_json(&output::node_json(&n))?;
            } else {
                out!("{}", output::node_text(&n));
            }
        }
        NodeCmd::Delete { name } => {
            c.delete_node(pb::DeleteNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("delete node {name}"))?;
            outln!("node {name} deleted; its certificate no longer works");
        }
        NodeCmd::Hold { name, reason } => {
            c.hold_node(pb::HoldNodeRequest {
                name: name.clone(),
                reason,
            })
            .await
            .map_err(st)
            .with_context(|| format!("hold node {name}"))?;
            outln!("node {name} held: no rollout gives it a new version until `lksctl node unhold {name}`");
        }
        NodeCmd::Retry { name, bundle } => {
            let r = c
                .retry_node(pb::RetryNodeRequest {
                    name: name.clone(),
                    bundle: bundle.unwrap_or_default(),
                })
                .await
                .map_err(st)
                .with_context(|| format!("retry node {name}"))?
                .into_inner();
            outln!("node {name}: retry of {} requested", r.bundles.join(", "));
        }
        NodeCmd::Unhold { name } => {
            c.unhold_node(pb::UnholdNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("unhold node {name}"))?;
            outln!("node {name} released: it catches up with the rollouts it missed");
        }
    }
    Ok(())
}

/// Writes lksctl's output. A closed pipe means the reader has what it
/// wanted: exit 0 at once. Any other write error is one line and status 1.
fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("lksctl: cannot write the output: {e}");
        std::process::exit(1);
    }
}
