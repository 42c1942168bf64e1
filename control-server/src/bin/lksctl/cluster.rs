//! `lksctl cluster …`: tenant clusters, their CA, API server and
//! maintenance windows, and the certificates issued with their CA.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Subcommand;
use lks_proto::duration::parse_duration;
use lks_proto::pb;

use crate::client::{Client, status};
use crate::output::{self, Format};
use crate::print_json;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Create a tenant cluster with its CA: imported (--ca-cert and --ca-key,
    /// e.g. kubeadm's /etc/kubernetes/pki/ca.{crt,key}) or generated.
    Create {
        name: String,
        /// The cluster CA certificate (PEM) to import; needs --ca-key.
        #[arg(long, value_name = "FILE")]
        ca_cert: Option<PathBuf>,
        /// The cluster CA private key (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC); needs --ca-cert.
        #[arg(long, value_name = "FILE")]
        ca_key: Option<PathBuf>,
        /// The tenant cluster's API server, e.g. https://10.0.0.1:6443.
        #[arg(long, value_name = "URL")]
        api_server: Option<String>,
    },
    /// Print the cluster CA certificate (PEM only: `lksctl cluster ca NAME > ca.crt`).
    Ca { name: String },
    /// List the certificates issued with the cluster CA (the newest per node, bundle and path).
    Certs {
        name: String,
        /// Only certificates that expire within this time (or have expired), e.g. 720h.
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        expiring: Option<Duration>,
        /// Every certificate ever issued, not only the newest of each path.
        #[arg(long)]
        all: bool,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Change a cluster: its maintenance windows (outside every window no
    /// rollout starts a node), its API server, or a CA if it has none.
    Set {
        name: String,
        /// A window, e.g. "Sat,Sun 02:00-06:00 Europe/Berlin" (days Mon..Sun, ranges
        /// like Mon-Fri, or daily; an end before the start runs past midnight);
        /// repeatable, replaces every window.
        #[arg(
            long = "maintenance-window",
            value_name = "WINDOW",
            required_unless_present_any = ["no_maintenance_window", "api_server", "no_api_server", "ca_cert", "ca_key", "generate_ca"]
        )]
        maintenance_window: Vec<String>,
        /// Remove every window: nodes may start at any time.
        #[arg(long, conflicts_with = "maintenance_window")]
        no_maintenance_window: bool,
        /// Set the tenant cluster's API server (https://HOST[:PORT]).
        #[arg(long, value_name = "URL")]
        api_server: Option<String>,
        /// Remove the API server.
        #[arg(long, conflicts_with = "api_server")]
        no_api_server: bool,
        /// Import this CA certificate for a cluster without a CA; needs --ca-key.
        #[arg(long, value_name = "FILE", conflicts_with = "generate_ca")]
        ca_cert: Option<PathBuf>,
        /// The private key of --ca-cert.
        #[arg(long, value_name = "FILE", conflicts_with = "generate_ca")]
        ca_key: Option<PathBuf>,
        /// Generate a CA for a cluster without one.
        #[arg(long)]
        generate_ca: bool,
    },
    /// List clusters.
    List {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

impl ClusterCmd {
    pub fn name(&self) -> Option<&str> {
        match self {
            ClusterCmd::Create { name, .. }
            | ClusterCmd::Ca { name }
            | ClusterCmd::Certs { name, .. }
            | ClusterCmd::Set { name, .. } => Some(name),
            ClusterCmd::List { .. } => None,
        }
    }

    /// Checks what can be checked before connecting: the CA files are given
    /// as a pair and readable.
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            ClusterCmd::Create { ca_cert, ca_key, .. } | ClusterCmd::Set { ca_cert, ca_key, .. } => {
                read_pair(ca_cert.as_deref(), ca_key.as_deref()).map(|_| ())
            }
            _ => Ok(()),
        }
    }
}

/// The CA certificate and key files, both or neither.
fn read_pair(cert: Option<&Path>, key: Option<&Path>) -> anyhow::Result<Option<(String, String)>> {
    let read = |p: &Path, what: &str| {
        std::fs::read_to_string(p).with_context(|| format!("read the CA {what} {}", p.display()))
    };
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some((read(c, "certificate")?, read(k, "key")?))),
        (Some(_), None) => Err(anyhow!("--ca-cert needs --ca-key (the CA's private key)")),
        (None, Some(_)) => Err(anyhow!("--ca-key needs --ca-cert (the CA certificate)")),
    }
}

