//! The server's way to each tenant cluster's API: the cluster's stored
//! kubeconfig opened, a `kube::Client` built from it and kept (built again
//! when the stored kubeconfig changes), and the tenant's Node objects read
//! for the operator's view, each cluster's at most once per [`NODES_TTL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::config::KubeConfigOptions;
use lks_proto::sync::lock;
use sha2::{Digest as _, Sha256};

use crate::config::{KubeconfigError, TenantKubeconfig};
use crate::nodes::NodeKubeState;
use crate::secret::{SecretError, open_kubeconfig};
use lks_pki::seal::SealKey;
use lks_store::{ClusterStore, SealedField, StoreError};

/// How long a cluster's Node list is reused for `node list`: a view a few
/// seconds old, and one tenant API request per cluster per 5 s however
/// often operators and consoles ask.
pub const NODES_TTL: Duration = Duration::from_secs(5);
/// How long a failed read is reused: a tenant API that is down costs a
/// `node list` the connect timeout once per 30 s, not every 5 s.
pub const NODES_ERROR_TTL: Duration = Duration::from_secs(30);
/// How long a built client is used without looking at the stored
/// kubeconfig again: drain and Ready tasks ask for a client every second
/// per node, and a kubeconfig changes rarely (a change on this replica is
/// seen at once, `forget`; on another, within this).
const CLIENT_TTL: Duration = Duration::from_secs(10);
/// Dialling a tenant API gives up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A tenant API request gives up after this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Secret(#[from] SecretError),
    #[error("cluster {cluster}: stored kubeconfig: {source}")]
    Stored {
        cluster: String,
        source: KubeconfigError,
    },
    #[error("cluster {cluster}: tenant API client: {source}")]
    Client {
        cluster: String,
        #[source]
        source: ClientError,
    },
    #[error("cluster {cluster}: tenant API {server}: {message}")]
    Api {
        cluster: String,
        server: String,
        message: String,
    },
}

/// Why a cluster's Nodes could not be read (kept for a while, shared by
/// the callers that wait for one read).
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("{0}")]
    Client(#[from] TenantError),
    #[error("tenant API {server}: {source}")]
    List {
        server: String,
        #[source]
        source: kube::Error,
    },
}

/// Why a client for a checked kubeconfig could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(#[from] kube::config::KubeconfigError),
    #[error("{0}")]
    Build(#[from] kube::Error),
}

/// A built client and what it was built from.
#[derive(Clone)]
struct Entry {
    /// SHA-256 of the stored kubeconfig: a change builds a new client.
    stored: [u8; 32],
    /// When the stored kubeconfig was last read for it.
    checked: Instant,
    client: kube::Client,
    server: String,
}

/// What `node list` last read of a cluster's Nodes.
#[derive(Clone)]
struct NodesRead {
    at: Instant,
    nodes: Result<Arc<HashMap<String, NodeKubeState>>, Arc<NodesError>>,
}

/// Clients of the tenant APIs, by cluster.
pub struct TenantApis {
    store: Arc<dyn ClusterStore>,
    seal: Option<Arc<SealKey>>,
    /// One map insert, remove or lookup at a time, whole after a panic:
    /// locked with [`lock`] (a poisoned map once made every client be
    /// built again, uncached).
    clients: Mutex<HashMap<String, Entry>>,
    nodes: tokio::sync::Mutex<HashMap<String, NodesRead>>,
}

impl TenantApis {
    /// `seal`: the `--encryption-key-file` key; a sealed kubeconfig is
    /// bound to where `store` keeps it, as cluster CA keys are.
    pub fn new(store: Arc<dyn ClusterStore>, seal: Option<Arc<SealKey>>) -> Self {
        TenantApis {
            store,
            seal,
            clients: Mutex::default(),
            nodes: tokio::sync::Mutex::default(),
        }
    }

