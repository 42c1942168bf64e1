//! Cluster documents changed in place (windows, API server, CA, peer
//! sharing) and the record of certificates issued with cluster CAs
//! (`certs/CLUSTER/NODE/SERIAL`).

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};
use serde::{Deserialize, Serialize};

use lks_store::{
    CERT_RECORD_RETENTION_MS, ClusterKube, ClusterRow, ClusterStore, EventRow, IssuedCertRow, Kind,
    KubeFlags, NewCluster, PeerSettings, Result, SealedField, StoreError, StoredCa, ca_already_set,
    cluster_exists, sort_certificates,
};

use crate::docs::{ClusterDoc, NodeDoc};
use crate::{Doc, EtcdStore, MAX_ATTEMPTS, busy, corrupt, json};
use lks_proto::labels::Labels;
use std::collections::HashMap;

/// An issued certificate as stored under `certs/CLUSTER/NODE/SERIAL`.
#[derive(Serialize, Deserialize, Clone)]
pub(super) struct CertDoc {
    profile: String,
    bundle: String,
    version: String,
    path: String,
    not_before_ms: i64,
    not_after_ms: i64,
    issued_at_ms: i64,
}

impl CertDoc {
    pub(super) fn from_row(r: &IssuedCertRow) -> Self {
        CertDoc {
            profile: r.profile.clone(),
            bundle: r.bundle.clone(),
            version: r.version.clone(),
            path: r.path.clone(),
            not_before_ms: r.not_before_ms,
            not_after_ms: r.not_after_ms,
            issued_at_ms: r.issued_at_ms,
        }
    }
}

/// A cluster's tenant Kubernetes access as stored under `clusterkube/CLUSTER`,
/// beside the cluster document (see [`ClusterKube`]).
#[derive(Serialize, Deserialize, Clone, Default)]
pub(super) struct KubeDoc {
    /// As the server handed it over: the YAML, or a sealed envelope in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) kubeconfig: Option<String>,
    #[serde(default)]
    pub(super) drain: bool,
}

impl KubeDoc {
    pub(super) fn from_kube(k: &ClusterKube) -> Self {
        KubeDoc {
            kubeconfig: k.kubeconfig.clone(),
            drain: k.drain,
        }
    }

    fn into_kube(self) -> ClusterKube {
        ClusterKube {
            kubeconfig: self.kubeconfig,
            drain: self.drain,
        }
    }
}

/// The key (after the prefix) of a certificate record.
pub(super) fn cert_key(r: &IssuedCertRow) -> String {
    format!("certs/{}/{}/{}", r.cluster, r.node, r.serial)
}

impl EtcdStore {
    /// Changes a cluster document with `f` and records `event`, retried
    /// while other replicas write the same document.
    pub(super) async fn update_cluster(
        &self,
        name: &str,
        what: &str,
        event: EventRow,
        f: impl Fn(&mut ClusterDoc) -> Result<()>,
    ) -> Result<ClusterRow> {
        let key = self.key(&format!("clusters/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let doc: Doc<ClusterDoc> = self.get(&key).await?;
            let Some(mut c) = doc.value.clone() else {
                return Err(StoreError::not_found(Kind::Cluster, name.to_string()));
            };
            f(&mut c)?;
            let mut ops = vec![TxnOp::put(key.clone(), json(&c)?, None)];
            if let Some(op) = self.event_op(std::slice::from_ref(&event))? {
                ops.push(op);
            }
            if self.txn(vec![doc.compare(&key)], ops).await? {
                let mut row = c.into_row(name, 0);
                row.kube = self.kube_doc(name).await?.into_kube().flags();
                return Ok(row);
            }
        }
        Err(busy(what))
    }

    /// The cluster's `clusterkube/NAME` document; the defaults when there is none.
    async fn kube_doc(&self, name: &str) -> Result<KubeDoc> {
        let doc: Doc<KubeDoc> = self.get(&self.key(&format!("clusterkube/{name}"))).await?;
        Ok(doc.value.unwrap_or_default())
    }

    /// Drops the records of `r`'s node and path that expired more than
    /// [`CERT_RECORD_RETENTION_MS`] before `r` was issued. Not in the put's
    /// transaction: a record dropped late is harmless, and a repeat drops it.
    async fn prune_certificates(&self, r: &IssuedCertRow) -> Result<()> {
        let cutoff = r.issued_at_ms - CERT_RECORD_RETENTION_MS;
        let old: Vec<IssuedCertRow> = self
            .list_certificates(Some(&r.cluster), Some(&r.node))
            .await?
            .into_iter()
            .filter(|c| c.path == r.path && c.not_after_ms < cutoff)
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        let ops = old
            .iter()
            .map(|c| TxnOp::delete(self.key(&cert_key(c)), None))
            .collect();
        self.txn(Vec::new(), ops).await?;
        Ok(())
    }
}

#[async_trait]
impl ClusterStore for EtcdStore {
    /// The key the value lives under and the field: `<prefix>clusters/<cluster>#ca_key`,
    /// `<prefix>clusterkube/<cluster>#kubeconfig`.
    fn sealed_aad(&self, cluster: &str, field: SealedField) -> Vec<u8> {
        match field {
            SealedField::CaKey => self.key(&format!("clusters/{cluster}#ca_key")),
            SealedField::Kubeconfig => self.key(&format!("clusterkube/{cluster}#kubeconfig")),
        }
        .into_bytes()
    }

