//! `IssueCertificate`: a node's CSR for a `[[certificate]]` of a bundle
//! assigned to it, signed with its tenant cluster's CA.
//!
//! What may be signed is decided here and nowhere else: the bundle version
//! must be in the calling node's desired state, the entry must be one of
//! its `[[certificate]]`s, and the CSR must ask for exactly the names
//! `lks_proto::certs` gives that entry for *this* node (its name from the
//! mTLS certificate, its addresses from its last `Hello`). The certificate
//! is then built from those names, not from the CSR — only the CSR's key
//! is used — and its serial is recorded before it is returned.

use std::net::IpAddr;

use lks_proto::certs::check_csr;
use lks_proto::identity::NodeIdentity;
use lks_proto::names::{validate_bundle_name, validate_version};
use lks_proto::{BundlePath, pb};
use tonic::Status;

use super::identity::Deps;
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::pki::clusterca::{CertTemplate, Usage};
use crate::store::{IssuedCertRow, Kind, NodeRow, StoreError, StoredBundle};

/// Largest CSR accepted (a P-256 CSR with 32 SANs is about 2 KiB).
const MAX_CSR: usize = 16 * 1024;

/// Signs `r` for `id`; returns the answer and the bundle name and version.
pub async fn issue(
    s: &Deps,
    id: &NodeIdentity,
    r: pb::IssueCertificateRequest,
) -> Result<(pb::IssueCertificateResponse, String, String), Status> {
    validate_bundle_name(&r.bundle).map_err(|e| Status::invalid_argument(format!("bundle: {e}")))?;
    validate_version(&r.version).map_err(|e| Status::invalid_argument(format!("version: {e}")))?;
    let path = BundlePath::new(&r.path).map_err(|e| Status::invalid_argument(format!("path: {e}")))?;
    if r.csr_pem.len() > MAX_CSR {
        return Err(Status::invalid_argument(format!(
            "the CSR is {} bytes; the limit is {MAX_CSR}",
            r.csr_pem.len()
        )));
    }
    let node = s
        .store
        .get_node(&id.node)
        .await
        .map_err(store_status)?
        .ok_or_else(|| store_status(StoreError::not_found(Kind::Node, id.node.clone())))?;
    let bundle = assigned(s, &node, &r.bundle, &r.version).await?;
    let spec = bundle.manifest().certificate(&path).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{} is not a [[certificate]] of bundle {}@{}",
            path, r.bundle, r.version
        ))
    })?;
    let names = spec
        .names_for(&id.node, &reported_addresses(&node.facts_json))
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    check_csr(&r.csr_pem, &names).map_err(|e| Status::permission_denied(format!("{path}: {e}")))?;
    let ca = s
        .cluster_cas
        .load(&id.cluster)
        .await
        .map_err(|e| Status::internal(format!("cluster {} CA: {e}", id.cluster)))?
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "cluster {c} has no CA to sign node certificates; give it one with \
                 `lksctl cluster set {c} --generate-ca` (or --ca-cert and --ca-key)",
                c = id.cluster
            ))
        })?;
    let template = CertTemplate {
        common_name: names.common_name.clone(),
        organizations: names.organizations.clone(),
        dns_names: names.dns_names.clone(),
        ip_addresses: names.ip_addresses.clone(),
        usage: if names.client {
            Usage::Client
        } else {
            Usage::Server
        },
        ttl: spec.ttl,
    };
    let signed = ca
        .sign(&r.csr_pem, &template, time::OffsetDateTime::now_utc())
        .map_err(|e| Status::invalid_argument(format!("{path}: {e}")))?;
    let cluster = s
        .store
        .get_cluster(&id.cluster)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::failed_precondition(format!("cluster {} no longer exists", id.cluster)))?;
    // Recorded before it is handed out: no certificate exists that the
    // store does not know of.
    s.store
        .record_certificate(IssuedCertRow {
            cluster: id.cluster.clone(),
            node: id.node.clone(),
            serial: signed.serial.clone(),
            profile: spec.profile.as_str().into(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            path: path.to_string(),
            not_before_ms: signed.not_before_ms,
            not_after_ms: signed.not_after_ms,
            issued_at_ms: now_ms(),
        })
        .await
        .map_err(store_status)?;
    Ok((
        pb::IssueCertificateResponse {
            certificate_pem: signed.pem,
            ca_pem: ca.cert_pem().to_string(),
            api_server: cluster.api_server.unwrap_or_default(),
            cluster: id.cluster.clone(),
            serial: signed.serial,
            not_after_ms: signed.not_after_ms,
        },
        r.bundle,
        r.version,
    ))
}

/// `bundle@version` if the node's desired state holds it.
async fn assigned(s: &Deps, node: &NodeRow, bundle: &str, version: &str) -> Result<StoredBundle, Status> {
    let not_assigned = || {
        Status::permission_denied(format!(
            "bundle {bundle}@{version} is not assigned to node {}",
            node.name
        ))
    };
    if node.desired.get(bundle).map(String::as_str) != Some(version) {
        return Err(not_assigned());
    }
    // Deleted since the node's row was read: no longer assigned either.
    s.store
        .get_bundle(bundle, version)
        .await
        .map_err(store_status)?
        .map(|row| row.bundle)
        .ok_or_else(not_assigned)
}

/// The addresses of the node's last `Hello` (none if it never sent any).
fn reported_addresses(facts_json: &str) -> Vec<IpAddr> {
    serde_json::from_str::<serde_json::Value>(facts_json)
        .ok()
        .and_then(|v| v.get("addresses").cloned())
        .and_then(|a| serde_json::from_value::<Vec<String>>(a).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_facts_and_only_parse() {
        let f = r#"{"hostname":"w1","addresses":["192.0.2.1","nonsense","2001:db8::1"]}"#;
        assert_eq!(
            reported_addresses(f),
            vec![
                "192.0.2.1".parse::<IpAddr>().unwrap(),
                "2001:db8::1".parse().unwrap()
            ]
        );
        assert!(reported_addresses("").is_empty());
        assert!(reported_addresses(r#"{"hostname":"w1"}"#).is_empty());
    }
}
