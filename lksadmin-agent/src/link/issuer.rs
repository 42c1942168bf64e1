//! `IssueCertificate` over the node's channel: the network side of the
//! node layer's [`CertIssuer`] port, which the engine asks for the
//! certificates of a bundle's `[[certificate]]` entries.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lks_proto::pb;

use crate::link::channel::SharedChannel;
use crate::node::certs::{CertIssuer, IssueError};

/// `IssueCertificate` on the channel of the current server connection.
pub struct NetIssuer {
    server: SharedChannel,
}

impl NetIssuer {
    pub fn new(server: SharedChannel) -> Arc<Self> {
        Arc::new(NetIssuer { server })
    }
}

impl CertIssuer for NetIssuer {
    fn issue(
        &self,
        req: pb::IssueCertificateRequest,
    ) -> BoxFuture<'_, Result<pb::IssueCertificateResponse, IssueError>> {
        Box::pin(async move {
            let channel = self
                .server
                .get()
                .ok_or_else(|| IssueError::Unavailable("not connected to the control server".into()))?;
            let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
            let mut request = tonic::Request::new(req);
            request.set_timeout(Duration::from_secs(30));
            match client.issue_certificate(request).await {
                Ok(r) => Ok(r.into_inner()),
                Err(s) => {
                    let msg = format!("IssueCertificate: {}", s.message());
                    Err(match s.code() {
                        tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::PermissionDenied
                        | tonic::Code::NotFound => IssueError::Refused(msg),
                        _ => IssueError::Unavailable(msg),
                    })
                }
            }
        })
    }
}
