//! The admin API's bootstrap tokens: `CreateToken` stores a token for a
//! cluster and answers with the join command (every replica, the CA hash)
//! and where VMs can download the agent.

use std::sync::Arc;

use lks_pki::Pki;
use lks_proto::pb;
use tonic::{Response, Status};

use crate::clock::now_ms;
use crate::ops::token::{self, Issued, NewToken};
use crate::packages::AgentPackages;
use crate::store::TokenStore;

crate::context::shared_view! {
    /// What `CreateToken` uses: the store, the server CA (its hash goes into
    /// the join command), the replicas' URLs and the agent packages offered.
    pub(super) struct Deps {
        store: Arc<dyn TokenStore>,
        pki: Arc<Pki>,
        agent_packages: Arc<AgentPackages>,
        /// `https://HOST:PORT` of this replica.
        server_url: String,
        /// `--join-url`: what join lines name, if given.
        join_urls: Vec<String>,
        /// Every replica's URL, this one's first.
        servers: tokio::sync::watch::Receiver<Vec<String>>,
    }
}

impl Deps {
    /// The `--server` value of join commands: the `--join-url`s if given,
    /// else every replica, comma-separated.
    fn join_servers(&self) -> String {
        if !self.join_urls.is_empty() {
            return self.join_urls.join(",");
        }
        self.servers.borrow().join(",")
    }
}

/// `CreateToken`: a bootstrap token and the join command that uses it.
pub(super) async fn create(
    s: &Deps,
    r: pb::CreateTokenRequest,
) -> Result<Response<pb::CreateTokenResponse>, Status> {
    let cluster = r.cluster.clone();
    let new = NewToken {
        cluster: r.cluster,
        ttl_seconds: r.ttl_seconds,
        uses: r.uses,
        labels: r.labels,
    };
    let Issued { token, expires_at_ms } = token::issue(&*s.store, new, now_ms()).await?;
    let ca_hash = s.pki.ca_hash().to_string();
    // Every replica, so the agent can fail over between them.
    let servers = s.join_servers();
    let join_command =
        format!("lksadmin-agent join --server {servers} --token {token} --ca-cert-hash {ca_hash}");
    tracing::info!(cluster = %cluster, token_id = %token.id(), "bootstrap token created");
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
