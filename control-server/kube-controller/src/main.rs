//! `lks-kube-controller`: kube0 drives lksadmin the Kubernetes way.
//! `crds` prints (or writes) the custom resources' manifests; `run` is the
//! controller (see the crate's `run` module).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "lks-kube-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the CustomResourceDefinitions (LksCluster, LksNode, LksRollout,
    /// LksBundleVersion) as YAML, or write one file each into --out.
    Crds {
        /// Write PLURAL.GROUP.yaml files into this directory.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// While holding the Lease: reconcile LksClusters and LksRollouts to the
    /// server, mirror its nodes, bundle versions and lksctl-started rollouts
    /// into kube0, and apply LksNode holds, one object at a time (one that
    /// fails holds up no other). kube0 is reached in-cluster or through
    /// $KUBECONFIG.
    Run {
        /// The admin credential of lks-control-server (a mounted Secret).
        #[arg(long, value_name = "FILE", env = "LKS_ADMIN_CONF")]
        admin_conf: PathBuf,
        /// Namespace of the leader-election Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "lksadmin")]
        namespace: String,
        /// Name of the Lease.
        #[arg(long, default_value = "lks-kube-controller")]
        lease: String,
        /// This copy's name in the Lease [default: $POD_NAME or the hostname].
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// How often the server is read (and each object looked at again).
        #[arg(long, value_parser = lks_proto::duration::parse_duration, default_value = "5s")]
        interval: Duration,
        /// How often a start the server refused (an LksRollout whose bundle
        /// is not published yet, say) is tried again; a changed spec is
        /// tried at once. Also the longest an object whose reconcile failed
        /// (kube0 or the server unreachable, a write refused) waits before
        /// it is tried again (1 s, then ×1.6 per failure).
        #[arg(long, value_parser = lks_proto::duration::parse_duration, default_value = "30s")]
        retry_interval: Duration,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run {
            admin_conf,
            namespace,
            lease,
            identity,
            interval,
            retry_interval,
        } => {
            tracing_subscriber::fmt().with_writer(std::io::stderr).init();
            let _ = rustls::crypto::ring::default_provider().install_default();
            let identity = identity
                .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .context("no --identity and no hostname")?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("start the runtime")?;
            rt.block_on(async move {
                let kube = kube::Client::try_default()
                    .await
                    .context("reach kube0 (in-cluster, or $KUBECONFIG)")?;
                let cancel = tokio_util::sync::CancellationToken::new();
                let stop = cancel.clone();
                tokio::spawn(async move {
                    let mut term =
                        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                            Ok(t) => t,
                            Err(_) => return,
                        };
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                    stop.cancel();
                });
                let opts = lks_kube_controller::run::Options {
                    admin_conf,
                    namespace,
                    lease,
                    identity,
                    interval,
                    retry_interval,
                };
                lks_kube_controller::run::run(opts, kube, cancel).await;
                anyhow::Ok(())
            })?;
        }
        Cmd::Crds { out } => {
            for c in lks_kube_controller::crds() {
                let text = lks_kube_controller::file_text(&c).context("serialise a CRD")?;
                match &out {
                    None => print!("---\n{text}"),
                    Some(dir) => {
                        let p = dir.join(lks_kube_controller::file_name(&c));
                        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
                    }
                }
            }
        }
    }
    Ok(())
}
