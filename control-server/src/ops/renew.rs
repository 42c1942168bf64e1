//! Renewing a node's certificate (`RenewCertificate`): the node's CSR
//! signed by the server CA for the same identity, the new serial put in
//! place of the one the caller presented (which revokes the old
//! certificate), and the renewal recorded as the node's event.

use std::time::Duration;

use lks_pki::{Pki, PkiError};
use lks_proto::identity::NodeIdentity;

use super::event::{self, NodeEvent};
use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::store::{EventStore, NodeStore};

/// A renewed certificate.
#[derive(Clone, Debug)]
pub struct Renewed {
    pub certificate_pem: String,
    /// Unix seconds.
    pub expires_at: i64,
}

/// Why a renewal was refused (besides the store's refusal).
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// The CSR could not be signed.
    #[error(transparent)]
    Csr(PkiError),
}

impl RenewError {
    pub fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// Signs `csr_pem` for `id`, whose current certificate has `serial`.
pub async fn renew(
    store: &(impl NodeStore + EventStore + ?Sized),
    pki: &Pki,
    ttl: Duration,
    id: &NodeIdentity,
    serial: &str,
    csr_pem: &str,
) -> Result<Renewed, OpError> {
    let cert = pki.issue_node_cert(csr_pem, id, ttl).map_err(RenewError::Csr)?;
    store.replace_cert_serial(&id.node, serial, &cert.serial).await?;
    let e = NodeEvent {
        kind: "certificate_renewed",
        bundle: "",
        version: "",
        message: format!("new serial {}", cert.serial),
        at_ms: now_ms(),
    };
    event::record(store, id, e).await;
    Ok(Renewed {
        certificate_pem: cert.pem,
        expires_at: cert.not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{EventFilter, EventRow, StoreError};

    fn csr() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
    }

    /// Node `n1` of cluster `a`, enrolled with a certificate of serial `01`.
    async fn enrolled() -> (SqliteStore, NodeIdentity) {
        let store = SqliteStore::open_in_memory().unwrap();
        crate::ops::fixture::cluster_a(&store).await;
        crate::ops::fixture::enrol(&store, "n1", "01", "sha256:00").await;
        (store, NodeIdentity::new("a", "n1").unwrap())
    }

    async fn serial(store: &SqliteStore) -> String {
        store.get_node("n1").await.unwrap().unwrap().cert_serial
    }

    /// The node's `certificate_renewed` events.
    async fn renewals(store: &SqliteStore) -> Vec<EventRow> {
        let filter = EventFilter {
            limit: 10,
            ..Default::default()
        };
        let mut events = store.list_events(filter).await.unwrap();
        events.retain(|e| e.kind == "certificate_renewed");
        events
    }

    #[tokio::test]
    async fn a_bad_csr_or_a_superseded_certificate_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).unwrap();
        let (store, id) = enrolled().await;
        let ttl = Duration::from_secs(60);

        let e = renew(&store, &pki, ttl, &id, "01", "not a CSR")
            .await
            .unwrap_err();
        assert!(matches!(e, OpError::Renew(RenewError::Csr(_))), "{e}");
        assert_eq!(e.kind(), Some(Kind::Invalid));
        // Renewing with a certificate that was already replaced.
        let e = renew(&store, &pki, ttl, &id, "02", &csr()).await.unwrap_err();
        assert!(matches!(e, OpError::Store(StoreError::Conflict(_))), "{e}");
        assert_eq!(serial(&store).await, "01");
        assert!(renewals(&store).await.is_empty());
    }

    #[tokio::test]
    async fn a_renewal_replaces_the_serial_and_is_the_nodes_event() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).unwrap();
        let (store, id) = enrolled().await;

        let r = renew(&store, &pki, Duration::from_secs(60), &id, "01", &csr())
            .await
            .unwrap();
        assert!(r.certificate_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let new = serial(&store).await;
        assert_ne!(new, "01");
        let events = renewals(&store).await;
        let [e] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!((e.cluster.as_str(), e.node.as_str()), ("a", "n1"));
        assert_eq!(e.message, format!("new serial {new}"));
    }
}
