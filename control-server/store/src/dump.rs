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
    /// Release plans, by name (their revisions are the source store's).
    pub plans: Vec<crate::PlanRow>,
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

/// How many of each kind a dump holds (a backup's manifest, a migration's
/// summary).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DumpCounts {
    pub clusters: usize,
    pub cluster_cas: usize,
    pub certificates: usize,
    pub tokens: usize,
    pub nodes: usize,
    pub bundles: usize,
    pub targets: usize,
    pub rollouts: usize,
    pub events: usize,
    pub audit: usize,
    pub releases: usize,
    pub roots: usize,
    pub generation: u64,
}

impl DumpCounts {
    pub fn of(d: &Dump) -> DumpCounts {
        DumpCounts {
            clusters: d.clusters.len(),
            cluster_cas: d.cluster_cas.len(),
            certificates: d.certificates.len(),
            tokens: d.tokens.len(),
            nodes: d.nodes.len(),
            bundles: d.bundles.len(),
            targets: d.targets.len(),
            rollouts: d.rollouts.len(),
            events: d.events.len(),
            audit: d.audit.len(),
            releases: d.releases.len(),
            roots: d.roots.len(),
            generation: d.max_generation(),
        }
    }

    /// One indented line per kind, as `backup`, `restore` and `migrate`
    /// print them; `bundles` is what the bundles line adds in brackets.
    pub fn write_lines(&self, f: &mut std::fmt::Formatter<'_>, bundles: &str) -> std::fmt::Result {
        writeln!(
            f,
            "  clusters    {} ({} with a CA; {} issued certificates recorded)",
            self.clusters, self.cluster_cas, self.certificates
        )?;
        writeln!(f, "  tokens      {}", self.tokens)?;
        writeln!(f, "  nodes       {}", self.nodes)?;
        writeln!(f, "  bundles     {} ({bundles})", self.bundles)?;
        writeln!(f, "  targets     {}", self.targets)?;
        writeln!(f, "  rollouts    {}", self.rollouts)?;
        writeln!(f, "  events      {}", self.events)?;
        writeln!(f, "  audit       {} records", self.audit)?;
        writeln!(
            f,
            "  releases    {} ({} trust-root rotations)",
            self.releases, self.roots
        )?;
        writeln!(f, "  generation  {}", self.generation)
    }
}
