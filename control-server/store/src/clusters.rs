//! Clusters: their rows, CAs, API servers, peer-sharing settings and
//! maintenance windows, and the record of certificates issued with a
//! cluster CA.

use async_trait::async_trait;

use lks_proto::labels::Labels;

use super::{EventRow, Result, StoreError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRow {
    pub name: String,
    pub created_at_ms: i64,
    pub node_count: u32,
    /// Maintenance windows as the operator wrote them (validated by
    /// [`crate::windows`] before they are stored); empty: always open.
    pub maintenance_windows: Vec<String>,
    /// The cluster CA certificate (PEM); `None` for clusters created before
    /// clusters had CAs, until one is set. Its key is read only through
    /// [`Store::cluster_ca`].
    pub ca_cert_pem: Option<String>,
    /// The tenant cluster's API server URL (`https://…`), for kubeconfigs.
    pub api_server: Option<String>,
    /// Whether the cluster's nodes share blobs with each other, and how.
    /// The port, rate and upload limit keep their values while sharing is
    /// off.
    pub peer: PeerSettings,
    /// Whether the cluster has a tenant kubeconfig, and drains by default.
    pub kube: KubeFlags,
    /// The cluster's labels (`cluster set NAME --labels k=v,…`), which
    /// release plans select clusters by.
    pub labels: Labels,
    /// Its reboot policy (issue [reboots]; off until set).
    pub reboots: crate::RebootPolicy,
}

/// What a [`ClusterRow`] shows of a cluster's tenant Kubernetes access:
/// never the kubeconfig itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeFlags {
    /// `lksctl cluster set NAME --kubeconfig FILE` gave it one.
    pub kubeconfig: bool,
    /// Rollouts of the cluster drain each node at its turn unless told
    /// otherwise (`cluster set NAME --drain on`).
    pub drain: bool,
}

/// A cluster's access to its tenant Kubernetes API (`lksctl cluster set
/// NAME --kubeconfig FILE --drain on|off`). Kept beside the cluster, not in
/// it: on etcd under `clusterkube/NAME` (outside the range every replica
/// watches), so a replica of an older release that
/// rewrites the cluster document cannot drop it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClusterKube {
    /// The kubeconfig as the server hands it over: the YAML, or a sealed
    /// envelope in hex (`--encryption-key-file`); opaque to the store.
    pub kubeconfig: Option<String>,
    /// Rollouts drain by default.
    pub drain: bool,
}

impl ClusterKube {
    pub fn flags(&self) -> KubeFlags {
        KubeFlags {
            kubeconfig: self.kubeconfig.is_some(),
            drain: self.drain,
        }
    }
}

impl std::fmt::Debug for ClusterKube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A kubeconfig holds a credential: never printed, sealed or not.
        f.debug_struct("ClusterKube")
            .field("kubeconfig", &self.kubeconfig.as_ref().map(|_| "<redacted>"))
            .field("drain", &self.drain)
            .finish()
    }
}

/// A cluster's peer-sharing settings (`lksctl cluster set NAME
/// --peer-sharing on|off --peer-port … --peer-upload-rate …
/// --peer-max-uploads …`). Nodes receive them in their desired state
/// (`DesiredState.peer_sharing`) while `enabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PeerSettings {
    /// Whether the nodes share blobs; off for every cluster until turned on.
    pub enabled: bool,
    /// TCP port each agent listens on for its peers.
    pub port: u16,
    /// Upload cap per node, bytes per second; 0: none.
    pub upload_rate: u64,
    /// Concurrent uploads per node; more are refused.
    pub max_uploads: u32,
}

impl PeerSettings {
    /// The port agents listen on unless the operator chose another.
    pub const DEFAULT_PORT: u16 = 7444;
    /// Concurrent uploads per node unless the operator chose another.
    pub const DEFAULT_MAX_UPLOADS: u32 = 4;
}

impl Default for PeerSettings {
    /// Off, port 7444, no upload cap, 4 concurrent uploads.
    fn default() -> Self {
        PeerSettings {
            enabled: false,
            port: Self::DEFAULT_PORT,
            upload_rate: 0,
            max_uploads: Self::DEFAULT_MAX_UPLOADS,
        }
    }
}

/// A cluster CA as the store keeps it. `key` is opaque to the store: PEM, or
/// a sealed envelope in hex (the server seals it, see `lks_pki::clusterca`).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCa {
    pub cert_pem: String,
    pub key: String,
}

impl std::fmt::Debug for StoredCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, sealed or not.
        f.debug_struct("StoredCa")
            .field("cert_pem", &self.cert_pem)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A cluster to create, with its CA and API server in the same write.
#[derive(Clone, Debug)]
pub struct NewCluster {
    pub name: String,
    pub now_ms: i64,
    pub ca: Option<StoredCa>,
    pub api_server: Option<String>,
}

impl NewCluster {
    /// A cluster without CA or API server.
    pub fn new(name: &str, now_ms: i64) -> Self {
        NewCluster {
            name: name.to_string(),
            now_ms,
            ca: None,
            api_server: None,
        }
    }

    /// The row the store returns for it once created.
    pub fn row(&self) -> ClusterRow {
        ClusterRow {
            name: self.name.clone(),
            created_at_ms: self.now_ms,
            node_count: 0,
            maintenance_windows: Vec::new(),
            ca_cert_pem: self.ca.as_ref().map(|c| c.cert_pem.clone()),
            api_server: self.api_server.clone(),
            peer: PeerSettings::default(),
            kube: KubeFlags::default(),
            labels: Labels::new(),
            reboots: crate::RebootPolicy::default(),
        }
    }
}

