//! The gRPC APIs: `AdminService`, the operator API behind `lksctl` (every
//! call requires the admin certificate), split by resource — clusters,
//! tokens, bundles, rollouts, nodes, events, and the rollout policy and
//! the views shared by several of them (`policy.rs`) — and, in `agent/`,
//! `AgentService`, the only API tenant nodes can reach.
//!
//! This file holds the service trait impl: each call times itself, checks
//! its caller, and hands the request to its resource's handler.

mod agent;
mod audit;
mod bundles;
mod clusters;
mod events;
mod nodes;
mod plans;
mod policy;
mod reboots;
mod releases;
mod rollouts;
mod tokens;

pub use agent::AgentApi;
pub use policy::rollout_pb;

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use lks_proto::pb::admin_service_server::AdminService;
use lks_proto::pb::{self};
use lks_rollout::Verb;
use lks_rollout::plan::PlanVerb;
use tonic::{Request, Response, Status, Streaming};

use crate::authz::{blob_status, require_admin, require_admin_caller, store_status};
use crate::clock::now_ms;
use crate::context::Shared;
use crate::controller::CommandError;
use crate::ops::{Kind, OpError};

/// The admin API: each resource's handlers get only what they use.
pub struct AdminApi {
    metrics: Arc<crate::metrics::Metrics>,
    events: Arc<dyn crate::store::EventStore>,
    clusters: clusters::Deps,
    tokens: tokens::Deps,
    nodes: nodes::Deps,
    bundles: bundles::Deps,
    rollouts: Arc<rollouts::Deps>,
    releases: releases::Deps,
    reboots: reboots::Deps,
    audit: audit::Deps,
    plans: plans::Deps,
}

