//! Reaching the admin API: `admin.conf` → mTLS channel, and gRPC statuses
//! turned into one-line errors a person can act on.
//!
//! With several replicas (`server` plus `servers` in `admin.conf`) the URLs
//! are tried in turn until one can be reached; a replica that answers is
//! used even if the command then fails, so an application error (not found,
//! invalid argument, …) is never retried elsewhere.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use lks_proto::adminconf::AdminConfFile;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use lks_proto::report::one_line;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub type Client = AdminServiceClient<Channel>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take in all, TLS and HTTP/2 handshakes included:
/// `connect_timeout` covers only the TCP connect, which the kernel completes
/// for a server that accepts nothing (at its open-file limit, say), and the
/// handshake would then wait for ever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a reached replica may take to say whether it serves.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the first server in the config file that can be reached;
/// returns the client and that server's URL.
pub async fn connect(config: &Path) -> anyhow::Result<(Client, String)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let file = AdminConfFile::load(config).context(
        "load lksctl config (give --config FILE or set LKSCTL_CONFIG; the server writes admin.conf in its data dir)",
    )?;
    let conf = &file.conf;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&conf.ca_cert))
        .identity(Identity::from_pem(&conf.client_cert, &conf.client_key));
    // Every URL is checked before any is dialled: a typo in the file is a
    // config error, not an unreachable replica.
    let mut endpoints = Vec::new();
    for url in file.endpoints() {
        let ep = Channel::from_shared(url.clone())
            .with_context(|| format!("{}: invalid server URL {url:?}", config.display()))?
            .tls_config(tls.clone())
            .with_context(|| format!("configure TLS from {}", config.display()))?
            .connect_timeout(CONNECT_TIMEOUT);
        endpoints.push((url, ep));
    }
    let several = endpoints.len() > 1;
    let mut tried = Vec::new();
    let mut last = anyhow!("{}: no server URL", config.display());
    for (url, ep) in endpoints {
        match reach(&ep, several).await {
            // Bundle lists and rollouts of a large fleet exceed tonic's 4 MiB default.
            Ok(channel) => {
                return Ok((
                    AdminServiceClient::new(channel).max_decoding_message_size(256 << 20),
                    url,
                ));
            }
            Err(reason) => {
                last = anyhow::Error::new(reason).context(format!("cannot reach control server at {url}"));
                tried.push(url);
            }
        }
    }
    if several {
        Err(last.context(format!(
            "no control server listed in {} could be reached (tried {})",
            config.display(),
            tried.join(", ")
        )))
    } else {
        Err(last)
    }
}

/// Why one server could not be used.
#[derive(Debug, thiserror::Error)]
enum ReachError {
    #[error("no TLS handshake within {HANDSHAKE_TIMEOUT:?} (the server accepts no connections)")]
    Handshake,
    /// The connection failed (the error and its sources, on one line).
    #[error("{}", one_line(.0))]
    Connect(tonic::transport::Error),
    #[error("no health answer within {PROBE_TIMEOUT:?}")]
    NoHealthAnswer,
    /// The health service's status name (`NOT_SERVING`).
    #[error("the admin API is {0}")]
    NotServing(&'static str),
    /// The server's UNAVAILABLE message, on one line.
    #[error("{0}")]
    Unavailable(String),
}

/// Opens a channel. With other replicas to fall back on, the replica must
/// also say it serves the admin API: one that is up but cannot serve (say,
/// cut off from its store) answers UNAVAILABLE or NOT_SERVING and is passed
/// over before any command is sent to it.
async fn reach(ep: &Endpoint, probe: bool) -> Result<Channel, ReachError> {
    let channel = tokio::time::timeout(HANDSHAKE_TIMEOUT, ep.connect())
        .await
        .map_err(|_| ReachError::Handshake)?
        .map_err(ReachError::Connect)?;
    if !probe {
        return Ok(channel);
    }
    let mut health = HealthClient::new(channel.clone());
    let check = health.check(tonic_health::pb::HealthCheckRequest {
        service: lks_proto::pb::admin_service_server::SERVICE_NAME.into(),
    });
    match tokio::time::timeout(PROBE_TIMEOUT, check).await {
        Err(_) => Err(ReachError::NoHealthAnswer),
        Ok(Ok(resp)) => match resp.into_inner().status() {
            ServingStatus::Serving => Ok(channel),
            other => Err(ReachError::NotServing(other.as_str_name())),
        },
        Ok(Err(st)) if st.code() == tonic::Code::Unavailable => {
            Err(ReachError::Unavailable(st.message().replace('\n', " ")))
        }
        // It answered, just not this question (no health service): use it.
        Ok(Err(_)) => Ok(channel),
    }
}

/// A failed admin call: the message `status` made, and the gRPC code, so a
/// caller (the console) can tell an unreachable server from a refusal.
#[derive(Debug)]
pub struct RpcError {
    pub code: tonic::Code,
    msg: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for RpcError {}

/// Turns a gRPC status into an error message.
pub fn status(url: &str, st: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let code = st.code();
    let msg = st.message().replace('\n', " ");
    let msg = match code {
        // Answered by the server (no transport error underneath): the
        // server is reached; what it depends on (etcd, the blob store) is not.
        Code::Unavailable if std::error::Error::source(&st).is_none() && !msg.is_empty() => {
            format!("control server at {url}: {msg}")
        }
        Code::Unavailable => {
            let detail = std::error::Error::source(&st).map(one_line).unwrap_or_default();
            let detail = if detail.is_empty() {
                msg
            } else {
                format!("{msg}: {detail}")
            };
            format!("cannot reach control server at {url}: {detail}")
        }
        Code::Unauthenticated | Code::PermissionDenied => format!("not authorised by {url}: {msg}"),
        Code::Unimplemented if msg.is_empty() => {
            format!("{url} does not implement this call (server too old?)")
        }
        Code::DeadlineExceeded => format!("control server at {url} did not answer in time: {msg}"),
        _ if msg.is_empty() => format!("control server answered {code:?}"),
        _ => msg,
    };
    anyhow::Error::new(RpcError { code, msg })
}
