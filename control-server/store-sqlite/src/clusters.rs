//! Cluster CAs, API servers, peer-sharing settings and the record of
//! issued certificates in the SQLite store.

use async_trait::async_trait;
use lks_proto::labels::Labels;
use rusqlite::{Connection, OptionalExtension, params};

use lks_store::{
    ClusterKube, ClusterRow, ClusterStore, EventRow, IssuedCertRow, Kind, NewCluster, PeerSettings, Result,
    SealedField, StoreError, StoredCa, ca_already_set, cluster_exists, sort_certificates,
};

use crate::{SqliteStore, insert_event, read_cluster, read_clusters};

pub(super) fn read_ca(c: &Connection, name: &str) -> Result<Option<StoredCa>> {
    let row: Option<(Option<String>, Option<String>)> = c
        .query_row(
            "SELECT ca_cert_pem, ca_key FROM clusters WHERE name = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match row {
        Some((Some(cert_pem), Some(key))) => Some(StoredCa { cert_pem, key }),
        _ => None,
    })
}

/// After an UPDATE of cluster `name` that changed `n` rows: none means
/// there is no such cluster; else `event` is recorded and the row read back,
/// in the same transaction.
fn changed(tx: &Connection, name: &str, n: usize, event: &EventRow) -> Result<ClusterRow> {
    if n == 0 {
        return Err(StoreError::not_found(Kind::Cluster, name.to_string()));
    }
    insert_event(tx, event)?;
    read_cluster(tx, name)?
        .ok_or_else(|| StoreError::backend(format!("cluster {name} vanished in its own transaction")))
}

pub(super) fn read_kube(c: &Connection, name: &str) -> Result<Option<ClusterKube>> {
    Ok(c.query_row(
        "SELECT kubeconfig, kube_drain FROM clusters WHERE name = ?1",
        [name],
        |r| {
            Ok(ClusterKube {
                kubeconfig: r.get(0)?,
                drain: r.get(1)?,
            })
        },
    )
    .optional()?)
}