impl AdminApi {
    pub fn new(s: &Shared) -> Self {
        AdminApi {
            metrics: s.metrics.clone(),
            events: s.store.clone(),
            clusters: clusters::Deps::of(s),
            tokens: tokens::Deps::of(s),
            nodes: nodes::Deps::of(s),
            bundles: bundles::Deps::of(s),
            rollouts: Arc::new(rollouts::Deps::of(s)),
            releases: releases::Deps::of(s),
            reboots: reboots::Deps::of(s),
            audit: audit::Deps::of(s),
            plans: plans::Deps::of(s),
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn invalid(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The one way an operation's error reaches a client: store and blob
/// store failures as every handler answers them (`authz`), the rest by
/// their kind, each with its message.
impl From<OpError> for Status {
    fn from(e: OpError) -> Status {
        let msg = e.to_string();
        match (e.kind(), e) {
            (_, OpError::Store(e) | OpError::Controller(CommandError::Store(e))) => store_status(e),
            (_, OpError::Blob { what, source }) => blob_status(&what, source),
            (Some(Kind::Invalid), _) => Status::invalid_argument(msg),
            (Some(Kind::AlreadyExists), _) => Status::already_exists(msg),
            (Some(Kind::NotFound), _) => Status::not_found(msg),
            (Some(Kind::FailedPrecondition), _) => Status::failed_precondition(msg),
            (Some(Kind::OutOfRange), _) => Status::out_of_range(msg),
            (Some(Kind::ResourceExhausted), _) => Status::resource_exhausted(msg),
            (Some(Kind::Unavailable), _) => Status::unavailable(msg),
            (Some(Kind::Unauthenticated), _) => Status::unauthenticated(msg),
            (Some(Kind::PermissionDenied), _) => Status::permission_denied(msg),
            (Some(Kind::Internal) | None, _) => Status::internal(msg),
        }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn create_cluster(
        &self,
        req: Request<pb::CreateClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let _t = self.metrics.timer("CreateCluster");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::create_cluster(&r);
        let answer = clusters::create(&self.clusters, r, &who.name, now_ms())
            .await
            .map(|c| Response::new(policy::cluster_pb(c, now_ms())));
        self.audit.record(&who, "CreateCluster", entry, &answer).await;
        answer
    }

    async fn set_cluster(
        &self,
        req: Request<pb::SetClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let _t = self.metrics.timer("SetCluster");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::set_cluster(&r);
        let answer = clusters::set(&self.clusters, r, who.name.clone()).await;
        self.audit.record(&who, "SetCluster", entry, &answer).await;
        answer
    }

    async fn get_cluster_ca(
        &self,
        req: Request<pb::GetClusterCaRequest>,
    ) -> Result<Response<pb::GetClusterCaResponse>, Status> {
        let _t = self.metrics.timer("GetClusterCa");
        require_admin(&req)?;
        let name = req.into_inner().name;
        Ok(Response::new(pb::GetClusterCaResponse {
            ca_cert_pem: clusters::ca_pem(&self.clusters, &name).await?,
        }))
    }

    async fn list_certificates(
        &self,
        req: Request<pb::ListCertificatesRequest>,
    ) -> Result<Response<pb::ListCertificatesResponse>, Status> {
        let _t = self.metrics.timer("ListCertificates");
        require_admin(&req)?;
        Ok(Response::new(pb::ListCertificatesResponse {
            certificates: clusters::list(&self.clusters, req.into_inner(), now_ms()).await?,
        }))
    }

    async fn list_clusters(
        &self,
        req: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let _t = self.metrics.timer("ListClusters");
        require_admin(&req)?;
        clusters::list_clusters(&self.clusters).await
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let _t = self.metrics.timer("CreateToken");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::create_token(&r);
        let answer = tokens::create(&self.tokens, r).await;
        self.audit.record(&who, "CreateToken", entry, &answer).await;
        answer
    }

    async fn publish_bundle(
        &self,
        req: Request<Streaming<pb::PublishBundleRequest>>,
    ) -> Result<Response<pb::PublishBundleResponse>, Status> {
        let _t = self.metrics.timer("PublishBundle");
        let who = require_admin_caller(&req)?;
        let answer = bundles::publish(&self.bundles, req.into_inner()).await;
        self.audit
            .record(&who, "PublishBundle", audit::publish(&answer), &answer)
            .await;
        answer
    }

    async fn list_bundles(
        &self,
        req: Request<pb::ListBundlesRequest>,
    ) -> Result<Response<pb::ListBundlesResponse>, Status> {
        let _t = self.metrics.timer("ListBundles");
        require_admin(&req)?;
        bundles::list(&self.bundles, req.into_inner()).await
    }

    async fn get_bundle(&self, req: Request<pb::GetBundleRequest>) -> Result<Response<pb::Bundle>, Status> {
        let _t = self.metrics.timer("GetBundle");
        require_admin(&req)?;
        bundles::get(&self.bundles, req.into_inner()).await
    }

    async fn delete_bundle(
        &self,
        req: Request<pb::GetBundleRequest>,
    ) -> Result<Response<pb::DeleteBundleResponse>, Status> {
        let _t = self.metrics.timer("DeleteBundle");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::bundle(&r);
        let answer = bundles::delete(&self.bundles, r, who.name.clone()).await;
        self.audit.record(&who, "DeleteBundle", entry, &answer).await;
        answer
    }

    async fn start_rollout(
        &self,
        req: Request<pb::StartRolloutRequest>,
    ) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("StartRollout");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::start_rollout(&r);
        let answer = rollouts::start(&self.rollouts, r, who.name.clone()).await;
        // The id is known once it started.
        let entry = match &answer {
            Ok(ro) => audit::Entry {
                target: format!("{} {}", ro.get_ref().id, entry.target),
                ..entry
            },
            Err(_) => entry,
        };
        self.audit.record(&who, "StartRollout", entry, &answer).await;
        answer
    }

    async fn get_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("GetRollout");
        require_admin(&req)?;
        let row = rollouts::load_rollout(&self.rollouts, &req.into_inner().id).await?;
        let mut p = rollout_pb(&row);
        policy::add_fetched_by_nodes(&mut p, &rollouts::nodes_of(&self.rollouts, &row.cluster).await?);
        Ok(Response::new(p))
    }

    type WatchRolloutStream = BoxStream<pb::Rollout>;

    async fn watch_rollout(
        &self,
        req: Request<pb::RolloutRef>,
    ) -> Result<Response<Self::WatchRolloutStream>, Status> {
        let _t = self.metrics.timer("WatchRollout");
        require_admin(&req)?;
        rollouts::watch(&self.rollouts, req.into_inner()).await
    }

    async fn list_rollouts(
        &self,
        req: Request<pb::ListRolloutsRequest>,
    ) -> Result<Response<pb::ListRolloutsResponse>, Status> {
        let _t = self.metrics.timer("ListRollouts");
        require_admin(&req)?;
        rollouts::list(&self.rollouts, req.into_inner()).await
    }

    async fn pause_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("PauseRollout");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::rollout(&r);
        let answer = rollouts::verb(&self.rollouts, r.id, Verb::Pause).await;
        self.audit.record(&who, "PauseRollout", entry, &answer).await;
        answer
    }

    async fn resume_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("ResumeRollout");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::rollout(&r);
        let answer = rollouts::verb(&self.rollouts, r.id, Verb::Resume).await;
        self.audit.record(&who, "ResumeRollout", entry, &answer).await;
        answer
    }

    async fn abort_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("AbortRollout");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::rollout(&r);
        let answer = rollouts::verb(&self.rollouts, r.id, Verb::Abort).await;
        self.audit.record(&who, "AbortRollout", entry, &answer).await;
        answer
    }

