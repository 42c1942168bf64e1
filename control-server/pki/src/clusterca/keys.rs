//! Cluster CA keys at rest. With `--store etcd --encryption-key-file` a
//! key is sealed with the server's [`SealKey`] before it reaches the store
//! (hex of the envelope, associated data `<prefix>clusters/<name>#ca_key`,
//! so a value copied to another cluster fails to open); otherwise it is
//! stored as PEM (SQLite: in the 0700 data dir, like the server's own CA
//! key). The store never sees anything but the opaque string.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use time::OffsetDateTime;

use super::{CaError, ClusterCa};
use crate::seal::{OpenTextError, SealError, SealKey, open_text, seal_text, sealed_envelope};
use lks_store::{ClusterStore, SealedField, StoreError, StoredCa};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("cluster {cluster}: stored CA: {source}")]
    Stored { cluster: String, source: CaError },
    #[error(
        "cluster {cluster}: the CA key is encrypted; give lks-control-server --encryption-key-file with the key it was sealed with"
    )]
    NoSealKey { cluster: String },
    #[error("cluster {cluster}: open the CA key: neither PEM nor a sealed value")]
    Unreadable { cluster: String },
    #[error("cluster {cluster}: open the CA key: {source}")]
    Open {
        cluster: String,
        #[source]
        source: OpenTextError,
    },
    #[error("cluster {cluster}: seal the CA key: {source}")]
    Seal {
        cluster: String,
        #[source]
        source: SealError,
    },
}

/// The server's access to cluster CAs: reads them from the store, opens
/// their keys, and keeps each parsed CA (a CA is never replaced, so a
/// cached one stays right).
pub struct ClusterCas {
    store: Arc<dyn ClusterStore>,
    seal: Option<Arc<SealKey>>,
    cache: Mutex<HashMap<String, Arc<ClusterCa>>>,
}

impl ClusterCas {
    /// `seal`: the `--encryption-key-file` key (etcd only); a sealed key
    /// is bound to where `store` keeps it ([`ClusterStore::sealed_aad`]).
    pub fn new(store: Arc<dyn ClusterStore>, seal: Option<Arc<SealKey>>) -> Self {
        ClusterCas {
            store,
            seal,
            cache: Mutex::default(),
        }
    }

    /// The CA of `cluster`, ready to sign; `None` if the cluster does not
    /// exist or has no CA.
    pub async fn load(&self, cluster: &str) -> Result<Option<Arc<ClusterCa>>, KeyError> {
        // One insert or lookup at a time, whole after a panic.
        let cached = lks_proto::sync::lock(&self.cache).get(cluster).cloned();
        if let Some(ca) = cached {
            return Ok(Some(ca));
        }
        let Some(stored) = self.store.cluster_ca(cluster).await? else {
            return Ok(None);
        };
        let aad = self.store.sealed_aad(cluster, SealedField::CaKey);
        let key = open_key(self.seal.as_deref(), &aad, cluster, &stored.key)?;
        let ca = Arc::new(
            ClusterCa::load(&stored.cert_pem, &key).map_err(|source| KeyError::Stored {
                cluster: cluster.to_string(),
                source,
            })?,
        );
        lks_proto::sync::lock(&self.cache).insert(cluster.to_string(), ca.clone());
        Ok(Some(ca))
    }

    /// `ca` as the store keeps it for `cluster`: its key sealed when the
    /// server has an encryption key.
    pub fn to_stored(&self, ca: &ClusterCa, cluster: &str) -> Result<StoredCa, KeyError> {
        Ok(StoredCa {
            cert_pem: ca.cert_pem().to_string(),
            key: seal_key(
                self.seal.as_deref(),
                &self.store.sealed_aad(cluster, SealedField::CaKey),
                cluster,
                ca.key_pem(),
            )?,
        })
    }

