//! `AdminService`: the operator API behind `lksctl`. Every call requires the
//! admin certificate.

mod clusters;
mod policy;

pub use clusters::check_api_server;

pub use policy::rollout_pb;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use lks_proto::chunks::ChunkHasher;
use lks_proto::labels::{Labels, validate_label};
use lks_proto::limits::MAX_LABELS;
use lks_proto::manifest::check_paths_disjoint;
use lks_proto::names::{validate_bundle_name, validate_cluster_name, validate_node_name, validate_version};
use lks_proto::pb::admin_service_server::AdminService;
use lks_proto::pb::publish_bundle_request::Msg as PublishMsg;
use lks_proto::pb::{self};
use lks_proto::token::BootstrapToken;
use lks_proto::{Digest, Manifest, SignedBundle, canonical, labels::selector_matches, sign};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::authz::{blob_status, require_admin, store_status};
use crate::blobs::{BlobError, BlobWriter, StagedBlob, Upload};
use crate::clock::now_ms;
use crate::rollout::{self, Verb, counts};
use crate::server::Shared;
use crate::store::{
    BundleRow, ClusterRow, EventFilter, EventRow, NewBundle, NewRollout, NodeRow, PutOutcome, RolloutRow,
    RolloutState, StoreError, TokenRow,
};

const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
const MAX_TOKEN_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
const MAX_EVENT_LIMIT: u32 = 10_000;
const MAX_BATCH_SIZE: u32 = 100_000;
const MAX_OFFLINE_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);

pub struct AdminApi {
    s: Arc<Shared>,
}

