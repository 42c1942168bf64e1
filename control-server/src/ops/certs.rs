//! What an operator reads of the tenant CAs: a cluster's CA certificate
//! (`GetClusterCa`) and the record of the certificates issued with them
//! (`ListCertificates`, and each node's in `ListNodes`/`GetNode`) — the
//! newest of each node, bundle and path unless all are asked for, and
//! only those expiring within a horizon when one is given.

use std::collections::HashMap;

use lks_proto::names::{NameError, validate_cluster_name, validate_node_name};

use super::{Kind, OpError};
use crate::store::{ClusterStore, IssuedCertRow};

/// Why a read of the CAs or their certificates was refused.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// The cluster's or the node's name is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("cluster {0} does not exist")]
    NoCluster(String),
    #[error(
        "cluster {0} has no CA; give it one with `lksctl cluster set {0} --generate-ca` or --ca-cert/--ca-key"
    )]
    NoCa(String),
    #[error("expiring_within_ms must not be negative")]
    NegativeHorizon,
}

impl CertsError {
    pub fn kind(&self) -> Kind {
        match self {
            CertsError::Name(_) | CertsError::NegativeHorizon => Kind::Invalid,
            CertsError::NoCluster(_) => Kind::NotFound,
            CertsError::NoCa(_) => Kind::FailedPrecondition,
        }
    }
}

/// The CA certificate of cluster `name`.
pub async fn ca_pem(store: &(impl ClusterStore + ?Sized), name: &str) -> Result<String, OpError> {
    validate_cluster_name(name).map_err(CertsError::from)?;
    let c = store
        .get_cluster(name)
        .await?
        .ok_or_else(|| CertsError::NoCluster(name.to_string()))?;
    Ok(c.ca_cert_pem.ok_or_else(|| CertsError::NoCa(name.to_string()))?)
}

/// The certificates a `ListCertificates` request asks for.
#[derive(Clone, Debug, Default)]
pub struct CertQuery {
    /// Empty: every cluster's.
    pub cluster: String,
    /// Empty: every node's.
    pub node: String,
    /// Every record, not only the newest of each node, bundle and path.
    pub all: bool,
    /// 0: whenever they expire.
    pub expiring_within_ms: i64,
}

/// The issued certificates `q` asks for, in the store's order.
pub async fn list(
    store: &(impl ClusterStore + ?Sized),
    q: &CertQuery,
    now_ms: i64,
) -> Result<Vec<IssuedCertRow>, OpError> {
    if !q.cluster.is_empty() {
        validate_cluster_name(&q.cluster).map_err(CertsError::from)?;
        if !store.cluster_exists(&q.cluster).await? {
            return Err(CertsError::NoCluster(q.cluster.clone()).into());
        }
    }
    if !q.node.is_empty() {
        validate_node_name(&q.node).map_err(CertsError::from)?;
    }
    if q.expiring_within_ms < 0 {
        return Err(CertsError::NegativeHorizon.into());
    }
    let rows = store
        .list_certificates(
            (!q.cluster.is_empty()).then_some(q.cluster.as_str()),
            (!q.node.is_empty()).then_some(q.node.as_str()),
        )
        .await?;
    let rows = if q.all { rows } else { newest_only(rows) };
    let horizon = now_ms.saturating_add(q.expiring_within_ms);
    Ok(rows
        .into_iter()
        .filter(|c| q.expiring_within_ms == 0 || c.not_after_ms <= horizon)
        .collect())
}

/// The newest certificate of each bundle and path of one node.
pub async fn node_certs(
    store: &(impl ClusterStore + ?Sized),
    cluster: &str,
    node: &str,
) -> Result<Vec<IssuedCertRow>, OpError> {
    Ok(newest_only(
        store.list_certificates(Some(cluster), Some(node)).await?,
    ))
}

/// The newest certificate of each bundle and path of every node of
/// `cluster` (empty: of every cluster), by node.
pub async fn newest_by_node(
    store: &(impl ClusterStore + ?Sized),
    cluster: &str,
) -> Result<HashMap<String, Vec<IssuedCertRow>>, OpError> {
    let issued = store
        .list_certificates((!cluster.is_empty()).then_some(cluster), None)
        .await?;
    let mut by_node: HashMap<String, Vec<IssuedCertRow>> = HashMap::new();
    for c in newest_only(issued) {
        by_node.entry(c.node.clone()).or_default().push(c);
    }
    Ok(by_node)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewCluster;
    use crate::store::sqlite::SqliteStore;

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
    }

    /// A store with cluster `a`, which has no CA.
    async fn store() -> SqliteStore {
        let store = SqliteStore::open_in_memory().unwrap();
        store.create_cluster(NewCluster::new("a", 0)).await.unwrap();
        store
    }

    #[tokio::test]
    async fn a_ca_is_handed_out_only_of_a_cluster_that_has_one() {
        let store = store().await;
        let e = ca_pem(&store, "Not A Name").await.unwrap_err();
        assert!(matches!(e, OpError::Certs(CertsError::Name(_))), "{e}");
        assert_eq!(e.kind(), Some(Kind::Invalid));
        let e = ca_pem(&store, "b").await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::NotFound));
        assert_eq!(e.to_string(), "cluster b does not exist");
        let e = ca_pem(&store, "a").await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::FailedPrecondition));
        assert_eq!(
            e.to_string(),
            "cluster a has no CA; give it one with `lksctl cluster set a --generate-ca` or --ca-cert/--ca-key"
        );
    }

    #[tokio::test]
    async fn a_certificate_query_is_checked_in_order() {
        let store = store().await;
        let q = |cluster: &str, node: &str, expiring_within_ms| CertQuery {
            cluster: cluster.into(),
            node: node.into(),
            all: false,
            expiring_within_ms,
        };
        // An unknown cluster before a bad node name or horizon.
        let e = list(&store, &q("b", "Bad Node", -1), 0).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (Some(Kind::NotFound), "cluster b does not exist")
        );
        let e = list(&store, &q("a", "Bad Node", -1), 0).await.unwrap_err();
        assert!(matches!(e, OpError::Certs(CertsError::Name(_))), "{e}");
        let e = list(&store, &q("a", "n1", -1), 0).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (Some(Kind::Invalid), "expiring_within_ms must not be negative")
        );
        assert!(list(&store, &q("a", "n1", 0), 0).await.unwrap().is_empty());
        assert!(list(&store, &q("", "", 5), 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn each_nodes_newest_certificates_are_read_by_node() {
        let store = store().await;
        for (node, path, serial, at) in [
            ("n1", "/a", "01", 1),
            ("n1", "/a", "02", 5),
            ("n2", "/a", "03", 2),
        ] {
            let r = IssuedCertRow {
                cluster: "a".into(),
                ..row(node, path, serial, at)
            };
            store.record_certificate(r).await.unwrap();
        }
        let by_node = newest_by_node(&store, "a").await.unwrap();
        let serials = |n: &str| -> Vec<&str> { by_node[n].iter().map(|r| r.serial.as_str()).collect() };
        assert_eq!((serials("n1"), serials("n2")), (vec!["02"], vec!["03"]));
        assert_eq!(by_node.len(), 2);
        assert!(newest_by_node(&store, "b").await.unwrap().is_empty());
    }
}
