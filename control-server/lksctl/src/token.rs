//! `lksctl token create`: a bootstrap token, printed as its join line, as
//! JSON, or as cloud-init user-data that installs and joins the agent.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use lks_proto::duration::parse_duration;
use lks_proto::pb;

use crate::client::{Client, status};
use crate::cloudinit;
use crate::flags::labels;
use crate::output::{self, Format, print_json};

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Create a bootstrap token and print the join command.
    Create {
        /// Tenant cluster.
        #[arg(long)]
        cluster: String,
        /// How long the token is valid.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        /// How many nodes may join with it (0: unlimited).
        #[arg(long, default_value_t = 0)]
        uses: u32,
        /// Labels given to every node enrolled with this token (k=v,…).
        #[arg(long, default_value = "")]
        labels: String,
        /// Print #cloud-config user-data that installs the agent, joins and starts it.
        #[arg(long)]
        cloud_init: bool,
        /// With --cloud-init: download the agent .deb from this http(s) URL and
        /// install it [default: the server's own package, downloaded over
        /// HTTPS and checked against the cluster CA; if the server offers
        /// none, --apt]
        #[arg(long, value_name = "URL", requires = "cloud_init", conflicts_with = "apt")]
        package_url: Option<String>,
        /// With --cloud-init: install lksadmin-agent from the apt repositories
        /// the image has configured (`packages:`)
        #[arg(long, requires = "cloud_init")]
        apt: bool,
        /// With --cloud-init: a publisher key the node trusts (PREFIX.pub;
        /// repeatable): it refuses bundles none of them signed
        #[arg(long = "trust-key", value_name = "FILE.pub", requires = "cloud_init")]
        trust_key: Vec<PathBuf>,
        /// With --cloud-init and --trust-key: the node requires signed
        /// releases, signed by this many of the keys (`lksctl release`)
        #[arg(long, value_name = "N", requires = "trust_key")]
        trust_threshold: Option<u32>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

/// The CA PEM the user-data hands to curl must be the CA the join line pins:
/// the first certificate's key hashes to `ca_cert_hash`.
fn check_ca_pem(pem: &str, ca_cert_hash: &str) -> anyhow::Result<()> {
    let hash = lks_proto::identity::pem_certs(pem).ok().and_then(|certs| {
        certs
            .first()
            .and_then(|der| lks_proto::identity::ca_cert_hash(der).ok())
    });
    match hash {
        Some(h) if h.to_string() == ca_cert_hash => Ok(()),
        Some(h) => bail!("the server's CA certificate hashes to {h}, not to its join line's {ca_cert_hash}"),
        None => bail!("the server returned no usable CA certificate to download its agent package with"),
    }
}

/// `lksctl token create`: the join line, as JSON, or as cloud-init
/// user-data.
pub async fn run(c: &mut Client, url: &str, cmd: TokenCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    let TokenCmd::Create {
        cluster,
        ttl,
        uses,
        labels: l,
        cloud_init,
        package_url,
        apt,
        trust_key,
        trust_threshold,
        output,
    } = cmd;
    if ttl.as_secs() == 0 {
        bail!("--ttl must be at least 1s");
    }
    let (trust_keys, trust_threshold) = trust_keys(&trust_key, trust_threshold)?;
    // Checked before the token exists, so a typo leaves no token behind.
    if let Some(url) = package_url.as_deref() {
        cloudinit::check_package_url(url)?;
    }
    let r = c
        .create_token(pb::CreateTokenRequest {
            cluster: cluster.clone(),
            ttl_seconds: ttl.as_secs(),
            uses,
            labels: labels("--labels", &l)?.into_iter().collect(),
        })
        .await
        .map_err(st)
        .with_context(|| format!("create token for cluster {cluster}"))?
        .into_inner();
    if output == Format::Json {
        print_json(&token_json(&r))?;
    } else if cloud_init {
        let text = user_data(
            &r,
            &cluster,
            package_url.as_deref(),
            apt,
            &trust_keys,
            trust_threshold,
        )?;
        out!("{text}");
    } else {
        outln!("{}", r.join_command);
    }
    Ok(())
}

/// The `--trust-key` files as distinct PEMs, and the `--trust-threshold`
/// checked against them (0: not given).
fn trust_keys(files: &[PathBuf], threshold: Option<u32>) -> anyhow::Result<(Vec<String>, u32)> {
    // Read before the token exists, so a bad key leaves no token behind.
    let mut trust_keys: Vec<String> = Vec::new();
    for p in files {
        let pem = lks_proto::sign::PublisherKey::from_file(p)
            .context("--trust-key")?
            .to_pem();
        if !trust_keys.contains(&pem) {
            trust_keys.push(pem);
        }
    }
    let trust_threshold = match threshold {
        None => 0,
        Some(n) if n == 0 || n as usize > trust_keys.len() => bail!(
            "--trust-threshold {n}: it must be between 1 and the number of distinct --trust-key files ({})",
            trust_keys.len()
        ),
        Some(n) => n,
    };
    Ok((trust_keys, trust_threshold))
}

/// `token create -o json`.
fn token_json(r: &pb::CreateTokenResponse) -> serde_json::Value {
    serde_json::json!({
        "token": r.token,
        "ca_cert_hash": r.ca_cert_hash,
        "server": r.server,
        "join_command": r.join_command,
        "expires_at": output::rfc3339_s(r.expires_at),
        "ca_cert_pem": r.ca_cert_pem,
        "agent_packages": r.agent_packages.iter().map(|p| serde_json::json!({
            "arch": p.arch,
            "version": p.version,
            "url": p.url,
            "digest": p.digest,
            "size": p.size,
            "file_name": p.file_name,
        })).collect::<Vec<_>>(),
    })
}

/// The cloud-init user-data that joins a node with the token `r`,
/// installing the agent from `--package-url`, apt, or the server.
fn user_data(
    r: &pb::CreateTokenResponse,
    cluster: &str,
    package_url: Option<&str>,
    apt: bool,
    trust_keys: &[String],
    trust_threshold: u32,
) -> anyhow::Result<String> {
    let offered = r
        .agent_packages
        .iter()
        .map(|p| format!("{} {}", p.arch, p.version))
        .collect::<Vec<_>>()
        .join(", ");
    let package = if let Some(url) = package_url {
        cloudinit::PackageSource::Url(url)
    } else if apt {
        cloudinit::PackageSource::Apt
    } else if r.agent_packages.is_empty() {
        eprintln!(
            "note: the server offers no agent package (lks-control-server --agent-package); \
             the user-data installs lksadmin-agent from the image's apt repositories"
        );
        cloudinit::PackageSource::Apt
    } else {
        check_ca_pem(&r.ca_cert_pem, &r.ca_cert_hash)?;
        cloudinit::PackageSource::Server {
            servers: &r.server,
            ca_pem: &r.ca_cert_pem,
            offered: &offered,
        }
    };
    let text = cloudinit::render(&cloudinit::UserData {
        cluster,
        join_command: &r.join_command,
        expires_at: &output::rfc3339_s(r.expires_at).unwrap_or_default(),
        package,
        trust_keys,
        trust_threshold,
    })?;
    Ok(text)
}