impl AdminApi {
    pub fn new(s: Arc<Shared>) -> Self {
        AdminApi { s }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn invalid(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

fn check_labels(what: &str, l: &HashMap<String, String>) -> Result<Labels, Status> {
    if l.len() > MAX_LABELS {
        return Err(invalid(format!(
            "{what}: {} labels; the limit is {MAX_LABELS}",
            l.len()
        )));
    }
    for (k, v) in l {
        validate_label(k, v).map_err(|e| invalid(format!("{what}: {e}")))?;
    }
    Ok(l.clone().into_iter().collect())
}

fn random_id() -> String {
    let mut b = [0u8; 6];
    let _ = getrandom::getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn create_cluster(
        &self,
        req: Request<pb::CreateClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let _t = self.s.metrics.timer("CreateCluster");
        let who = require_admin(&req)?;
        let c = clusters::create(&self.s, req.into_inner(), &who, now_ms()).await?;
        Ok(Response::new(policy::cluster_pb(c, now_ms())))
    }

    async fn set_cluster(
        &self,
        req: Request<pb::SetClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let _t = self.s.metrics.timer("SetCluster");
        let who = require_admin(&req)?;
        let r = req.into_inner();
        validate_cluster_name(&r.name).map_err(invalid)?;
        let name = r.name.clone();
        let wants_windows = r.clear_maintenance_windows || !r.maintenance_windows.is_empty();
        let change = clusters::check_change(&self.s, &r).await?;
        if !wants_windows && change.is_empty() {
            return Err(invalid(
                "nothing to set: give --maintenance-window (repeatable), --no-maintenance-window, \
                 --api-server, --no-api-server, --ca-cert with --ca-key, --generate-ca, \
                 --peer-sharing, --peer-port, --peer-upload-rate or --peer-max-uploads",
            ));
        }
        // Windows are checked before anything is stored.
        let windows = if wants_windows {
            Some(policy::check_windows(&r)?)
        } else {
            None
        };
        let mut row = clusters::apply_change(&self.s, &name, change, &who, now_ms()).await?;
        if let Some(w) = windows {
            let c = policy::set_windows(self.s.store.as_ref(), &name, w, &who, now_ms()).await?;
            tracing::info!(cluster = %name, admin = %who, windows = ?c.maintenance_windows, "maintenance windows set");
            // Rollouts waiting for a window may start at once, or must stop starting.
            self.s.rollouts_changed.notify_one();
            row = Some(c);
        }
        let c = row.ok_or_else(|| Status::internal("set cluster: nothing was changed"))?;
        Ok(Response::new(policy::cluster_pb(c, now_ms())))
    }

    async fn get_cluster_ca(
        &self,
        req: Request<pb::GetClusterCaRequest>,
    ) -> Result<Response<pb::GetClusterCaResponse>, Status> {
        let _t = self.s.metrics.timer("GetClusterCa");
        require_admin(&req)?;
        let name = req.into_inner().name;
        Ok(Response::new(pb::GetClusterCaResponse {
            ca_cert_pem: clusters::ca_pem(&self.s, &name).await?,
        }))
    }

    async fn list_certificates(
        &self,
        req: Request<pb::ListCertificatesRequest>,
    ) -> Result<Response<pb::ListCertificatesResponse>, Status> {
        let _t = self.s.metrics.timer("ListCertificates");
        require_admin(&req)?;
        Ok(Response::new(pb::ListCertificatesResponse {
            certificates: clusters::list(&self.s, req.into_inner(), now_ms()).await?,
        }))
    }

    async fn list_clusters(
        &self,
        req: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let _t = self.s.metrics.timer("ListClusters");
        require_admin(&req)?;
        let clusters = self.s.store.list_clusters().await.map_err(store_status)?;
        let now = now_ms();
        Ok(Response::new(pb::ListClustersResponse {
            clusters: clusters.into_iter().map(|c| policy::cluster_pb(c, now)).collect(),
        }))
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let _t = self.s.metrics.timer("CreateToken");
        require_admin(&req)?;
        let r = req.into_inner();
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
        self.s
            .store
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
        let ca_hash = self.s.pki.ca_hash().to_string();
        // Every replica, so the agent can fail over between them.
        let servers = self.s.join_servers();
        let join_command =
            format!("lksadmin-agent join --server {servers} --token {token} --ca-cert-hash {ca_hash}");
        tracing::info!(cluster = %r.cluster, token_id = %token.id(), "bootstrap token created");
        Ok(Response::new(pb::CreateTokenResponse {
            token: token.to_string(),
            ca_cert_hash: ca_hash,
            server: servers.clone(),
            join_command,
            expires_at: expires_at_ms / 1000,
            ca_cert_pem: self.s.pki.ca_pem().to_string(),
            agent_packages: self
                .s
                .agent_packages
                .list()
                .iter()
                // Where VMs can reach: the first join URL (this replica's
                // own unless --join-url names a load balancer).
                .map(|p| p.to_pb(servers.split(',').next().unwrap_or(&self.s.server_url)))
                .collect(),
        }))
    }

    async fn publish_bundle(
        &self,
        req: Request<Streaming<pb::PublishBundleRequest>>,
    ) -> Result<Response<pb::PublishBundleResponse>, Status> {
        let _t = self.s.metrics.timer("PublishBundle");
        require_admin(&req)?;
        let mut inbound = req.into_inner();
        let header = match inbound.message().await? {
            Some(pb::PublishBundleRequest {
                msg: Some(PublishMsg::Header(h)),
            }) => h,
            Some(_) => {
                return Err(invalid(
                    "the first message of a publish must be the bundle header",
                ));
            }
            None => return Err(invalid("empty publish stream")),
        };
        let signed =
            SignedBundle::try_from(header).map_err(|e| invalid(format!("invalid bundle manifest: {e}")))?;
        if signed.signature.is_some() {
            sign::verify(&signed, &[]).map_err(invalid)?;
        }
        let m = &signed.manifest;
        let id = m.id();
        let manifest_digest = canonical::manifest_digest(m).to_string();
        if let Some(existing) = self
            .s
            .store
            .get_bundle(&m.name, &m.version)
            .await
            .map_err(store_status)?
        {
            if existing.manifest_digest != manifest_digest {
                return Err(Status::already_exists(format!(
                    "bundle {id} already exists with other content; versions are immutable, publish a new version"
                )));
            }
            // Identical: read the rest so the client sees a clean close.
            while inbound.message().await?.is_some() {}
            return Ok(Response::new(pb::PublishBundleResponse {
                name: m.name.clone(),
                version: m.version.clone(),
                created: false,
            }));
        }

        // The bytes the server must hold: files without a mirror URL.
        let mut expected: BTreeMap<Digest, u64> = BTreeMap::new();
        for (i, f) in m.files.iter().enumerate().filter(|(_, f)| f.url.is_none()) {
            if let Some(size) = expected.insert(f.digest, f.size)
                && size != f.size
            {
                return Err(invalid(format!(
                    "file[{i}]: digest {} is listed with two different sizes",
                    f.digest
                )));
            }
        }
        // The target path of a served blob, for error messages.
        let path_of = |d: &Digest| {
            m.files
                .iter()
                .find(|f| f.digest == *d)
                .map(|f| f.path.to_string())
                .unwrap_or_default()
        };
        if let Some(max) = self.s.blobs.store().max_blob_size()
            && let Some((d, size)) = expected.iter().find(|(_, size)| **size > max)
        {
            return Err(invalid(format!(
                "{}: {}",
                path_of(d),
                BlobError::TooLarge {
                    digest: *d,
                    size: *size,
                    max
                }
            )));
        }
        // Chunk lists are checked against the bytes like the digests are:
        // a list that does not describe its file would make every peer
        // that serves it look like a liar.
        let mut lists: BTreeMap<Digest, &lks_proto::chunks::Chunks> = BTreeMap::new();
        for (i, f) in m.files.iter().enumerate() {
            if let Some(c) = &f.chunks
                && let Some(other) = lists.insert(f.digest, c)
                && other != c
            {
                return Err(invalid(format!(
                    "file[{i}]: digest {} is listed with two different chunk lists",
                    f.digest
                )));
            }
        }
        let mut pieces: Option<ChunkHasher> = None;
        let mut done: HashSet<Digest> = HashSet::new();
        let mut current: Option<BlobWriter> = None;
        let mut staged: Vec<StagedBlob> = Vec::new();
        // Large blobs also stream into the blob store as they arrive
        // (visible there only once verified and claimed, below).
        let mut uploads = Uploads::default();
        let mut streaming: Option<Box<dyn Upload>> = None;
        let received: Result<(), Status> = async {
            while let Some(msg) = inbound.message().await? {
                let chunk = match msg.msg {
                    Some(PublishMsg::Chunk(c)) => c,
                    Some(PublishMsg::Header(_)) => {
                        return Err(invalid("a publish carries exactly one header"));
                    }
                    None => return Err(invalid("empty message in publish stream")),
                };
                let d: Digest = chunk
                    .digest
                    .parse()
                    .map_err(|e| invalid(format!("chunk digest: {e}")))?;
                if current.as_ref().map(BlobWriter::digest) != Some(d) {
                    if let Some(w) = current.take() {
                        check_pieces(&path_of(&w.digest()), lists.get(&w.digest()), pieces.take())?;
                        end_blob(w, streaming.take(), &mut done, &mut staged, &mut uploads).await?;
                    }
                    if done.contains(&d) {
                        return Err(invalid(format!("chunks of {d} are not contiguous")));
                    }
                    let size = *expected.get(&d).ok_or_else(|| {
                        invalid(format!(
                            "upload of {d}, which is not a file of {id} (or is fetched from a mirror URL)"
                        ))
                    })?;
                    current = Some(
                        self.s
                            .blobs
                            .local
                            .writer(d, size)
                            .await
                            .map_err(|e| Status::internal(e.to_string()))?,
                    );
                    pieces = lists.get(&d).map(|c| ChunkHasher::new(c.size));
                    streaming = self
                        .s
                        .blobs
                        .store()
                        .start_upload(&d, size)
                        .await
                        .map_err(|e| blob_status(&path_of(&d), e))?;
                }
                if let Some(p) = pieces.as_mut() {
                    p.update(&chunk.data);
                }
                if let Some(w) = current.as_mut() {
                    w.write(&chunk.data)
                        .await
                        .map_err(|e| invalid(format!("upload rejected: {e}")))?;
                }
                if let Some(up) = streaming.as_mut() {
                    up.write(&chunk.data)
                        .await
                        .map_err(|e| blob_status(&path_of(&d), e))?;
                }
            }
            if let Some(w) = current.take() {
                check_pieces(&path_of(&w.digest()), lists.get(&w.digest()), pieces.take())?;
                end_blob(w, streaming.take(), &mut done, &mut staged, &mut uploads).await?;
            }
            Ok(())
        }
        .await;
        if let Err(st) = received {
            if let Some(up) = streaming.take() {
                up.abort().await;
            }
            uploads.abort_all().await;
            return Err(st);
        }
        let prepared: Result<(), Status> = async {
            // Blobs the server held already: their lists against the copy.
            for (d, c) in lists.iter().filter(|(d, _)| !done.contains(*d)) {
                let p = self.s.blobs.local.path(d);
                if !p.is_file() {
                    continue; // not uploaded: refused below
                }
                let size = c.size;
                let read = tokio::task::spawn_blocking(move || {
                    std::fs::File::open(&p).and_then(|f| lks_proto::chunks::Chunks::of_reader(f, size))
                })
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::internal(format!("read blob {d}: {e}")))?;
                check_list(&path_of(d), c, &read.2)?;
            }
            for (d, size) in &expected {
                if done.contains(d) || self.s.blobs.local.contains(d) {
                    continue;
                }
                if *size == 0 {
                    let w = self
                        .s
                        .blobs
                        .local
                        .writer(*d, 0)
                        .await
                        .map_err(|e| Status::internal(e.to_string()))?;
                    staged.push(
                        w.stage()
                            .await
                            .map_err(|e| invalid(format!("upload rejected: {e}")))?,
                    );
                    continue;
                }
                return Err(invalid(format!(
                    "the bytes of {} ({d}) were not uploaded",
                    path_of(d)
                )));
            }

            // Claimed before they take their local names: from here on no
            // garbage collector deletes them (blobs/gc.rs).
            let store_name = self.s.blobs.store().describe();
            for (d, size) in &expected {
                crate::blobs::gc::claim(&*self.s.store, &store_name, d, *size, now_ms)
                    .await
                    .map_err(|e| blob_status(&path_of(d), e))?;
            }
            // Every byte is verified: only now do the blobs enter the store, so
            // a publish refused halfway leaves none behind.
            for b in staged {
                b.commit()
                    .await
                    .map_err(|e| Status::internal(format!("store blob: {e}")))?;
            }
            Ok(())
        }
        .await;
        if let Err(st) = prepared {
            uploads.abort_all().await;
            return Err(st);
        }
        // Streamed uploads complete now that their blobs are verified and
        // claimed (or are dropped if another publish stored the blob).
        let mut in_store: HashSet<Digest> = HashSet::new();
        while let Some((d, up)) = uploads.0.pop() {
            in_store.insert(d);
            let done = match self.s.blobs.store().contains(&d).await {
                Ok(true) => {
                    up.abort().await;
                    Ok(())
                }
                Ok(false) => up.finish().await.map(|()| {
                    self.s
                        .metrics
                        .blob_bytes_stored(expected.get(&d).copied().unwrap_or(0));
                }),
                Err(e) => {
                    up.abort().await;
                    Err(e)
                }
            };
            if let Err(e) = done {
                uploads.abort_all().await;
                return Err(blob_status(&path_of(&d), e));
            }
        }
        // The rest into the blob store before the bundle is recorded, so
        // any replica can serve them once publish answers (blobs/mod.rs).
        for (d, size) in expected.iter().filter(|(d, _)| !in_store.contains(*d)) {
            let uploaded = self
                .s
                .blobs
                .persist(d, *size)
                .await
                .map_err(|e| blob_status(&path_of(d), e))?;
            if uploaded {
                self.s.metrics.blob_bytes_stored(*size);
            }
        }
        let outcome = self
            .s
            .store
            .put_bundle(NewBundle {
                name: m.name.clone(),
                version: m.version.clone(),
                signed_bundle: pb::SignedBundle::from(&signed).encode_to_vec(),
                manifest_digest,
                signed: signed.signature.is_some(),
                files: m.files.len() as u32,
                total_size: m.total_size(),
                blob_digests: expected.keys().map(ToString::to_string).collect(),
                now_ms: now_ms(),
            })
            .await
            .map_err(store_status)?;
        let created = outcome == PutOutcome::Created;
        if created {
            self.s
                .store
                .add_event(EventRow::bundle(
                    "bundle_published",
                    &m.name,
                    &m.version,
                    format!("{} file(s), {} bytes", m.files.len(), m.total_size()),
                    now_ms(),
                ))
                .await
                .map_err(store_status)?;
            tracing::info!(bundle = %id, signed = signed.signature.is_some(), "bundle published");
        }
        Ok(Response::new(pb::PublishBundleResponse {
            name: m.name.clone(),
            version: m.version.clone(),
            created,
        }))
    }

    async fn list_bundles(
        &self,
        req: Request<pb::ListBundlesRequest>,
    ) -> Result<Response<pb::ListBundlesResponse>, Status> {
        let _t = self.s.metrics.timer("ListBundles");
        require_admin(&req)?;
        let name = req.into_inner().name;
        let rows = self
            .s
            .store
            .list_bundles((!name.is_empty()).then_some(name.as_str()))
            .await
            .map_err(store_status)?;
        Ok(Response::new(pb::ListBundlesResponse {
            bundles: rows.into_iter().map(bundle_info).collect(),
        }))
    }

    async fn get_bundle(&self, req: Request<pb::GetBundleRequest>) -> Result<Response<pb::Bundle>, Status> {
        let _t = self.s.metrics.timer("GetBundle");
        require_admin(&req)?;
        let row = self.published(&req.into_inner()).await?;
        let bundle = pb::SignedBundle::decode(row.signed_bundle.as_slice())
            .map_err(|e| Status::internal(format!("stored bundle: {e}")))?;
        Ok(Response::new(pb::Bundle {
            info: Some(bundle_info(row)),
            bundle: Some(bundle),
        }))
    }

    async fn delete_bundle(
        &self,
        req: Request<pb::GetBundleRequest>,
    ) -> Result<Response<pb::DeleteBundleResponse>, Status> {
        let _t = self.s.metrics.timer("DeleteBundle");
        let who = require_admin(&req)?;
        let r = req.into_inner();
        let row = self.published(&r).await?;
        let id = format!("{}@{}", r.name, r.version);
        self.s
            .store
            .delete_bundle(&r.name, &r.version)
            .await
            .map_err(|e| match e {
                StoreError::NotFound(_) => Status::not_found(format!("bundle {id} is not published")),
                e => store_status(e),
            })?;
        let (still, _) = self.s.store.referenced_blobs().await.map_err(store_status)?;
        let reclaimable_bytes = held_blobs(&row.signed_bundle)
            .iter()
            .filter(|(d, _)| !still.contains(d))
            .map(|(_, size)| size)
            .sum();
        self.s
            .store
            .add_event(EventRow::bundle(
                "bundle_deleted",
                &r.name,
                &r.version,
                format!("by {who}; {reclaimable_bytes} bytes to reclaim"),
                now_ms(),
            ))
            .await
            .map_err(store_status)?;
        tracing::info!(bundle = %id, by = %who, reclaimable_bytes, "bundle deleted");
        Ok(Response::new(pb::DeleteBundleResponse {
            name: r.name,
            version: r.version,
            reclaimable_bytes,
        }))
    }

    async fn start_rollout(
        &self,
        req: Request<pb::StartRolloutRequest>,
    ) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("StartRollout");
        let who = require_admin(&req)?;
        let r = req.into_inner();
        validate_cluster_name(&r.cluster).map_err(invalid)?;
        validate_bundle_name(&r.bundle).map_err(invalid)?;
        validate_version(&r.version).map_err(invalid)?;
        let selector = check_labels("selector", &r.selector)?;
        let bundle = self
            .s
            .store
            .get_bundle(&r.bundle, &r.version)
            .await
            .map_err(store_status)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "bundle {}@{} is not published; publish it with `lksctl bundle publish DIR`",
                    r.bundle, r.version
                ))
            })?;
        let cluster = self
            .s
            .store
            .get_cluster(&r.cluster)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("cluster {} does not exist", r.cluster)))?;
        identity_preconditions(&cluster, &decode_manifest(&bundle.signed_bundle)?)?;
        if r.batch_size > MAX_BATCH_SIZE {
            return Err(invalid(format!(
                "batch size {} is larger than the limit of {MAX_BATCH_SIZE}",
                r.batch_size
            )));
        }
        let offline_deadline = if r.offline_deadline_seconds == 0 {
            rollout::DEFAULT_OFFLINE_DEADLINE
        } else {
            Duration::from_secs(r.offline_deadline_seconds)
        };
        if offline_deadline > MAX_OFFLINE_DEADLINE {
            return Err(invalid("offline deadline is longer than the limit of 7 days"));
        }
        self.check_path_conflicts(&r.cluster, &selector, &bundle).await?;
        let matched = policy::matched_nodes(self.s.store.as_ref(), &r.cluster, &selector).await?;
        let policy = policy::policy(&r, matched)?;
        if policy.ignore_windows {
            tracing::warn!(cluster = %r.cluster, bundle = %r.bundle, admin = %who, "rollout ignores maintenance windows");
        }
        let row = self
            .s
            .rollouts
            .start(NewRollout {
                id: random_id(),
                cluster: r.cluster,
                bundle: r.bundle,
                version: r.version,
                selector,
                batch_size: r.batch_size,
                failure_threshold: if r.failure_threshold == 0 {
                    rollout::DEFAULT_FAILURE_THRESHOLD
                } else {
                    r.failure_threshold
                },
                offline_deadline_ms: offline_deadline.as_millis() as u64,
                policy,
                started_by: who,
                now_ms: now_ms(),
            })
            .await?;
        Ok(Response::new(rollout_pb(&row)))
    }

    async fn get_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("GetRollout");
        require_admin(&req)?;
        let row = self.load_rollout(&req.into_inner().id).await?;
        Ok(Response::new(rollout_pb(&row)))
    }

    type WatchRolloutStream = BoxStream<pb::Rollout>;

    async fn watch_rollout(
        &self,
        req: Request<pb::RolloutRef>,
    ) -> Result<Response<Self::WatchRolloutStream>, Status> {
        let _t = self.s.metrics.timer("WatchRollout");
        require_admin(&req)?;
        let id = req.into_inner().id;
        let first = self.load_rollout(&id).await?;
        let (tx, rx) = mpsc::channel(4);
        let s = self.s.clone();
        let mut updates = s.rollout_updates.subscribe();
        self.s.tasks.spawn(async move {
            let mut last: Option<pb::Rollout> = None;
            let mut row = first;
            loop {
                let p = rollout_pb(&row);
                if last.as_ref() != Some(&p) {
                    if tx.send(Ok(p.clone())).await.is_err() {
                        return;
                    }
                    last = Some(p);
                }
                // An ended rollout may still have nodes finishing their
                // apply; the watch ends once none is left.
                if row.state.is_terminal() && counts(&row).applying == 0 {
                    return;
                }
                tokio::select! {
                    _ = s.cancel.cancelled() => return,
                    _ = tx.closed() => return,
                    _ = updates.changed() => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
                row = match s.store.get_rollout(&row.id).await {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(store_status(e))).await;
                        return;
                    }
                };
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_rollouts(
        &self,
        req: Request<pb::ListRolloutsRequest>,
    ) -> Result<Response<pb::ListRolloutsResponse>, Status> {
        let _t = self.s.metrics.timer("ListRollouts");
        require_admin(&req)?;
        let cluster = req.into_inner().cluster;
        let rows = self
            .s
            .store
            .list_rollouts((!cluster.is_empty()).then_some(cluster.as_str()), false)
            .await
            .map_err(store_status)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(rollout_pb(&r));
        }
        Ok(Response::new(pb::ListRolloutsResponse { rollouts: out }))
    }

    async fn pause_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("PauseRollout");
        require_admin(&req)?;
        self.verb(req.into_inner().id, Verb::Pause).await
    }

    async fn resume_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("ResumeRollout");
        require_admin(&req)?;
        self.verb(req.into_inner().id, Verb::Resume).await
    }

    async fn abort_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("AbortRollout");
        require_admin(&req)?;
        self.verb(req.into_inner().id, Verb::Abort).await
    }

    async fn rollback_rollout(&self, req: Request<pb::RolloutRef>) -> Result<Response<pb::Rollout>, Status> {
        let _t = self.s.metrics.timer("RollbackRollout");
        require_admin(&req)?;
        let id = req.into_inner().id;
        // The versions a rollback returns nodes to must still exist: a
        // deleted one (`bundle delete`, allowed once the rollout finished)
        // is named rather than assigned.
        let r = self.load_rollout(&id).await?;
        let previous: HashSet<&str> = r
            .nodes
            .iter()
            .filter(|n| n.touched && !n.previous_version.is_empty())
            .map(|n| n.previous_version.as_str())
            .collect();
        for v in previous {
            if self
                .s
                .store
                .get_bundle(&r.bundle, v)
                .await
                .map_err(store_status)?
                .is_none()
            {
                return Err(Status::failed_precondition(format!(
                    "rollout {id} cannot be rolled back: it would return nodes to {}@{v}, which was deleted; \
                     publish that version again, or roll the nodes forward with a new rollout",
                    r.bundle
                )));
            }
        }
        self.verb(id, Verb::Rollback).await
    }

    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let _t = self.s.metrics.timer("ListNodes");
        require_admin(&req)?;
        let cluster = req.into_inner().cluster;
        if !cluster.is_empty()
            && !self
                .s
                .store
                .cluster_exists(&cluster)
                .await
                .map_err(store_status)?
        {
            return Err(Status::not_found(format!("cluster {cluster} does not exist")));
        }
        let rows = self
            .s
            .store
            .list_nodes((!cluster.is_empty()).then_some(cluster.as_str()))
            .await
            .map_err(store_status)?;
        // Each node's newest certificate per bundle and path, so `node
        // list` can say which nodes hold expired ones.
        let now = now_ms();
        let mut certs: HashMap<String, Vec<pb::IssuedCertificate>> = HashMap::new();
        let issued = self
            .s
            .store
            .list_certificates((!cluster.is_empty()).then_some(cluster.as_str()), None)
            .await
            .map_err(store_status)?;
        for c in clusters::newest_only(issued) {
            certs
                .entry(c.node.clone())
                .or_default()
                .push(clusters::cert_pb(c, now));
        }
        Ok(Response::new(pb::ListNodesResponse {
            nodes: rows
                .into_iter()
                .map(|n| {
                    let mine = certs.remove(&n.name).unwrap_or_default();
                    pb::Node {
                        certificates: mine,
                        ..node_pb(&self.s, n)
                    }
                })
                .collect(),
        }))
    }

    async fn get_node(&self, req: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.s.metrics.timer("GetNode");
        require_admin(&req)?;
        let name = req.into_inner().name;
        validate_node_name(&name).map_err(invalid)?;
        let row = self
            .s
            .store
            .get_node(&name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("node {name} does not exist")))?;
        let certificates = clusters::node_certs(&self.s, &row.cluster, &row.name, now_ms()).await?;
        Ok(Response::new(pb::Node {
            certificates,
            ..node_pb(&self.s, row)
        }))
    }

    async fn delete_node(
        &self,
        req: Request<pb::DeleteNodeRequest>,
    ) -> Result<Response<pb::DeleteNodeResponse>, Status> {
        let _t = self.s.metrics.timer("DeleteNode");
        require_admin(&req)?;
        let name = req.into_inner().name;
        validate_node_name(&name).map_err(invalid)?;
        if !self.s.store.delete_node(&name).await.map_err(store_status)? {
            return Err(Status::not_found(format!("node {name} does not exist")));
        }
        self.s.hub.kick(&name);
        self.s.rollouts_changed.notify_one();
        tracing::info!(node = %name, "node deleted; its certificate no longer works");
        Ok(Response::new(pb::DeleteNodeResponse {}))
    }

    async fn hold_node(&self, req: Request<pb::HoldNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.s.metrics.timer("HoldNode");
        let who = require_admin(&req)?;
        let r = req.into_inner();
        validate_node_name(&r.name).map_err(invalid)?;
        policy::check_reason(&r.reason)?;
        self.set_hold(&r.name, Some(r.reason), &who).await
    }

    async fn retry_node(
        &self,
        req: Request<pb::RetryNodeRequest>,
    ) -> Result<Response<pb::RetryNodeResponse>, Status> {
        let _t = self.s.metrics.timer("RetryNode");
        let who = require_admin(&req)?;
        let r = req.into_inner();
        validate_node_name(&r.name).map_err(invalid)?;
        if !r.bundle.is_empty() {
            validate_bundle_name(&r.bundle).map_err(invalid)?;
        }
        let bundles = self
            .s
            .store
            .retry_node(
                &r.name,
                (!r.bundle.is_empty()).then_some(r.bundle.as_str()),
                &who,
                now_ms(),
            )
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("node {} does not exist", r.name)))?;
        if bundles.is_empty() {
            return Err(Status::failed_precondition(format!(
                "node {} has no bundle to retry",
                r.name
            )));
        }
        self.s.hub.notify(&r.name);
        tracing::info!(node = %r.name, admin = %who, ?bundles, "retry requested");
        Ok(Response::new(pb::RetryNodeResponse { bundles }))
    }

    async fn unhold_node(&self, req: Request<pb::UnholdNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let _t = self.s.metrics.timer("UnholdNode");
        let who = require_admin(&req)?;
        let name = req.into_inner().name;
        validate_node_name(&name).map_err(invalid)?;
        self.set_hold(&name, None, &who).await
    }

    async fn list_events(
        &self,
        req: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        let _t = self.s.metrics.timer("ListEvents");
        require_admin(&req)?;
        let r = req.into_inner();
        let opt = |s: String| (!s.is_empty()).then_some(s);
        let rows = self
            .s
            .store
            .list_events(EventFilter {
                cluster: opt(r.cluster),
                node: opt(r.node),
                rollout_id: opt(r.rollout_id),
                limit: r.limit.min(MAX_EVENT_LIMIT),
            })
            .await
            .map_err(store_status)?;
        Ok(Response::new(pb::ListEventsResponse {
            events: rows
                .into_iter()
                .map(|e| pb::Event {
                    id: e.id,
                    at_ms: e.at_ms,
                    cluster: e.cluster,
                    node: e.node,
                    rollout_id: e.rollout_id,
                    kind: e.kind,
                    bundle: e.bundle,
                    version: e.version,
                    message: e.message,
                })
                .collect(),
        }))
    }
}

