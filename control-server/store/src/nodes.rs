//! Nodes: enrolment, identity, holds and retries, and what their agents
//! report (connects, bundle states, last-seen).

use std::collections::BTreeMap;

use async_trait::async_trait;
use lks_proto::BundleState;
use lks_proto::labels::{Labels, selector_matches};

use super::{EventRow, Result, RolloutNodeRow, RolloutState, StoreError};

/// A node to create by consuming one use of a token.
#[derive(Clone, Debug)]
pub struct NewNode {
    pub name: String,
    pub cluster: String,
    pub labels: Labels,
    pub cert_serial: String,
    /// `sha256:` + hex SHA-256 of the node key's SubjectPublicKeyInfo.
    pub key_hash: String,
    pub token_id: String,
    pub now_ms: i64,
}

impl NewNode {
    /// The joiner's first desired state: for each target of its cluster
    /// (bundle, version, selector) whose selector matches its labels, that
    /// version. Both backends seed an enrolment with it.
    pub fn seed_desired<'a>(
        &self,
        targets: impl IntoIterator<Item = (String, String, &'a Labels)>,
    ) -> BTreeMap<String, String> {
        targets
            .into_iter()
            .filter(|(_, _, selector)| selector_matches(selector, &self.labels))
            .map(|(bundle, version, _)| (bundle, version))
            .collect()
    }

    /// The row a rollout of the joiner's cluster (of `bundle`, in `state`,
    /// over `selector`) takes it in with, if it does: a running or paused
    /// rollout whose selector matches, the node waiting for its turn on the
    /// version its first desired state gives it (`seeded`,
    /// [`seed_desired`](Self::seed_desired)), or none.
    pub fn adopted_by(
        &self,
        state: RolloutState,
        bundle: &str,
        selector: &Labels,
        seeded: &BTreeMap<String, String>,
    ) -> Option<RolloutNodeRow> {
        let live = RolloutState::TAKING_JOINERS.contains(&state);
        (live && selector_matches(selector, &self.labels))
            .then(|| RolloutNodeRow::waiting(&self.name, seeded.get(bundle).map_or("", String::as_str)))
    }

    /// An enrolment may take over a node of that name only when it is the
    /// same enrolment again: same cluster, same key (the agent keeps its
    /// key until its identity is written), and the node never connected —
    /// the answer to the first attempt was lost (a server killed, a link
    /// cut) before the agent got its certificate.
    pub fn repeats(&self, cluster: &str, key_hash: &str, never_connected: bool) -> bool {
        never_connected && cluster == self.cluster && !self.key_hash.is_empty() && key_hash == self.key_hash
    }

    /// Settles an enrolment under a name already in use, in `cluster` with
    /// `key_hash`: `Ok` when it [`repeats`](Self::repeats) that node's own
    /// enrolment, else refused.
    pub fn over_existing(&self, cluster: &str, key_hash: &str, never_connected: bool) -> Result<()> {
        if self.repeats(cluster, key_hash, never_connected) {
            return Ok(());
        }
        Err(StoreError::AlreadyExists(format!(
            "node {} is already enrolled in cluster {cluster}; to replace it, run `lksctl node delete {}` first",
            self.name, self.name
        )))
    }
}

/// The refusal of a certificate swap whose old certificate is no longer
/// the node's.
pub fn cert_replaced(node: &str) -> StoreError {
    StoreError::Conflict(format!(
        "the certificate of node {node} was replaced or revoked meanwhile"
    ))
}

/// Whether a stored node never connected, which lets an enrolment repeat
/// over it ([`NewNode::over_existing`]): it never reported facts, was never
/// seen, and has no stream open now. A Hello writes all three, so any one
/// of them marks a node that did connect; the open stream is checked too
/// so that a node connected this instant (its Hello's time 0, or its
/// last-seen time not yet written) is never replaced under it.
pub fn never_connected(facts_json: &str, last_seen_ms: i64, connected_now: bool) -> bool {
    facts_json.is_empty() && last_seen_ms == 0 && !connected_now
}

