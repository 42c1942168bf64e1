//! `AgentService`: enrolment, the long-lived `Connect` stream, certificate
//! renewal and blob download — the only API tenant nodes can reach. Split
//! by concern: node identity (`identity.rs`), the stream (`session.rs`) and
//! blobs and peers (`blobs.rs`); this file holds the service trait impl.

mod blobs;
mod identity;
mod session;

use std::sync::Arc;

use lks_proto::pb::agent_service_server::AgentService;
use lks_proto::pb::{self, AgentMessage, ServerMessage};
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::context::Shared;

/// The agent API: each concern's handlers get only what they use.
pub struct AgentApi {
    metrics: Arc<crate::metrics::Metrics>,
    identity: identity::Deps,
    session: Arc<session::Deps>,
    blobs: blobs::Deps,
}

impl AgentApi {
    pub fn new(s: &Shared) -> Self {
        AgentApi {
            metrics: s.metrics.clone(),
            identity: identity::Deps::of(s),
            session: Arc::new(session::Deps::of(s)),
            blobs: blobs::Deps::of(s),
        }
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn enroll(&self, req: Request<pb::EnrollRequest>) -> Result<Response<pb::EnrollResponse>, Status> {
        let _t = self.metrics.timer("Enroll");
        identity::enroll(&self.identity, req).await
    }

    type ConnectStream = BoxStream<ServerMessage>;

    async fn connect(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let _t = self.metrics.timer("Connect");
        session::connect(&self.session, req).await
    }

    async fn renew_certificate(
        &self,
        req: Request<pb::RenewCertificateRequest>,
    ) -> Result<Response<pb::RenewCertificateResponse>, Status> {
        let _t = self.metrics.timer("RenewCertificate");
        identity::renew(&self.identity, req).await
    }

    async fn find_peers(
        &self,
        req: Request<pb::FindPeersRequest>,
    ) -> Result<Response<pb::FindPeersResponse>, Status> {
        let _t = self.metrics.timer("FindPeers");
        blobs::find_peers(&self.blobs, req).await
    }

    async fn find_deltas(
        &self,
        req: Request<pb::FindDeltasRequest>,
    ) -> Result<Response<pb::FindDeltasResponse>, Status> {
        let _t = self.metrics.timer("FindDeltas");
        blobs::find_deltas(&self.blobs, req).await
    }

    async fn issue_certificate(
        &self,
        req: Request<pb::IssueCertificateRequest>,
    ) -> Result<Response<pb::IssueCertificateResponse>, Status> {
        let _t = self.metrics.timer("IssueCertificate");
        identity::issue(&self.identity, req).await
    }

    type FetchBlobStream = BoxStream<pb::BlobChunk>;

    async fn fetch_blob(
        &self,
        req: Request<pb::FetchBlobRequest>,
    ) -> Result<Response<Self::FetchBlobStream>, Status> {
        let _t = self.metrics.timer("FetchBlob");
        blobs::fetch(&self.blobs, req).await
    }
}
