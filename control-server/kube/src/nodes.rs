//! A tenant Node object as the operator's view shows it: its `Ready`
//! condition, whether it is cordoned and by whom, its kubelet version.

use k8s_openapi::api::core::v1::Node;
use lks_proto::pb;

/// The annotation lksadmin puts on a Node it cordons, naming the rollout
/// that owns the cordon: a new leader knows whose cordon it is, and a
/// cordon an operator made is never lifted by lksadmin.
pub const CORDONED_BY: &str = "lksadmin.io/cordoned-by";

/// The `Ready` condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady,
    /// `Unknown`, or no `Ready` condition at all (never posted).
    Unknown,
}

impl Readiness {
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Ready => "Ready",
            Readiness::NotReady => "NotReady",
            Readiness::Unknown => "Unknown",
        }
    }
}

/// What the view shows of one Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeKubeState {
    pub ready: Readiness,
    pub unschedulable: bool,
    /// `status.nodeInfo.kubeletVersion`; empty if not posted.
    pub kubelet_version: String,
    /// When `Ready` last changed (Unix ms); 0 if unknown.
    pub ready_since_ms: i64,
    /// The [`CORDONED_BY`] annotation's value; empty if none.
    pub cordoned_by: String,
}

impl NodeKubeState {
    pub fn of(n: &Node) -> NodeKubeState {
        let status = n.status.as_ref();
        let cond = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        let ready = match cond.map(|c| c.status.as_str()) {
            Some("True") => Readiness::Ready,
            Some("False") => Readiness::NotReady,
            _ => Readiness::Unknown,
        };
        NodeKubeState {
            ready,
            unschedulable: n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            kubelet_version: status
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.kubelet_version.clone())
                .unwrap_or_default(),
            ready_since_ms: cond
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.as_millisecond())
                .unwrap_or(0),
            cordoned_by: n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CORDONED_BY).cloned())
                .unwrap_or_default(),
        }
    }

    /// The KUBE column: `Ready`, `NotReady`, `Unknown`, or `cordoned` for
    /// a Ready node that takes no new pods.
    pub fn state(&self) -> &'static str {
        match (self.ready, self.unschedulable) {
            (Readiness::Ready, true) => "cordoned",
            (r, _) => r.as_str(),
        }
    }

    pub fn to_pb(&self) -> pb::NodeKube {
        pb::NodeKube {
            state: self.state().to_string(),
            ready: self.ready == Readiness::Ready,
            unschedulable: self.unschedulable,
            kubelet_version: self.kubelet_version.clone(),
            ready_since_ms: self.ready_since_ms,
            cordoned_by: self.cordoned_by.clone(),
            error: String::new(),
        }
    }
}

/// The view of a node its tenant API has no Node for.
pub fn absent_pb() -> pb::NodeKube {
    pb::NodeKube {
        state: "absent".into(),
        ..Default::default()
    }
}

/// The view of a node whose tenant API could not be read.
pub fn unreachable_pb(why: &str) -> pb::NodeKube {
    pb::NodeKube {
        state: "unreachable".into(),
        error: why.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn ready_cordoned_and_unknown_nodes_read_as_the_column_says() {
        let ready = node(serde_json::json!({
            "metadata": {"name": "a"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "architecture": "", "bootID": "", "containerRuntimeVersion": "",
                    "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "", "osImage": "", "systemUUID": ""}
            }
        }));
        let s = NodeKubeState::of(&ready);
        assert_eq!(s.state(), "Ready");
        assert_eq!(s.kubelet_version, "v1.37.2");
        assert_eq!(s.ready_since_ms, 1_767_225_600_000);
        assert!(s.to_pb().ready);

        let cordoned = node(serde_json::json!({
            "metadata": {"name": "a", "annotations": {CORDONED_BY: "r-1"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let s = NodeKubeState::of(&cordoned);
        assert_eq!(s.state(), "cordoned");
        assert_eq!(s.cordoned_by, "r-1");

        let not_ready = node(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }));
        assert_eq!(
            NodeKubeState::of(&not_ready).state(),
            "NotReady",
            "NotReady says more than cordoned"
        );
        let never = node(serde_json::json!({"metadata": {"name": "a"}}));
        assert_eq!(NodeKubeState::of(&never).state(), "Unknown");
        assert_eq!(NodeKubeState::of(&never).ready_since_ms, 0);
    }
}