/// What an agent reported about one bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleStatusRow {
    pub name: String,
    pub version: String,
    pub state: BundleState,
    pub message: String,
    pub updated_at_ms: i64,
    /// Generation of the desired state the report answered (0: unknown),
    /// so a rollout can tell a fresh verdict from one given before the
    /// node was assigned its version.
    pub generation: u64,
    /// What the node fetched for this version: bytes from the server, from
    /// peers (peer sharing).
    pub fetched_from_server: u64,
    pub fetched_from_peers: u64,
    /// Of `fetched_from_server`, binary-delta patches (issue [delta]).
    pub fetched_as_delta: u64,
}

/// Where a node stands with its signed releases, as its agent reported
/// it (`TrustStatus`): one of the states the agent protocol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrustHealth {
    /// Following a current release.
    Ok,
    /// Its release expired: it keeps what it has and applies nothing new.
    StaleRelease,
    /// It requires releases and has received none yet.
    NoRelease,
    /// The last release or root the server sent was refused.
    Refused,
    /// Its clock reads earlier than the last time it verified metadata at.
    Clock,
}

impl TrustHealth {
    pub const ALL: [TrustHealth; 5] = [
        TrustHealth::Ok,
        TrustHealth::StaleRelease,
        TrustHealth::NoRelease,
        TrustHealth::Refused,
        TrustHealth::Clock,
    ];

    /// The wire name (`TrustStatus.state`).
    pub fn as_str(self) -> &'static str {
        match self {
            TrustHealth::Ok => "ok",
            TrustHealth::StaleRelease => "stale-release",
            TrustHealth::NoRelease => "no-release",
            TrustHealth::Refused => "refused",
            TrustHealth::Clock => "clock",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

impl std::fmt::Display for TrustHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node's release trust as it last reported it; `None` in a
/// [`NodeRow`] from agents that never reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeTrust {
    /// Off: the node has no release requirement; the rest is empty.
    pub enabled: bool,
    /// `None` while off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TrustHealth>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The release it follows (0: none yet) and when that expires.
    #[serde(default)]
    pub release_version: u64,
    #[serde(default)]
    pub release_expires_at_ms: i64,
    #[serde(default)]
    pub root_version: u64,
}

impl NodeTrust {
    /// A node without a release requirement: nothing else to say.
    pub fn off() -> NodeTrust {
        NodeTrust {
            enabled: false,
            state: None,
            message: String::new(),
            release_version: 0,
            release_expires_at_ms: 0,
            root_version: 0,
        }
    }

    /// "off", or the state's wire name: how metrics and `node list` name it.
    pub fn label(&self) -> &'static str {
        match (self.enabled, self.state) {
            (true, Some(s)) => s.as_str(),
            _ => "off",
        }
    }
}

/// Where a node stands with rebooting, as its agent reported it
/// (`RebootStatus.state`; issue [reboots]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootState {
    /// Nothing to do.
    None,
    /// A bundle, the OS sentinel or the check command says so.
    Required,
    /// Carrying out a reboot request.
    Rebooting,
    /// The reboot command ran and the node did not reboot.
    Failed,
}

impl RebootState {
    pub const ALL: [RebootState; 4] = [
        RebootState::None,
        RebootState::Required,
        RebootState::Rebooting,
        RebootState::Failed,
    ];

