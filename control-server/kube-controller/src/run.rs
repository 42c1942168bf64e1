//! The controller's loop (issue [kube-front], item 2): while this copy
//! holds the Lease, every `interval` it reads the server's clusters, nodes,
//! published bundle versions and rollouts through the admin API and
//! - reconciles every `LksCluster` and every declared `LksRollout` to the
//!   server ([`crate::clusters`], [`crate::rollouts`]: spec wins);
//! - mirrors each node as an `LksNode` (status: connected, last seen,
//!   agent, architecture, bundles, trust, KUBE state) and each version as
//!   an `LksBundleVersion`, creating what is new and deleting what the
//!   server no longer has;
//! - converges each node's hold to its `LksNode.spec.hold` (spec wins:
//!   a hold set or lifted with lksctl on a mirrored node is put back as
//!   the spec says). A mirror made for a new node starts with the hold the
//!   server has, so nothing changes when the controller first sees it.
//!
//! The server is read by a bounded poll, not a watch: the admin API has no
//! watch of nodes and bundles, one `ListNodes` per interval is what `lksctl
//! node list` costs, and a poll needs no resume logic after a leader
//! change. kube0 is watched (kube-rs `watcher` on LksCluster, LksRollout,
//! LksNode): a change there starts a pass at once. Only changed objects
//! are written.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::Notify;

use anyhow::Context;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use lks_proto::pb;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Admin};
use crate::crd::{Hold, LksBundleVersion, LksCluster, LksNode, LksNodeSpec, LksRollout};
use crate::lease::{Elector, RENEW};
use crate::{clusters, mirror, rollouts};

/// The label on every object the controller mirrors.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// On an LksRollout that mirrors a rollout started with lksctl (or the
/// console), not declared in Git.
pub const OUTSIDE_GIT: &str = "lksadmin.io/created-outside-git";
const ME: &str = "lks-kube-controller";

pub struct Options {
    pub admin_conf: PathBuf,
    /// Namespace of the Lease.
    pub namespace: String,
    pub lease: String,
    /// This copy's name in the Lease (the pod name).
    pub identity: String,
    pub interval: Duration,
    /// How often a refused LksRollout start is tried again.
    pub retry_interval: Duration,
}

/// The shortest time between two passes woken by kube0's watch events.
const EVENT_GAP: Duration = Duration::from_millis(500);

/// Wakes the loop whenever a user changes an object of kind `K` in kube0
/// (kube-rs' `watcher`, which lists again and resumes by itself, with its
/// default backoff after errors): a new object, a spec change (a new
/// `metadata.generation`), a deletion begun or done. The controller's own
/// status writes change no generation and wake nothing, so a pass that
/// writes statuses (every LksNode's last-seen time moves) does not start
/// another. The passes stay level-based: an event only says "look now";
/// what a pass does comes from comparing the whole state, so a missed event
/// costs at most one `--interval`.
fn watch<K>(kube: &kube::Client, changed: &Arc<Notify>, cancel: &CancellationToken)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(kube.clone());
    let changed = changed.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        let mut seen = Generations::default();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                e = events.next() => match e {
                    None => return,
                    Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => {
                        let m = o.meta();
                        let uid = m.uid.clone().unwrap_or_default();
                        if seen.applied(uid, m.generation.unwrap_or(0), m.deletion_timestamp.is_some()) {
                            changed.notify_one();
                        }
                    }
                    Some(Ok(watcher::Event::Delete(o))) => {
                        seen.deleted(&o.meta().uid.clone().unwrap_or_default());
                        changed.notify_one();
                    }
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(e)) => tracing::debug!(error = %e, kind = %K::kind(&K::DynamicType::default()), "watch"),
                },
            }
        }
    });
}

/// The spec generation (and whether deletion began) of each object seen,
/// by UID: what tells a user's change from a status write.
#[derive(Default)]
struct Generations(HashMap<String, (i64, bool)>);

impl Generations {
    /// Records an object as the watch delivered it; true if it is new or
    /// its spec or deletion changed.
    fn applied(&mut self, uid: String, generation: i64, deleting: bool) -> bool {
        self.0.insert(uid, (generation, deleting)) != Some((generation, deleting))
    }

