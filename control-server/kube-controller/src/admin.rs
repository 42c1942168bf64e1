//! The admin API of lks-control-server, reached with an `admin.conf` (a
//! Secret mounted into the controller's pod): mTLS, the first replica that
//! answers. One connection is shared by every reconcile ([`Pool`]): it is
//! made when first needed, and dropped (so the next call connects again,
//! to whichever replica answers then) only when a call through it fails for
//! want of a connection, never because the server refused one request.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::adminconf::{AdminConfError, AdminConfFile};
use lks_proto::pb::admin_service_client::AdminServiceClient;
use lks_proto::report::one_line;
use tokio::sync::Mutex;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

pub type Admin = AdminServiceClient<Channel>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no server of an `admin.conf` could be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Conf(#[from] AdminConfError),
    #[error("{path}: no server URL")]
    NoServer { path: PathBuf },
    #[error("{path}: server URL {url:?}: {source}")]
    Url {
        path: PathBuf,
        url: String,
        #[source]
        source: tonic::codegen::http::uri::InvalidUri,
    },
    #[error("{path}: TLS for {url}: {}", one_line(.source))]
    Tls {
        path: PathBuf,
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connect to {url}: {}", one_line(.source))]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// A client of the first server in `conf` that can be reached.
pub async fn connect(conf: &Path) -> Result<Admin, ConnectError> {
    let file = AdminConfFile::load(conf)?;
    let c = &file.conf;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&c.ca_cert))
        .identity(Identity::from_pem(&c.client_cert, &c.client_key));
    let mut last = ConnectError::NoServer {
        path: conf.to_path_buf(),
    };
    for url in file.endpoints() {
        let ep = Channel::from_shared(url.clone())
            .map_err(|source| ConnectError::Url {
                path: conf.to_path_buf(),
                url: url.clone(),
                source,
            })?
            .tls_config(tls.clone())
            .map_err(|source| ConnectError::Tls {
                path: conf.to_path_buf(),
                url: url.clone(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(Duration::from_secs(30));
        match ep.connect().await {
            Ok(ch) => return Ok(AdminServiceClient::new(ch).max_decoding_message_size(64 << 20)),
            Err(source) => last = ConnectError::Connect { url, source },
        }
    }
    Err(last)
}

/// Why an admin call has no answer: no server could be reached, or the
/// server answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The server's line, without gRPC's framing.
    #[error("{}", .0.message())]
    Status(#[source] tonic::Status),
}

impl CallError {
    /// The gRPC code of the server's answer (`Unavailable` when none was
    /// reached).
    pub fn code(&self) -> Code {
        match self {
            CallError::Connect(_) => Code::Unavailable,
            CallError::Status(s) => s.code(),
        }
    }
}

/// Whether a call that ended with `code` says the connection is broken
/// (rather than that the server refused the request).
pub fn connection_lost(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::Unknown)
}

/// The admin connection every reconcile shares.
pub struct Pool {
    conf: PathBuf,
    /// The client and the number of the connection it is, so a failure
    /// reported late does not drop a newer connection.
    current: Mutex<(u64, Option<Admin>)>,
}

impl Pool {
    pub fn new(conf: PathBuf) -> Self {
        Pool {
            conf,
            current: Mutex::new((0, None)),
        }
    }

    /// The shared client and its number, connecting first if there is
    /// none (one caller connects; the others wait for it).
    async fn client(&self) -> Result<(u64, Admin), ConnectError> {
        let mut cur = self.current.lock().await;
        if let Some(a) = &cur.1 {
            return Ok((cur.0, a.clone()));
        }
        let a = connect(&self.conf).await?;
        cur.0 += 1;
        cur.1 = Some(a.clone());
        Ok((cur.0, a))
    }

    /// Drops connection `number` if it is still the shared one.
    async fn drop_connection(&self, number: u64) {
        let mut cur = self.current.lock().await;
        if cur.0 == number && cur.1.take().is_some() {
            tracing::info!("admin API connection lost; the next call connects again");
        }
    }

    /// Runs one call on the shared client: `call(client)`, e.g.
    /// `pool.call(|mut a| async move { a.list_nodes(req).await })`.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: FnOnce(Admin) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let (number, client) = self.client().await?;
        match call(client).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) => {
                if connection_lost(s.code()) {
                    self.drop_connection(number).await;
                }
                Err(CallError::Status(s))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pool_without_a_reachable_server_says_why_and_keeps_no_client() {
        let dir = std::env::temp_dir().join(format!("lks-kc-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.conf");
        let pool = Pool::new(missing.clone());
        let e = pool
            .call(|mut a| async move {
                a.list_clusters(lks_proto::pb::ListClustersRequest::default())
                    .await
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.to_string().contains("missing.conf"), "{e}");
        assert!(pool.current.lock().await.1.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_a_lost_connection_drops_the_shared_client() {
        assert!(connection_lost(Code::Unavailable));
        assert!(connection_lost(Code::Unknown));
        for refused in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::PermissionDenied,
        ] {
            assert!(!connection_lost(refused), "{refused:?}");
        }
    }
}
