//! The documents the etcd store keeps, as JSON: a cluster, a node (with
//! what it reported), its desired state, a bundle version and a cluster's
//! target, and the conversions between a node's reports and their rows.

use lks_proto::BundleState;
use lks_proto::labels::Labels;
use serde::{Deserialize, Serialize};

use lks_store::{BundleStatusRow, ClusterRow, KubeFlags, NewCluster, NodeReboot, NodeTrust, PeerSettings};

use crate::name::Name;

use crate::smallmap::SmallMap;

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct ClusterDoc {
    pub(super) created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) maintenance_windows: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ca_cert_pem: Option<String>,
    /// As the server handed it over: PEM, or a sealed envelope in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ca_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) api_server: Option<String>,
    /// Documents written before peer sharing read as the defaults (off).
    #[serde(default)]
    pub(super) peer: PeerSettings,
    /// The cluster's labels (issue [fleet-plans]); none in older documents.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub(super) labels: Labels,
    /// The reboot policy (issue [reboots]); absent: the default (off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) reboots: Option<lks_store::RebootPolicy>,
}

impl ClusterDoc {
    pub(super) fn new(c: &NewCluster) -> Self {
        ClusterDoc {
            created_at_ms: c.now_ms,
            maintenance_windows: Vec::new(),
            ca_cert_pem: c.ca.as_ref().map(|a| a.cert_pem.clone()),
            ca_key: c.ca.as_ref().map(|a| a.key.clone()),
            api_server: c.api_server.clone(),
            peer: PeerSettings::default(),
            labels: Labels::new(),
            reboots: None,
        }
    }

    pub(super) fn into_row(self, name: &str, node_count: u32) -> ClusterRow {
        ClusterRow {
            name: name.to_string(),
            created_at_ms: self.created_at_ms,
            node_count,
            maintenance_windows: self.maintenance_windows,
            ca_cert_pem: self.ca_cert_pem,
            api_server: self.api_server,
            peer: self.peer,
            kube: KubeFlags::default(),
            labels: self.labels,
            reboots: self.reboots.unwrap_or_default(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct ActualDoc {
    /// Shared by the nodes that hold the same version in the watch-fed copy.
    pub(super) version: Name,
    pub(super) state: BundleState,
    /// Box<str>: 8 bytes fewer per reported bundle in the copy, same JSON.
    pub(super) message: Box<str>,
    pub(super) updated_at_ms: i64,
    pub(super) generation: u64,
    /// Bytes fetched for the version, by source; absent (0) in documents
    /// written before peer sharing, and left out while 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) fetched_server: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) fetched_peers: u64,
    /// Of `fetched_server`, binary-delta patches (issue [delta]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) fetched_delta: u64,
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct NodeDoc {
    /// Shared by the node documents of a cluster in the watch-fed copy.
    pub(super) cluster: Name,
    pub(super) labels: Labels,
    // Box<str> rather than String here and below: 8 bytes fewer in every
    // node document the watch-fed copy holds, the same JSON.
    pub(super) cert_serial: Box<str>,
    pub(super) facts_json: Box<str>,
    pub(super) last_seen_ms: i64,
    pub(super) enrolled_at_ms: i64,
    /// The replica holding the node's stream ("" if none).
    pub(super) replica: String,
    pub(super) actual: SmallMap<ActualDoc>,
    /// Held by the operator, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) hold: Option<Box<str>>,
    /// Hash of the key the node enrolled with.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub(super) key_hash: Box<str>,
    /// The node's release trust as last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: most nodes report none, and the watch-fed copy holds every
    /// node document of the region.
    pub(super) trust: Option<Box<NodeTrust>>,
    /// The node's reboot state as last reported (issue [reboots]); boxed
    /// like `trust`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) reboot: Option<Box<NodeReboot>>,
}

/// `heard/ID`: when replica ID last heard one of the agents whose streams
/// it holds. A node whose document names replica ID was seen then: one
/// small document per replica, written every few seconds, instead of a
/// time per node (the `seen/ID` documents before, which listed every node
/// a replica held and made up most of what etcd stored at rest).
#[derive(Serialize, Deserialize, Clone, Copy, Default, Debug, PartialEq)]
pub(super) struct HeardDoc {
    pub(super) at_ms: i64,
}

#[derive(Serialize, Deserialize, Clone, Default)]
pub(super) struct DesiredDoc {
    pub(super) generation: u64,
    /// Bundle → version; the versions shared in the watch-fed copy.
    pub(super) bundles: SmallMap<Name>,
    /// Bundle → generation of the operator's last retry request.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    pub(super) retry: SmallMap<u64>,
    /// The node's last reboot request (`lksctl node reboot`; issue
    /// [reboots]), a generation; absent (0): none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) reboot: u64,
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct BundleDoc {
    pub(super) signed_bundle: String,
    pub(super) manifest_digest: String,
    pub(super) signed: bool,
    pub(super) files: u32,
    pub(super) total_size: u64,
    pub(super) published_at_ms: i64,
    pub(super) blob_digests: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct TargetDoc {
    pub(super) version: String,
    pub(super) selector: Labels,
    pub(super) rollout_id: String,
}

pub(super) fn actual_row(name: &str, a: &ActualDoc) -> BundleStatusRow {
    BundleStatusRow {
        name: name.to_string(),
        version: a.version.to_string(),
        state: a.state,
        message: a.message.to_string(),
        updated_at_ms: a.updated_at_ms,
        generation: a.generation,
        fetched_from_server: a.fetched_server,
        fetched_from_peers: a.fetched_peers,
        fetched_as_delta: a.fetched_delta,
    }
}

pub(super) fn actual_doc(s: &BundleStatusRow) -> ActualDoc {
    ActualDoc {
        version: s.version.as_str().into(),
        state: s.state,
        message: s.message.as_str().into(),
        updated_at_ms: s.updated_at_ms,
        generation: s.generation,
        fetched_server: s.fetched_from_server,
        fetched_peers: s.fetched_from_peers,
        fetched_delta: s.fetched_as_delta,
    }
}

/// A replica's entry in `replicas/ID` (bound to its lease; written by
/// `replicas::run_lease`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub url: String,
    pub started_at_ms: i64,
    /// Where it keeps blobs (`etcd`, `s3://…`; empty: a replica older
    /// than the blob store, which keeps them in etcd).
    #[serde(default)]
    pub blob_store: String,
    /// Its release (the package version); empty: a release before the
    /// version-skew contract.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub release: String,
    /// The [`lks_store::STORE_FORMAT`] it reads and writes; 0: a
    /// release before the contract.
    #[serde(default)]
    pub store_format: u32,
}

/// What [`lks_store::RolloutStore::older_replica`] reads of a
/// `replicas/ID` entry (every field optional, so an entry of any release
/// reads).
#[derive(Deserialize, Default)]
pub(super) struct ReplicaFormat {
    #[serde(default)]
    pub(super) release: String,
    #[serde(default)]
    pub(super) store_format: u32,
}