    async fn rollback_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.metrics.timer("RollbackRollout");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::rollout(&r);
        let answer = rollouts::rollback(&self.rollouts, r).await;
        self.audit.record(&who, "RollbackRollout", entry, &answer).await;
        answer
    }

    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let _t = self.metrics.timer("ListNodes");
        require_admin(&req)?;
        nodes::list(&self.nodes, req.into_inner()).await
    }

    async fn get_node(&self, req: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.metrics.timer("GetNode");
        require_admin(&req)?;
        nodes::get(&self.nodes, req.into_inner()).await
    }

    async fn delete_node(
        &self,
        req: Request<pb::DeleteNodeRequest>,
    ) -> Result<Response<pb::DeleteNodeResponse>, Status> {
        let _t = self.metrics.timer("DeleteNode");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::node(&r.name, serde_json::json!({}));
        let answer = nodes::delete(&self.nodes, r).await;
        self.audit.record(&who, "DeleteNode", entry, &answer).await;
        answer
    }

    async fn hold_node(&self, req: Request<pb::HoldNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.metrics.timer("HoldNode");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::node(&r.name, serde_json::json!({"reason": r.reason}));
        let answer = nodes::set_hold(&self.nodes, &r.name, Some(r.reason.clone()), &who.name).await;
        self.audit.record(&who, "HoldNode", entry, &answer).await;
        answer
    }

    async fn retry_node(
        &self,
        req: Request<pb::RetryNodeRequest>,
    ) -> Result<Response<pb::RetryNodeResponse>, Status> {
        let _t = self.metrics.timer("RetryNode");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::node(&r.name, serde_json::json!({"bundle": r.bundle}));
        let answer = nodes::retry(&self.nodes, r, who.name.clone()).await;
        self.audit.record(&who, "RetryNode", entry, &answer).await;
        answer
    }

    async fn reboot_node(
        &self,
        req: Request<pb::RebootNodeRequest>,
    ) -> Result<Response<pb::RebootNodeResponse>, Status> {
        let _t = self.metrics.timer("RebootNode");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::node(&r.name, serde_json::json!({}));
        let answer = nodes::reboot(&self.nodes, r, who.name.clone()).await;
        self.audit.record(&who, "RebootNode", entry, &answer).await;
        answer
    }

    async fn start_reboots(
        &self,
        req: Request<pb::StartRebootsRequest>,
    ) -> Result<Response<pb::RebootsStatus>, Status> {
        let _t = self.metrics.timer("StartReboots");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::reboots(&r.cluster, serde_json::json!({"selector": r.selector}));
        let answer = reboots::start(&self.reboots, r, who.name.clone()).await;
        self.audit.record(&who, "StartReboots", entry, &answer).await;
        answer
    }

    async fn get_reboots(
        &self,
        req: Request<pb::GetRebootsRequest>,
    ) -> Result<Response<pb::RebootsStatus>, Status> {
        let _t = self.metrics.timer("GetReboots");
        require_admin(&req)?;
        reboots::get(&self.reboots, req.into_inner()).await
    }

    async fn set_reboot_run(
        &self,
        req: Request<pb::SetRebootRunRequest>,
    ) -> Result<Response<pb::RebootsStatus>, Status> {
        let _t = self.metrics.timer("SetRebootRun");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let verb = pb::RebootRunVerb::try_from(r.verb).map_or("unknown", |v| v.as_str_name());
        let entry = audit::reboots(&r.cluster, serde_json::json!({"verb": verb}));
        let answer = reboots::set_run(&self.reboots, r, who.name.clone()).await;
        self.audit.record(&who, "SetRebootRun", entry, &answer).await;
        answer
    }

    async fn unhold_node(&self, req: Request<pb::UnholdNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.metrics.timer("UnholdNode");
        let who = require_admin_caller(&req)?;
        let name = req.into_inner().name;
        let entry = audit::node(&name, serde_json::json!({}));
        let answer = nodes::set_hold(&self.nodes, &name, None, &who.name).await;
        self.audit.record(&who, "UnholdNode", entry, &answer).await;
        answer
    }

    async fn list_events(
        &self,
        req: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        let _t = self.metrics.timer("ListEvents");
        require_admin(&req)?;
        events::list(self.events.as_ref(), req.into_inner()).await
    }

    async fn list_audit(
        &self,
        req: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        let _t = self.metrics.timer("ListAudit");
        require_admin(&req)?;
        audit::list(self.audit.store.as_ref(), req.into_inner()).await
    }

    async fn publish_release(
        &self,
        req: Request<pb::PublishReleaseRequest>,
    ) -> Result<Response<pb::ReleaseInfo>, Status> {
        let _t = self.metrics.timer("PublishRelease");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::release(&r);
        let answer = releases::publish(&self.releases, r).await;
        self.audit.record(&who, "PublishRelease", entry, &answer).await;
        answer
    }

    async fn list_releases(
        &self,
        req: Request<pb::ListReleasesRequest>,
    ) -> Result<Response<pb::ListReleasesResponse>, Status> {
        let _t = self.metrics.timer("ListReleases");
        require_admin(&req)?;
        releases::list(&self.releases, req.into_inner()).await
    }

    async fn publish_root(
        &self,
        req: Request<pb::PublishRootRequest>,
    ) -> Result<Response<pb::RootInfo>, Status> {
        let _t = self.metrics.timer("PublishRoot");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = audit::root(&r);
        let answer = releases::publish_root(&self.releases, r).await;
        self.audit.record(&who, "PublishRoot", entry, &answer).await;
        answer
    }

    async fn list_roots(
        &self,
        req: Request<pb::ListRootsRequest>,
    ) -> Result<Response<pb::ListRootsResponse>, Status> {
        let _t = self.metrics.timer("ListRoots");
        require_admin(&req)?;
        releases::list_roots(&self.releases, req.into_inner()).await
    }

    async fn create_plan(&self, req: Request<pb::CreatePlanRequest>) -> Result<Response<pb::Plan>, Status> {
        let _t = self.metrics.timer("CreatePlan");
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = plans::audit_create(&r);
        let dry_run = r.dry_run;
        let answer = plans::create(&self.plans, r, who.name.clone()).await;
        if !dry_run {
            self.audit.record(&who, "CreatePlan", entry, &answer).await;
        }
        answer
    }

    async fn get_plan(&self, req: Request<pb::PlanRef>) -> Result<Response<pb::Plan>, Status> {
        let _t = self.metrics.timer("GetPlan");
        require_admin(&req)?;
        plans::get(&self.plans, req.into_inner()).await
    }

    async fn list_plans(
        &self,
        req: Request<pb::ListPlansRequest>,
    ) -> Result<Response<pb::ListPlansResponse>, Status> {
        let _t = self.metrics.timer("ListPlans");
        require_admin(&req)?;
        plans::list(&self.plans).await
    }

    async fn pause_plan(&self, req: Request<pb::PlanRef>) -> Result<Response<pb::Plan>, Status> {
        self.plan_verb(req, PlanVerb::Pause, "PausePlan").await
    }

    async fn resume_plan(&self, req: Request<pb::PlanRef>) -> Result<Response<pb::Plan>, Status> {
        self.plan_verb(req, PlanVerb::Resume, "ResumePlan").await
    }

    async fn abort_plan(&self, req: Request<pb::PlanRef>) -> Result<Response<pb::Plan>, Status> {
        self.plan_verb(req, PlanVerb::Abort, "AbortPlan").await
    }

    async fn rollback_plan(&self, req: Request<pb::PlanRef>) -> Result<Response<pb::Plan>, Status> {
        self.plan_verb(req, PlanVerb::Rollback, "RollbackPlan").await
    }
}

impl AdminApi {
    /// A plan verb, timed and audited like every state-changing call.
    async fn plan_verb(
        &self,
        req: Request<pb::PlanRef>,
        verb: PlanVerb,
        call: &'static str,
    ) -> Result<Response<pb::Plan>, Status> {
        let _t = self.metrics.timer(call);
        let who = require_admin_caller(&req)?;
        let r = req.into_inner();
        let entry = plans::audit_ref(&r);
        let answer = plans::verb(&self.plans, r, verb, &who.name).await;
        self.audit.record(&who, call, entry, &answer).await;
        answer
    }
}