    async fn create_cluster(&self, c: NewCluster) -> Result<ClusterRow> {
        let key = self.key(&format!("clusters/{}", c.name));
        let ok = self
            .txn(
                vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
                vec![TxnOp::put(key, json(&ClusterDoc::new(&c))?, None)],
            )
            .await?;
        if !ok {
            return Err(cluster_exists(&c.name));
        }
        Ok(c.row())
    }

    async fn set_cluster_api_server(
        &self,
        name: &str,
        api_server: Option<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        self.update_cluster(name, "set the API server", event, |c| {
            c.api_server = api_server.clone();
            Ok(())
        })
        .await
    }

    async fn set_cluster_labels(&self, name: &str, labels: Labels, event: EventRow) -> Result<ClusterRow> {
        self.update_cluster(name, "set cluster labels", event, |c| {
            c.labels = labels.clone();
            Ok(())
        })
        .await
    }

    async fn set_cluster_peer(&self, name: &str, peer: PeerSettings, event: EventRow) -> Result<ClusterRow> {
        self.update_cluster(name, "set peer sharing", event, |c| {
            c.peer = peer;
            Ok(())
        })
        .await
    }

    async fn set_cluster_reboots(
        &self,
        name: &str,
        policy: lks_store::RebootPolicy,
        event: EventRow,
    ) -> Result<ClusterRow> {
        self.update_cluster(name, "set the reboot policy", event, |c| {
            c.reboots = Some(policy.clone());
            Ok(())
        })
        .await
    }

    async fn set_cluster_ca(&self, name: &str, ca: StoredCa, event: EventRow) -> Result<ClusterRow> {
        self.update_cluster(name, "set the cluster CA", event, |c| {
            if c.ca_cert_pem.is_some() {
                return Err(ca_already_set(name));
            }
            c.ca_cert_pem = Some(ca.cert_pem.clone());
            c.ca_key = Some(ca.key.clone());
            Ok(())
        })
        .await
    }

    async fn cluster_ca(&self, name: &str) -> Result<Option<StoredCa>> {
        let doc: Doc<ClusterDoc> = self.get(&self.key(&format!("clusters/{name}"))).await?;
        Ok(doc.value.and_then(|c| match (c.ca_cert_pem, c.ca_key) {
            (Some(cert_pem), Some(key)) => Some(StoredCa { cert_pem, key }),
            _ => None,
        }))
    }

    async fn cluster_kube(&self, name: &str) -> Result<Option<ClusterKube>> {
        if !self.cluster_exists(name).await? {
            return Ok(None);
        }
        Ok(Some(self.kube_doc(name).await?.into_kube()))
    }

    async fn set_cluster_kube(&self, name: &str, kube: ClusterKube, event: EventRow) -> Result<ClusterRow> {
        let ckey = self.key(&format!("clusters/{name}"));
        let mut ops = vec![TxnOp::put(
            self.key(&format!("clusterkube/{name}")),
            json(&KubeDoc::from_kube(&kube))?,
            None,
        )];
        if let Some(op) = self.event_op(std::slice::from_ref(&event))? {
            ops.push(op);
        }
        // The cluster must exist (it is never deleted); the last write wins,
        // as for every other cluster setting.
        let ok = self
            .txn(vec![Compare::create_revision(ckey, CompareOp::Greater, 0)], ops)
            .await?;
        if !ok {
            return Err(StoreError::not_found(Kind::Cluster, name.to_string()));
        }
        self.get_cluster(name)
            .await?
            .ok_or_else(|| StoreError::not_found(Kind::Cluster, name.to_string()))
    }

