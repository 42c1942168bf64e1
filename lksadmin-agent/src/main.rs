//! `lksadmin-agent`: parses the command line, builds the runtime, wires
//! SIGTERM/SIGINT to a cancellation token and calls into the library.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use lksadmin_agent::config::{DEFAULT_ROOT, DEFAULT_STATE_DIR, StateDir};
use lksadmin_agent::join::{JoinOutcome, JoinRequest};
use lksadmin_agent::settings::{DEFAULT_SETTINGS_FILE, RebootKeys, RunFlags, Settings, parse_heal_interval};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "lksadmin-agent", version, about = "lksadmin node agent")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Text,
}

#[derive(Subcommand)]
enum Cmd {
    /// Enrol this node into a tenant cluster.
    Join {
        /// Control server URL, or several separated by commas.
        #[arg(long, value_name = "URL[,URL...]")]
        server: String,
        /// Bootstrap token (abcdef.0123456789abcdef).
        #[arg(long)]
        token: String,
        /// Pin of the cluster CA: sha256 of its SubjectPublicKeyInfo.
        #[arg(long, value_name = "sha256:HEX")]
        ca_cert_hash: String,
        /// Node name (default: the hostname).
        #[arg(long)]
        node_name: Option<String>,
        /// Labels for this node: k=v,k2=v2.
        #[arg(long)]
        labels: Option<String>,
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Directory treated as / for every bundle path.
        #[arg(long, default_value = DEFAULT_ROOT)]
        root: PathBuf,
        /// Publisher key to trust (repeatable); then unsigned bundles are refused.
        #[arg(long = "trust-key", value_name = "FILE.pub")]
        trust_key: Vec<PathBuf>,
        /// Require signed release records: how many of the --trust-key keys
        /// must sign one (1..=number of keys). Absent: releases are not required.
        #[arg(long = "trust-threshold", value_name = "N")]
        trust_threshold: Option<u32>,
    },
    /// Run the agent (the systemd service).
    ///
    /// Settings come from the flags, then the settings file, then the defaults.
    Run {
        /// Settings file (keys: state_dir, root, heal_interval, peer_listen,
        /// reboot_sentinel, reboot_check, reboot_command); a missing default
        /// file is fine [default: /etc/lksadmin/agent.toml]
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// State dir written by join [default: /var/lib/lksadmin]
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Directory treated as / [default: the one given to join]
        #[arg(long)]
        root: Option<PathBuf>,
        /// How often managed files are re-verified [default: 60s]
        #[arg(long, value_parser = parse_heal_interval)]
        heal_interval: Option<Duration>,
        /// Where to listen for peers while the cluster shares blobs, as
        /// IP:PORT; this address is what the server names to other nodes
        /// [default: all addresses, the cluster's --peer-port]
        #[arg(long, value_name = "IP:PORT")]
        peer_listen: Option<std::net::SocketAddr>,
        /// The OS's reboot-required file, a path on the node (inside --root);
        /// `PATH.pkgs` lists the packages [default: /var/run/reboot-required]
        #[arg(long, value_name = "PATH")]
        reboot_sentinel: Option<PathBuf>,
        /// Command (run by /bin/sh -c every heal interval) whose exit status 0
        /// means a reboot is required; its first output line is the reason
        #[arg(long, value_name = "CMD")]
        reboot_check: Option<String>,
        /// How the node reboots when the server asks it to (run by /bin/sh -c)
        /// [default: systemctl reboot]
        #[arg(long, value_name = "CMD")]
        reboot_command: Option<String>,
    },
    /// Print `lksadmin-agent VERSION` (what a self-update checks a new
    /// binary with before handing over to it).
    Version,
    /// Show this node's local view.
    Status {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<Output>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let msg = match e.kind() {
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
                    "error: a command is required: join, run or status (see --help)".to_string()
                }
                _ => e
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or("error: invalid arguments")
                    .to_string(),
            };
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    lksadmin_agent::node::memory::keep_freed_memory_for_reuse();
    // reqwest and tonic share rustls; one process-wide provider (ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    lksadmin_agent::logging::init(match cli.cmd {
        Cmd::Run { .. } => "info",
        _ => "warn",
    });
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.cmd)) {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("error: {}", msg.split_whitespace().collect::<Vec<_>>().join(" "));
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Join {
            server,
            token,
            ca_cert_hash,
            node_name,
            labels,
            state_dir,
            root,
            trust_key,
            trust_threshold,
        } => {
            let req = JoinRequest {
                servers: server,
                token,
                ca_cert_hash,
                node_name,
                labels,
                state_dir,
                root,
                trust_keys: trust_key,
                trust_threshold,
            };
            match lksadmin_agent::join::join(&req)
                .await
                .context("join the cluster")?
            {
                JoinOutcome::Joined {
                    node,
                    cluster,
                    expires_at,
                } => println!(
                    "node {node} joined cluster {cluster} (certificate valid until {})",
                    lksadmin_agent::clock::when(expires_at * 1000)
                ),
                JoinOutcome::AlreadyJoined { node, cluster } => {
                    println!("node {node} is already joined to cluster {cluster}; nothing to do")
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            config,
            state_dir,
            root,
            heal_interval,
            peer_listen,
            reboot_sentinel,
            reboot_check,
            reboot_command,
        } => {
            // Read before anything starts, so a bad file stops the agent with
            // one line instead of running it on the wrong settings.
            let settings = match &config {
                Some(path) => Settings::load(path, true),
                None => Settings::load(DEFAULT_SETTINGS_FILE.as_ref(), false),
            }
            .context("load the agent settings")?;
            let reboot = RebootKeys {
                sentinel: reboot_sentinel,
                check: reboot_check,
                command: reboot_command,
            };
            reboot.check().context("check the reboot flags")?;
            let opts = settings.resolve(RunFlags {
                state_dir,
                root,
                heal_interval,
                peer_listen,
                reboot,
            });
            let cancel = CancellationToken::new();
            let on_signal = cancel.clone();
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("install the SIGTERM handler")?;
            tokio::spawn(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                on_signal.cancel();
            });
            match lksadmin_agent::run::run(opts, cancel)
                .await
                .context("run the agent")?
            {
                lksadmin_agent::run::RunEnd::Stopped => Ok(ExitCode::SUCCESS),
                // systemd's ExecStopPost guard switches binaries on this
                // status, then systemd starts the new one.
                lksadmin_agent::run::RunEnd::HandOver => {
                    Ok(ExitCode::from(lksadmin_agent::apply::selfupdate::HANDOVER_EXIT))
                }
            }
        }
        Cmd::Version => {
            println!("lksadmin-agent {}", lksadmin_agent::node::facts::AGENT_VERSION);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status { state_dir, output } => {
            let text = lksadmin_agent::status::render(
                &StateDir::new(state_dir),
                matches!(output, Some(Output::Json)),
            )
            .context("read the local state")?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
