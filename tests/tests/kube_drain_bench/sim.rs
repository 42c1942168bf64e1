//! The benchmark's simulated kubelets, ReplicaSet controller and scheduler
//! of the `web` pods (not Kubernetes: there are no kubelets here), driven
//! by watch events on a runtime of their own, so neither drain waits on a
//! polling loop; and what they saw of the Nodes (when a cordon was lifted).

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use lks_e2e::kube::KubeControlPlane;
use tokio_stream::{Stream, StreamExt};

use super::NS;

/// The simulated kubelets, ReplicaSet controller and scheduler of the
/// `web` pods, on a runtime of their own.
pub(crate) struct Workload {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    seen: Arc<Mutex<Seen>>,
}

/// What the workload saw of the Nodes.
#[derive(Default)]
struct Seen {
    unschedulable: HashMap<String, bool>,
    /// When each node's cordon was last seen lifted.
    uncordoned: HashMap<String, Instant>,
}

impl Seen {
    fn observe(&mut self, n: &Node) {
        let name = n.metadata.name.clone().unwrap_or_default();
        let now = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        if self.unschedulable.insert(name.clone(), now) == Some(true) && !now {
            self.uncordoned.insert(name, Instant::now());
        }
    }
}

struct Sim {
    client: kube::Client,
    replicas: usize,
    owner_uid: String,
    start: Duration,
    stop: Duration,
}

type Watch<K> = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<K>>>>>;

/// The next event of `w`, never if there is none; `w` is dropped when it
/// ends or fails (the loop watches again from a fresh list).
async fn next_event<K>(w: &mut Option<Watch<K>>) -> Option<K> {
    let Some(s) = w.as_mut() else {
        return std::future::pending().await;
    };
    match s.next().await {
        Some(Ok(WatchEvent::Added(k) | WatchEvent::Modified(k) | WatchEvent::Deleted(k))) => Some(k),
        Some(Ok(WatchEvent::Bookmark(_))) => None,
        Some(Ok(WatchEvent::Error(_)) | Err(_)) | None => {
            *w = None;
            None
        }
    }
}

pub(crate) fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_web(p: &Pod) -> bool {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .is_some_and(|a| a == "web")
}

impl Sim {
    async fn run(self, seen: Arc<Mutex<Seen>>, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let sim = Arc::new(self);
        let pods: Api<Pod> = Api::namespaced(sim.client.clone(), NS);
        let nodes: Api<Node> = Api::all(sim.client.clone());
        let mut pending: HashSet<String> = HashSet::new();
        let mut pw: Option<Watch<Pod>> = None;
        let mut nw: Option<Watch<Node>> = None;
        loop {
            if !matches!(
                stop.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            ) {
                return;
            }
            let (Ok(pl), Ok(nl)) = (
                pods.list(&ListParams::default()).await,
                nodes.list(&ListParams::default()).await,
            ) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if let Ok(mut s) = seen.lock() {
                nl.items.iter().for_each(|n| s.observe(n));
            }
            sim.reconcile(&pods, &pl.items, &nl.items, &mut pending).await;
            let wp = WatchParams::default();
            if pw.is_none() {
                let rv = pl.metadata.resource_version.clone().unwrap_or_default();
                pw = pods.watch(&wp, &rv).await.ok().map(|s| Box::pin(s) as Watch<Pod>);
            }
            if nw.is_none() {
                let rv = nl.metadata.resource_version.clone().unwrap_or_default();
                nw = nodes
                    .watch(&wp, &rv)
                    .await
                    .ok()
                    .map(|s| Box::pin(s) as Watch<Node>);
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = next_event(&mut pw) => {}
                n = next_event(&mut nw) => {
                    if let (Some(n), Ok(mut s)) = (n, seen.lock()) {
                        s.observe(&n);
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One pass: a kubelet confirms each evicted pod gone `stop` after its
    /// eviction and reports each new pod Ready `start` after it was made;
    /// the ReplicaSet and scheduler make up the number on the node that
    /// takes pods and has the fewest.
    async fn reconcile(
        self: &Arc<Self>,
        api: &Api<Pod>,
        pods: &[Pod],
        nodes: &[Node],
        pending: &mut HashSet<String>,
    ) {
        let present: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        pending.retain(|k| present.contains(k.split_once(' ').map_or("", |(_, u)| u)));
        for p in pods {
            let (Some(uid), Some(name)) = (p.metadata.uid.clone(), p.metadata.name.clone()) else {
                continue;
            };
            let (action, delay) = if p.metadata.deletion_timestamp.is_some() {
                ("stop", self.stop)
            } else if !is_ready(p) {
                ("start", self.start)
            } else {
                continue;
            };
            if !pending.insert(format!("{action} {uid}")) {
                continue;
            }
            let api = api.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if action == "stop" {
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: Some(uid),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    let _ = api.delete(&name, &dp).await;
                } else {
                    let status = serde_json::json!({"status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            });
        }
        let live: Vec<&Pod> = pods
            .iter()
            .filter(|p| is_web(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        let count = |node: &str| {
            live.iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                .count()
        };
        let target = nodes
            .iter()
            .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true))
            .filter_map(|n| n.metadata.name.as_deref())
            .min_by_key(|n| count(n));
        let Some(target) = target else { return };
        for _ in live.len()..self.replicas {
            let pod: Pod = serde_json::from_value(self.pod_json(target)).expect("pod manifest");
            let _ = api.create(&PostParams::default(), &pod).await;
        }
    }

    fn pod_json(&self, node: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "web-",
                "namespace": NS,
                "labels": {"app": "web"},
                "annotations": {"lksadmin.test/written-by": "simulated-kubelet"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": self.owner_uid, "controller": true}],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "registry.invalid/pause:1"}],
            },
        })
    }
}

impl Workload {
    pub(crate) fn start(
        cp: &KubeControlPlane,
        replicas: usize,
        owner_uid: &str,
        start: Duration,
        stop: Duration,
    ) -> Workload {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let admin = cp.admin_kubeconfig.clone();
        let owner_uid = owner_uid.to_string();
        let s = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("workload runtime");
            rt.block_on(async move {
                let kc = kube::config::Kubeconfig::read_from(&admin).expect("admin kubeconfig");
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .expect("admin config");
                let sim = Sim {
                    client: kube::Client::try_from(config).expect("admin client"),
                    replicas,
                    owner_uid,
                    start,
                    stop,
                };
                sim.run(s, rx).await;
            });
        });
        Workload {
            stop: Some(tx),
            thread: Some(thread),
            seen,
        }
    }

    /// When `node`'s cordon was last seen lifted.
    pub(crate) fn uncordoned(&self, node: &str) -> Option<Instant> {
        self.seen.lock().ok()?.uncordoned.get(node).copied()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
