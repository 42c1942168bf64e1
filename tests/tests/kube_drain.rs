//! `rollout start --drain` against a real kube-apiserver and controller
//! manager (tests/src/kube.rs), with real agents:
//! - two nodes, an app's pods on each under a PodDisruptionBudget
//!   `minAvailable: 1`, batch size 1: node-1 is cordoned, drained,
//!   upgraded, Ready, uncordoned, then node-2; the budget is never broken
//!   (the disruption controller's own count, sampled throughout) and a
//!   DaemonSet's pod is never touched;
//! - a budget that never allows an eviction (`maxUnavailable: 0`): the
//!   node's drain ends `drain-blocked` naming the budget, the node is
//!   uncordoned and keeps its version, the rollout fails at threshold 1;
//! - a pause mid-drain stops the drain and lifts the cordon;
//! - a kubelet that never gets Ready fails its node with the reason.
//!
//! There are no kubelets, scheduler or ReplicaSet controller: the tests'
//! simulated kubelet registers the Nodes and posts pod status, confirms
//! the deletion of evicted pods, and puts a replacement on a node that
//! takes pods (what a Deployment and the scheduler would do). It is
//! labelled as such in every object it writes.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lks_e2e::agent::BundleFile;
use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet, pod_manifest, set_pod_ready};
use lks_e2e::rollout::{Fleet, first_line, rollout_events};
use lks_e2e::{one_line_error, wait_until};

const NS: &str = "work";
const CONF: &str = "/etc/kubernetes/kubelet.conf";

/// The cluster of `f` gets the admin kubeconfig of `cp` (the RBAC is
/// tested in kube_control_plane.rs).
fn give_kubeconfig(f: &Fleet, cp: &KubeControlPlane) {
    let conf = cp.admin_kubeconfig.to_str().unwrap().to_string();
    f.server
        .lksctl_ok(&["cluster", "set", &f.cluster, "--kubeconfig", &conf]);
}

