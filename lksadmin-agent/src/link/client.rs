//! gRPC channels to the control server: TLS with the cluster CA pinned,
//! mTLS with the node certificate after `join`, HTTP/2 keepalive and a
//! connect timeout.

use std::time::Duration;

use lks_proto::fsutil::FsError;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::StateDir;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 keepalive of the agent's connections, to the control server and
/// (the listener's side) from peers: a ping after this long without a
/// frame, and the connection closed if it is not answered within
/// [`KEEPALIVE_TIMEOUT`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url}: {reason}")]
    Endpoint { url: String, reason: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{url}: connect: {reason}")]
    Connect { url: String, reason: String },
}

/// The node's credentials, read fresh for every connection so a renewed
/// certificate is used from the next connection on.
#[derive(Clone)]
pub struct NodeCredentials {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl NodeCredentials {
    pub fn load(dirs: &StateDir) -> Result<Self, FsError> {
        let read =
            |p: std::path::PathBuf| std::fs::read_to_string(&p).map_err(|e| FsError::new("read", &p, e));
        Ok(NodeCredentials {
            ca_pem: read(dirs.ca_cert())?,
            cert_pem: read(dirs.node_cert())?,
            key_pem: read(dirs.node_key())?,
        })
    }
}

/// `host:port` or a URL without scheme becomes `https://…`.
pub fn normalize_url(s: &str) -> String {
    let s = s.trim().trim_end_matches('/');
    if s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    }
}

/// TLS trusting only `ca_pem`, presenting the node identity.
pub fn node_tls(creds: &NodeCredentials) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&creds.ca_pem))
        .identity(Identity::from_pem(&creds.cert_pem, &creds.key_pem))
}

/// An endpoint with keepalive and timeouts and the given TLS settings.
pub fn endpoint(url: &str, tls: ClientTlsConfig) -> Result<Endpoint, ClientError> {
    let err = |reason: String| ClientError::Endpoint {
        url: url.into(),
        reason,
    };
    Endpoint::from_shared(url.to_string())
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .tls_config(tls)
        .map_err(|e| err(crate::link::channel::error_chain(&e)))
}

/// Connects with the node's mTLS identity.
pub async fn connect_node(url: &str, creds: &NodeCredentials) -> Result<Channel, ClientError> {
    endpoint(url, node_tls(creds))?
        .connect()
        .await
        .map_err(|e| ClientError::Connect {
            url: url.into(),
            reason: crate::link::channel::error_chain(&e),
        })
}
