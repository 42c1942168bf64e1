//! The poll of the server (issue [kube-front], item 2): while this copy
//! leads, every `interval` it lists the server's nodes, published bundle
//! versions and rollouts through the admin API and
//! - publishes the nodes and rollouts for the reconcilers ([`Ctx`]'s
//!   `nodes` and `rollouts`), which wakes every `LksNode` and declared
//!   `LksRollout` (their status follows the server);
//! - makes an `LksNode` for each new node (with the hold the server has)
//!   and deletes the one of a node the server no longer has;
//! - mirrors each version as an `LksBundleVersion`, creating what is new
//!   and deleting what the server no longer has;
//! - mirrors each rollout no `LksRollout` declared (started with lksctl or
//!   the console) as an `LksRollout` annotated [`OUTSIDE_GIT`].
//!
//! The server is read by a bounded poll, not a watch: the admin API has no
//! watch of nodes and bundles, one `ListNodes` per interval is what `lksctl
//! node list` costs, and a poll needs no resume logic after a leader
//! change. Each part stands alone: a list that fails skips its part, and an
//! object whose write fails is logged and tried again at the next poll
//! while the others are written. Only changed objects are written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use lks_proto::pb;
use tokio_util::sync::CancellationToken;

use crate::context::{Ctx, Error};
use crate::crd::{Hold, LksBundleVersion, LksNode, LksNodeSpec, LksRollout};
use crate::mirror::{self, MANAGED_BY, ME, OUTSIDE_GIT};
use crate::rollouts;

/// What one poll changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    /// Objects whose write failed (each logged), and lists that failed.
    pub failed: usize,
}

impl Pass {
    /// Counts `r`: a failure is logged, and the poll goes on.
    fn count(&mut self, r: Result<Change, Error>) {
        match r {
            Ok(Change::None) => {}
            Ok(Change::Created) => self.created += 1,
            Ok(Change::Updated) => self.updated += 1,
            Ok(Change::Deleted) => self.deleted += 1,
            Err(e) => {
                tracing::warn!(error = %e, "mirror");
                self.failed += 1;
            }
        }
    }
}

/// What a write did to one object.
enum Change {
    None,
    Created,
    Updated,
    Deleted,
}

/// Polls until `stop`.
pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(ctx.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let p = tokio::select! {
            _ = stop.cancelled() => return,
            p = pass(&ctx) => p,
        };
        if p != Pass::default() {
            tracing::info!(?p, "mirrored");
        }
    }
}

/// One poll: each part on its own.
pub async fn pass(ctx: &Ctx) -> Pass {
    let mut pass = Pass::default();
    let at = Instant::now();
    let admin = &ctx.admin;
    match admin
        .call(|mut a| async move { a.list_nodes(pb::ListNodesRequest::default()).await })
        .await
    {
        Ok(r) => {
            let by_object = r
                .nodes
                .into_iter()
                .map(|n| (mirror::object_name(&n.name), n))
                .collect();
            let read = ctx.nodes.publish(by_object, at);
            sync_nodes(ctx, &read.items, &mut pass).await;
        }
        Err(e) => pass.count(Err(Error::admin("list nodes", e))),
    }
    match admin
        .call(|mut a| async move { a.list_bundles(pb::ListBundlesRequest::default()).await })
        .await
    {
        Ok(r) => sync_bundles(ctx, &r.bundles, &mut pass).await,
        Err(e) => pass.count(Err(Error::admin("list bundles", e))),
    }
    match admin
        .call(|mut a| async move { a.list_rollouts(pb::ListRolloutsRequest::default()).await })
        .await
    {
        Ok(r) => {
            let by_id = r.rollouts.into_iter().map(|r| (r.id.clone(), r)).collect();
            let read = ctx.rollouts.publish(by_id, at);
            sync_rollouts(ctx, read.items.values(), &mut pass).await;
        }
        Err(e) => pass.count(Err(Error::admin("list rollouts", e))),
    }
    pass
}

fn managed() -> ListParams {
    ListParams::default().labels(&format!("{MANAGED_BY}={ME}"))
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(MANAGED_BY.to_string(), ME.to_string())])),
        ..Default::default()
    }
}

/// The names of the objects of kind `K` the controller made.
async fn mirrors<K>(api: &Api<K>, pass: &mut Pass) -> Option<HashMap<String, K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.list(&managed()).await {
        Ok(l) => Some(
            l.items
                .into_iter()
                .filter_map(|o| Some((o.meta().name.clone()?, o)))
                .collect(),
        ),
        Err(e) => {
            let kind = K::kind(&K::DynamicType::default()).to_string();
            pass.count(Err(Error::kube(format!("list {kind}s"), e)));
            None
        }
    }
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<Change, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    api.delete(name, &DeleteParams::default()).await.map_err(|e| {
        Error::kube(
            format!("delete {} {name}", K::kind(&K::DynamicType::default())),
            e,
        )
    })?;
    Ok(Change::Deleted)
}