    fn deleted(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub holds: usize,
    /// Changes made on the server for LksClusters and declared LksRollouts.
    pub reconciled: usize,
}

/// Runs until `cancel`: leads when it can, and mirrors while it leads.
pub async fn run(opts: Options, kube: kube::Client, cancel: CancellationToken) -> anyhow::Result<()> {
    let elector = Elector::new(kube.clone(), &opts.namespace, &opts.lease, &opts.identity);
    let mut admin: Option<Admin> = None;
    let mut attempts = rollouts::Attempts::new(opts.retry_interval);
    let mut leading = false;
    let mut tick = tokio::time::interval(opts.interval.min(RENEW));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let changed = Arc::new(Notify::new());
    watch::<LksCluster>(&kube, &changed, &cancel);
    watch::<LksRollout>(&kube, &changed, &cancel);
    watch::<LksNode>(&kube, &changed, &cancel);
    let mut last_pass = Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => {}
            // A user's change is acted on at once rather than at the next
            // tick, and changes close together make one pass.
            _ = changed.notified(), if leading => {
                let wait = EVENT_GAP.saturating_sub(last_pass.elapsed());
                tokio::time::sleep(wait).await;
            }
        }
        last_pass = Instant::now();
        let now_leading = match elector.lead().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "lease");
                false
            }
        };
        if now_leading != leading {
            tracing::info!(leading = now_leading, identity = %opts.identity, "leadership changed");
            leading = now_leading;
        }
        if !leading {
            continue;
        }
        if admin.is_none() {
            match admin::connect(&opts.admin_conf).await {
                Ok(a) => admin = Some(a),
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "admin API");
                    continue;
                }
            }
        }
        if let Some(a) = admin.as_mut() {
            match sync_once(&kube, a, &opts.namespace, &mut attempts).await {
                Ok(p) if p != Pass::default() => tracing::info!(?p, "mirrored"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "mirror pass");
                    admin = None;
                }
            }
        }
    }
}

/// One pass: LksClusters and declared LksRollouts reconciled; nodes,
/// bundle versions, and rollouts started outside Git (mirrored into
/// `namespace`).
pub async fn sync_once(
    kube: &kube::Client,
    admin: &mut Admin,
    namespace: &str,
    attempts: &mut rollouts::Attempts,
) -> anyhow::Result<Pass> {
    let clusters = admin
        .list_clusters(pb::ListClustersRequest::default())
        .await
        .context("list clusters")?
        .into_inner()
        .clusters;
    let nodes = admin
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .context("list nodes")?
        .into_inner()
        .nodes;
    let bundles = admin
        .list_bundles(pb::ListBundlesRequest::default())
        .await
        .context("list bundles")?
        .into_inner()
        .bundles;
    let rollouts = admin
        .list_rollouts(pb::ListRolloutsRequest::default())
        .await
        .context("list rollouts")?
        .into_inner()
        .rollouts;
    let mut reconciled = clusters::sync(kube, admin, &clusters, &nodes).await?;
    reconciled += rollouts::sync(kube, admin, &rollouts, attempts, (MANAGED_BY, ME)).await?;
    let rollouts = if reconciled > 0 {
        // Started or changed just now: mirrored as they are now.
        admin
            .list_rollouts(pb::ListRolloutsRequest::default())
            .await
            .context("list rollouts")?
            .into_inner()
            .rollouts
    } else {
        rollouts
    };
    let mut pass = sync_nodes(kube, admin, &nodes).await?;
    pass.reconciled = reconciled;
    for p in [
        sync_bundles(kube, &bundles).await?,
        sync_rollouts(kube, namespace, &rollouts).await?,
    ] {
        pass.created += p.created;
        pass.updated += p.updated;
        pass.deleted += p.deleted;
    }
    Ok(pass)
}

/// Rollouts no LksRollout declared (started with lksctl or the console)
/// appear as LksRollouts annotated [`OUTSIDE_GIT`], status kept current,
/// so both fronts see one truth. Declared ones (started by the controller
/// with a `kube:` request ID, or rolled back for one) are
/// [`crate::rollouts`]' and are left alone here.
async fn sync_rollouts(
    kube: &kube::Client,
    namespace: &str,
    rollouts: &[pb::Rollout],
) -> anyhow::Result<Pass> {
    let all: Api<LksRollout> = Api::all(kube.clone());
    let api: Api<LksRollout> = Api::namespaced(kube.clone(), namespace);
    let existing = all
        .list(&ListParams::default())
        .await
        .context("list LksRollouts")?
        .items;
    let declared: std::collections::HashSet<String> = existing
        .iter()
        .filter(|o| o.labels().get(MANAGED_BY).map(String::as_str) != Some(ME))
        .filter_map(|o| o.status.as_ref().map(|s| s.id.clone()))
        .collect();
    let mut have: HashMap<String, LksRollout> = existing
        .into_iter()
        .filter(|o| o.labels().get(MANAGED_BY).map(String::as_str) == Some(ME))
        .filter_map(|o| Some((o.metadata.name.clone()?, o)))
        .collect();
    let mut pass = Pass::default();
    for r in rollouts
        .iter()
        .filter(|r| !declared.contains(&r.id) && !crate::rollouts::declared(r))
    {
        let name = mirror::rollout_name(r);
        let obj = match have.remove(&name) {
            Some(o) => o,
            None => {
                let mut m = meta(&name);
                m.annotations = Some(BTreeMap::from([(OUTSIDE_GIT.to_string(), "true".to_string())]));
                let o = LksRollout {
                    metadata: m,
                    spec: mirror::rollout_spec(r),
                    status: None,
                };
                pass.created += 1;
                api.create(&PostParams::default(), &o)
                    .await
                    .with_context(|| format!("create LksRollout {name}"))?
            }
        };
        let status = mirror::rollout_status(r, obj.metadata.generation.unwrap_or(0));
        if obj.status.as_ref() != Some(&status) {
            let patch = serde_json::json!({ "status": status });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("write LksRollout {name} status"))?;
            pass.updated += 1;
        }
    }
    Ok(pass)
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

