//! Who is calling: the verified TLS peer certificate, never a message field.
//!
//! The TLS layer has already checked the chain against our CA. Here the
//! identity is read from the certificate's URI SAN, and for nodes checked
//! against the store: the node must still exist, in the same cluster, and the
//! certificate's serial must be the one stored — which is how deleting a
//! node, or renewing its certificate, revokes the old certificate without
//! CRLs.

use lks_proto::identity::{Identity, NodeIdentity, cert_info};
use tonic::{Request, Status};

use crate::store::{NodeStore, StoreError, TokenRefusal};
use lks_blobs::BlobError;

/// The identity and serial of the caller's certificate, if it sent one.
pub fn peer_identity<T>(req: &Request<T>) -> Result<(Identity, String), Status> {
    let certs = req.peer_certs().ok_or_else(|| {
        Status::unauthenticated(
            "this call requires a client certificate: agents enrol with `lksadmin-agent join`, operators use admin.conf",
        )
    })?;
    let der = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("the TLS peer sent an empty certificate chain"))?;
    let id = Identity::from_cert_der(der)
        .map_err(|e| Status::unauthenticated(format!("client certificate refused: {e}")))?;
    let serial = cert_info(der)
        .map_err(|e| Status::unauthenticated(format!("client certificate refused: {e}")))?
        .serial;
    Ok((id, serial))
}

/// Admin API calls: the admin certificate only.
pub fn require_admin<T>(req: &Request<T>) -> Result<String, Status> {
    match peer_identity(req)? {
        (Identity::Admin { name }, _) => Ok(name),
        (Identity::Node(n), _) => Err(Status::permission_denied(format!(
            "node {n} may not call the admin API; use the admin certificate from admin.conf"
        ))),
    }
}

/// The operator behind an admin call, as the audit trail names them.
#[derive(Clone, Debug)]
pub struct AdminCaller {
    /// The admin certificate's name.
    pub name: String,
    /// `sha256:<hex>` of the certificate (DER): which credential it was.
    pub fingerprint: String,
}

/// Admin API calls that change state: the admin certificate only, and
/// who it is for the audit trail.
pub fn require_admin_caller<T>(req: &Request<T>) -> Result<AdminCaller, Status> {
    let name = require_admin(req)?;
    let fingerprint = req
        .peer_certs()
        .and_then(|c| {
            c.first()
                .map(|der| lks_proto::Digest::of(der.as_ref()).to_string())
        })
        .unwrap_or_default();
    Ok(AdminCaller { name, fingerprint })
}

/// A node's identity that was checked against the store.
#[derive(Clone, Debug)]
pub struct NodeCaller {
    pub id: NodeIdentity,
    pub serial: String,
}

/// Agent API calls: a current node certificate.
pub async fn require_node<T>(
    req: &Request<T>,
    store: &(impl NodeStore + ?Sized),
) -> Result<NodeCaller, Status> {
    let (id, serial) = peer_identity(req)?;
    let Identity::Node(id) = id else {
        return Err(Status::permission_denied(
            "the agent API requires a node certificate; the admin certificate is not a node",
        ));
    };
    let (cluster, cert_serial) = store
        .node_identity(&id.node)
        .await
        .map_err(store_status)?
        .ok_or_else(|| {
            Status::unauthenticated(format!(
                "node {} is not enrolled (it was deleted); join again with a new bootstrap token",
                id.node
            ))
        })?;
    if cluster != id.cluster {
        return Err(Status::unauthenticated(format!(
            "certificate names node {} in cluster {}, but that node belongs to cluster {}",
            id.node, id.cluster, cluster
        )));
    }
    if cert_serial != serial {
        return Err(Status::unauthenticated(format!(
            "the certificate of node {} (serial {serial}) was revoked or superseded; join again",
            id.node
        )));
    }
    Ok(NodeCaller { id, serial })
}

/// Maps a store error to the status the caller sees.
pub fn store_status(e: StoreError) -> Status {
    match e {
        e @ (StoreError::NotFound { .. } | StoreError::NotDesired { .. }) => Status::not_found(e.to_string()),
        StoreError::AlreadyExists(m) => Status::already_exists(m),
        StoreError::Conflict(m) => Status::failed_precondition(m),
        StoreError::Token(r) => token_status(r),
        StoreError::Unavailable(m) => {
            Status::unavailable(format!("control server storage is unavailable: {m}; retry"))
        }
        StoreError::Backend(m) => {
            tracing::error!(error = %m, "store failure");
            Status::internal(format!("control server storage error: {m}"))
        }
        e @ StoreError::Corrupt { .. } => {
            tracing::error!(error = %e, "store failure");
            Status::internal(format!("control server storage error: {e}"))
        }
    }
}

/// A blob store failure as the status a client sees; `what` names the
/// file or blob it concerns.
pub fn blob_status(what: &str, e: BlobError) -> Status {
    let msg = if what.is_empty() {
        e.to_string()
    } else {
        format!("{what}: {e}")
    };
    match e {
        BlobError::TooLarge { .. } | BlobError::Verify { .. } => Status::invalid_argument(msg),
        BlobError::Meta(se) => store_status(se),
        e if e.is_unavailable() => Status::unavailable(format!("{msg}; retry")),
        _ => {
            tracing::error!(error = %msg, "blob store failure");
            Status::internal(msg)
        }
    }
}

pub fn token_status(r: TokenRefusal) -> Status {
    Status::unauthenticated(r.to_string())
}

#[cfg(test)]
mod tests {
    use lks_pki::Pki;

    use super::*;
    use crate::store::NodeStore;
    use crate::store::SqliteStore;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn no_certificate_is_unauthenticated() {
        let req = Request::new(());
        assert_eq!(
            peer_identity(&req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            require_admin(&req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }

    #[tokio::test]
    async fn serial_and_existence_are_checked() {
        // Peer certificates can only be attached through a real TLS
        // connection; the store side of the check is exercised here, the
        // TLS side in the end-to-end tests.
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).unwrap();
        let store = Arc::new(SqliteStore::open_in_memory().unwrap());
        crate::ops::fixture::cluster_a(&*store).await;
        let key = rcgen::KeyPair::generate().unwrap();
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let id = NodeIdentity::new("a", "n1").unwrap();
        let cert = pki.issue_node_cert(&csr, &id, Duration::from_secs(60)).unwrap();
        crate::ops::fixture::enrol(&*store, "n1", &cert.serial, &cert.key_hash).await;
        assert_eq!(
            store.get_node("n1").await.unwrap().unwrap().cert_serial,
            cert.serial
        );
        assert_eq!(
            store_status(StoreError::Token(TokenRefusal::Expired)).code(),
            tonic::Code::Unauthenticated
        );
    }
}
