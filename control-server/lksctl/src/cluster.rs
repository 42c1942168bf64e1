//! `lksctl cluster …`: tenant clusters, their CA, API server, maintenance
//! windows and peer sharing, and the certificates issued with their CA.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::rate::parse_rate;

use anyhow::{Context, anyhow};
use clap::Subcommand;
use lks_proto::duration::parse_duration;
use lks_proto::pb;

use crate::client::{Client, status};
use crate::flags::labels;
use crate::output::{self, Format, print_json};

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
    /// rollout starts a node), its API server, a CA if it has none,
    /// whether and how its nodes share blobs with each other, its tenant
    /// API, or its coordinated reboots and their gates.
    Set(Box<SetFlags>),
    /// Show one cluster.
    Get {
        name: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// List clusters.
    List {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

/// A value that is neither on nor off; carries it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?}: give on or off")]
pub struct NotOnOff {
    pub value: String,
}

/// `on` or `off` (also `true`/`false`, `yes`/`no`).
fn parse_on_off(s: &str) -> Result<bool, NotOnOff> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(NotOnOff { value: s.into() }),
    }
}

impl ClusterCmd {
    pub fn name(&self) -> Option<&str> {
        match self {
            ClusterCmd::Create { name, .. }
            | ClusterCmd::Ca { name }
            | ClusterCmd::Certs { name, .. }
            | ClusterCmd::Get { name, .. } => Some(name),
            ClusterCmd::Set(f) => Some(&f.name),
            ClusterCmd::List { .. } => None,
        }
    }

    /// Checks what can be checked before connecting: the CA files are given
    /// as a pair and readable.
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            ClusterCmd::Create { ca_cert, ca_key, .. } => {
                read_pair(ca_cert.as_deref(), ca_key.as_deref()).map(|_| ())
            }
            ClusterCmd::Set(f) => read_pair(f.ca_cert.as_deref(), f.ca_key.as_deref()).map(|_| ()),
            _ => Ok(()),
        }
    }
}

/// Largest kubeconfig read (the server takes 64 KiB).
const MAX_KUBECONFIG: u64 = 64 * 1024;

/// The text of a kubeconfig file, read whole.
fn read_kubeconfig(p: &Path) -> anyhow::Result<String> {
    let what = || format!("read the kubeconfig {}", p.display());
    let len = std::fs::metadata(p).with_context(what)?.len();
    if len > MAX_KUBECONFIG {
        return Err(anyhow!(
            "{}: {len} bytes is larger than a kubeconfig (64 KiB at most)",
            what()
        ));
    }
    std::fs::read_to_string(p).with_context(what)
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
        } => create(c, url, name, ca_cert, ca_key, api_server).await?,
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
        } => certs(c, url, name, expiring, all, output).await?,
        ClusterCmd::Set(flags) => set(c, url, *flags).await?,
        ClusterCmd::Get { name, output } => {
            // No call reads one cluster: the list has it.
            let r = c
                .list_clusters(pb::ListClustersRequest {})
                .await
                .map_err(st)
                .with_context(|| format!("get cluster {name}"))?
                .into_inner();
            let cluster = r
                .clusters
                .into_iter()
                .find(|c| c.name == name)
                .ok_or_else(|| anyhow!("get cluster {name}: cluster {name} does not exist"))?;
            if output == Format::Json {
                print_json(&output::cluster_json(&cluster))?;
            } else {
                out!("{}", output::cluster_detail(&cluster));
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
                out!("{}", clusters_table(&r.clusters));
            }
        }
    }
    Ok(())
}

/// `cluster create NAME`, with a CA generated or imported.
async fn create(
    c: &mut Client,
    url: &str,
    name: String,
    ca_cert: Option<PathBuf>,
    ca_key: Option<PathBuf>,
    api_server: Option<String>,
) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
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
    Ok(())
}

/// `cluster certs NAME`: the node certificates of a cluster (expiring
/// within `expiring`, or all).
async fn certs(
    c: &mut Client,
    url: &str,
    name: String,
    expiring: Option<Duration>,
    all: bool,
    output: Format,
) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
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
    let now = crate::output::now_ms();
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
    Ok(())
}