pub(super) fn read_certs(
    c: &Connection,
    cluster: Option<&str>,
    node: Option<&str>,
) -> Result<Vec<IssuedCertRow>> {
    let mut stmt = c.prepare(
        "SELECT cluster, node, serial, profile, bundle, version, path, not_before_ms, not_after_ms, issued_at_ms
         FROM issued_certs WHERE (?1 IS NULL OR cluster = ?1) AND (?2 IS NULL OR node = ?2)",
    )?;
    let mut rows = stmt
        .query_map(params![cluster, node], |r| {
            Ok(IssuedCertRow {
                cluster: r.get(0)?,
                node: r.get(1)?,
                serial: r.get(2)?,
                profile: r.get(3)?,
                bundle: r.get(4)?,
                version: r.get(5)?,
                path: r.get(6)?,
                not_before_ms: r.get(7)?,
                not_after_ms: r.get(8)?,
                issued_at_ms: r.get(9)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    sort_certificates(&mut rows);
    Ok(rows)
}

#[async_trait]
impl ClusterStore for SqliteStore {
    /// The table, row and column (a SQLite server seals nothing today:
    /// `--encryption-key-file` needs etcd; the binding is there for when it does).
    fn sealed_aad(&self, cluster: &str, field: SealedField) -> Vec<u8> {
        match field {
            SealedField::CaKey => format!("sqlite:clusters/{cluster}#ca_key"),
            SealedField::Kubeconfig => format!("sqlite:cluster_kube/{cluster}#kubeconfig"),
        }
        .into_bytes()
    }

    async fn create_cluster(&self, c: NewCluster) -> Result<ClusterRow> {
        self.tx(move |tx| {
            let n = tx.execute(
                "INSERT INTO clusters (name, created_at_ms, ca_cert_pem, ca_key, api_server)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                params![
                    c.name,
                    c.now_ms,
                    c.ca.as_ref().map(|a| &a.cert_pem),
                    c.ca.as_ref().map(|a| &a.key),
                    c.api_server
                ],
            )?;
            if n == 0 {
                return Err(cluster_exists(&c.name));
            }
            Ok(c.row())
        })
        .await
    }

    async fn set_cluster_api_server(
        &self,
        name: &str,
        api_server: Option<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET api_server = ?2 WHERE name = ?1",
                params![name, api_server],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn set_cluster_labels(&self, name: &str, labels: Labels, event: EventRow) -> Result<ClusterRow> {
        let name = name.to_string();
        let text = serde_json::to_string(&labels)?;
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET labels = ?2 WHERE name = ?1",
                params![name, text],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn set_cluster_peer(&self, name: &str, peer: PeerSettings, event: EventRow) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET peer_enabled = ?2, peer_port = ?3, peer_upload_rate = ?4,
                                     peer_max_uploads = ?5
                 WHERE name = ?1",
                params![
                    name,
                    peer.enabled,
                    peer.port,
                    peer.upload_rate as i64,
                    peer.max_uploads
                ],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn set_cluster_reboots(
        &self,
        name: &str,
        policy: lks_store::RebootPolicy,
        event: EventRow,
    ) -> Result<ClusterRow> {
        let name = name.to_string();
        let json = serde_json::to_string(&policy)?;
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET reboots = ?2 WHERE name = ?1",
                params![name, json],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn cluster_kube(&self, name: &str) -> Result<Option<ClusterKube>> {
        let name = name.to_string();
        self.call(move |c| read_kube(c, &name)).await
    }

    async fn set_cluster_kube(&self, name: &str, kube: ClusterKube, event: EventRow) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET kubeconfig = ?2, kube_drain = ?3 WHERE name = ?1",
                params![name, kube.kubeconfig, kube.drain],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn set_cluster_ca(&self, name: &str, ca: StoredCa, event: EventRow) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let has: Option<bool> = tx
                .query_row(
                    "SELECT ca_cert_pem IS NOT NULL FROM clusters WHERE name = ?1",
                    [&name],
                    |r| r.get(0),
                )
                .optional()?;
            match has {
                None => return Err(StoreError::not_found(Kind::Cluster, name.to_string())),
                Some(true) => return Err(ca_already_set(&name)),
                Some(false) => {}
            }
            let n = tx.execute(
                "UPDATE clusters SET ca_cert_pem = ?2, ca_key = ?3 WHERE name = ?1",
                params![name, ca.cert_pem, ca.key],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn cluster_ca(&self, name: &str) -> Result<Option<StoredCa>> {
        let name = name.to_string();
        self.call(move |c| read_ca(c, &name)).await
    }

    async fn record_certificate(&self, r: IssuedCertRow) -> Result<()> {
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&r.cluster], |_| Ok(()))
                .optional()?
                .is_some();
            if !exists {
                return Err(StoreError::not_found(Kind::Cluster, r.cluster.to_string()));
            }
            let n = tx.execute(
                "INSERT INTO issued_certs (cluster, node, serial, profile, bundle, version, path,
                                           not_before_ms, not_after_ms, issued_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
                params![
                    r.cluster,
                    r.node,
                    r.serial,
                    r.profile,
                    r.bundle,
                    r.version,
                    r.path,
                    r.not_before_ms,
                    r.not_after_ms,
                    r.issued_at_ms
                ],
            )?;
            if n == 0 {
                return Err(r.serial_taken());
            }
            tx.execute(
                "DELETE FROM issued_certs WHERE cluster = ?1 AND node = ?2 AND path = ?3 AND not_after_ms < ?4",
                params![
                    r.cluster,
                    r.node,
                    r.path,
                    r.issued_at_ms - lks_store::CERT_RECORD_RETENTION_MS
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn list_certificates(
        &self,
        cluster: Option<&str>,
        node: Option<&str>,
    ) -> Result<Vec<IssuedCertRow>> {
        let cluster = cluster.map(str::to_string);
        let node = node.map(str::to_string);
        self.call(move |c| read_certs(c, cluster.as_deref(), node.as_deref()))
            .await
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterRow>> {
        self.call(|c| read_clusters(c)).await
    }

    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRow>> {
        let name = name.to_string();
        self.call(move |c| read_cluster(c, &name)).await
    }

    async fn set_cluster_windows(
        &self,
        name: &str,
        windows: Vec<String>,
        event: EventRow,
    ) -> Result<ClusterRow> {
        let name = name.to_string();
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE clusters SET maintenance_windows = ?2 WHERE name = ?1",
                params![name, serde_json::to_string(&windows)?],
            )?;
            changed(tx, &name, n, &event)
        })
        .await
    }

    async fn cluster_exists(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.call(move |c| {
            Ok(
                c.query_row("SELECT 1 FROM clusters WHERE name = ?1", [name], |_| Ok(()))
                    .optional()?
                    .is_some(),
            )
        })
        .await
    }
}
