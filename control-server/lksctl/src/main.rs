//! `lksctl`: the operator CLI for the lksadmin control server. This file
//! parses the command line, checks it before any call and dispatches to
//! the library's verb modules (`lksctl::…`), which never reach back here.
//!
//! Every error is one line on stderr (`error: …`) and a non-zero exit.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use lks_proto::names::{parse_bundle_ref, validate_cluster_name, validate_node_name};
use lks_proto::report::one_line;
use lks_proto::windows;

use lksctl::bundle::{self, BundleCmd};
use lksctl::client::{self, Client};
use lksctl::event::EventCmd;
use lksctl::flags::labels;
use lksctl::node::{self, NodeCmd};
use lksctl::reboot::RebootCmd;
use lksctl::token::{self, TokenCmd};
use lksctl::{audit, cluster, console, event, plan, reboot, release, rollout};

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
    /// Release plans: one bundle version to many clusters, in ordered
    /// groups, with soak, an in-flight limit and a failure budget.
    Plan {
        #[command(subcommand)]
        cmd: plan::PlanCmd,
    },
    /// Enrolled nodes.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Coordinated reboots of a cluster's nodes: at most N at a time,
    /// inside the maintenance windows, drained first, Ready after boot.
    Reboot {
        #[command(subcommand)]
        cmd: RebootCmd,
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

fn precheck(cmd: &Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Cluster { cmd } => {
            if let Some(name) = cmd.name() {
                validate_cluster_name(name)?;
            }
            if let cluster::ClusterCmd::Set(f) = cmd {
                windows::parse_all(&f.maintenance_window).context("--maintenance-window")?;
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
        Cmd::Plan {
            cmd: plan::PlanCmd::Create(a),
        } => plan::check_create(a),
        Cmd::Reboot { cmd } => cmd.check(),
        _ => Ok(()),
    }
}

async fn dispatch(c: &mut Client, url: &str, cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        // `run` serves the console before anything is dialled.
        Cmd::Console { .. } => bail!("lksctl console needs no connection made beforehand"),
        Cmd::Cluster { cmd } => cluster::run(c, url, cmd).await,
        Cmd::Release { cmd } => release::run_release(c, url, cmd).await,
        Cmd::Root { cmd } => release::run_root(c, url, cmd).await,
        Cmd::Token { cmd } => token::run(c, url, cmd).await,
        Cmd::Bundle { cmd } => bundle::run(c, url, cmd).await,
        Cmd::Rollout { cmd } => rollout::run(c, url, cmd).await,
        Cmd::Plan { cmd } => plan::run(c, url, cmd).await,
        Cmd::Audit(a) => audit::run(c, url, a).await,
        Cmd::Node { cmd } => node::run(c, url, cmd).await,
        Cmd::Reboot { cmd } => reboot::run(c, url, cmd).await,
        Cmd::Event { cmd } => event::run(c, url, cmd).await,
    }
}
