//! The audit trail's API side: what each state-changing admin call
//! records (its target and arguments, secrets redacted, bulk counted),
//! the record written once the call has ended, and `ListAudit`.
//!
//! A record is written after the call, with how it ended. If the store
//! cannot take it, the call's own answer stands (what it did is done) and
//! the failure is logged and counted (`lks_audit_write_errors_total`): the
//! same store failing usually failed the call as well.

use std::sync::Arc;

use lks_proto::pb;
use serde_json::{Value, json};
use tonic::{Response, Status};

use crate::authz::AdminCaller;
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::ops::event::clip;
use crate::ops::logs;
use crate::store::{AuditRow, AuditStore};

/// Longest target kept (names are far shorter; a hostile one is clipped).
const MAX_TARGET: usize = 512;
/// Longest arguments kept, as JSON; longer ones are replaced by their size.
const MAX_ARGS: usize = 16 * 1024;

/// What a call records besides its verb and outcome.
pub(super) struct Entry {
    pub target: String,
    pub args: Value,
}

crate::context::shared_view! {
    /// What the audit trail uses: the store, this replica's URL, the metrics.
    pub(super) struct Deps {
        store: Arc<dyn AuditStore>,
        server_url: String,
        metrics: Arc<Metrics>,
    }
}

impl Deps {
    /// Records `verb` by `caller` on `entry`, ending as `result` did.
    pub async fn record<T>(
        &self,
        caller: &AdminCaller,
        verb: &str,
        entry: Entry,
        result: &Result<T, Status>,
    ) {
        let outcome = match result {
            Ok(_) => "ok".to_string(),
            Err(s) => format!("{:?}: {}", s.code(), clip(s.message(), 1024)),
        };
        let mut args = entry.args.to_string();
        if args.len() > MAX_ARGS {
            args =
                json!({ "omitted": format!("{} bytes of arguments, over the {MAX_ARGS} kept", args.len()) })
                    .to_string();
        }
        let row = AuditRow {
            id: 0,
            at_ms: now_ms(),
            verb: verb.to_string(),
            target: clip(&entry.target, MAX_TARGET).to_string(),
            args,
            outcome,
            caller: caller.name.clone(),
            caller_fingerprint: caller.fingerprint.clone(),
            server: self.server_url.clone(),
        };
        if let Err(e) = self.store.append_audit(row).await {
            self.metrics.audit_write_failed();
            tracing::error!(verb, caller = %caller.name, error = %e, "could not write the audit record of an admin call");
        }
    }
}

/// `ListAudit` (`ops::logs::audit`).
pub(super) async fn list(
    store: &(impl AuditStore + ?Sized),
    r: pb::ListAuditRequest,
) -> Result<Response<pb::ListAuditResponse>, Status> {
    let rows = logs::audit(store, r.since_ms, r.verb, r.limit).await?;
    Ok(Response::new(pb::ListAuditResponse {
        records: rows
            .into_iter()
            .map(|a| pb::AuditRecord {
                id: a.id,
                at_ms: a.at_ms,
                verb: a.verb,
                target: a.target,
                args: a.args,
                outcome: a.outcome,
                caller: a.caller,
                caller_fingerprint: a.caller_fingerprint,
                server: a.server,
            })
            .collect(),
    }))
}

/// A PEM the request carried: whether there was one; a key is never kept.
fn pem(given: &str) -> Value {
    if given.is_empty() {
        Value::Null
    } else {
        json!("<redacted>")
    }
}

/// A certificate the request carried: its SHA-256, enough to tell which.
fn cert(given: &str) -> Value {
    if given.is_empty() {
        Value::Null
    } else {
        json!(lks_proto::Digest::of(given.as_bytes()).to_string())
    }
}

/// A kubeconfig the request carried holds a credential: only its server
/// is recorded (or that it was given, if it does not parse).
fn kubeconfig(given: Option<&str>) -> Value {
    match given {
        None => Value::Null,
        Some(text) => match lks_kube::config::TenantKubeconfig::check(text) {
            Ok(k) => json!({"server": k.server, "user": k.user, "credential": "<redacted>"}),
            Err(_) => json!("<redacted>"),
        },
    }
}

pub(super) fn create_cluster(r: &pb::CreateClusterRequest) -> Entry {
    Entry {
        target: r.name.clone(),
        args: json!({
            "ca_cert": cert(&r.ca_cert_pem),
            "ca_key": pem(&r.ca_key_pem),
            "api_server": r.api_server,
        }),
    }
}

pub(super) fn set_cluster(r: &pb::SetClusterRequest) -> Entry {
    Entry {
        target: r.name.clone(),
        args: json!({
            "maintenance_windows": r.maintenance_windows,
            "clear_maintenance_windows": r.clear_maintenance_windows,
            "api_server": r.api_server,
            "clear_api_server": r.clear_api_server,
            "ca_cert": cert(&r.ca_cert_pem),
            "ca_key": pem(&r.ca_key_pem),
            "generate_ca": r.generate_ca,
            "peer_sharing": r.peer_sharing,
            "peer_port": r.peer_port,
            "peer_upload_rate": r.peer_upload_rate,
            "peer_max_uploads": r.peer_max_uploads,
            "kubeconfig": kubeconfig(r.kubeconfig.as_deref()),
            "clear_kubeconfig": r.clear_kubeconfig,
            "drain": r.drain,
            "reboots": r.reboots,
            "max_concurrent_reboots": r.max_concurrent_reboots,
            "reboot_timeout_ms": r.reboot_timeout_ms,
            "on_reboot_timeout": r.on_reboot_timeout,
            "reboot_alert_gate": r.reboot_alert_gate,
            "alert_filter": r.alert_filter,
            "clear_reboot_alert_gate": r.clear_reboot_alert_gate,
            "blocking_pod_selector": r.blocking_pod_selector,
            "clear_blocking_pod_selector": r.clear_blocking_pod_selector,
        }),
    }
}

