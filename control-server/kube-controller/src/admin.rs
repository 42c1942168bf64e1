//! The admin API of lks-control-server, reached with an `admin.conf` (a
//! Secret mounted into the controller's pod): mTLS, the first replica that
//! answers.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use lks_proto::adminconf::AdminConfFile;
use lks_proto::pb::admin_service_client::AdminServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

pub type Admin = AdminServiceClient<Channel>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of the first server in `conf` that can be reached.
pub async fn connect(conf: &Path) -> anyhow::Result<Admin> {
    let file = AdminConfFile::load(conf).with_context(|| format!("load {}", conf.display()))?;
    let c = &file.conf;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&c.ca_cert))
        .identity(Identity::from_pem(&c.client_cert, &c.client_key));
    let mut last = anyhow!("{}: no server URL", conf.display());
    for url in file.endpoints() {
        let ep = Channel::from_shared(url.clone())
            .with_context(|| format!("{}: server URL {url:?}", conf.display()))?
            .tls_config(tls.clone())
            .context("configure TLS")?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(Duration::from_secs(30));
        match ep.connect().await {
            Ok(ch) => return Ok(AdminServiceClient::new(ch).max_decoding_message_size(64 << 20)),
            Err(e) => last = anyhow::Error::new(e).context(format!("connect to {url}")),
        }
    }
    Err(last)
}
