//! The event log: what happened to clusters, nodes, bundles and
//! rollouts, newest kept.

use async_trait::async_trait;
use lks_proto::labels::Labels;

use super::{NewNode, NewRollout, OfflinePolicy, PeerSettings, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub id: u64,
    pub at_ms: i64,
    pub cluster: String,
    pub node: String,
    pub rollout_id: String,
    pub kind: String,
    pub bundle: String,
    pub version: String,
    pub message: String,
}

impl EventRow {
    /// An event about a bundle version itself (published, deleted).
    pub fn bundle(kind: &str, name: &str, version: &str, message: String, at_ms: i64) -> EventRow {
        EventRow {
            id: 0,
            at_ms,
            cluster: String::new(),
            node: String::new(),
            rollout_id: String::new(),
            kind: kind.into(),
            bundle: name.into(),
            version: version.into(),
            message,
        }
    }

    /// What every store records when a node enrols.
    pub fn enrolled(n: &NewNode) -> EventRow {
        EventRow {
            id: 0,
            at_ms: n.now_ms,
            cluster: n.cluster.clone(),
            node: n.name.clone(),
            rollout_id: String::new(),
            kind: "enrolled".into(),
            bundle: String::new(),
            version: String::new(),
            message: format!("enrolled with token {}", n.token_id),
        }
    }

    /// What every store records when an enrolment is repeated (its first
    /// answer was lost): the node gets a new certificate, no token use.
    pub fn reenrolled(n: &NewNode) -> EventRow {
        Self::about(
            &n.cluster,
            &n.name,
            "enrolled",
            n.now_ms,
            format!(
                "enrolment repeated with token {} and the same key (the first answer was lost); new certificate",
                n.token_id
            ),
        )
    }

    /// What every store records when a node is deleted.
    pub fn deleted(cluster: &str, node: &str, at_ms: i64) -> EventRow {
        Self::about(
            cluster,
            node,
            "deleted",
            at_ms,
            "node deleted; its certificate is revoked".into(),
        )
    }

    /// An event about a cluster or one of its nodes (`node` may be
    /// empty), outside any rollout.
    pub fn about(cluster: &str, node: &str, kind: &str, at_ms: i64, message: String) -> EventRow {
        EventRow {
            id: 0,
            at_ms,
            cluster: cluster.to_string(),
            node: node.to_string(),
            rollout_id: String::new(),
            kind: kind.to_string(),
            bundle: String::new(),
            version: String::new(),
            message,
        }
    }

    /// What every store records when an operator asks a node to retry.
    pub fn retry(cluster: &str, node: &str, bundles: &[String], admin: &str, at_ms: i64) -> EventRow {
        let message = format!("retry of {} requested by {admin}", bundles.join(", "));
        let mut e = Self::about(cluster, node, "retry_requested", at_ms, message);
        if let [one] = bundles {
            e.bundle = one.clone();
        }
        e
    }

    /// What every store records when a node is asked to reboot.
    pub fn reboot_requested(cluster: &str, node: &str, admin: &str, at_ms: i64) -> EventRow {
        Self::about(
            cluster,
            node,
            "reboot_requested",
            at_ms,
            format!("reboot requested by {admin}"),
        )
    }

    /// What every store records when a node is held or released.
    pub fn hold(cluster: &str, node: &str, hold: Option<&str>, admin: &str, at_ms: i64) -> EventRow {
        let (kind, message) = match hold {
            Some("") => ("held", format!("held by {admin}")),
            Some(why) => ("held", format!("held by {admin}: {why}")),
            None => ("unheld", format!("released by {admin}")),
        };
        Self::about(cluster, node, kind, at_ms, message)
    }

    /// What every store records when a cluster's API server changes.
    pub fn api_server_set(cluster: &str, api_server: Option<&str>, admin: &str, at_ms: i64) -> EventRow {
        let message = match api_server {
            Some(u) => format!("API server set to {u} by {admin}"),
            None => format!("API server cleared by {admin}"),
        };
        Self::about(cluster, "", "api_server", at_ms, message)
    }

    /// An event of a rollout's work in a tenant cluster outside a decision:
    /// a cordon lifted when a node's turn ended, a stray one repaired.
    pub fn tenant(
        cluster: &str,
        node: &str,
        rollout_id: &str,
        kind: &str,
        at_ms: i64,
        message: String,
    ) -> EventRow {
        EventRow {
            rollout_id: rollout_id.to_string(),
            ..Self::about(cluster, node, kind, at_ms, message)
        }
    }