    /// The wire name ("" for none).
    pub fn as_str(self) -> &'static str {
        match self {
            RebootState::None => "",
            RebootState::Required => "required",
            RebootState::Rebooting => "rebooting",
            RebootState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// A node's reboot state as it last reported it; `None` in a [`NodeRow`]
/// from agents that never reported one (older than the "reboot" feature).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeReboot {
    pub state: RebootState,
    /// Why ("bundle kernel@6.1", the sentinel's packages, the check's line).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Unix ms since when it is in `state` (0: unknown).
    #[serde(default)]
    pub since_ms: i64,
    /// The boot ID it reported with it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// The last reboot request it took on (0: none).
    #[serde(default)]
    pub request: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub name: String,
    pub cluster: String,
    pub labels: Labels,
    pub cert_serial: String,
    /// Facts as JSON (the agent's last `Hello`), empty if never connected.
    pub facts_json: String,
    /// Unix ms; 0 if never seen.
    pub last_seen_ms: i64,
    pub connected: bool,
    pub enrolled_at_ms: i64,
    /// Generation of the node's current desired state.
    pub generation: u64,
    /// bundle name → desired version.
    pub desired: BTreeMap<String, String>,
    /// What the node last reported, by bundle name.
    pub actual: BTreeMap<String, BundleStatusRow>,
    /// Set by `lksctl node hold`: no rollout gives the node a new desired
    /// state. The reason ("" if none was given).
    pub hold: Option<String>,
    /// Hash of the node key it enrolled with ("" for nodes enrolled before
    /// it was recorded).
    pub key_hash: String,
    /// Its release trust as last reported (issue [trust]).
    pub trust: Option<NodeTrust>,
    /// Its reboot state as last reported (issue [reboots]).
    pub reboot: Option<NodeReboot>,
    /// The last reboot request made for it (`lksctl node reboot`; 0: none).
    pub reboot_request: u64,
}

/// The `features` and `architecture` of a node's facts JSON (what a
/// rollout judges it by); `None` when it has no facts yet.
pub fn facts_needed(facts_json: &str) -> Option<(Vec<String>, Option<lks_proto::arch::Arch>)> {
    #[derive(serde::Deserialize, Default)]
    struct Facts {
        #[serde(default)]
        features: Vec<String>,
        #[serde(default)]
        architecture: String,
    }
    if facts_json.is_empty() {
        return None;
    }
    let f = serde_json::from_str::<Facts>(facts_json).unwrap_or_default();
    Some((f.features, lks_proto::arch::Arch::parse(&f.architecture).ok()))
}

/// The architecture a node reported (`None`: none, or no facts yet).
pub fn facts_architecture(facts_json: &str) -> Option<lks_proto::arch::Arch> {
    facts_needed(facts_json).and_then(|(_, a)| a)
}

/// The bundles a retry request of `node` stamps: `bundle` if it is one of
/// the node's `desired` bundles, or all of them.
pub fn retry_targets(node: &str, desired: Vec<String>, bundle: Option<&str>) -> Result<Vec<String>> {
    match bundle {
        Some(b) if !desired.iter().any(|d| d == b) => Err(StoreError::NotDesired {
            bundle: b.to_string(),
            node: node.to_string(),
        }),
        Some(b) => Ok(vec![b.to_string()]),
        None => Ok(desired),
    }
}

/// Nodes as the operator and enrolment see them.
#[async_trait]
pub trait NodeStore: Send + Sync {
    /// In one transaction: checks the token is still usable at `now_ms`,
    /// takes one use, creates the node (refusing a name in use), and gives it
    /// the cluster's target bundles. Returns the node's generation.
    async fn enroll_node(&self, node: NewNode) -> Result<u64>;
    async fn get_node(&self, name: &str) -> Result<Option<NodeRow>>;
    /// Cluster and current certificate serial of a node: what every agent
    /// call is authorised by, read without the rest of the node.
    async fn node_identity(&self, name: &str) -> Result<Option<(String, String)>>;
    async fn list_nodes(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>>;
    /// How many nodes are enrolled, read from the backend itself (never a
    /// copy), without reading their documents: `/metrics` asks it
    /// periodically, so it is also the probe that the store answers.
    async fn count_nodes(&self) -> Result<u64>;
    /// Holds (`Some(reason)`) or releases (`None`) a node and records
    /// `event` (its cluster is filled in). False if the node is absent.
    async fn set_node_hold(&self, name: &str, hold: Option<String>, event: EventRow) -> Result<bool>;
    /// Asks the node to try its desired version of `bundle` (`None`: every
    /// desired bundle) again: stamps those bundles with a new generation
    /// and gives the node that generation, so its desired state is pushed.
    /// Returns the bundles stamped, or `None` if the node does not exist;
    /// `NotFound` if `bundle` is not desired for it.
    async fn retry_node(
        &self,
        name: &str,
        bundle: Option<&str>,
        admin: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>>;
    /// Removes the node with its desired and reported state. False if absent.
    async fn delete_node(&self, name: &str) -> Result<bool>;
    /// Replaces the node's certificate serial if it is still `old`.
    async fn replace_cert_serial(&self, name: &str, old: &str, new: &str) -> Result<()>;
    /// Asks the node to reboot (`lksctl node reboot`): a new request id
    /// (a new generation, so its desired state is pushed with the request)
    /// and the event [`EventRow::reboot_requested`]. Returns the id, or
    /// `None` if the node does not exist.
    async fn request_reboot(&self, name: &str, admin: &str, now_ms: i64) -> Result<Option<u64>>;
    /// Takes reboot request `id` out of the node's desired state once its
    /// agent reported it carried out (a new generation, so the state
    /// without it is pushed): an agent whose `reboot.json` is lost does
    /// not take it on again. Only while `id` is still the node's request;
    /// answers whether it was.
    async fn clear_reboot_request(&self, name: &str, id: u64) -> Result<bool>;
}

/// What agents report: connects, disconnects, bundle states and
/// last-seen times.
#[async_trait]
pub trait NodeStatusStore: Send + Sync {
    /// Records a `Hello`: facts, what the node holds, its release trust
    /// and its reboot state (each `None`: not reported, so none is shown),
    /// connected. One write.
    async fn node_hello(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        trust: Option<NodeTrust>,
        reboot: Option<NodeReboot>,
        now_ms: i64,
    ) -> Result<()>;
    /// [`NodeStatusStore::node_hello`] of an agent that reports no trust.
    async fn node_connected(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        now_ms: i64,
    ) -> Result<()> {
        self.node_hello(name, facts_json, held, None, None, now_ms).await
    }
    async fn node_disconnected(&self, name: &str, now_ms: i64) -> Result<()>;
    /// Records the node's release trust as it reported it (callers write
    /// only changes: it moves rarely).
    async fn record_trust(&self, name: &str, trust: NodeTrust) -> Result<()>;
    /// Records the node's reboot state as it reported it (callers write
    /// only changes).
    async fn record_reboot(&self, name: &str, reboot: NodeReboot) -> Result<()>;
    /// Upserts reported bundle states. A bundle the report leaves out that
    /// is no longer desired for the node is forgotten: the node removed it.
    async fn record_status(&self, name: &str, statuses: Vec<BundleStatusRow>) -> Result<()>;
    /// Batched heartbeat flush: last-seen times by node.
    async fn touch_nodes(&self, seen: Vec<(String, i64)>) -> Result<()>;
    /// At start: no agent is connected to a server that was not running.
    async fn mark_all_disconnected(&self) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NewNode {
        NewNode {
            name: "n1".into(),
            cluster: "a".into(),
            labels: Labels::new(),
            cert_serial: "01".into(),
            key_hash: "sha256:aa".into(),
            token_id: "t".into(),
            now_ms: 0,
        }
    }

    #[test]
    fn only_the_same_enrolment_again_takes_over_a_name_in_use() {
        let n = node();
        assert!(n.over_existing("a", "sha256:aa", true).is_ok());
        for (cluster, key, never) in [
            ("a", "sha256:aa", false),
            ("b", "sha256:aa", true),
            ("a", "sha256:bb", true),
        ] {
            let Err(StoreError::AlreadyExists(m)) = n.over_existing(cluster, key, never) else {
                panic!("{cluster} {key} {never} took over the node");
            };
            assert_eq!(
                m,
                format!(
                    "node n1 is already enrolled in cluster {cluster}; to replace it, run `lksctl node delete n1` first"
                )
            );
        }
        let keyless = NewNode {
            key_hash: String::new(),
            ..node()
        };
        assert!(keyless.over_existing("a", "", true).is_err());
    }
}
