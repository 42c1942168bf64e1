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

/// Which part of the TLS set-up failed; one line naming the part.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("serving certificate: {0}")]
    ServingCert(rustls_pki_types::pem::Error),
    #[error("serving key: {0}")]
    ServingKey(rustls_pki_types::pem::Error),
    #[error("CA certificate: {0}")]
    CaPem(rustls_pki_types::pem::Error),
    #[error("CA certificate: {0}")]
    Ca(rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    /// The provider offers none of the default protocol versions.
    #[error("{0}")]
    Protocols(rustls::Error),
    #[error("serving certificate and key: {0}")]
    CertAndKey(rustls::Error),
}

/// `chain_pem` (serving certificate first), its key, and the CA that client
/// certificates must chain to. Errors are one line naming the part.
pub fn server_config(
    chain_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    clients: ClientCerts,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsSetupError::ServingCert)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(TlsSetupError::ServingKey)?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let ca = ca.map_err(TlsSetupError::CaPem)?;
        roots.add(ca).map_err(TlsSetupError::Ca)?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match clients {
        ClientCerts::Optional => builder.allow_unauthenticated(),
        ClientCerts::Required => builder,
    };
    let verifier = builder.build().map_err(TlsSetupError::Verifier)?;
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Protocols)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(TlsSetupError::CertAndKey)?;
    // gRPC (and the control server's package endpoint) is HTTP/2.
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_the_part_that_failed() {
        let e = server_config("", "", "", ClientCerts::Optional).unwrap_err();
        assert!(matches!(e, TlsSetupError::ServingKey(_)), "{e:?}");
        assert!(e.to_string().starts_with("serving key: "), "{e}");
    }
}