    /// What every store records when a cluster's tenant Kubernetes access
    /// changes: `what` says what (the kubeconfig's server and user, never
    /// its credential).
    pub fn kube_set(cluster: &str, what: &str, admin: &str, at_ms: i64) -> EventRow {
        Self::about(cluster, "", "kube_access", at_ms, format!("{what} by {admin}"))
    }

    /// A cluster's labels replaced (`cluster set NAME --labels`).
    pub fn cluster_labels_set(cluster: &str, labels: &Labels, admin: &str, at_ms: i64) -> EventRow {
        let text: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let message = if text.is_empty() {
            format!("labels cleared by {admin}")
        } else {
            format!("labels set by {admin}: {}", text.join(","))
        };
        Self::about(cluster, "", "cluster_labels", at_ms, message)
    }

    /// What every store records when a cluster's peer-sharing settings
    /// change.
    pub fn peer_sharing_set(cluster: &str, peer: &PeerSettings, admin: &str, at_ms: i64) -> EventRow {
        let rate = match peer.upload_rate {
            0 => "no upload cap".to_string(),
            r => format!("uploads capped at {r} bytes/s"),
        };
        let settings = format!(
            "port {}, {rate}, at most {} concurrent uploads",
            peer.port, peer.max_uploads
        );
        let message = if peer.enabled {
            format!("peer sharing on by {admin}: {settings}")
        } else {
            format!("peer sharing off by {admin} (kept: {settings})")
        };
        Self::about(cluster, "", "peer_sharing", at_ms, message)
    }

    /// What every store records when a cluster gets its CA (`how`:
    /// "imported" or "generated"); `hash` is the CA's `sha256:` pin.
    pub fn ca_set(cluster: &str, how: &str, hash: &str, admin: &str, at_ms: i64) -> EventRow {
        Self::about(
            cluster,
            "",
            "cluster_ca",
            at_ms,
            format!("cluster CA {how} by {admin} ({hash})"),
        )
    }

    /// What the admin API records when a cluster is created.
    pub fn cluster_created(cluster: &str, message: String, at_ms: i64) -> EventRow {
        Self::about(cluster, "", "cluster_created", at_ms, message)
    }

    /// What every store records when a cluster's windows change.
    pub fn windows_set(cluster: &str, windows: &[String], admin: &str, at_ms: i64) -> EventRow {
        let message = if windows.is_empty() {
            format!("maintenance windows cleared by {admin}: nodes may start at any time")
        } else {
            format!("maintenance windows set by {admin}: {}", windows.join("; "))
        };
        Self::about(cluster, "", "maintenance_windows", at_ms, message)
    }

    /// What every store records when a rollout of `nodes` nodes starts.
    pub fn rollout_started(r: &NewRollout, batch_size: u32, nodes: usize) -> EventRow {
        EventRow {
            id: 0,
            at_ms: r.now_ms,
            cluster: r.cluster.clone(),
            node: String::new(),
            rollout_id: r.id.clone(),
            kind: "rollout_started".into(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            message: {
                let d = |ms: u64| lks_proto::duration::format_duration(std::time::Duration::from_millis(ms));
                let p = &r.policy;
                let mut m = format!(
                    "{nodes} node(s), batch size {batch_size}, failure threshold {}, offline {}",
                    r.failure_threshold,
                    p.offline.as_str(),
                );
                if p.offline == OfflinePolicy::Wait {
                    m.push_str(&format!(" (deadline {})", d(r.offline_deadline_ms)));
                }
                if p.canary > 0 {
                    m.push_str(&format!(
                        ", {} canary node(s) soaking {}",
                        p.canary,
                        d(p.canary_soak_ms)
                    ));
                }
                if p.batch_interval_ms > 0 {
                    m.push_str(&format!(", {} between batches", d(p.batch_interval_ms)));
                }
                if p.ignore_windows {
                    m.push_str(", ignoring maintenance windows");
                }
                if !r.started_by.is_empty() {
                    m.push_str(&format!("; started by {}", r.started_by));
                }
                m
            },
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    pub cluster: Option<String>,
    pub node: Option<String>,
    pub rollout_id: Option<String>,
    pub limit: u32,
}

/// The event log.
#[async_trait]
pub trait EventStore: Send + Sync {
    async fn add_event(&self, event: EventRow) -> Result<()>;
    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventRow>>;
}
