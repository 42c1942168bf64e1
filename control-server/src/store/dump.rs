//! A whole store read out, for `lks-control-server migrate`.

use lks_proto::Digest;

use super::{
    AuditRow, BundleRow, ClusterKube, ClusterRow, EventRow, IssuedCertRow, NodeRow, ReleaseRow, RolloutRow,
    RootRow, StoredCa, Target, TokenRow,
};

/// A bundle version as dumped, with the blobs the server serves for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedBundle {
    pub row: BundleRow,
    /// Digests served by the control server (files without a mirror URL).
    pub blob_digests: Vec<Digest>,
}

/// A cluster's target for one bundle name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedTarget {
    pub cluster: String,
    pub bundle: String,
    pub target: Target,
}

/// Everything a store holds, read in one consistent snapshot, to move an
/// installation from one backend to another (`lks-control-server migrate`).
/// Connection state is not part of it: no agent is connected to a store
/// being moved.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The last desired-state generation handed out.
    pub generation: u64,
    pub clusters: Vec<ClusterRow>,
    /// Cluster CAs by cluster name, keys as stored.
    pub cluster_cas: Vec<(String, StoredCa)>,
    /// Every issued-certificate record.
    pub certificates: Vec<IssuedCertRow>,
    /// Tenant Kubernetes access by cluster name, kubeconfigs as stored;
    /// only clusters that have a kubeconfig or drain by default.
    pub cluster_kube: Vec<(String, ClusterKube)>,
    pub tokens: Vec<TokenRow>,
    /// With desired state, generation and reports.
    pub nodes: Vec<NodeRow>,
    pub bundles: Vec<DumpedBundle>,
    pub targets: Vec<DumpedTarget>,
    /// With their node rows and revisions.
    pub rollouts: Vec<RolloutRow>,
    /// Oldest first.
    pub events: Vec<EventRow>,
    /// The audit trail, oldest first.
    pub audit: Vec<AuditRow>,
    /// Every cluster's signed releases, by cluster, oldest first.
    pub releases: Vec<ReleaseRow>,
    /// Every cluster's trust-root rotations, by cluster, in version order.
    pub roots: Vec<RootRow>,
}

impl Dump {
    /// The highest generation anything in the dump refers to: a store
    /// importing it must hand out only higher ones.
    pub fn max_generation(&self) -> u64 {
        let nodes = self
            .nodes
            .iter()
            .flat_map(|n| std::iter::once(n.generation).chain(n.actual.values().map(|a| a.generation)));
        let rollouts = self
            .rollouts
            .iter()
            .flat_map(|r| r.nodes.iter().map(|n| n.generation));
        nodes.chain(rollouts).fold(self.generation, u64::max)
    }
}