/// The token's secret is in the answer, never in the request: nothing to
/// redact, and the answer is not recorded.
pub(super) fn create_token(r: &pb::CreateTokenRequest) -> Entry {
    Entry {
        target: r.cluster.clone(),
        args: json!({"ttl_seconds": r.ttl_seconds, "uses": r.uses, "labels": r.labels}),
    }
}

/// A publish is recorded by what it stored; a refused one by its header
/// if it got that far (the handler reads the stream).
pub(super) fn publish(answer: &Result<Response<pb::PublishBundleResponse>, Status>) -> Entry {
    match answer {
        Ok(r) => {
            let r = r.get_ref();
            Entry {
                target: format!("{}@{}", r.name, r.version),
                args: json!({"created": r.created}),
            }
        }
        Err(_) => Entry {
            target: String::new(),
            args: json!({}),
        },
    }
}

pub(super) fn bundle(r: &pb::GetBundleRequest) -> Entry {
    Entry {
        target: format!("{}@{}", r.name, r.version),
        args: json!({}),
    }
}

/// A policy choice for the record: its word, "" when not given, or the
/// string as sent when it names nothing (the start is refused).
fn choice<E>(read: Result<Option<&'static str>, E>, sent: &str) -> String {
    match read {
        Ok(word) => word.unwrap_or_default().to_string(),
        Err(_) => sent.to_string(),
    }
}

pub(super) fn start_rollout(r: &pb::StartRolloutRequest) -> Entry {
    Entry {
        target: format!("{}@{}", r.bundle, r.version),
        args: json!({
            "cluster": r.cluster,
            "selector": r.selector,
            "batch_size": r.batch_size,
            "failure_threshold": r.failure_threshold,
            "offline_deadline_seconds": r.offline_deadline_seconds,
            // The choice as the server reads it (typed field or string).
            "offline": choice(lks_rollout::policy::wire::offline_of(r).map(|o| o.map(|o| o.as_str())), &r.offline),
            "canary": r.canary,
            "canary_soak_seconds": r.canary_soak_seconds,
            "batch_interval_seconds": r.batch_interval_seconds,
            "ignore_windows": r.ignore_windows,
            "drain": r.drain,
            "drain_timeout_seconds": r.drain_timeout_seconds,
            "ready_timeout_seconds": r.ready_timeout_seconds,
            "drain_delete_local_data": r.drain_delete_local_data,
            "on_drain_timeout": choice(
                lks_rollout::policy::wire::on_drain_timeout_of(r).map(|o| o.map(|o| o.as_str())),
                &r.on_drain_timeout
            ),
            "kubelet_version": r.kubelet_version,
            "request_id": r.request_id,
        }),
    }
}

pub(super) fn rollout(r: &pb::RolloutRef) -> Entry {
    Entry {
        target: r.id.clone(),
        args: json!({}),
    }
}

/// A release by what it names; the record itself is kept by the store.
pub(super) fn release(r: &pb::PublishReleaseRequest) -> Entry {
    let Some(rel) = r.release.as_ref().and_then(|s| s.release.as_ref()) else {
        return Entry {
            target: String::new(),
            args: json!({}),
        };
    };
    let sigs = r.release.as_ref().map_or(0, |s| s.signatures.len());
    Entry {
        target: format!("release {} of {}", rel.version, rel.channel),
        args: json!({
            "expires_at_ms": rel.expires_at_ms,
            "bundles": rel.bundles.iter().take(256).map(|b| format!("{}@{}", b.name, b.version)).collect::<Vec<_>>(),
            "signatures": sigs,
        }),
    }
}

pub(super) fn root(r: &pb::PublishRootRequest) -> Entry {
    let root = r.root.as_ref().and_then(|s| s.root.as_ref());
    Entry {
        target: format!("trust root {} of {}", root.map_or(0, |x| x.version), r.cluster),
        args: json!({
            "keys": root.map_or(0, |x| x.keys.len()),
            "threshold": root.map_or(0, |x| x.threshold),
            "expires_at_ms": root.map_or(0, |x| x.expires_at_ms),
            "signatures": r.root.as_ref().map_or(0, |s| s.signatures.len()),
        }),
    }
}

/// A cluster's coordinated reboots (`StartReboots`, `SetRebootRun`).
pub(super) fn reboots(cluster: &str, args: Value) -> Entry {
    Entry {
        target: cluster.to_string(),
        args,
    }
}

pub(super) fn node(name: &str, args: Value) -> Entry {
    Entry {
        target: name.to_string(),
        args,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_redacted_and_certificates_named_by_digest() {
        let e = create_cluster(&pb::CreateClusterRequest {
            name: "a".into(),
            ca_cert_pem: "-----BEGIN CERTIFICATE-----".into(),
            ca_key_pem: "-----BEGIN PRIVATE KEY-----secret".into(),
            api_server: "https://api:6443".into(),
        });
        let text = e.args.to_string();
        assert!(!text.contains("secret") && !text.contains("PRIVATE"), "{text}");
        assert_eq!(e.args["ca_key"], "<redacted>");
        assert!(e.args["ca_cert"].as_str().unwrap().starts_with("sha256:"));
        let none = set_cluster(&pb::SetClusterRequest {
            name: "a".into(),
            ..Default::default()
        });
        assert!(none.args["ca_key"].is_null() && none.args["ca_cert"].is_null());
    }
}