async fn sync_nodes(kube: &kube::Client, admin: &mut Admin, nodes: &[pb::Node]) -> anyhow::Result<Pass> {
    let api: Api<LksNode> = Api::all(kube.clone());
    let mut have: HashMap<String, LksNode> = api
        .list(&managed())
        .await
        .context("list LksNodes")?
        .items
        .into_iter()
        .filter_map(|o| Some((o.metadata.name.clone()?, o)))
        .collect();
    let mut pass = Pass::default();
    for n in nodes {
        let name = mirror::object_name(&n.name);
        let obj = match have.remove(&name) {
            Some(o) => o,
            None => {
                let hold = n.held.then(|| Hold {
                    reason: n.hold_reason.clone(),
                });
                let o = LksNode {
                    metadata: meta(&name),
                    spec: LksNodeSpec { hold },
                    status: None,
                };
                pass.created += 1;
                api.create(&PostParams::default(), &o)
                    .await
                    .with_context(|| format!("create LksNode {name}"))?
            }
        };
        pass.holds += converge_hold(admin, n, obj.spec.hold.as_ref()).await?;
        let status = mirror::node_status(n);
        if obj.status.as_ref() != Some(&status) {
            let patch = serde_json::json!({ "status": status });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("write LksNode {name} status"))?;
            pass.updated += 1;
        }
    }
    for name in have.into_keys() {
        api.delete(&name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete LksNode {name}"))?;
        pass.deleted += 1;
    }
    Ok(pass)
}

/// Holds or releases the node as its spec says; 1 if it changed anything.
async fn converge_hold(admin: &mut Admin, n: &pb::Node, want: Option<&Hold>) -> anyhow::Result<usize> {
    match want {
        Some(h) if !n.held || n.hold_reason != h.reason => {
            admin
                .hold_node(pb::HoldNodeRequest {
                    name: n.name.clone(),
                    reason: h.reason.clone(),
                })
                .await
                .with_context(|| format!("hold node {}", n.name))?;
            Ok(1)
        }
        None if n.held => {
            admin
                .unhold_node(pb::UnholdNodeRequest { name: n.name.clone() })
                .await
                .with_context(|| format!("release node {}", n.name))?;
            Ok(1)
        }
        _ => Ok(0),
    }
}

async fn sync_bundles(kube: &kube::Client, bundles: &[pb::BundleInfo]) -> anyhow::Result<Pass> {
    let api: Api<LksBundleVersion> = Api::all(kube.clone());
    let mut have: HashMap<String, LksBundleVersion> = api
        .list(&managed())
        .await
        .context("list LksBundleVersions")?
        .items
        .into_iter()
        .filter_map(|o| Some((o.metadata.name.clone()?, o)))
        .collect();
    let mut pass = Pass::default();
    for b in bundles {
        let name = mirror::bundle_version_name(b);
        let spec = mirror::bundle_spec(b);
        match have.remove(&name) {
            Some(o) if o.spec == spec => {}
            Some(_) => {
                let patch = serde_json::json!({ "spec": spec });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("write LksBundleVersion {name}"))?;
                pass.updated += 1;
            }
            None => {
                let o = LksBundleVersion {
                    metadata: meta(&name),
                    spec,
                };
                api.create(&PostParams::default(), &o)
                    .await
                    .with_context(|| format!("create LksBundleVersion {name}"))?;
                pass.created += 1;
            }
        }
    }
    for name in have.into_keys() {
        api.delete(&name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete LksBundleVersion {name}"))?;
        pass.deleted += 1;
    }
    Ok(pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_users_change_wakes_the_loop() {
        let mut g = Generations::default();
        assert!(g.applied("a".into(), 1, false), "a new object");
        assert!(
            !g.applied("a".into(), 1, false),
            "a status write: same generation"
        );
        assert!(g.applied("a".into(), 2, false), "a spec change");
        assert!(g.applied("a".into(), 2, true), "deletion begun");
        g.deleted("a");
        assert!(g.applied("a".into(), 2, true), "seen again after a relist");
    }
}