// `cluster set`'s flags, as given (a plain comment: the subcommand's help
// is the doc comment of `ClusterCmd::Set`).
#[derive(clap::Args)]
pub struct SetFlags {
    name: String,
    /// A window, e.g. "Sat,Sun 02:00-06:00 Europe/Berlin" (days Mon..Sun, ranges
    /// like Mon-Fri, or daily; an end before the start runs past midnight);
    /// repeatable, replaces every window.
    #[arg(
        long = "maintenance-window",
        value_name = "WINDOW",
        required_unless_present_any = [
            "no_maintenance_window", "api_server", "no_api_server", "ca_cert", "ca_key", "generate_ca",
            "peer_sharing", "peer_port", "peer_upload_rate", "peer_max_uploads",
            "kubeconfig", "drain", "reboots", "max_concurrent_reboots", "reboot_timeout",
            "on_reboot_timeout", "reboot_alert_gate", "alert_filter", "no_reboot_alert_gate",
            "blocking_pod_selector", "no_blocking_pod_selector", "labels", "no_labels"
        ]
    )]
    pub maintenance_window: Vec<String>,
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
    /// Whether the cluster's nodes share blobs with each other (each
    /// node fetches chunks from peers and serves what it holds).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    peer_sharing: Option<bool>,
    /// TCP port each node listens on for its peers [default: 7444].
    /// Kept while sharing is off.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u32).range(1..=65535))]
    peer_port: Option<u32>,
    /// Upload cap per node: bytes per second, or with a unit, e.g.
    /// 50MiB, 20MB, 200Mbit (bits per second); 0: no cap [default: 0].
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    peer_upload_rate: Option<u64>,
    /// Concurrent uploads per node, 1 to 64 [default: 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    peer_max_uploads: Option<u32>,
    /// A kubeconfig for the tenant cluster's API server, so rollouts can
    /// drain nodes and wait for them to be Ready (a ServiceAccount's:
    /// packaging/kubernetes/tenant/README.md); `none` removes it. Stored
    /// encrypted like the CA keys, never printed back.
    #[arg(long, value_name = "FILE|none")]
    kubeconfig: Option<PathBuf>,
    /// Whether rollouts of the cluster drain each node at its turn
    /// unless `rollout start` says otherwise; needs a kubeconfig.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    drain: Option<bool>,
    /// The cluster's labels, k=v,… (replaces them all); release plans
    /// select clusters by them (`plan create --group NAME=k=v`).
    #[arg(long, value_name = "k=v,…", value_parser = parse_cluster_labels)]
    labels: Option<lks_proto::labels::Labels>,
    /// Remove every label of the cluster.
    #[arg(long, conflicts_with = "labels")]
    no_labels: bool,
    /// Coordinated reboots: auto (nodes that report a reboot required, and
    /// `lksctl reboot start`), manual (only `reboot start`), off [default].
    #[arg(long, value_name = "auto|manual|off", value_parser = ["auto", "manual", "off"])]
    reboots: Option<String>,
    /// Nodes rebooting at once, from their drain until back Ready [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_concurrent_reboots: Option<u32>,
    /// How long a node has, from taking its slot, to be back Ready; past
    /// it the node is reboot-lost [default: 30m].
    #[arg(long, value_name = "DUR", value_parser = lks_proto::duration::parse_duration)]
    reboot_timeout: Option<Duration>,
    /// What a reboot-lost node's slot becomes: free (given to the next
    /// node) or keep (until it is back, or `reboot abort`) [default: free].
    #[arg(long, value_name = "free|keep", value_parser = ["free", "keep"])]
    on_reboot_timeout: Option<String>,
    /// Reboot gate: give no node a reboot slot while an alert is firing in
    /// this Prometheus (http[s]://HOST:PORT[/PATH], asked at
    /// URL/api/v1/alerts, answers kept 3 s, 5 s timeout). Only firing
    /// alerts count, not pending ones; a Prometheus that cannot be asked
    /// closes the gate. Slots already held are not taken back.
    #[arg(long, value_name = "URL")]
    reboot_alert_gate: Option<String>,
    /// Only alerts whose name this regular expression matches (searched
    /// anywhere in the name; ^Name$ for one) hold reboots; '' (the
    /// default): every firing alert does. Needs an alert gate.
    #[arg(long, value_name = "REGEX")]
    alert_filter: Option<String>,
    /// Remove the alert gate.
    #[arg(long, conflicts_with_all = ["reboot_alert_gate", "alert_filter"])]
    no_reboot_alert_gate: bool,
    /// Reboot gate: a node running a pod this Kubernetes label selector
    /// matches (k=v, k!=v, k in (a,b), k notin (a), k, !k; not Succeeded
    /// or Failed) gets no reboot slot until the pod is gone. Asked of the
    /// tenant API, so it needs --kubeconfig: without one, or when the
    /// tenant API cannot be asked, nodes wait.
    #[arg(long, value_name = "SELECTOR")]
    blocking_pod_selector: Option<String>,
    /// Remove the blocking-pod selector.
    #[arg(long, conflicts_with = "blocking_pod_selector")]
    no_blocking_pod_selector: bool,
}

fn parse_cluster_labels(s: &str) -> anyhow::Result<lks_proto::labels::Labels> {
    labels("--labels", s)
}

