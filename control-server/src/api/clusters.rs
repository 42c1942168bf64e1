//! The admin API's clusters: creating and changing them (decoded here,
//! done by `ops::cluster`), listing them, handing out the CA certificate,
//! and the record of certificates issued with the CAs (read by
//! `ops::certs`).

use lks_kube::tenant;
use lks_proto::names::validate_cluster_name;
use lks_proto::pb;
use tonic::{Response, Status};

use super::{invalid, policy};
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::ops::certs::{self, CertQuery};
use crate::ops::cluster::{self, CreateCluster, SetCluster};
use crate::store::{ClusterRow, ClusterStore, IssuedCertRow};

/// What the cluster handlers use: those of the cluster operations.
pub(super) use crate::ops::cluster::Deps;

/// Creates a cluster with its CA (imported, or generated when none is
/// given) and API server, in one store write (`ops::cluster::create`).
pub async fn create(
    s: &Deps,
    r: pb::CreateClusterRequest,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, Status> {
    validate_cluster_name(&r.name).map_err(invalid)?;
    let asked = CreateCluster {
        name: r.name,
        api_server: r.api_server,
        ca_cert_pem: r.ca_cert_pem,
        ca_key_pem: r.ca_key_pem,
    };
    Ok(cluster::create(s, asked, admin, now_ms).await?)
}

/// The CA certificate of a cluster (`ops::certs::ca_pem`).
pub async fn ca_pem(s: &Deps, name: &str) -> Result<String, Status> {
    Ok(certs::ca_pem(&*s.store, name).await?)
}

/// An issued certificate as the admin API shows it: expired or not at
/// `now_ms`.
pub fn cert_pb(r: IssuedCertRow, now_ms: i64) -> pb::IssuedCertificate {
    pb::IssuedCertificate {
        expired: r.not_after_ms <= now_ms,
        cluster: r.cluster,
        node: r.node,
        serial: r.serial,
        profile: r.profile,
        bundle: r.bundle,
        version: r.version,
        path: r.path,
        not_before_ms: r.not_before_ms,
        not_after_ms: r.not_after_ms,
        issued_at_ms: r.issued_at_ms,
    }
}

/// The certificates a `ListCertificates` request asks for (`ops::certs::list`).
pub async fn list(
    s: &Deps,
    r: pb::ListCertificatesRequest,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    let q = CertQuery {
        cluster: r.cluster,
        node: r.node,
        all: r.all,
        expiring_within_ms: r.expiring_within_ms,
    };
    let rows = certs::list(&*s.store, &q, now_ms).await?;
    Ok(rows.into_iter().map(|c| cert_pb(c, now_ms)).collect())
}

/// The newest certificate of each bundle and path of one node.
pub async fn node_certs(
    store: &(impl ClusterStore + ?Sized),
    cluster: &str,
    node: &str,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    let rows = certs::node_certs(store, cluster, node).await?;
    Ok(rows.into_iter().map(|c| cert_pb(c, now_ms)).collect())
}

/// `SetCluster`: the request decoded, the change made by
/// `ops::cluster::set`, then the kubeconfig it gave tried.
pub(super) async fn set(
    s: &Deps,
    r: pb::SetClusterRequest,
    who: String,
) -> Result<Response<pb::Cluster>, Status> {
    validate_cluster_name(&r.name).map_err(invalid)?;
    let labels = if r.clear_labels || !r.labels.is_empty() {
        if r.clear_labels && !r.labels.is_empty() {
            return Err(Status::invalid_argument("give --labels or --no-labels, not both"));
        }
        Some(crate::ops::labels::check("labels", &r.labels).map_err(crate::ops::OpError::from)?)
    } else {
        None
    };
    let asked = SetCluster {
        labels,
        name: r.name,
        maintenance_windows: r.maintenance_windows,
        clear_maintenance_windows: r.clear_maintenance_windows,
        api_server: r.api_server,
        clear_api_server: r.clear_api_server,
        ca_cert_pem: r.ca_cert_pem,
        ca_key_pem: r.ca_key_pem,
        generate_ca: r.generate_ca,
        peer_sharing: r.peer_sharing,
        peer_port: r.peer_port,
        peer_upload_rate: r.peer_upload_rate,
        peer_max_uploads: r.peer_max_uploads,
        kubeconfig: r.kubeconfig,
        clear_kubeconfig: r.clear_kubeconfig,
        drain: r.drain,
        reboots: crate::ops::reboot::RebootChange {
            mode: r.reboots.and_then(super::reboots::mode_of),
            max_concurrent: r.max_concurrent_reboots,
            timeout_ms: r.reboot_timeout_ms,
            on_timeout: r.on_reboot_timeout.and_then(super::reboots::on_timeout_of),
            alert_gate: r.reboot_alert_gate,
            alert_filter: r.alert_filter,
            clear_alert_gate: r.clear_reboot_alert_gate,
            blocking_pod_selector: r.blocking_pod_selector,
            clear_blocking_pod_selector: r.clear_blocking_pod_selector,
        },
    };
    let changed = cluster::set(s, asked, &who, now_ms).await?;
    let mut answer = policy::cluster_pb(changed.row, now_ms());
    if let Some(k) = changed.kubeconfig {
        answer.kube_probe = tenant::probe(&k).await;
    }
    Ok(Response::new(answer))
}

/// `ListClusters`.
pub(super) async fn list_clusters(s: &Deps) -> Result<Response<pb::ListClustersResponse>, Status> {
    let clusters = s.store.list_clusters().await.map_err(store_status)?;
    let now = now_ms();
    Ok(Response::new(pb::ListClustersResponse {
        clusters: clusters.into_iter().map(|c| policy::cluster_pb(c, now)).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(not_after_ms: i64) -> IssuedCertRow {
        IssuedCertRow {
            cluster: "c".into(),
            node: "n".into(),
            serial: "1".into(),
            profile: "client".into(),
            bundle: "b".into(),
            version: "1".into(),
            path: "/a".into(),
            not_before_ms: 0,
            not_after_ms,
            issued_at_ms: 5,
        }
    }

    #[test]
    fn a_certificate_is_expired_from_its_not_after() {
        assert!(cert_pb(row(15), 15).expired);
        assert!(!cert_pb(row(15), 14).expired);
    }
}
