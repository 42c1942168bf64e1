//! What the agent tells the control server, in its own terms: each
//! bundle's state and node events. The engine (and peer sharing, for a peer
//! that sent a bad piece) produce these; the connection converts them to
//! the wire's `BundleStatus` and `NodeEvent` as it sends them.

use lks_proto::BundleState;

/// One bundle's state on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleStatus {
    pub name: String,
    pub version: String,
    pub state: BundleState,
    pub message: String,
    pub updated_at_ms: i64,
    /// Bytes of this version fetched from the control server.
    pub fetched_from_server: u64,
    /// Bytes of this version fetched from peers.
    pub fetched_from_peers: u64,
    /// Of `fetched_from_server`, binary-delta patches.
    pub fetched_as_delta: u64,
}

/// Something notable that happened on the node (`applied`, `failed`,
/// `repaired`, `bad_peer`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub kind: String,
    pub bundle: String,
    pub version: String,
    pub message: String,
    pub at_ms: i64,
    /// The peer a `bad_peer` event is about; empty otherwise.
    pub peer: String,
    /// Bytes of the version fetched from the control server.
    pub fetched_from_server: u64,
    /// Bytes of the version fetched from peers.
    pub fetched_from_peers: u64,
}

/// The node's release trust (issue [trust]), as `TrustStatus` carries it;
/// the default is trust off.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustReport {
    pub enabled: bool,
    /// `ok`, `stale-release`, `no-release`, `refused`, `clock`; empty when off.
    pub state: String,
    pub message: String,
    /// The release the node follows (0: none yet) and when it expires.
    pub release_version: u64,
    pub release_expires_at_ms: i64,
    pub root_version: u64,
}