pub async fn run(c: &mut Client, url: &str, cmd: ClusterCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        ClusterCmd::Create {
            name,
            ca_cert,
            ca_key,
            api_server,
        } => {
            let ca = read_pair(ca_cert.as_deref(), ca_key.as_deref())?;
            let imported = ca.is_some();
            let (ca_cert_pem, ca_key_pem) = ca.unwrap_or_default();
            let r = c
                .create_cluster(pb::CreateClusterRequest {
                    name: name.clone(),
                    ca_cert_pem,
                    ca_key_pem,
                    api_server: api_server.unwrap_or_default(),
                })
                .await
                .map_err(st)
                .with_context(|| format!("create cluster {name}"))?
                .into_inner();
            let how = if imported { "CA imported" } else { "CA generated" };
            outln!("cluster {name} created ({how}, {})", r.ca_cert_hash);
        }
        ClusterCmd::Ca { name } => {
            let r = c
                .get_cluster_ca(pb::GetClusterCaRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("get the CA of cluster {name}"))?
                .into_inner();
            out!("{}", r.ca_cert_pem);
            if !r.ca_cert_pem.ends_with('\n') {
                outln!();
            }
        }
        ClusterCmd::Certs {
            name,
            expiring,
            all,
            output,
        } => {
            let within = expiring.unwrap_or_default();
            let r = c
                .list_certificates(pb::ListCertificatesRequest {
                    cluster: name.clone(),
                    node: String::new(),
                    expiring_within_ms: i64::try_from(within.as_millis()).unwrap_or(i64::MAX),
                    all,
                })
                .await
                .map_err(st)
                .with_context(|| format!("list the certificates of cluster {name}"))?
                .into_inner();
            let now = lks_control_server::clock::now_ms();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.certificates
                        .iter()
                        .map(|x| output::cert_json(x, now, within))
                        .collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::certs_table(&r.certificates, now, within));
            }
        }
        ClusterCmd::Set {
            name,
            maintenance_window,
            no_maintenance_window,
            api_server,
            no_api_server,
            ca_cert,
            ca_key,
            generate_ca,
        } => {
            let windows = no_maintenance_window || !maintenance_window.is_empty();
            let ca = read_pair(ca_cert.as_deref(), ca_key.as_deref())?;
            let (ca_cert_pem, ca_key_pem) = ca.clone().unwrap_or_default();
            let r = c
                .set_cluster(pb::SetClusterRequest {
                    peer_upload_rate: Default::default(),
                    peer_max_uploads: Default::default(),
                    peer_port: Default::default(),
                    peer_sharing: None,
                    name: name.clone(),
                    maintenance_windows: maintenance_window,
                    clear_maintenance_windows: no_maintenance_window,
                    api_server: api_server.clone(),
                    clear_api_server: no_api_server,
                    ca_cert_pem,
                    ca_key_pem,
                    generate_ca,
                })
                .await
                .map_err(st)
                .with_context(|| format!("set cluster {name}"))?
                .into_inner();
            if ca.is_some() || generate_ca {
                let how = if ca.is_some() { "imported" } else { "generated" };
                outln!("cluster {name}: CA {how} ({})", r.ca_cert_hash);
            }
            if api_server.is_some() || no_api_server {
                match r.api_server.as_str() {
                    "" => outln!("cluster {name}: no API server"),
                    u => outln!("cluster {name}: API server {u}"),
                }
            }
            if windows {
                outln!("{}", output::cluster_windows_line(&r));
            }
        }
        ClusterCmd::List { output } => {
            let r = c
                .list_clusters(pb::ListClustersRequest {})
                .await
                .map_err(st)
                .context("list clusters")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.clusters.iter().map(output::cluster_json).collect::<Vec<_>>()
                ))?;
            } else {
                let rows: Vec<Vec<String>> = r
                    .clusters
                    .iter()
                    .map(|c| {
                        vec![
                            c.name.clone(),
                            c.node_count.to_string(),
                            output::rfc3339_ms(c.created_at_ms).unwrap_or_default(),
                            if c.api_server.is_empty() {
                                "-".into()
                            } else {
                                c.api_server.clone()
                            },
                            if c.has_ca {
                                c.ca_cert_hash.clone()
                            } else {
                                "none".into()
                            },
                            output::windows_text(c),
                        ]
                    })
                    .collect();
                out!(
                    "{}",
                    output::table(
                        &[
                            "NAME",
                            "NODES",
                            "CREATED",
                            "API-SERVER",
                            "CA",
                            "MAINTENANCE WINDOWS"
                        ],
                        &rows
                    )
                );
            }
        }
    }
    Ok(())
}
