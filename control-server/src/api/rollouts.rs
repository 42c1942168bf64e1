//! The admin API's rollouts: starting one (every precondition checked
//! before anything is stored: the bundle, the cluster's CA and API server
//! for identity bundles, path conflicts on every target node), reading and
//! watching them, and the operator verbs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lks_proto::Manifest;
use lks_proto::labels::{Labels, selector_matches};
use lks_proto::manifest::check_paths_disjoint;
use lks_proto::names::{validate_bundle_name, validate_cluster_name, validate_version};
use lks_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status};

use super::{BoxStream, check_labels, invalid, policy, rollout_pb};
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::controller;
use crate::rollout::{self, Verb, counts};
#[cfg(test)]
use crate::store::RolloutPolicy;
use crate::store::Store;
use crate::store::{BundleRow, ClusterRow, NewRollout, RolloutRow, RolloutState, StoredBundle};

const MAX_BATCH_SIZE: u32 = 100_000;
const MAX_OFFLINE_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);

/// What the rollout handlers use: the store, the controller's command
/// queue, the change signal `WatchRollout` follows, and the tasks that
/// stream a watch.
pub(super) struct Deps {
    pub store: Arc<dyn Store>,
    pub controller: controller::Handle,
    pub updates: tokio::sync::watch::Sender<u64>,
    pub cancel: tokio_util::sync::CancellationToken,
    pub tasks: tokio_util::task::TaskTracker,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            controller: s.rollouts.clone(),
            updates: s.rollout_updates.clone(),
            cancel: s.cancel.clone(),
            tasks: s.tasks.clone(),
        }
    }
}
/// `StartRollout`: every precondition is checked before the rollout is stored.
pub(super) async fn start(
    s: &Deps,
    r: pb::StartRolloutRequest,
    who: String,
) -> Result<Response<pb::Rollout>, Status> {
    validate_cluster_name(&r.cluster).map_err(invalid)?;
    validate_bundle_name(&r.bundle).map_err(invalid)?;
    validate_version(&r.version).map_err(invalid)?;
    let selector = check_labels("selector", &r.selector)?;
    check_request_id(&r.request_id)?;
    let id = if r.request_id.is_empty() {
        random_id()
    } else {
        let id = request_rollout_id(&r.request_id);
        if let Some(done) = s.store.get_rollout(&id).await.map_err(store_status)? {
            return same_request(&r, done).map(|d| Response::new(rollout_pb(&d)));
        }
        id
    };
    let bundle = s
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
    let cluster = s
        .store
        .get_cluster(&r.cluster)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("cluster {} does not exist", r.cluster)))?;
    identity_preconditions(&cluster, bundle.bundle.manifest())?;
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
    check_path_conflicts(s, &r.cluster, &selector, &bundle).await?;
    let matched = policy::matched_nodes(s.store.as_ref(), &r.cluster, &selector).await?;
    let mut policy = policy::policy(&r, matched)?;
    policy.drain = policy::drain_policy(&r, &cluster)?;
    if policy.drain.is_some() {
        every_replica_reads(s, DRAIN_FORMAT, "a rollout that drains").await?;
    }
    if policy.ignore_windows {
        tracing::warn!(cluster = %r.cluster, bundle = %r.bundle, admin = %who, "rollout ignores maintenance windows");
    }
    let row = s
        .controller
        .start(NewRollout {
            id,
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

/// How often a `WatchRollout` stream reads the cluster's nodes again for
/// what they fetched.
const FETCHED_EVERY: Duration = Duration::from_secs(2);

/// `WatchRollout`: the rollout each time it changes, until it ended and no node is applying.
pub(super) async fn watch(
    shared: &Arc<Deps>,
    req: pb::RolloutRef,
) -> Result<Response<BoxStream<pb::Rollout>>, Status> {
    let id = req.id;
    let first = load_rollout(shared, &id).await?;
    let (tx, rx) = mpsc::channel(4);
    let s = shared.clone();
    let mut updates = s.updates.subscribe();
    shared.tasks.spawn(async move {
        let mut last: Option<pb::Rollout> = None;
        let mut row = first;
        // What its nodes fetched (issue [delta]): the cluster's nodes read
        // at most every FETCHED_EVERY (a rollout's updates come faster),
        // and once more when it has ended.
        let mut fetched = (0, 0, 0);
        let mut fetched_at: Option<tokio::time::Instant> = None;
        loop {
            let mut p = rollout_pb(&row);
            let done = row.state.is_terminal() && counts(&row).applying == 0;
            if done || fetched_at.is_none_or(|t| t.elapsed() >= FETCHED_EVERY) {
                match nodes_of(&s, &row.cluster).await {
                    Ok(nodes) => {
                        let mut q = p.clone();
                        policy::add_fetched_by_nodes(&mut q, &nodes);
                        fetched = (q.fetched_from_server, q.fetched_as_delta, q.fetched_from_peers);
                        fetched_at = Some(tokio::time::Instant::now());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            (p.fetched_from_server, p.fetched_as_delta, p.fetched_from_peers) = fetched;
            if last.as_ref() != Some(&p) {
                if tx.send(Ok(p.clone())).await.is_err() {
                    return;
                }
                last = Some(p);
            }
            // An ended rollout may still have nodes finishing their
            // apply; the watch ends once none is left.
            if done {
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

/// `ListRollouts`.
pub(super) async fn list(
    s: &Deps,
    req: pb::ListRolloutsRequest,
) -> Result<Response<pb::ListRolloutsResponse>, Status> {
    let cluster = req.cluster;
    let rows = s
        .store
        .list_rollouts((!cluster.is_empty()).then_some(cluster.as_str()), false)
        .await
        .map_err(store_status)?;
    // What their nodes fetched: each cluster's nodes read once.
    let mut nodes: HashMap<String, Vec<crate::store::NodeRow>> = HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut p = rollout_pb(&r);
        if !nodes.contains_key(&r.cluster) {
            nodes.insert(r.cluster.clone(), nodes_of(s, &r.cluster).await?);
        }
        if let Some(n) = nodes.get(&r.cluster) {
            policy::add_fetched_by_nodes(&mut p, n);
        }
        out.push(p);
    }
    Ok(Response::new(pb::ListRolloutsResponse { rollouts: out }))
}

/// `RollbackRollout`: refused if a version it would return nodes to was deleted.
pub(super) async fn rollback(s: &Deps, req: pb::RolloutRef) -> Result<Response<pb::Rollout>, Status> {
    let id = req.id;
    // The versions a rollback returns nodes to must still exist: a
    // deleted one (`bundle delete`, allowed once the rollout finished)
    // is named rather than assigned.
    let r = load_rollout(s, &id).await?;
    let previous: HashSet<&str> = r
        .nodes
        .iter()
        .filter(|n| n.touched && !n.previous_version.is_empty())
        .map(|n| n.previous_version.as_str())
        .collect();
    for v in previous {
        if s.store
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
    verb(s, id, Verb::Rollback).await
}

/// An operator verb, carried out by the rollout controller.
pub(super) async fn verb(s: &Deps, id: String, verb: Verb) -> Result<Response<pb::Rollout>, Status> {
    if id.is_empty() || id.len() > 64 {
        return Err(invalid("rollout ID is empty or too long"));
    }
    let row = s.controller.verb(&id, verb).await?;
    tracing::info!(rollout = %id, ?verb, state = row.state.as_str(), "operator verb applied");
    Ok(Response::new(rollout_pb(&row)))
}

/// The nodes of `cluster` (what they report holding), for a rollout's
/// fetched bytes.
pub(super) async fn nodes_of(s: &Deps, cluster: &str) -> Result<Vec<crate::store::NodeRow>, Status> {
    s.store.list_nodes(Some(cluster)).await.map_err(store_status)
}

pub(super) async fn load_rollout(s: &Deps, id: &str) -> Result<RolloutRow, Status> {
    if id.is_empty() || id.len() > 64 {
        return Err(invalid("rollout ID is empty or too long"));
    }
    s.store
        .get_rollout(id)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("rollout {id} does not exist")))
}

/// Two bundles on one node may not own the same path (DESIGN §4): the
/// new version is checked against every other bundle of each target node.
async fn check_path_conflicts(
    s: &Deps,
    cluster: &str,
    selector: &Labels,
    bundle: &BundleRow,
) -> Result<(), Status> {
    let new = bundle.bundle.manifest();
    let mut cache: HashMap<(String, String), StoredBundle> = HashMap::new();
    let nodes = s.store.list_nodes(Some(cluster)).await.map_err(store_status)?;
    // Versions a rollout of another bundle will still give a node count
    // as if they were assigned already: nodes an active rollout has not
    // started, and the deferred or held nodes a completed one may still
    // catch up.
    let mut coming: HashMap<&str, Vec<(String, String)>> = HashMap::new();
    // The rollouts still driven are the ones that may yet assign.
    let driven = s.store.rollouts_to_drive().await.map_err(store_status)?;
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
                let row = s
                    .store
                    .get_bundle(b, v)
                    .await
                    .map_err(store_status)?
                    .ok_or_else(|| Status::internal(format!("assigned bundle {b}@{v} is missing")))?;
                cache.insert(key.clone(), row.bundle);
            }
        }
        for key in &others {
            if let Some(m) = cache.get(key).and_then(|b| b.manifest().for_arch(arch).ok()) {
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

/// The store format whose fields a rollout that drains keeps (its policy's
/// `drain`, its rows' kube steps): an older replica that rewrote the
/// rollout would drop them.
const DRAIN_FORMAT: u32 = 1;

/// Refuses `what` while a live replica of the region is of a release that
/// does not read store format `format` (the version-skew contract).
async fn every_replica_reads(s: &Deps, format: u32, what: &str) -> Result<(), Status> {
    match s.store.older_replica(format).await.map_err(store_status)? {
        None => Ok(()),
        Some(o) => Err(Status::failed_precondition(format!(
            "{what} waits until every replica is upgraded: replica {} runs {} (store format {}, this needs {format}); \
             finish the rolling upgrade, or start it without --drain",
            o.replica,
            if o.release.is_empty() {
                "an older release (before the version-skew contract)".to_string()
            } else {
                format!("release {}", o.release)
            },
            o.format
        ))),
    }
}

/// Longest `StartRolloutRequest.request_id`.
const MAX_REQUEST_ID: usize = 128;

fn check_request_id(id: &str) -> Result<(), Status> {
    if id.len() > MAX_REQUEST_ID {
        return Err(invalid(format!(
            "request ID is {} bytes, more than {MAX_REQUEST_ID}",
            id.len()
        )));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
    {
        return Err(invalid(format!(
            "request ID {id:?} has {c:?}; use only A-Z a-z 0-9 . _ : / -"
        )));
    }
    Ok(())
}

/// The ID of the rollout a request ID starts: derived from it (12 hex
/// digits of its SHA-256, like a random ID), so that a retried start finds
/// the rollout in one read, and two starts with one ID cannot both be
/// stored (each store refuses a second rollout under an existing ID).
fn request_rollout_id(request_id: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(format!("lksadmin rollout request {request_id}").as_bytes());
    d[..6].iter().map(|x| format!("{x:02x}")).collect()
}

/// A start sent again: the rollout its request ID started, when it is for
/// the same cluster, bundle and version.
fn same_request(r: &pb::StartRolloutRequest, done: RolloutRow) -> Result<RolloutRow, Status> {
    if done.policy.request_id == r.request_id
        && (done.cluster.as_str(), done.bundle.as_str(), done.version.as_str())
            == (r.cluster.as_str(), r.bundle.as_str(), r.version.as_str())
    {
        return Ok(done);
    }
    Err(Status::already_exists(format!(
        "request ID {:?} already started rollout {} ({} {}@{}); a new rollout needs a new request ID",
        r.request_id, done.id, done.cluster, done.bundle, done.version
    )))
}

fn random_id() -> String {
    let mut b = [0u8; 6];
    let _ = getrandom::getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
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
            kube: Default::default(),
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

    #[test]
    fn a_request_id_names_one_rollout_and_a_retry_gets_it_back() {
        assert_eq!(request_rollout_id("kube:abc"), request_rollout_id("kube:abc"));
        assert_ne!(request_rollout_id("kube:abc"), request_rollout_id("kube:abd"));
        let id = request_rollout_id("kube:abc");
        assert!(
            id.len() == 12 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );

        check_request_id("").unwrap();
        check_request_id("kube:0b7c-11/ci.job_7").unwrap();
        let e = check_request_id("a b").unwrap_err();
        assert!(e.message().contains("' '"), "{}", e.message());
        assert!(check_request_id(&"x".repeat(129)).is_err());

        let req = pb::StartRolloutRequest {
            cluster: "a".into(),
            bundle: "k".into(),
            version: "2".into(),
            request_id: "kube:abc".into(),
            ..Default::default()
        };
        let policy = RolloutPolicy {
            request_id: "kube:abc".into(),
            ..Default::default()
        };
        let done = NewRollout {
            id,
            cluster: "a".into(),
            bundle: "k".into(),
            version: "2".into(),
            selector: Labels::new(),
            batch_size: 1,
            failure_threshold: 1,
            offline_deadline_ms: 1,
            policy,
            started_by: "admin".into(),
            now_ms: 1,
        }
        .start(Vec::new(), None);
        assert_eq!(same_request(&req, done.clone()).unwrap(), done);
        let other = pb::StartRolloutRequest {
            version: "3".into(),
            ..req
        };
        let e = same_request(&other, done).unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists);
        assert!(
            e.message().contains("already started rollout") && e.message().contains("k@2"),
            "{}",
            e.message()
        );
    }
}
