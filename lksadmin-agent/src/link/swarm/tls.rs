//! The dialling side of peer TLS: this node's certificate as the client's,
//! and the peer's checked against the node CA and required to be the node
//! the tracker named.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lks_proto::fsutil::FsError;
use lks_proto::identity::{Identity, NodeIdentity};
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tonic::transport::{Channel, Endpoint, Uri};

use super::CONNECT_TIMEOUT;
use crate::link::client::NodeCredentials;
use crate::link::pin::signatures_by_provider;

/// Why no channel to a peer could be had: this node's credentials, the TLS
/// set-up, or the connection (its whole cause chain, on one line).
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("{0}")]
    Credentials(FsError),
    /// The cluster or node name the tracker gave (the text says which).
    #[error("{0}")]
    Identity(lks_proto::names::NameError),
    #[error("CA certificate: {0}")]
    CaPem(rustls_pki_types::pem::Error),
    #[error("CA certificate: {0}")]
    Ca(rustls::Error),
    #[error("peer certificate verifier: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    #[error("node certificate: {0}")]
    NodeCert(rustls_pki_types::pem::Error),
    #[error("node key: {0}")]
    NodeKey(rustls_pki_types::pem::Error),
    #[error("{0}")]
    Protocols(rustls::Error),
    #[error("node certificate and key: {0}")]
    CertAndKey(rustls::Error),
    #[error("{0}")]
    Endpoint(tonic::transport::Error),
    #[error("connect to node {node} at {addr}: {}", crate::link::channel::error_chain(.error))]
    Connect {
        node: String,
        addr: SocketAddr,
        error: tonic::transport::Error,
    },
}

/// An mTLS channel to the peer listener of `node` of `cluster` at `addr`,
/// with `creds` as the client's identity.
pub async fn dial_peer(
    creds: &NodeCredentials,
    cluster: &str,
    node: &str,
    addr: SocketAddr,
) -> Result<Channel, DialError> {
    let expect = NodeIdentity::new(cluster, node).map_err(DialError::Identity)?;
    let tls = peer_client_config(creds, expect)?;
    let connector = PeerConnector { addr, tls };
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(DialError::Endpoint)?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(connector)
        .await
        .map_err(|error| DialError::Connect {
            node: node.to_string(),
            addr,
            error,
        })
}

/// TLS to a peer: this node's certificate as the client's, the peer's
/// checked against the node CA and required to name `expect`.
fn peer_client_config(creds: &NodeCredentials, expect: NodeIdentity) -> Result<Arc<ClientConfig>, DialError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(creds.ca_pem.as_bytes()) {
        roots.add(ca.map_err(DialError::CaPem)?).map_err(DialError::Ca)?;
    }
    let chain_verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(DialError::Verifier)?;
    let verifier = Arc::new(PeerVerifier {
        chain: chain_verifier,
        provider: provider.clone(),
        expect,
    });
    let chain = CertificateDer::pem_slice_iter(creds.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(DialError::NodeCert)?;
    let key = PrivateKeyDer::from_pem_slice(creds.key_pem.as_bytes()).map_err(DialError::NodeKey)?;
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(DialError::Protocols)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(DialError::CertAndKey)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// A peer's certificate is a node certificate (client-auth usage, issued by
/// the node CA): its chain is checked by webpki as a client certificate
/// would be, and its identity must be the node the tracker named. The DNS
/// or IP name dialled plays no part: a node certificate names none.
#[derive(Debug)]
struct PeerVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    provider: Arc<CryptoProvider>,
    expect: NodeIdentity,
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.chain.verify_client_cert(end_entity, intermediates, now)?;
        match Identity::from_cert_der(end_entity.as_ref()) {
            Ok(Identity::Node(id)) if id == self.expect => Ok(ServerCertVerified::assertion()),
            Ok(Identity::Node(id)) => Err(rustls::Error::General(format!(
                "the peer is node {} of cluster {}, not {} of {}",
                id.node, id.cluster, self.expect.node, self.expect.cluster
            ))),
            _ => Err(rustls::Error::General("the peer has no node certificate".into())),
        }
    }

    signatures_by_provider!();
}

/// Dials a peer and does TLS; tonic then speaks HTTP/2 over it.
#[derive(Clone)]
struct PeerConnector {
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
}

type Io = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl tower_service::Service<Uri> for PeerConnector {
    type Response = Io;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Io, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (addr, tls) = (self.addr, self.tls.clone());
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::IpAddress(addr.ip().into());
            let tls = tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}