    async fn record_certificate(&self, r: IssuedCertRow) -> Result<()> {
        let ckey = self.key(&format!("clusters/{}", r.cluster));
        let key = self.key(&cert_key(&r));
        // The cluster must exist (it is never deleted) and the serial be new.
        let ok = self
            .txn(
                vec![
                    Compare::create_revision(ckey, CompareOp::Greater, 0),
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                ],
                vec![TxnOp::put(key, json(&CertDoc::from_row(&r))?, None)],
            )
            .await?;
        if ok {
            self.prune_certificates(&r).await?;
            return Ok(());
        }
        if !self.cluster_exists(&r.cluster).await? {
            return Err(StoreError::not_found(Kind::Cluster, r.cluster.to_string()));
        }
        Err(r.serial_taken())
    }

    async fn list_certificates(
        &self,
        cluster: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<IssuedCertRow>> {
        let prefix = match (cluster, node) {
            (Some(c), Some(n)) => format!("certs/{c}/{n}/"),
            (Some(c), None) => format!("certs/{c}/"),
            _ => "certs/".to_string(),
        };
        let mut out = Vec::new();
        for (rest, d, _) in self.range::<CertDoc>(&self.key(&prefix)).await? {
            let full = format!("{prefix}{rest}");
            let mut parts = full.splitn(4, '/').skip(1);
            let (Some(c), Some(n), Some(serial)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(corrupt(&self.key(&full), "not certs/CLUSTER/NODE/SERIAL"));
            };
            if node.is_some_and(|want| want != n) {
                continue;
            }
            out.push(IssuedCertRow {
                cluster: c.to_string(),
                node: n.to_string(),
                serial: serial.to_string(),
                profile: d.profile,
                bundle: d.bundle,
                version: d.version,
                path: d.path,
                not_before_ms: d.not_before_ms,
                not_after_ms: d.not_after_ms,
                issued_at_ms: d.issued_at_ms,
            });
        }
        sort_certificates(&mut out);
        Ok(out)
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterRow>> {
        let clusters = self.range::<ClusterDoc>(&self.key("clusters/")).await?;
        let nodes = self.range::<NodeDoc>(&self.key("nodes/")).await?;
        let kube: HashMap<String, KubeFlags> = self
            .range::<KubeDoc>(&self.key("clusterkube/"))
            .await?
            .into_iter()
            .map(|(name, k, _)| (name, k.into_kube().flags()))
            .collect();
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for (_, n, _) in &nodes {
            *counts.entry(n.cluster.as_str()).or_default() += 1;
        }
        Ok(clusters
            .into_iter()
            .map(|(name, c, _)| {
                let count = counts.get(name.as_str()).copied().unwrap_or(0);
                let mut row = c.into_row(&name, count);
                row.kube = kube.get(&name).copied().unwrap_or_default();
                row
            })
            .collect())
    }

    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRow>> {
        // Both documents in one round trip: the controller reads a cluster
        // each time it drives one of its rollouts.
        let ckey = self.key(&format!("clusters/{name}"));
        let kkey = self.key(&format!("clusterkube/{name}"));
        let mut docs = self
            .get_many::<serde_json::Value>(&[ckey.clone(), kkey.clone()])
            .await?
            .into_iter()
            .map(|d| d.value);
        let (Some(Some(c)), kube) = (docs.next(), docs.next().flatten()) else {
            return Ok(None);
        };
        let c: ClusterDoc = serde_json::from_value(c).map_err(|e| corrupt(&ckey, e))?;
        let kube: KubeDoc = match kube {
            Some(k) => serde_json::from_value(k).map_err(|e| corrupt(&kkey, e))?,
            None => KubeDoc::default(),
        };
        let mut row = c.into_row(name, 0);
        row.kube = kube.into_kube().flags();
        Ok(Some(row))
    }

    async fn set_cluster_windows(
        &self,
        name: &str,
        windows: Vec<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        self.update_cluster(name, "set maintenance windows", event, |c| {
            c.maintenance_windows = windows.clone();
            Ok(())
        })
        .await
    }

    async fn cluster_exists(&self, name: &str) -> Result<bool> {
        Ok(self
            .get_raw(&self.key(&format!("clusters/{name}")))
            .await?
            .is_some())
    }
}
