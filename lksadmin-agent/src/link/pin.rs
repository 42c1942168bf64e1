//! Verifying a server against a CA pin before trusting it with anything.
//!
//! `join` knows only the hash of the CA's public key (kubeadm's
//! `--discovery-token-ca-cert-hash`). [`fetch_pinned_ca`] does a TLS
//! handshake whose certificate verifier looks, in the chain the server
//! presents, for the certificate whose SubjectPublicKeyInfo hashes to the
//! pin, then verifies the end-entity certificate against *that* CA with
//! webpki (chain, validity, server name) — so a server that does not hold a
//! certificate issued by the pinned CA fails the handshake before any
//! request, and with it the bootstrap token, is sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lks_proto::Digest;
use lks_proto::identity::ca_cert_hash;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// Why the pin check failed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{url}: invalid server URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: connect: {reason}")]
    Connect { url: String, reason: String },
    #[error(
        "{url}: the server's certificate chain has no CA matching --ca-cert-hash {pin} (it presented {presented}); refusing to send the token"
    )]
    Mismatch {
        url: String,
        pin: String,
        presented: String,
    },
    #[error(
        "{url}: the server's certificate does not verify against the pinned CA: {reason}; refusing to send the token"
    )]
    Untrusted { url: String, reason: String },
    #[error("{url}: TLS handshake: {reason}")]
    Handshake { url: String, reason: String },
}

impl PinError {
    /// True if the server was reached and failed the pin: do not try others.
    pub fn is_refusal(&self) -> bool {
        matches!(self, PinError::Mismatch { .. } | PinError::Untrusted { .. })
    }
}

/// The handshake-signature half of a [`ServerCertVerifier`] whose
/// certificate check is our own (the CA pin here, the cluster CA and node
/// name of a peer in `swarm/tls.rs`): the signatures are checked as rustls
/// does, with the algorithms of the verifier's `provider` field.
macro_rules! signatures_by_provider {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}
pub(crate) use signatures_by_provider;

/// The ring provider, which the whole agent uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Debug)]
enum Finding {
    Mismatch(Vec<String>),
    Untrusted(String),
    Found(Vec<u8>),
}

#[derive(Debug)]
struct PinVerifier {
    pin: Digest,
    provider: Arc<CryptoProvider>,
    /// One slot written, whole after a panic (locked with
    /// `lks_proto::sync::lock`).
    finding: Mutex<Option<Finding>>,
}

impl PinVerifier {
    fn record(&self, f: Finding) {
        *lks_proto::sync::lock(&self.finding) = Some(f);
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let chain = std::iter::once(end_entity).chain(intermediates.iter());
        let mut presented = Vec::new();
        let mut ca = None;
        for cert in chain {
            match ca_cert_hash(cert.as_ref()) {
                Ok(h) if h == self.pin => {
                    ca = Some(cert.clone().into_owned());
                    break;
                }
                Ok(h) => presented.push(h.to_string()),
                Err(_) => presented.push("an unparsable certificate".into()),
            }
        }
        let Some(ca) = ca else {
            self.record(Finding::Mismatch(presented));
            return Err(rustls::Error::General(
                "no certificate in the chain matches the CA pin".into(),
            ));
        };
        let mut roots = RootCertStore::empty();
        if let Err(e) = roots.add(ca.clone()) {
            self.record(Finding::Untrusted(format!(
                "the pinned CA is not usable as a trust anchor: {e}"
            )));
            return Err(e);
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Ok(v) => {
                self.record(Finding::Found(ca.as_ref().to_vec()));
                Ok(v)
            }
            Err(e) => {
                self.record(Finding::Untrusted(e.to_string()));
                Err(e)
            }
        }
    }

    signatures_by_provider!();
}

/// Host and port of an `https://host:port` URL.
pub fn host_port(url: &str) -> Result<(String, u16), PinError> {
    let bad = |reason: &str| PinError::BadUrl {
        url: url.into(),
        reason: reason.into(),
    };
    let uri: tonic::transport::Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad("expected https://HOST[:PORT]"));
    }
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    Ok((host, uri.port_u16().unwrap_or(443)))
}

/// Connects to `url`, checks the server against `pin` as described in the
/// module docs, and returns the DER of the pinned CA certificate.
pub async fn fetch_pinned_ca(url: &str, pin: &Digest, timeout: Duration) -> Result<Vec<u8>, PinError> {
    let (host, port) = host_port(url)?;
    let server_name = ServerName::try_from(host.clone()).map_err(|e| PinError::BadUrl {
        url: url.into(),
        reason: e.to_string(),
    })?;
    let provider = provider();
    let verifier = Arc::new(PinVerifier {
        pin: *pin,
        provider: provider.clone(),
        finding: Mutex::new(None),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PinError::Handshake {
            url: url.into(),
            reason: e.to_string(),
        })?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| PinError::Connect {
                url: url.into(),
                reason: e.to_string(),
            })?;
        connector
            .connect(server_name, tcp)
            .await
            .map_err(|e| PinError::Handshake {
                url: url.into(),
                reason: e.to_string(),
            })
    };
    let handshake = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| PinError::Connect {
            url: url.into(),
            reason: format!("timed out after {timeout:?}"),
        })?;
    let finding = lks_proto::sync::lock(&verifier.finding).take();
    match (handshake, finding) {
        (Ok(_stream), Some(Finding::Found(ca))) => Ok(ca),
        (_, Some(Finding::Mismatch(presented))) => Err(PinError::Mismatch {
            url: url.into(),
            pin: pin.to_string(),
            presented: if presented.is_empty() {
                "no certificate".into()
            } else {
                presented.join(", ")
            },
        }),
        (_, Some(Finding::Untrusted(reason))) => Err(PinError::Untrusted {
            url: url.into(),
            reason,
        }),
        (Err(e), _) => Err(e),
        (Ok(_), _) => Err(PinError::Handshake {
            url: url.into(),
            reason: "the handshake finished without verifying the server".into(),
        }),
    }
}