/// `cluster set`: reads the files it names, sends the change, and says
/// what each flag given changed.
async fn set(c: &mut Client, url: &str, f: SetFlags) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    let SetFlags {
        name,
        maintenance_window,
        no_maintenance_window,
        api_server,
        no_api_server,
        ca_cert,
        ca_key,
        generate_ca,
        peer_sharing,
        peer_port,
        peer_upload_rate,
        peer_max_uploads,
        kubeconfig,
        drain,
        labels: cluster_labels,
        no_labels,
        reboots,
        max_concurrent_reboots,
        reboot_timeout,
        on_reboot_timeout,
        reboot_alert_gate,
        alert_filter,
        no_reboot_alert_gate,
        blocking_pod_selector,
        no_blocking_pod_selector,
    } = f;
    let reboot_change = reboots.is_some()
        || max_concurrent_reboots.is_some()
        || reboot_timeout.is_some()
        || on_reboot_timeout.is_some()
        || reboot_alert_gate.is_some()
        || alert_filter.is_some()
        || no_reboot_alert_gate
        || blocking_pod_selector.is_some()
        || no_blocking_pod_selector;
    let labelled = cluster_labels.is_some() || no_labels;
    let windows = no_maintenance_window || !maintenance_window.is_empty();
    let clear_kubeconfig = kubeconfig.as_deref() == Some(Path::new("none"));
    let kubeconfig_text = match &kubeconfig {
        Some(p) if !clear_kubeconfig => Some(read_kubeconfig(p)?),
        _ => None,
    };
    let peer = peer_sharing.is_some()
        || peer_port.is_some()
        || peer_upload_rate.is_some()
        || peer_max_uploads.is_some();
    let ca = read_pair(ca_cert.as_deref(), ca_key.as_deref())?;
    let (ca_cert_pem, ca_key_pem) = ca.clone().unwrap_or_default();
    let r = c
        .set_cluster(pb::SetClusterRequest {
            peer_sharing,
            peer_port,
            peer_upload_rate,
            peer_max_uploads,
            name: name.clone(),
            maintenance_windows: maintenance_window,
            clear_maintenance_windows: no_maintenance_window,
            api_server: api_server.clone(),
            clear_api_server: no_api_server,
            ca_cert_pem,
            ca_key_pem,
            generate_ca,
            kubeconfig: kubeconfig_text,
            clear_kubeconfig,
            drain,
            labels: cluster_labels.unwrap_or_default().into_iter().collect(),
            clear_labels: no_labels,
            reboots: reboots.as_deref().map(|m| match m {
                "auto" => pb::RebootMode::Auto as i32,
                "manual" => pb::RebootMode::Manual as i32,
                _ => pb::RebootMode::Off as i32,
            }),
            max_concurrent_reboots,
            reboot_timeout_ms: reboot_timeout.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            on_reboot_timeout: on_reboot_timeout.as_deref().map(|m| match m {
                "keep" => pb::RebootTimeoutPolicy::Keep as i32,
                _ => pb::RebootTimeoutPolicy::Free as i32,
            }),
            reboot_alert_gate,
            alert_filter,
            clear_reboot_alert_gate: no_reboot_alert_gate,
            blocking_pod_selector,
            clear_blocking_pod_selector: no_blocking_pod_selector,
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
    if peer {
        outln!("cluster {name}: peer sharing {}", output::peer_text(&r));
    }
    if clear_kubeconfig {
        outln!("cluster {name}: kubeconfig removed");
    } else if kubeconfig.is_some() {
        outln!("cluster {name}: kubeconfig stored; tenant API {}", r.kube_probe);
    }
    if let Some(d) = drain {
        let how = if d { "drain" } else { "do not drain" };
        outln!("cluster {name}: rollouts {how} nodes by default");
    }
    if reboot_change {
        outln!(
            "cluster {name}: {}",
            output::reboot_policy_sentence(r.reboots.as_ref())
        );
    }
    if labelled {
        outln!("cluster {name}: labels {}", output::labels_text(&r.labels));
    }
    Ok(())
}

/// `cluster list` as a table.
fn clusters_table(clusters: &[pb::Cluster]) -> String {
    let rows: Vec<Vec<String>> = clusters
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
                output::labels_text(&c.labels),
                output::windows_text(c),
                output::peer_text(c),
                output::reboot_policy_text(c.reboots.as_ref()),
            ]
        })
        .collect();
    output::table(
        &[
            "NAME",
            "NODES",
            "CREATED",
            "API-SERVER",
            "CA",
            "LABELS",
            "MAINTENANCE WINDOWS",
            "PEER SHARING",
            "REBOOTS",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_and_off() {
        assert_eq!(parse_on_off("on"), Ok(true));
        assert_eq!(parse_on_off("OFF"), Ok(false));
        assert_eq!(
            parse_on_off("maybe").unwrap_err().to_string(),
            "\"maybe\": give on or off"
        );
    }
}
