//! The peer listener: started, restarted and stopped as the cluster's
//! peer-sharing settings, the listen address and the node certificate
//! change; mTLS with client certificates required, each handshake in a
//! task of its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use lks_proto::pb;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::{HANDSHAKE_TIMEOUT, MAX_WATCHES, PeerApi, RateLimit, Shared};
use crate::config::StateDir;
use crate::link::client::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, NodeCredentials};

/// The settings a listener runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Running {
    listen: SocketAddr,
    upload_rate: u64,
    max_uploads: u32,
    /// The node certificate it serves with: a renewed one restarts it.
    cert_pem: String,
}

/// Starts, changes and stops the peer listener as the cluster's settings
/// come and go.
pub struct PeerHost {
    dirs: StateDir,
    cluster: String,
    cache: PathBuf,
    shared: Arc<Shared>,
    /// `--peer-listen`: where to listen instead of all addresses on the
    /// cluster's port.
    listen_override: Option<SocketAddr>,
    running: Option<(Running, CancellationToken)>,
}

impl PeerHost {
    pub fn new(
        dirs: StateDir,
        cluster: String,
        shared: Arc<Shared>,
        listen_override: Option<SocketAddr>,
    ) -> Self {
        PeerHost {
            cache: dirs.cache(),
            dirs,
            cluster,
            shared,
            listen_override,
            running: None,
        }
    }

    /// Follows one desired state: what is served, and whether and how the
    /// listener runs.
    pub async fn apply(&mut self, desired: &pb::DesiredState) {
        self.shared.set_served(desired);
        let cert_pem = std::fs::read_to_string(self.dirs.node_cert()).unwrap_or_default();
        let want = desired.peer_sharing.as_ref().map(|p| Running {
            cert_pem,
            listen: self
                .listen_override
                .unwrap_or_else(|| SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), p.port as u16)),
            upload_rate: p.upload_rate,
            max_uploads: p.max_uploads.clamp(1, 64),
        });
        if self.running.as_ref().map(|r| &r.0) == want.as_ref() {
            return;
        }
        self.stop();
        let Some(want) = want else { return };
        match self.start(&want).await {
            Ok(cancel) => {
                tracing::info!(
                    listen = %want.listen,
                    max_uploads = want.max_uploads,
                    upload_rate = want.upload_rate,
                    "peer sharing on: serving this node's blobs to its cluster"
                );
                self.running = Some((want, cancel));
            }
            Err(e) => tracing::warn!(listen = %want.listen, "peer sharing: cannot listen: {e}"),
        }
    }

    pub fn stop(&mut self) {
        if let Some((r, cancel)) = self.running.take() {
            cancel.cancel();
            tracing::info!(listen = %r.listen, "peer sharing off: listener closed");
        }
    }

    async fn start(&self, r: &Running) -> Result<CancellationToken, ListenError> {
        let creds = NodeCredentials::load(&self.dirs).map_err(ListenError::Credentials)?;
        // The node certificate, client certificates required and checked
        // against the node's CA, ALPN h2.
        let tls = lks_proto::tls::server_config(
            &creds.cert_pem,
            &creds.key_pem,
            &creds.ca_pem,
            lks_proto::tls::ClientCerts::Required,
        )
        .map_err(ListenError::Tls)?;
        let listener = match TcpListener::bind(r.listen).await {
            Ok(l) => l,
            // A host without IPv6: all IPv4 addresses instead.
            Err(_) if r.listen.ip() == std::net::Ipv6Addr::UNSPECIFIED => TcpListener::bind(SocketAddr::new(
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                r.listen.port(),
            ))
            .await
            .map_err(|error| ListenError::Bind {
                addr: r.listen,
                error,
            })?,
            Err(error) => {
                return Err(ListenError::Bind {
                    addr: r.listen,
                    error,
                });
            }
        };
        let cancel = CancellationToken::new();
        let svc = PeerApi {
            cluster: self.cluster.clone(),
            cache: self.cache.clone(),
            shared: self.shared.clone(),
            uploads: Arc::new(Semaphore::new(r.max_uploads as usize)),
            watches: Arc::new(Semaphore::new(MAX_WATCHES)),
            rate: Arc::new(RateLimit::new(r.upload_rate)),
            cancel: cancel.clone(),
        };
        let incoming = incoming(listener, TlsAcceptor::from(tls), cancel.clone());
        let c = cancel.clone();
        tokio::spawn(async move {
            // The control server's transport limits, and invalid_argument
            // for a request that does not decode (lks_proto::wire).
            // Keepalive as on the agent's own channel: a dialler whose VM
            // went away without closing its connection does not hold a
            // socket here for good (a live one closes its idle
            // connections itself, `swarm::conns`).
            let res = tonic::transport::Server::builder()
                .http2_max_header_list_size(lks_proto::wire::MAX_HEADER_LIST)
                .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
                .layer(lks_proto::wire::MalformedRequestLayer)
                .add_service(
                    pb::peer_service_server::PeerServiceServer::new(svc)
                        .max_decoding_message_size(lks_proto::wire::MAX_MESSAGE),
                )
                .serve_with_incoming_shutdown(incoming, c.cancelled_owned())
                .await;
            if let Err(e) = res {
                tracing::warn!("peer listener ended: {e}");
            }
        });
        Ok(cancel)
    }
}

impl Drop for PeerHost {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why the peer listener did not start.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error("{0}")]
    Credentials(lks_proto::fsutil::FsError),
    /// The TLS set-up from this node's certificate (the text says why).
    #[error("{0}")]
    Tls(lks_proto::tls::TlsSetupError),
    #[error("bind {addr}: {error}")]
    Bind { addr: SocketAddr, error: std::io::Error },
}

/// Accepted connections, each handshaken in its own task (a peer that
/// stalls its handshake holds up nobody).
fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    cancel: CancellationToken,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (tcp, addr) = tokio::select! {
                _ = cancel.cancelled() => return,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!("peer accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // As the control server's: an upload's last frames (the end
            // of a piece's stream) go out at once instead of waiting for
            // the ACK of what went before (Nagle's algorithm).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(peer = %addr, "peer socket: TCP_NODELAY: {e}");
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::info!(peer = %addr, "peer refused at TLS: {e}"),
                    Err(_) => tracing::info!(peer = %addr, "peer TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_rustls::{TlsAcceptor, TlsConnector};
    use tokio_util::sync::CancellationToken;

    use super::incoming;

    #[tokio::test]
    async fn accepted_connections_send_without_delay() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let mut accepted = Box::pin(incoming(
            listener,
            TlsAcceptor::from(Arc::new(server)),
            cancel.clone(),
        ));
        let dial = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            assert!(!tcp.nodelay().unwrap(), "a socket delays small sends by default");
            TlsConnector::from(Arc::new(client))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap()
        });
        let tls = accepted.next().await.unwrap().unwrap();
        assert!(tls.get_ref().0.nodelay().unwrap());
        drop(dial.await.unwrap());
        cancel.cancel();
    }
}
