//! The admin API's bootstrap tokens: `CreateToken` stores a token for a
//! cluster and answers with the join command (every replica, the CA hash)
//! and where VMs can download the agent.

use std::sync::Arc;
use std::time::Duration;

use lks_proto::names::validate_cluster_name;
use lks_proto::pb;
use lks_proto::token::BootstrapToken;
use tonic::{Response, Status};

use super::{check_labels, invalid};
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::packages::AgentPackages;
use crate::pki::Pki;
use crate::store::{Store, TokenRow};

/// What `CreateToken` uses: the store, the server CA (its hash goes into
/// the join command), the replicas' URLs and the agent packages offered.
pub(super) struct Deps {
    pub store: Arc<dyn Store>,
    pub pki: Arc<Pki>,
    pub agent_packages: Arc<AgentPackages>,
    /// `https://HOST:PORT` of this replica.
    pub server_url: String,
    /// `--join-url`: what join lines name, if given.
    pub join_urls: Vec<String>,
    /// Every replica's URL, this one's first.
    pub servers: tokio::sync::watch::Receiver<Vec<String>>,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            pki: s.pki.clone(),
            agent_packages: s.agent_packages.clone(),
            server_url: s.server_url.clone(),
            join_urls: s.join_urls.clone(),
            servers: s.servers.clone(),
        }
    }

    /// The `--server` value of join commands: the `--join-url`s if given,
    /// else every replica, comma-separated.
    fn join_servers(&self) -> String {
        if !self.join_urls.is_empty() {
            return self.join_urls.join(",");
        }
        self.servers.borrow().join(",")
    }
}

const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
const MAX_TOKEN_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// `CreateToken`: a bootstrap token and the join command that uses it.
pub(super) async fn create(
    s: &Deps,
    r: pb::CreateTokenRequest,
) -> Result<Response<pb::CreateTokenResponse>, Status> {
    validate_cluster_name(&r.cluster).map_err(invalid)?;
    let ttl = if r.ttl_seconds == 0 {
        DEFAULT_TOKEN_TTL
    } else {
        Duration::from_secs(r.ttl_seconds)
    };
    if ttl > MAX_TOKEN_TTL {
        return Err(invalid("token TTL is longer than the limit of 365 days"));
    }
    let labels = check_labels("labels", &r.labels)?;
    let token = BootstrapToken::generate();
    let now = now_ms();
    let expires_at_ms = now.saturating_add(ttl.as_millis() as i64);
    s.store
        .create_token(TokenRow {
            id: token.id().to_string(),
            secret_hash: *token.secret_hash().as_bytes(),
            cluster: r.cluster.clone(),
            expires_at_ms,
            remaining_uses: (r.uses > 0).then_some(r.uses),
            labels,
            created_at_ms: now,
        })
        .await
        .map_err(store_status)?;
    let ca_hash = s.pki.ca_hash().to_string();
    // Every replica, so the agent can fail over between them.
    let servers = s.join_servers();
    let join_command =
        format!("lksadmin-agent join --server {servers} --token {token} --ca-cert-hash {ca_hash}");
    tracing::info!(cluster = %r.cluster, token_id = %token.id(), "bootstrap token created");
    Ok(Response::new(pb::CreateTokenResponse {
        token: token.to_string(),
        ca_cert_hash: ca_hash,
        server: servers.clone(),
        join_command,
        expires_at: expires_at_ms / 1000,
        ca_cert_pem: s.pki.ca_pem().to_string(),
        agent_packages: s
            .agent_packages
            .list()
            .iter()
            // Where VMs can reach: the first join URL (this replica's
            // own unless --join-url names a load balancer).
            .map(|p| p.to_pb(servers.split(',').next().unwrap_or(&s.server_url)))
            .collect(),
    }))
}