impl AdminApi {
    async fn set_hold(
        &self,
        name: &str,
        hold: Option<String>,
        who: &str,
    ) -> Result<Response<pb::Node>, Status> {
        let event = EventRow::hold("", name, hold.as_deref(), who, now_ms());
        let held = hold.is_some();
        if !self
            .s
            .store
            .set_node_hold(name, hold, event)
            .await
            .map_err(store_status)?
        {
            return Err(Status::not_found(format!("node {name} does not exist")));
        }
        tracing::info!(node = %name, admin = %who, held, "node hold changed");
        // A released node may catch up now.
        self.s.rollouts_changed.notify_one();
        let row = self
            .s
            .store
            .get_node(name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("node {name} does not exist")))?;
        Ok(Response::new(node_pb(&self.s, row)))
    }

    async fn verb(&self, id: String, verb: Verb) -> Result<Response<pb::Rollout>, Status> {
        if id.is_empty() || id.len() > 64 {
            return Err(invalid("rollout ID is empty or too long"));
        }
        let row = self.s.rollouts.verb(&id, verb).await?;
        tracing::info!(rollout = %id, ?verb, state = row.state.as_str(), "operator verb applied");
        Ok(Response::new(rollout_pb(&row)))
    }

    /// The published version a request names; `not_found` if there is none.
    async fn published(&self, r: &pb::GetBundleRequest) -> Result<BundleRow, Status> {
        validate_bundle_name(&r.name).map_err(invalid)?;
        validate_version(&r.version).map_err(invalid)?;
        self.s
            .store
            .get_bundle(&r.name, &r.version)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("bundle {}@{} is not published", r.name, r.version)))
    }

    async fn load_rollout(&self, id: &str) -> Result<RolloutRow, Status> {
        if id.is_empty() || id.len() > 64 {
            return Err(invalid("rollout ID is empty or too long"));
        }
        self.s
            .store
            .get_rollout(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("rollout {id} does not exist")))
    }

    /// Two bundles on one node may not own the same path (DESIGN §4): the
    /// new version is checked against every other bundle of each target node.
    async fn check_path_conflicts(
        &self,
        cluster: &str,
        selector: &Labels,
        bundle: &BundleRow,
    ) -> Result<(), Status> {
        let new = decode_manifest(&bundle.signed_bundle)?;
        let mut cache: HashMap<(String, String), Manifest> = HashMap::new();
        let nodes = self
            .s
            .store
            .list_nodes(Some(cluster))
            .await
            .map_err(store_status)?;
        // Versions a rollout of another bundle will still give a node count
        // as if they were assigned already: nodes an active rollout has not
        // started, and the deferred or held nodes a completed one may still
        // catch up.
        let mut coming: HashMap<&str, Vec<(String, String)>> = HashMap::new();
        // The rollouts still driven are the ones that may yet assign.
        let driven = self.s.store.rollouts_to_drive().await.map_err(store_status)?;
        for r in driven.iter().filter(|r| {
            r.cluster == cluster
                && r.bundle != new.name
                && r.state != RolloutState::RollingBack
                && r.needs_driving()
        }) {
            for rn in r.nodes.iter().filter(|rn| rn.startable()) {
                coming
                    .entry(rn.name.as_str())
                    .or_default()
                    .push((r.bundle.clone(), r.version.clone()));
            }
        }
        for n in nodes.iter().filter(|n| selector_matches(selector, &n.labels)) {
            // What this node would install: its architecture's variant. A
            // node the bundle has no variant for fails at its turn instead.
            let arch = crate::store::facts_architecture(&n.facts_json);
            let Ok(new) = new.for_arch(arch) else { continue };
            let mut paths: Vec<(String, lks_proto::BundlePath)> = new
                .owned_paths()
                .into_iter()
                .map(|p| (new.name.clone(), p.clone()))
                .collect();
            let mut others: Vec<(String, String)> = n
                .desired
                .iter()
                .filter(|(b, _)| **b != new.name)
                .map(|(b, v)| (b.clone(), v.clone()))
                .collect();
            others.extend(coming.get(n.name.as_str()).into_iter().flatten().cloned());
            for key in &others {
                if !cache.contains_key(key) {
                    let (b, v) = key;
                    let row = self
                        .s
                        .store
                        .get_bundle(b, v)
                        .await
                        .map_err(store_status)?
                        .ok_or_else(|| Status::internal(format!("assigned bundle {b}@{v} is missing")))?;
                    cache.insert(key.clone(), decode_manifest(&row.signed_bundle)?);
                }
            }
            for key in &others {
                if let Some(m) = cache.get(key).and_then(|m| m.for_arch(arch).ok()) {
                    paths.extend(m.owned_paths().into_iter().map(|p| (m.name.clone(), p.clone())));
                }
            }
            if let Err((i, why)) = check_paths_disjoint(paths.iter().map(|(_, p)| p)) {
                return Err(Status::failed_precondition(format!(
                    "node {}: bundle {} conflicts with bundle {}: {why}",
                    n.name, new.name, paths[i].0
                )));
            }
        }
        Ok(())
    }
}