/// An `LksNode` for each node (its status is the `LksNode` reconciler's),
/// none for a node the server no longer has.
async fn sync_nodes(ctx: &Ctx, nodes: &HashMap<String, pb::Node>, pass: &mut Pass) {
    let api: Api<LksNode> = Api::all(ctx.kube.clone());
    let Some(mut have) = mirrors(&api, pass).await else {
        return;
    };
    for (name, n) in nodes {
        if have.remove(name).is_some() {
            continue;
        }
        let o = LksNode {
            metadata: meta(name),
            spec: LksNodeSpec {
                hold: n.held.then(|| Hold {
                    reason: n.hold_reason.clone(),
                }),
            },
            status: None,
        };
        let r = api
            .create(&PostParams::default(), &o)
            .await
            .map(|_| Change::Created)
            .map_err(|e| Error::kube(format!("create LksNode {name}"), e));
        pass.count(r);
    }
    for name in have.into_keys() {
        pass.count(delete(&api, &name).await);
    }
}

async fn sync_bundles(ctx: &Ctx, bundles: &[pb::BundleInfo], pass: &mut Pass) {
    let api: Api<LksBundleVersion> = Api::all(ctx.kube.clone());
    let Some(mut have) = mirrors(&api, pass).await else {
        return;
    };
    for b in bundles {
        let name = mirror::bundle_version_name(b);
        let spec = mirror::bundle_spec(b);
        let r = match have.remove(&name) {
            Some(o) if o.spec == spec => Ok(Change::None),
            Some(_) => {
                let patch = serde_json::json!({ "spec": spec });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| Change::Updated)
                    .map_err(|e| Error::kube(format!("write LksBundleVersion {name}"), e))
            }
            None => {
                let o = LksBundleVersion {
                    metadata: meta(&name),
                    spec,
                };
                api.create(&PostParams::default(), &o)
                    .await
                    .map(|_| Change::Created)
                    .map_err(|e| Error::kube(format!("create LksBundleVersion {name}"), e))
            }
        };
        pass.count(r);
    }
    for name in have.into_keys() {
        pass.count(delete(&api, &name).await);
    }
}

/// Rollouts no LksRollout declared (started with lksctl or the console)
/// appear as LksRollouts annotated [`OUTSIDE_GIT`], status kept current,
/// so both fronts see one truth. Declared ones (started by the controller
/// with a `kube:` request ID, or rolled back for one) are
/// [`crate::rollouts`]' and are left alone here.
async fn sync_rollouts<'a>(ctx: &Ctx, rollouts: impl Iterator<Item = &'a pb::Rollout>, pass: &mut Pass) {
    let all: Api<LksRollout> = Api::all(ctx.kube.clone());
    let existing = match all.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => return pass.count(Err(Error::kube("list LksRollouts", e))),
    };
    let mine = |o: &LksRollout| o.labels().get(MANAGED_BY).map(String::as_str) == Some(ME);
    let declared: HashSet<String> = existing
        .iter()
        .filter(|o| !mine(o))
        .filter_map(|o| o.status.as_ref().map(|s| s.id.clone()))
        .collect();
    let mut have: HashMap<String, LksRollout> = existing
        .into_iter()
        .filter(|o| mine(o))
        .filter_map(|o| Some((o.metadata.name.clone()?, o)))
        .collect();
    let api: Api<LksRollout> = Api::namespaced(ctx.kube.clone(), &ctx.namespace);
    for r in rollouts.filter(|r| !declared.contains(&r.id) && !rollouts::declared(r)) {
        let name = mirror::rollout_name(r);
        let r = mirror_rollout(&api, r, &name, have.remove(&name)).await;
        pass.count(r);
    }
}

/// The mirror of rollout `r`: made if new, its status written if changed.
async fn mirror_rollout(
    api: &Api<LksRollout>,
    r: &pb::Rollout,
    name: &str,
    have: Option<LksRollout>,
) -> Result<Change, Error> {
    let (obj, mut change) = match have {
        Some(o) => (o, Change::None),
        None => {
            let mut m = meta(name);
            m.annotations = Some(BTreeMap::from([(OUTSIDE_GIT.to_string(), "true".to_string())]));
            let o = LksRollout {
                metadata: m,
                spec: mirror::rollout_spec(r),
                status: None,
            };
            let made = api
                .create(&PostParams::default(), &o)
                .await
                .map_err(|e| Error::kube(format!("create LksRollout {name}"), e))?;
            (made, Change::Created)
        }
    };
    let status = mirror::rollout_status(r, obj.metadata.generation.unwrap_or(0));
    if obj.status.as_ref() != Some(&status) {
        let patch = serde_json::json!({ "status": status });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format!("write LksRollout {name} status"), e))?;
        if matches!(change, Change::None) {
            change = Change::Updated;
        }
    }
    Ok(change)
}
