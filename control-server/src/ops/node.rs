//! What an operator reads of nodes (a cluster's, or one) and does to one
//! node: delete it (its certificate stops
//! working), ask it to retry a failed bundle (or every one) or to reboot, hold it out of
//! rollouts with a reason, or release it. Each names the node first, then
//! what it asks, and answers what the store did; the caller tells the
//! node's stream and the rollout controller.

use lks_proto::names::{NameError, validate_bundle_name, validate_node_name};

use super::{Kind, OpError};
use lks_proto::manifest::FEATURE_REBOOT;

use crate::store::{ClusterStore, EventRow, NodeRow, NodeStore, facts_needed};

/// The longest hold reason, in bytes.
const MAX_REASON: usize = 512;

/// Why an operation on a node was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cluster {cluster} does not exist")]
    NoCluster { cluster: String },
    /// The node's or the bundle's name is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("node {name} does not exist")]
    NotFound { name: String },
    #[error("node {name} has no bundle to retry")]
    NothingToRetry { name: String },
    #[error("hold reason is {len} bytes; the limit is {MAX_REASON}")]
    ReasonTooLong { len: usize },
    #[error("hold reason must be one line of printable text")]
    ReasonNotOneLine,
    #[error("node {name} is not connected; a reboot is asked of a connected agent only")]
    Offline { name: String },
    #[error(
        "the agent of node {name} ({version}) does not announce the \"reboot\" feature; update the agent first"
    )]
    NoRebootFeature { name: String, version: String },
}

impl NodeError {
    pub fn kind(&self) -> Kind {
        match self {
            NodeError::Name(_) | NodeError::ReasonTooLong { .. } | NodeError::ReasonNotOneLine => {
                Kind::Invalid
            }
            NodeError::NotFound { .. } | NodeError::NoCluster { .. } => Kind::NotFound,
            NodeError::NothingToRetry { .. }
            | NodeError::Offline { .. }
            | NodeError::NoRebootFeature { .. } => Kind::FailedPrecondition,
        }
    }
}

fn not_found(name: &str) -> OpError {
    NodeError::NotFound { name: name.into() }.into()
}

/// Node `name` as stored.
pub async fn get(store: &(impl NodeStore + ?Sized), name: &str) -> Result<NodeRow, OpError> {
    validate_node_name(name).map_err(NodeError::from)?;
    store.get_node(name).await?.ok_or_else(|| not_found(name))
}

/// The nodes of `cluster` (empty: every node); an unknown cluster is
/// refused.
pub async fn list(
    store: &(impl NodeStore + ClusterStore + ?Sized),
    cluster: &str,
) -> Result<Vec<NodeRow>, OpError> {
    if !cluster.is_empty() && !store.cluster_exists(cluster).await? {
        return Err(NodeError::NoCluster {
            cluster: cluster.into(),
        }
        .into());
    }
    Ok(store.list_nodes((!cluster.is_empty()).then_some(cluster)).await?)
}

/// Deletes node `name`: its certificate no longer works.
pub async fn delete(store: &(impl NodeStore + ?Sized), name: &str) -> Result<(), OpError> {
    validate_node_name(name).map_err(NodeError::from)?;
    if !store.delete_node(name).await? {
        return Err(not_found(name));
    }
    Ok(())
}

/// Asks node `name` to try `bundle` again (empty: every failed bundle);
/// answers the bundles it will retry.
pub async fn retry(
    store: &(impl NodeStore + ?Sized),
    name: &str,
    bundle: &str,
    who: &str,
    now_ms: i64,
) -> Result<Vec<String>, OpError> {
    validate_node_name(name).map_err(NodeError::from)?;
    if !bundle.is_empty() {
        validate_bundle_name(bundle).map_err(NodeError::from)?;
    }
    let bundles = store
        .retry_node(name, (!bundle.is_empty()).then_some(bundle), who, now_ms)
        .await?
        .ok_or_else(|| not_found(name))?;
    if bundles.is_empty() {
        return Err(NodeError::NothingToRetry { name: name.into() }.into());
    }
    Ok(bundles)
}

/// Asks node `name` to reboot (`connected`: its stream is open, here or
/// on another replica); answers the request's id. Refused for a node that
/// is not connected, or whose agent does not announce the "reboot" feature
/// (an older agent would drop the request).
pub async fn reboot(
    store: &(impl NodeStore + ?Sized),
    name: &str,
    connected: impl FnOnce(&NodeRow) -> bool,
    who: &str,
    now_ms: i64,
) -> Result<u64, OpError> {
    let n = get(store, name).await?;
    if !connected(&n) {
        return Err(NodeError::Offline { name: name.into() }.into());
    }
    let features = facts_needed(&n.facts_json).map(|(f, _)| f).unwrap_or_default();
    if !features.iter().any(|f| f == FEATURE_REBOOT) {
        let version = serde_json::from_str::<serde_json::Value>(&n.facts_json)
            .ok()
            .and_then(|v| v["agent_version"].as_str().map(String::from))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "version unknown".into());
        return Err(NodeError::NoRebootFeature {
            name: name.into(),
            version,
        }
        .into());
    }
    store
        .request_reboot(name, who, now_ms)
        .await?
        .ok_or_else(|| not_found(name))
}

/// Holds node `name` (`Some(reason)`) or releases it (`None`); answers the
/// node as it is now.
pub async fn set_hold(
    store: &(impl NodeStore + ?Sized),
    name: &str,
    hold: Option<String>,
    who: &str,
    now_ms: i64,
) -> Result<NodeRow, OpError> {
    validate_node_name(name).map_err(NodeError::from)?;
    if let Some(reason) = &hold {
        check_reason(reason)?;
    }
    let event = EventRow::hold("", name, hold.as_deref(), who, now_ms);
    if !store.set_node_hold(name, hold, event).await? {
        return Err(not_found(name));
    }
    store.get_node(name).await?.ok_or_else(|| not_found(name))
}

/// A hold reason: at most [`MAX_REASON`] bytes of printable text on one line.
fn check_reason(reason: &str) -> Result<(), NodeError> {
    if reason.len() > MAX_REASON {
        return Err(NodeError::ReasonTooLong { len: reason.len() });
    }
    if reason.chars().any(char::is_control) {
        return Err(NodeError::ReasonNotOneLine);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_reason_is_one_printable_line_of_at_most_512_bytes() {
        assert!(check_reason("kernel upgrade, ticket 42").is_ok());
        assert_eq!(
            check_reason(&"x".repeat(513)).unwrap_err().to_string(),
            "hold reason is 513 bytes; the limit is 512"
        );
        assert_eq!(
            check_reason("two\nlines").unwrap_err().to_string(),
            "hold reason must be one line of printable text"
        );
    }
}