/// A bundle with `[[certificate]]` needs a cluster CA to sign them, and
/// one with `[[kubeconfig]]` the tenant API server's address: refused
/// before any node is asked, rather than failing on every node.
fn identity_preconditions(cluster: &ClusterRow, m: &Manifest) -> Result<(), Status> {
    let c = &cluster.name;
    if !m.certificates.is_empty() && cluster.ca_cert_pem.is_none() {
        return Err(Status::failed_precondition(format!(
            "bundle {} has [[certificate]] entries but cluster {c} has no CA to sign them; \
             give it one with `lksctl cluster set {c} --generate-ca` (or --ca-cert and --ca-key)",
            m.id()
        )));
    }
    if !m.kubeconfigs.is_empty() && cluster.api_server.is_none() {
        return Err(Status::failed_precondition(format!(
            "bundle {} has [[kubeconfig]] entries but cluster {c} has no API server address; \
             set one with `lksctl cluster set {c} --api-server URL`",
            m.id()
        )));
    }
    Ok(())
}

fn decode_manifest(bytes: &[u8]) -> Result<Manifest, Status> {
    let pb = pb::SignedBundle::decode(bytes).map_err(|e| Status::internal(format!("stored bundle: {e}")))?;
    SignedBundle::try_from(pb)
        .map(|b| b.manifest)
        .map_err(|e| Status::internal(format!("stored bundle: {e}")))
}