    /// A CA for a new cluster: `import` (certificate and key PEM) checked
    /// at `now`, or a generated one.
    pub fn make(
        cluster: &str,
        import: Option<(&str, &str)>,
        now: OffsetDateTime,
    ) -> Result<ClusterCa, CaError> {
        match import {
            Some((cert, key)) => ClusterCa::import(cert, key, now),
            None => ClusterCa::generate(cluster, now),
        }
    }
}

/// The stored form of a CA key: sealed (hex) with `seal` for `aad` (the
/// store's [`ClusterStore::sealed_aad`]), else the PEM.
pub fn seal_key(
    seal: Option<&SealKey>,
    aad: &[u8],
    cluster: &str,
    key_pem: &str,
) -> Result<String, KeyError> {
    seal_text(seal, aad, key_pem).map_err(|source| KeyError::Seal {
        cluster: cluster.to_string(),
        source,
    })
}

/// The PEM of a stored CA key. A PEM stored before the server had an
/// encryption key is read as it is.
pub fn open_key(seal: Option<&SealKey>, aad: &[u8], cluster: &str, stored: &str) -> Result<String, KeyError> {
    if stored.trim_start().starts_with("-----BEGIN") {
        return Ok(stored.to_string());
    }
    let envelope = sealed_envelope(stored).ok_or_else(|| KeyError::Unreadable {
        cluster: cluster.to_string(),
    })?;
    open_text(seal, aad, &envelope).map_err(|e| match e {
        OpenTextError::NoKey => KeyError::NoSealKey {
            cluster: cluster.to_string(),
        },
        source => KeyError::Open {
            cluster: cluster.to_string(),
            source,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_store::{NewCluster, Store};
    use lks_store_sqlite::SqliteStore;

    #[tokio::test]
    async fn a_sealed_key_is_stored_without_its_pem_and_opens_only_for_its_cluster() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let seal = Arc::new(SealKey::from_bytes(&[9; 32]));
        let cas = ClusterCas::new(store.clone(), Some(seal.clone()));
        let aad = |c: &str| store.sealed_aad(c, SealedField::CaKey);
        let ca = ClusterCa::generate("a", OffsetDateTime::now_utc()).unwrap();
        let stored = cas.to_stored(&ca, "a").unwrap();
        let body = ca.key_pem().lines().nth(1).unwrap();
        assert!(!stored.key.contains(body), "the key is sealed");
        assert!(!stored.key.contains("PRIVATE KEY"));
        store
            .create_cluster(NewCluster {
                ca: Some(stored.clone()),
                ..NewCluster::new("a", 1)
            })
            .await
            .unwrap();
        let loaded = cas.load("a").await.unwrap().unwrap();
        assert_eq!(loaded.key_pem(), ca.key_pem());
        assert_eq!(loaded.hash(), ca.hash());
        assert!(cas.load("b").await.unwrap().is_none());

        // Copied to another cluster's name, it does not open.
        let e = open_key(Some(&seal), &aad("b"), "b", &stored.key).unwrap_err();
        assert!(matches!(e, KeyError::Open { .. }), "{e}");
        // Without the encryption key: one clear line.
        let e = open_key(None, &aad("a"), "a", &stored.key).unwrap_err();
        assert!(e.to_string().contains("--encryption-key-file"), "{e}");
        // Another key is named as such.
        let other = SealKey::from_bytes(&[8; 32]);
        assert!(open_key(Some(&other), &aad("a"), "a", &stored.key).is_err());
        // Stored before there was an encryption key: read as PEM.
        assert_eq!(
            open_key(Some(&seal), &aad("a"), "a", ca.key_pem()).unwrap(),
            ca.key_pem()
        );
        assert!(open_key(None, &aad("a"), "a", "zz").is_err());
    }

    #[test]
    fn without_an_encryption_key_the_pem_is_stored() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let cas = ClusterCas::new(store, None);
        let ca = ClusterCa::generate("a", OffsetDateTime::now_utc()).unwrap();
        assert_eq!(cas.to_stored(&ca, "a").unwrap().key, ca.key_pem());
    }
}