    /// The stored form of a checked kubeconfig for `cluster`.
    pub fn to_stored(&self, cluster: &str, k: &TenantKubeconfig) -> Result<String, SecretError> {
        let aad = self.store.sealed_aad(cluster, SealedField::Kubeconfig);
        crate::secret::seal_kubeconfig(self.seal.as_deref(), &aad, cluster, &k.to_text())
    }

    /// A client of `cluster`'s tenant API and its URL; `None` when the
    /// cluster has no kubeconfig (or does not exist).
    pub async fn client(&self, cluster: &str) -> Result<Option<(kube::Client, String)>, TenantError> {
        let cached = lock(&self.clients).get(cluster).cloned();
        if let Some(e) = cached
            && e.checked.elapsed() < CLIENT_TTL
        {
            return Ok(Some((e.client, e.server)));
        }
        let Some(stored) = self.store.cluster_kube(cluster).await?.and_then(|k| k.kubeconfig) else {
            self.forget(cluster);
            return Ok(None);
        };
        let hash: [u8; 32] = Sha256::digest(stored.as_bytes()).into();
        if let Some(e) = lock(&self.clients).get_mut(cluster)
            && e.stored == hash
        {
            e.checked = Instant::now();
            return Ok(Some((e.client.clone(), e.server.clone())));
        }
        let aad = self.store.sealed_aad(cluster, SealedField::Kubeconfig);
        let text = open_kubeconfig(self.seal.as_deref(), &aad, cluster, &stored)?;
        let checked = TenantKubeconfig::check(&text).map_err(|source| TenantError::Stored {
            cluster: cluster.to_string(),
            source,
        })?;
        let client = build_client(&checked)
            .await
            .map_err(|source| TenantError::Client {
                cluster: cluster.to_string(),
                source,
            })?;
        lock(&self.clients).insert(
            cluster.to_string(),
            Entry {
                stored: hash,
                checked: Instant::now(),
                client: client.clone(),
                server: checked.server.clone(),
            },
        );
        Ok(Some((client, checked.server)))
    }

    /// The version `cluster`'s tenant API server reports (`v1.37.2`);
    /// `None` when the cluster has no kubeconfig. Waits at most `timeout`.
    pub async fn server_version(
        &self,
        cluster: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<String>, TenantError> {
        let Some((client, server)) = self.client(cluster).await? else {
            return Ok(None);
        };
        let api = |message: String| TenantError::Api {
            cluster: cluster.to_string(),
            server: server.clone(),
            message,
        };
        match tokio::time::timeout(timeout, client.apiserver_version()).await {
            Ok(Ok(v)) => Ok(Some(v.git_version)),
            Ok(Err(e)) => Err(api(one_line(&e.to_string()))),
            Err(_) => Err(api(format!("no answer within {}s", timeout.as_secs()))),
        }
    }

    /// The pods of `cluster` that the label `selector` matches, in every
    /// namespace, that are not Succeeded or Failed: `namespace/name` by
    /// the node they are bound to (`spec.nodeName`; unbound ones left
    /// out), for the reboot lock's blocking-pod gate. One list per call,
    /// however many nodes wait. `None` when the cluster has no kubeconfig.
    pub async fn blocking_pods(
        &self,
        cluster: &str,
        selector: &str,
    ) -> Result<Option<HashMap<String, Vec<String>>>, TenantError> {
        let Some((client, server)) = self.client(cluster).await? else {
            return Ok(None);
        };
        let api: Api<Pod> = Api::all(client);
        let lp = ListParams::default()
            .labels(selector)
            .fields("status.phase!=Succeeded,status.phase!=Failed");
        let list = api.list(&lp).await.map_err(|e| TenantError::Api {
            cluster: cluster.to_string(),
            server,
            message: one_line(&e.to_string()),
        })?;
        let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
        for p in list.items {
            let Some(node) = p.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()) else {
                continue;
            };
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            let ns = p.metadata.namespace.unwrap_or_default();
            let name = p.metadata.name.unwrap_or_default();
            by_node.entry(node).or_default().push(format!("{ns}/{name}"));
        }
        for pods in by_node.values_mut() {
            pods.sort();
        }
        Ok(Some(by_node))
    }