/// A certificate the server signed with a cluster CA for a node's bundle
/// (`[[certificate]]`). Kept after the node is deleted, for audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCertRow {
    pub cluster: String,
    pub node: String,
    /// Lowercase hex, no separators.
    pub serial: String,
    pub profile: String,
    pub bundle: String,
    pub version: String,
    /// The certificate's path on the node.
    pub path: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    pub issued_at_ms: i64,
}

impl IssuedCertRow {
    /// The refusal of a record whose serial the node already has.
    pub fn serial_taken(&self) -> StoreError {
        StoreError::AlreadyExists(format!(
            "node {} of cluster {} already has a certificate with serial {}",
            self.node, self.cluster, self.serial
        ))
    }
}

/// The refusal of a cluster whose name is taken.
pub fn cluster_exists(name: &str) -> StoreError {
    StoreError::AlreadyExists(format!("cluster {name} already exists"))
}

/// The refusal of a second CA for a cluster.
pub fn ca_already_set(cluster: &str) -> StoreError {
    StoreError::Conflict(format!(
        "cluster {cluster} already has a CA; replacing it would orphan every certificate issued with it"
    ))
}

/// How long the record of an expired certificate is kept once the same
/// node has a newer one for the same path: 30 days.
pub const CERT_RECORD_RETENTION_MS: i64 = 30 * 24 * 3600 * 1000;

/// Orders certificate records as `list_certificates` returns them.
pub fn sort_certificates(rows: &mut [IssuedCertRow]) {
    rows.sort_by(|a, b| {
        (&a.node, &a.path, a.issued_at_ms, &a.serial).cmp(&(&b.node, &b.path, b.issued_at_ms, &b.serial))
    });
}

/// A cluster secret the server may keep sealed with its
/// `--encryption-key-file` key (etcd only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealedField {
    /// The cluster CA's private key.
    CaKey,
    /// The tenant kubeconfig.
    Kubeconfig,
}

/// Clusters and the certificates issued with their CAs.
#[async_trait]
pub trait ClusterStore: Send + Sync {
    /// What a sealed `field` of `cluster` is bound to (the AEAD's
    /// associated data): where this store keeps it, so that a sealed value
    /// copied to another cluster, field or store does not open. Only the
    /// store knows its layout; the sealing code asks it.
    fn sealed_aad(&self, cluster: &str, field: SealedField) -> Vec<u8>;
    /// Creates the cluster with its CA and API server in one write;
    /// `AlreadyExists` if the name is taken.
    async fn create_cluster(&self, cluster: NewCluster) -> Result<ClusterRow>;
    async fn list_clusters(&self) -> Result<Vec<ClusterRow>>;
    async fn cluster_exists(&self, name: &str) -> Result<bool>;
    /// One cluster (its node count may be 0: only `list_clusters` counts).
    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRow>>;
    /// Replaces the cluster's maintenance windows and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_windows(
        &self,
        name: &str,
        windows: Vec<String>,
        event: EventRow,
    ) -> Result<ClusterRow>;
    /// Sets or clears the cluster's API server and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_api_server(
        &self,
        name: &str,
        api_server: Option<String>,
        event: EventRow,
    ) -> Result<ClusterRow>;
    /// Replaces the cluster's peer-sharing settings and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_peer(&self, name: &str, peer: PeerSettings, event: EventRow) -> Result<ClusterRow>;
    /// Replaces the cluster's labels and records `event`. `NotFound` if
    /// the cluster does not exist.
    async fn set_cluster_labels(&self, name: &str, labels: Labels, event: EventRow) -> Result<ClusterRow>;
    /// Replaces the cluster's reboot policy (issue [reboots]) and records
    /// `event`. `NotFound` if the cluster does not exist.
    async fn set_cluster_reboots(
        &self,
        name: &str,
        policy: crate::RebootPolicy,
        event: EventRow,
    ) -> Result<ClusterRow>;
    /// The cluster's tenant Kubernetes access, its kubeconfig as stored;
    /// `None` if the cluster does not exist.
    async fn cluster_kube(&self, name: &str) -> Result<Option<ClusterKube>>;
    /// Replaces the cluster's tenant Kubernetes access and records `event`.
    /// `NotFound` if the cluster does not exist.
    async fn set_cluster_kube(&self, name: &str, kube: ClusterKube, event: EventRow) -> Result<ClusterRow>;
    /// Gives a cluster without a CA its CA and records `event`. `Conflict`
    /// ([`ca_already_set`]) if it has one: a CA is never replaced.
    async fn set_cluster_ca(&self, name: &str, ca: StoredCa, event: EventRow) -> Result<ClusterRow>;
    /// The cluster's CA with its key as stored; `None` if the cluster does
    /// not exist or has no CA.
    async fn cluster_ca(&self, name: &str) -> Result<Option<StoredCa>>;
    /// Records a certificate issued with a cluster CA. `AlreadyExists` if
    /// the node already has a record of that serial; `NotFound` if the
    /// cluster does not exist. Then drops the records of the same node and
    /// path that expired more than [`CERT_RECORD_RETENTION_MS`] before this
    /// one was issued: each renewal adds a record, and without this a
    /// node's records (read by every `node list`) would grow for ever. A
    /// deleted node's records, and those of a node that stopped renewing,
    /// stay (audit).
    async fn record_certificate(&self, row: IssuedCertRow) -> Result<()>;
    /// Issued-certificate records, optionally of one cluster and/or node,
    /// ordered by node, path and issue time ([`sort_certificates`]).
    async fn list_certificates(
        &self,
        cluster: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<IssuedCertRow>>;
}