/// The last chunk of a blob of a publish arrived: it is verified and
/// staged, and its streamed upload (if any) waits for the claim.
/// Refuses an upload whose bytes do not match the chunk list of its file.
fn check_pieces(
    path: &str,
    list: Option<&&lks_proto::chunks::Chunks>,
    pieces: Option<ChunkHasher>,
) -> Result<(), Status> {
    match (list, pieces) {
        (Some(list), Some(p)) => check_list(path, list, &p.finish()),
        _ => Ok(()),
    }
}

fn check_list(
    path: &str,
    list: &lks_proto::chunks::Chunks,
    got: &lks_proto::chunks::Chunks,
) -> Result<(), Status> {
    match list.digests.iter().zip(&got.digests).position(|(a, b)| a != b) {
        None if list.digests.len() == got.digests.len() => Ok(()),
        i => Err(invalid(format!(
            "upload rejected: {path}: chunk {} does not match the manifest's chunk list",
            i.unwrap_or(list.digests.len().min(got.digests.len()))
        ))),
    }
}

async fn end_blob(
    w: BlobWriter,
    streaming: Option<Box<dyn Upload>>,
    done: &mut HashSet<Digest>,
    staged: &mut Vec<StagedBlob>,
    uploads: &mut Uploads,
) -> Result<(), Status> {
    let digest = w.digest();
    done.insert(digest);
    match w.stage().await {
        Ok(b) => staged.push(b),
        Err(e) => {
            // Not the blob: its upload never completes.
            if let Some(up) = streaming {
                up.abort().await;
            }
            return Err(invalid(format!("upload rejected: {e}")));
        }
    }
    if let Some(up) = streaming {
        uploads.0.push((digest, up));
    }
    Ok(())
}