/// `kubectl … -o json`, or `None` when it fails (the workload thread
/// must not die of one failed call).
fn try_json(cp: &KubeControlPlane, args: &[&str]) -> Option<serde_json::Value> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = cp.kubectl(&a);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// The simulated kubelets, ReplicaSet and scheduler of the `web` app: keeps
/// `replicas` pods of it, Ready, on nodes that take pods; confirms the
/// deletion of evicted pods (as the kubelet does once containers stopped);
/// samples the budget's status as the disruption controller computes it.
struct Workload {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Fewest Ready `web` pods seen; and the budget's `currentHealthy`
    /// below its `desiredHealthy` ever seen (a broken budget).
    min_ready: Arc<AtomicI64>,
    broken: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    fn start(cp: Arc<KubeControlPlane>, replicas: usize) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let min_ready = Arc::new(AtomicI64::new(i64::MAX));
        let broken = Arc::new(Mutex::new(Vec::new()));
        let (s, m, b) = (stop.clone(), min_ready.clone(), broken.clone());
        let thread = std::thread::spawn(move || {
            let mut serial = 100;
            while !s.load(Ordering::Relaxed) {
                let (Some(pods), Some(nodes)) = (
                    try_json(&cp, &["get", "pods", "-n", NS, "-l", "app=web"]),
                    try_json(&cp, &["get", "nodes"]),
                ) else {
                    continue;
                };
                let mut live = Vec::new();
                let mut ready = 0;
                for p in pods["items"].as_array().into_iter().flatten() {
                    let name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
                    if p["metadata"]["deletionTimestamp"].is_string() {
                        let _ = cp.kubectl(&[
                            "delete",
                            "pod",
                            &name,
                            "-n",
                            NS,
                            "--grace-period=0",
                            "--force",
                            "--wait=false",
                        ]);
                        continue;
                    }
                    let is_ready = p["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                    if is_ready {
                        ready += 1;
                    } else {
                        set_pod_ready(&cp, NS, &name);
                    }
                    live.push(name);
                }
                m.fetch_min(ready, Ordering::Relaxed);
                if live.len() < replicas {
                    // The ReplicaSet and the scheduler: a new pod on a node
                    // that takes pods.
                    let schedulable = nodes["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|n| n["spec"]["unschedulable"] != true);
                    if let Some(n) = schedulable {
                        serial += 1;
                        let name = format!("web-{serial}");
                        let node = n["metadata"]["name"].as_str().unwrap_or_default();
                        let _ = cp.kubectl_stdin(
                            &["apply", "-f", "-"],
                            &pod_manifest(NS, &name, node, "web", None),
                        );
                        set_pod_ready(&cp, NS, &name);
                    }
                }
                let pdb = try_json(&cp, &["get", "pdb", "web", "-n", NS]).unwrap_or_default();
                let (current, desired) = (&pdb["status"]["currentHealthy"], &pdb["status"]["desiredHealthy"]);
                if let (Some(c), Some(d)) = (current.as_i64(), desired.as_i64())
                    && c < d
                {
                    b.lock()
                        .unwrap()
                        .push(format!("currentHealthy {c} < desiredHealthy {d}"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Workload {
            stop,
            thread: Some(thread),
            min_ready,
            broken,
        }
    }

    fn finish(mut self) -> (i64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("workload thread");
        }
        (
            self.min_ready.load(Ordering::Relaxed),
            self.broken.lock().unwrap().clone(),
        )
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A DaemonSet object (no controller runs it here) and its pod on `node`.
fn daemonset_pod(cp: &KubeControlPlane, node: &str) -> String {
    cp.apply(&format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\n  namespace: {NS}\nspec:\n  selector:\n    matchLabels: {{app: agent}}\n  template:\n    metadata:\n      labels: {{app: agent}}\n    spec:\n      containers:\n      - name: c\n        image: registry.invalid/pause:1\n"
    ));
    let ds = cp.get_json(&["get", "daemonset", "agent", "-n", NS]);
    let uid = ds["metadata"]["uid"].as_str().unwrap().to_string();
    let name = format!("agent-{node}");
    cp.apply(&pod_manifest(NS, &name, node, "agent", Some(("DaemonSet", &uid))));
    set_pod_ready(cp, NS, &name);
    name
}

fn node_json(cp: &KubeControlPlane, node: &str) -> serde_json::Value {
    cp.get_json(&["get", "node", node])
}

fn cordoned(cp: &KubeControlPlane, node: &str) -> bool {
    node_json(cp, node)["spec"]["unschedulable"] == true
}

fn bundle(f: &Fleet, version: &str) -> String {
    let content = format!("kubelet {version}\n");
    f.publish(
        "kubelet",
        version,
        &[BundleFile {
            path: CONF,
            content: content.as_bytes(),
            mode: "0600",
        }],
        "0.2",
        "",
    )
}

#[test]
fn each_node_is_drained_upgraded_ready_and_uncordoned_in_turn_never_breaking_the_budget() {
    let cp = Arc::new(KubeControlPlane::start());
    let f = Fleet::start("t", 2);
    for a in &f.agents {
        SimulatedKubelet::new(&cp, &a.name).register(true, "v1.37.2");
    }
    give_kubeconfig(&f, &cp);
    cp.create_namespace(NS);
    let ds_pod = daemonset_pod(&cp, "node-1");
    for (p, n) in [("web-1", "node-1"), ("web-2", "node-2")] {
        cp.apply(&pod_manifest(NS, p, n, "web", None));
        set_pod_ready(&cp, NS, p);
    }
    cp.apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: {NS}\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{app: web}}\n"
    ));
    wait_until(
        Duration::from_secs(60),
        "the budget to allow one disruption",
        || cp.get_json(&["get", "pdb", "web", "-n", NS])["status"]["disruptionsAllowed"] == 1,
    );
    let work = Workload::start(cp.clone(), 2);

    let b = bundle(&f, "2");
    let out = f.start_rollout(
        &b,
        &[
            "--batch-size",
            "1",
            "--drain",
            "--drain-timeout",
            "60s",
            "--kubelet-version",
            "v1.37.2",
            "--wait",
        ],
    );
    let stdout = lks_e2e::ok_stdout(&out, "rollout start --drain --wait");
    let id = first_line(&stdout);
    let (min_ready, broken) = work.finish();
    assert!(broken.is_empty(), "the budget was broken: {broken:?}");
    assert!(min_ready >= 1, "no Ready web pod at some point (min {min_ready})");

    let st = f.status(&id);
    assert_eq!(st["state"], "completed", "{st:#}");
    assert_eq!(st["updated"], 2, "{st:#}");
    assert_eq!(st["drain"]["on_timeout"], "fail", "{st:#}");
    for n in st["nodes"].as_array().unwrap() {
        assert!(n["kube_step"].is_null(), "{n}");
        assert!(n["message"].as_str().unwrap().contains("Ready"), "{n}");
    }
    for a in &f.agents {
        assert_eq!(a.read(CONF).map(|(c, _)| c), Some(b"kubelet 2\n".to_vec()));
    }

    // In turn: node-2's drain began after node-1 was Ready, and each was
    // uncordoned; the events say how long each phase took.
    let ev = rollout_events(&f.server, &id);
    let pos = |kind: &str, node: &str| {
        ev.iter()
            .position(|(k, m)| k == kind && m.contains(node))
            .unwrap_or_else(|| panic!("no {kind} event of {node}: {ev:?}"))
    };
    let _ = pos("drained", "node-1");
    assert!(pos("node_ready", "node-1") < pos("drained", "node-2"), "{ev:?}");
    let events = f.server.lksctl_ok(&["event", "list", "--rollout", &id]);
    assert!(events.contains("drained in"), "{events}");
    assert!(events.contains("after it applied 2"), "{events}");
    wait_until(Duration::from_secs(20), "both nodes uncordoned", || {
        !cordoned(&cp, "node-1") && !cordoned(&cp, "node-2")
    });
    for n in ["node-1", "node-2"] {
        let j = node_json(&cp, n);
        assert!(
            j["metadata"]["annotations"]["lksadmin.io/cordoned-by"].is_null(),
            "{n}: {j}"
        );
    }
    // The DaemonSet's pod was left alone.
    let ds = cp.get_json(&["get", "pod", &ds_pod, "-n", NS]);
    assert!(ds["metadata"]["deletionTimestamp"].is_null(), "{ds}");
    // The original pods were evicted (replacements run elsewhere).
    assert!(!cp.kubectl(&["get", "pod", "web-1", "-n", NS]).status.success());
    assert!(!cp.kubectl(&["get", "pod", "web-2", "-n", NS]).status.success());
}

#[test]
fn a_drain_never_hangs_blocked_paused_or_never_ready_each_ends_uncordoned() {
    let cp = Arc::new(KubeControlPlane::start());
    let f = Fleet::start("t", 1);
    SimulatedKubelet::new(&cp, "node-1").register(true, "v1.37.2");
    cp.create_namespace(NS);

    // Without a kubeconfig the cluster cannot drain: refused up front.
    let b2 = bundle(&f, "2");
    let e = one_line_error(&f.start_rollout(&b2, &["--drain"]), "drain without kubeconfig");
    assert!(e.contains("--kubeconfig"), "{e}");
    give_kubeconfig(&f, &cp);

    // A budget that allows no eviction at all.
    cp.apply(&pod_manifest(NS, "db-1", "node-1", "db", None));
    set_pod_ready(&cp, NS, "db-1");
    cp.apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: db\n  namespace: {NS}\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels: {{app: db}}\n"
    ));
    wait_until(Duration::from_secs(60), "the db budget's status", || {
        cp.get_json(&["get", "pdb", "db", "-n", NS])["status"]["observedGeneration"].is_number()
    });
    let out = f.start_rollout(&b2, &["--drain", "--drain-timeout", "4s", "--wait"]);
    assert!(!out.status.success(), "a blocked drain fails the rollout");
    let id = first_line(&String::from_utf8_lossy(&out.stdout));
    let st = f.status(&id);
    assert_eq!(st["state"], "failed", "{st:#}");
    let n = &st["nodes"][0];
    let m = n["message"].as_str().unwrap();
    assert!(
        m.starts_with("drain-blocked after 4s: 1 pod remains (work/db-1)"),
        "{m}"
    );
    assert!(m.contains("refused by PodDisruptionBudget work/db"), "{m}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("PodDisruptionBudget work/db"),
        "{st:#}"
    );
    wait_until(
        Duration::from_secs(20),
        "node-1 uncordoned after the blocked drain",
        || !cordoned(&cp, "node-1"),
    );
    assert_eq!(f.agent("node-1").read(CONF), None, "the node kept its version");
    let ev = rollout_events(&f.server, &id);
    assert!(ev.iter().any(|(k, _)| k == "drain_blocked"), "{ev:?}");

    // Paused mid-drain: the drain stops and the cordon is lifted.
    let b3 = bundle(&f, "3");
    let id = f.roll_out(&b3, &["--drain", "--drain-timeout", "10m"]);
    wait_until(Duration::from_secs(30), "node-1 cordoned by the rollout", || {
        cordoned(&cp, "node-1")
            && node_json(&cp, "node-1")["metadata"]["annotations"]["lksadmin.io/cordoned-by"] == id.as_str()
    });
    assert_eq!(f.status(&id)["nodes"][0]["kube_step"], "draining");
    f.server.lksctl_ok(&["rollout", "pause", &id]);
    wait_until(
        Duration::from_secs(20),
        "node-1 uncordoned after the pause",
        || !cordoned(&cp, "node-1"),
    );
    let st = f.status(&id);
    assert_eq!(st["state"], "paused", "{st:#}");
    assert_eq!(st["nodes"][0]["state"], "waiting", "{st:#}");
    assert!(st["nodes"][0]["kube_step"].is_null(), "{st:#}");
    f.server.lksctl_ok(&["rollout", "abort", &id]);
    cp.kubectl_ok(&["delete", "pdb", "db", "-n", NS]);
    // Its pod gone as its kubelet would confirm an eviction (there is none
    // here to do it): an evicted pod is waited for until it is gone.
    cp.kubectl_ok(&["delete", "pod", "db-1", "-n", NS, "--grace-period=0", "--force"]);

    // A kubelet that never gets Ready: the node fails with the reason,
    // uncordoned; the agent applied (a rollback is the operator's call).
    SimulatedKubelet::new(&cp, "node-1").set_ready(false, "v1.37.2");
    let b4 = bundle(&f, "4");
    let out = f.start_rollout(
        &b4,
        &[
            "--drain",
            "--drain-timeout",
            "30s",
            "--ready-timeout",
            "3s",
            "--wait",
        ],
    );
    assert!(!out.status.success());
    let id = first_line(&String::from_utf8_lossy(&out.stdout));
    let st = f.status(&id);
    assert_eq!(st["state"], "failed", "{st:#}");
    assert_eq!(
        st["nodes"][0]["message"], "not Ready within 3s of applying: the Node is NotReady",
        "{st:#}"
    );
    wait_until(
        Duration::from_secs(20),
        "node-1 uncordoned after the failed gate",
        || !cordoned(&cp, "node-1"),
    );
    assert_eq!(
        f.agent("node-1").read(CONF).map(|(c, _)| c),
        Some(b"kubelet 4\n".to_vec()),
        "the agent applied; the gate failed the node afterwards"
    );
}
