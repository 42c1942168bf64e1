//! rustls server configuration from PEM material, shared by the control
//! server's port and an agent's peer listener: the serving chain and key,
//! client certificates verified against a CA, the ring provider, ALPN h2.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Whether a client must present a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// Verified when sent; a call without one (`Enroll`) is let through to
    /// handlers that check the peer themselves.
    Optional,
    /// The handshake fails without one.
    Required,
}

/// `chain_pem` (serving certificate first), its key, and the CA that client
/// certificates must chain to. Errors are one line naming the part.
pub fn server_config(
    chain_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    clients: ClientCerts,
) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("serving certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("serving key: {e}"))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| format!("CA certificate: {e}"))?;
        roots.add(ca).map_err(|e| format!("CA certificate: {e}"))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match clients {
        ClientCerts::Optional => builder.allow_unauthenticated(),
        ClientCerts::Required => builder,
    };
    let verifier = builder
        .build()
        .map_err(|e| format!("client certificate verifier: {e}"))?;
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("serving certificate and key: {e}"))?;
    // gRPC (and the control server's package endpoint) is HTTP/2.
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}