/// Uploads a publish streamed into the blob store, not yet completed.
#[derive(Default)]
struct Uploads(Vec<(Digest, Box<dyn Upload>)>);

impl Uploads {
    /// A publish that fails leaves none of them behind in the store.
    async fn abort_all(&mut self) {
        for (_, up) in self.0.drain(..) {
            up.abort().await;
        }
    }
}

/// The distinct blobs a stored bundle version has the server hold, with
/// their sizes (files without a mirror URL).
fn held_blobs(signed_bundle: &[u8]) -> BTreeMap<Digest, u64> {
    pb::SignedBundle::decode(signed_bundle)
        .ok()
        .and_then(|p| SignedBundle::try_from(p).ok())
        .map(|b| {
            b.manifest
                .files
                .iter()
                .filter(|f| f.url.is_none())
                .map(|f| (f.digest, f.size))
                .collect()
        })
        .unwrap_or_default()
}

/// The architectures a stored bundle version is for (empty: any node).
fn bundle_arches(signed_bundle: &[u8]) -> Vec<String> {
    pb::SignedBundle::decode(signed_bundle)
        .ok()
        .and_then(|p| SignedBundle::try_from(p).ok())
        .map(|b| b.manifest.arches().iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

fn bundle_info(b: BundleRow) -> pb::BundleInfo {
    pb::BundleInfo {
        held_bytes: held_blobs(&b.signed_bundle).values().sum(),
        architectures: bundle_arches(&b.signed_bundle),
        name: b.name,
        version: b.version,
        files: b.files,
        total_size: b.total_size,
        signed: b.signed,
        published_at_ms: b.published_at_ms,
        manifest_digest: b.manifest_digest,
    }
}

fn node_pb(s: &Shared, n: NodeRow) -> pb::Node {
    let mut bundles = Vec::new();
    for (name, version) in &n.desired {
        match n.actual.get(name) {
            Some(a) if a.version == *version => bundles.push(pb::BundleStatus {
                name: name.clone(),
                version: version.clone(),
                state: pb::BundleState::from(a.state) as i32,
                message: a.message.clone(),
                updated_at_ms: a.updated_at_ms,
                fetched_from_server: a.fetched_from_server,
                fetched_from_peers: a.fetched_from_peers,
            }),
            _ => bundles.push(pb::BundleStatus {
                name: name.clone(),
                version: version.clone(),
                state: pb::BundleState::Pending as i32,
                message: String::new(),
                updated_at_ms: 0,
                fetched_from_server: 0,
                fetched_from_peers: 0,
            }),
        }
    }
    // Held but no longer desired: shown as reported until the node removes it.
    for (name, a) in n.actual.iter().filter(|(name, _)| !n.desired.contains_key(*name)) {
        bundles.push(pb::BundleStatus {
            name: name.clone(),
            version: a.version.clone(),
            state: pb::BundleState::from(a.state) as i32,
            message: a.message.clone(),
            updated_at_ms: a.updated_at_ms,
            fetched_from_server: a.fetched_from_server,
            fetched_from_peers: a.fetched_from_peers,
        });
    }
    let facts: serde_json::Value = serde_json::from_str(&n.facts_json).unwrap_or_default();
    let strings = |k: &str| -> Vec<String> {
        facts[k]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let text = |k: &str| {
        facts
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let num = |k: &str| {
        facts
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_default()
    };
    // Here, or (on etcd) on a live replica.
    let connected = n.connected || s.hub.is_connected(&n.name);
    let last_seen_ms = n.last_seen_ms.max(s.hub.last_heard(&n.name).unwrap_or(0));
    pb::Node {
        name: n.name,
        cluster: n.cluster,
        labels: n.labels.into_iter().collect(),
        connected,
        last_seen_ms,
        bundles,
        facts: (!n.facts_json.is_empty()).then(|| pb::NodeFactsView {
            hostname: text("hostname"),
            os: text("os"),
            kernel: text("kernel"),
            arch: text("arch"),
            architecture: text("architecture"),
            cpus: num("cpus") as u32,
            memory_bytes: num("memory_bytes"),
            agent_version: text("agent_version"),
            addresses: strings("addresses"),
            features: strings("features"),
        }),
        certificate_serial: n.cert_serial,
        enrolled_at_ms: n.enrolled_at_ms,
        held: n.hold.is_some(),
        hold_reason: n.hold.unwrap_or_default(),
        certificates: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(ca: bool, api: bool) -> ClusterRow {
        ClusterRow {
            name: "tenant-a".into(),
            created_at_ms: 0,
            node_count: 0,
            maintenance_windows: Vec::new(),
            ca_cert_pem: ca.then(|| "PEM".into()),
            api_server: api.then(|| "https://api:6443".into()),
            peer: crate::store::PeerSettings::default(),
        }
    }

    #[test]
    fn identity_bundles_need_a_ca_and_kubeconfigs_an_api_server() {
        let text = "name = \"id\"\nversion = \"1\"\n\
            [[certificate]]\npath = \"/a.crt\"\nkey_path = \"/a.key\"\nprofile = \"kubelet-client\"\n\
            [[kubeconfig]]\npath = \"/k.conf\"\ncertificate = \"/a.crt\"\n";
        let m = lks_proto::authoring::parse_bundle_toml(
            text,
            std::path::Path::new("/"),
            &mut lks_proto::authoring::RequireSize,
        )
        .unwrap()
        .manifest;
        identity_preconditions(&cluster(true, true), &m).unwrap();
        let e = identity_preconditions(&cluster(false, true), &m).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.message().contains("cluster tenant-a has no CA"),
            "{}",
            e.message()
        );
        let e = identity_preconditions(&cluster(true, false), &m).unwrap_err();
        assert!(
            e.message().contains("has no API server address"),
            "{}",
            e.message()
        );
        let plain = Manifest {
            name: "plain".into(),
            version: "1".into(),
            ..Default::default()
        };
        identity_preconditions(&cluster(false, false), &plain).unwrap();
    }
}