    /// Drops what is kept of `cluster` (its kubeconfig changed or went).
    pub fn forget(&self, cluster: &str) {
        lock(&self.clients).remove(cluster);
        if let Ok(mut n) = self.nodes.try_lock() {
            n.remove(cluster);
        }
    }

    /// `cluster`'s Nodes by name as its tenant API last listed them, read
    /// again when older than [`NODES_TTL`]; `None` when the cluster has no
    /// kubeconfig; `Some(Err(why))` when the tenant API could not be read.
    /// One read per cluster at a time: concurrent callers wait for it.
    pub async fn nodes(
        &self,
        cluster: &str,
    ) -> Option<Result<Arc<HashMap<String, NodeKubeState>>, Arc<NodesError>>> {
        let mut cache = self.nodes.lock().await;
        if let Some(r) = cache.get(cluster)
            && r.at.elapsed()
                < if r.nodes.is_ok() {
                    NODES_TTL
                } else {
                    NODES_ERROR_TTL
                }
        {
            return Some(r.nodes.clone());
        }
        let nodes = match self.client(cluster).await {
            Ok(None) => {
                cache.remove(cluster);
                return None;
            }
            Ok(Some((client, server))) => list_nodes(client)
                .await
                .map(Arc::new)
                .map_err(|source| Arc::new(NodesError::List { server, source })),
            Err(e) => Err(Arc::new(NodesError::Client(e))),
        };
        cache.insert(
            cluster.to_string(),
            NodesRead {
                at: Instant::now(),
                nodes: nodes.clone(),
            },
        );
        Some(nodes)
    }
}

/// A client for a checked kubeconfig, with the timeouts above.
pub async fn build_client(k: &TenantKubeconfig) -> Result<kube::Client, ClientError> {
    let mut config =
        kube::Config::from_custom_kubeconfig(k.kubeconfig().clone(), &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    // kube retries 429 and 503 itself (15 times, backing off to minutes)
    // unless told not to: an eviction a budget refuses is a 429, and the
    // drain must see it at once, retry it on its own schedule (one request
    // per pod per round) and keep to its deadline.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Every Node of a tenant cluster, by name.
pub async fn list_nodes(client: kube::Client) -> Result<HashMap<String, NodeKubeState>, kube::Error> {
    let api: Api<Node> = Api::all(client);
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, NodeKubeState::of(n))))
        .collect())
}

/// How long `cluster set --kubeconfig` waits for the tenant API's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// What a `cluster set --kubeconfig` answer says of the tenant API: its
/// version and Node count, or why it could not be read, within
/// [`PROBE_TIMEOUT`]. Never fails: the kubeconfig is stored either way (the
/// tenant API may not be up yet).
pub async fn probe(k: &TenantKubeconfig) -> String {
    match tokio::time::timeout(PROBE_TIMEOUT, probe_now(k)).await {
        Ok(answer) => answer,
        Err(_) => format!("{}: no answer within {}s", k.server, PROBE_TIMEOUT.as_secs()),
    }
}

async fn probe_now(k: &TenantKubeconfig) -> String {
    let client = match build_client(k).await {
        Ok(c) => c,
        Err(e) => return format!("{}: not usable: {e}", k.server),
    };
    let version = match client.apiserver_version().await {
        Ok(v) => v.git_version,
        Err(e) => return format!("{}: not reachable now: {}", k.server, one_line(&e.to_string())),
    };
    match list_nodes(client).await {
        Ok(n) => format!("{}: reachable, Kubernetes {version}, {} nodes", k.server, n.len()),
        Err(e) => format!(
            "{}: reachable (Kubernetes {version}), but listing nodes failed: {} (packaging/kubernetes/tenant/rbac.yaml grants what the server needs)",
            k.server,
            one_line(&e.to_string())
        ),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
