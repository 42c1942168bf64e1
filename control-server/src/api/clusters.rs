//! The admin API's clusters: creating and changing them (decoded here,
//! done by `ops::cluster`), listing them, handing out the CA certificate,
//! and the record of certificates issued with the CAs.

use std::collections::HashMap;

use lks_proto::names::{validate_cluster_name, validate_node_name};
use lks_proto::pb;
use tonic::{Response, Status};

use super::{invalid, policy};
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::kube::tenant;
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

/// The CA certificate of a cluster.
pub async fn ca_pem(s: &Deps, name: &str) -> Result<String, Status> {
    validate_cluster_name(name).map_err(invalid)?;
    let c = s
        .store
        .get_cluster(name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("cluster {name} does not exist")))?;
    c.ca_cert_pem.ok_or_else(|| {
        Status::failed_precondition(format!(
            "cluster {name} has no CA; give it one with `lksctl cluster set {name} --generate-ca` or --ca-cert/--ca-key"
        ))
    })
}

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

/// Only the newest record of each node, bundle and path, in the store's
/// order.
pub fn newest_only(rows: Vec<IssuedCertRow>) -> Vec<IssuedCertRow> {
    let mut newest: HashMap<(String, String, String), (i64, String)> = HashMap::new();
    for r in &rows {
        let k = (r.node.clone(), r.bundle.clone(), r.path.clone());
        let v = (r.issued_at_ms, r.serial.clone());
        let e = newest.entry(k).or_insert_with(|| v.clone());
        if v > *e {
            *e = v;
        }
    }
    rows.into_iter()
        .filter(|r| {
            newest
                .get(&(r.node.clone(), r.bundle.clone(), r.path.clone()))
                .is_some_and(|(_, serial)| *serial == r.serial)
        })
        .collect()
}

/// The certificates a `ListCertificates` request asks for.
pub async fn list(
    s: &Deps,
    r: pb::ListCertificatesRequest,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    if !r.cluster.is_empty() {
        validate_cluster_name(&r.cluster).map_err(invalid)?;
        if !s.store.cluster_exists(&r.cluster).await.map_err(store_status)? {
            return Err(Status::not_found(format!("cluster {} does not exist", r.cluster)));
        }
    }
    if !r.node.is_empty() {
        validate_node_name(&r.node).map_err(invalid)?;
    }
    if r.expiring_within_ms < 0 {
        return Err(invalid("expiring_within_ms must not be negative"));
    }
    let rows = s
        .store
        .list_certificates(
            (!r.cluster.is_empty()).then_some(r.cluster.as_str()),
            (!r.node.is_empty()).then_some(r.node.as_str()),
        )
        .await
        .map_err(store_status)?;
    let rows = if r.all { rows } else { newest_only(rows) };
    let horizon = now_ms.saturating_add(r.expiring_within_ms);
    Ok(rows
        .into_iter()
        .filter(|c| r.expiring_within_ms == 0 || c.not_after_ms <= horizon)
        .map(|c| cert_pb(c, now_ms))
        .collect())
}

/// The newest certificate of each bundle and path of one node.
pub async fn node_certs(
    store: &(impl ClusterStore + ?Sized),
    cluster: &str,
    node: &str,
    now_ms: i64,
) -> Result<Vec<pb::IssuedCertificate>, Status> {
    let rows = store
        .list_certificates(Some(cluster), Some(node))
        .await
        .map_err(store_status)?;
    Ok(newest_only(rows)
        .into_iter()
        .map(|c| cert_pb(c, now_ms))
        .collect())
}

/// `SetCluster`: the request decoded, the change made by
/// `ops::cluster::set`, then the kubeconfig it gave tried.
pub(super) async fn set(
    s: &Deps,
    r: pb::SetClusterRequest,
    who: String,
) -> Result<Response<pb::Cluster>, Status> {
    validate_cluster_name(&r.name).map_err(invalid)?;
    let asked = SetCluster {
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

    fn row(node: &str, path: &str, serial: &str, at: i64) -> IssuedCertRow {
        IssuedCertRow {
            cluster: "c".into(),
            node: node.into(),
            serial: serial.into(),
            profile: "client".into(),
            bundle: "b".into(),
            version: "1".into(),
            path: path.into(),
            not_before_ms: 0,
            not_after_ms: at + 10,
            issued_at_ms: at,
        }
    }

    #[test]
    fn only_the_newest_of_each_node_bundle_and_path_is_shown() {
        let rows = vec![
            row("n1", "/a", "01", 1),
            row("n1", "/a", "02", 5),
            row("n1", "/b", "03", 2),
            row("n2", "/a", "04", 1),
        ];
        let serials: Vec<String> = newest_only(rows).into_iter().map(|r| r.serial).collect();
        assert_eq!(serials, ["02", "03", "04"]);
        assert!(cert_pb(row("n", "/a", "1", 5), 15).expired);
        assert!(!cert_pb(row("n", "/a", "1", 5), 14).expired);
    }
}
