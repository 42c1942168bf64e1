//! Reaching the admin API: `admin.conf` → mTLS channel, and gRPC statuses
//! turned into one-line errors a person can act on.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use lks_control_server::adminconf::AdminConf;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

pub type Client = AdminServiceClient<Channel>;

/// Connects to the server named in the config file.
pub async fn connect(config: &Path) -> anyhow::Result<(Client, String)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let conf = AdminConf::load(config).map_err(|e| anyhow!("{e}")).with_context(|| {
        "load lksctl config (give --config FILE or set LKSCTL_CONFIG; the server writes admin.conf in its data dir)"
            .to_string()
    })?;
    let url = conf.server.clone();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&conf.ca_cert))
        .identity(Identity::from_pem(&conf.client_cert, &conf.client_key));
    let channel = Channel::from_shared(url.clone())
        .map_err(|e| anyhow!("{}: invalid server URL {url:?}: {e}", config.display()))?
        .tls_config(tls)
        .map_err(|e| anyhow!("configure TLS from {}: {}", config.display(), chain(&e)))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| anyhow!("cannot reach control server at {url}: {}", chain(&e)))?;
    // Bundle lists and rollouts of a large fleet exceed tonic's 4 MiB default.
    Ok((
        AdminServiceClient::new(channel).max_decoding_message_size(256 << 20),
        url,
    ))
}

/// An error and all its sources on one line.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// Turns a gRPC status into an error message.
pub fn status(url: &str, st: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let msg = st.message().replace('\n', " ");
    match st.code() {
        Code::Unavailable => {
            let detail = std::error::Error::source(&st).map(chain).unwrap_or_default();
            let detail = if detail.is_empty() {
                msg
            } else {
                format!("{msg}: {detail}")
            };
            anyhow!("cannot reach control server at {url}: {detail}")
        }
        Code::Unauthenticated | Code::PermissionDenied => anyhow!("not authorised by {url}: {msg}"),
        Code::Unimplemented if msg.is_empty() => {
            anyhow!("{url} does not implement this call (server too old?)")
        }
        Code::DeadlineExceeded => anyhow!("control server at {url} did not answer in time: {msg}"),
        _ if msg.is_empty() => anyhow!("control server answered {:?}", st.code()),
        _ => anyhow!("{msg}"),
    }
}
