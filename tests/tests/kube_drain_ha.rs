//! A leader killed mid-drain (kill -9) on etcd replicas, against a real
//! kube-apiserver (tests/src/kube.rs) with real agents: the next leader
//! resumes that node's drain from the store (the cordon is the rollout's,
//! named by its annotation), the rollout completes, each node is started
//! and drained once, and no node is left cordoned.
//!
//! Node objects and pod status are written by the tests' simulated
//! kubelet; there is no kubelet here.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet, pod_manifest};
use lks_e2e::rollout::rollout_events;
use lks_e2e::server::Server;
use lks_e2e::wait_until;

const NS: &str = "work";
const CORDONED_BY: &str = "lksadmin.io/cordoned-by";

fn is_leader(s: &Server) -> bool {
    s.log().contains("elected: this replica drives rollouts")
}

fn node(cp: &KubeControlPlane, name: &str) -> serde_json::Value {
    cp.get_json(&["get", "node", name])
}

#[test]
fn a_leader_killed_mid_drain_is_replaced_by_one_that_finishes_it_and_leaves_no_cordon() {
    let cp = KubeControlPlane::start();
    let etcd = Etcd::start();
    let prefix = "/lks-drain-ha/";
    let mut r1 = etcd.replica(prefix, &[]);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let r2 = etcd.replica(prefix, &[]);

    let agents = two_agents_with_kubelets_join_through_r2(&cp, &r2);
    let id = a_drain_a_budget_blocks_is_under_way_on_n0(&cp, &r2);

    // The leader dies mid-drain; r2 takes over and resumes it.
    r1.kill9();
    wait_until(Duration::from_secs(30), "r2 elected", || is_leader(&r2));
    let st = r2.lksctl_json(&["rollout", "status", &id]);
    assert_eq!(st["nodes"][0]["kube_step"], "draining", "{st:#}");
    assert_eq!(
        node(&cp, "n0")["spec"]["unschedulable"],
        true,
        "the cordon stays while the drain goes on"
    );

    the_new_leader_finishes_the_drain_and_leaves_no_cordon(&cp, &r2, &id, &agents);
    each_node_started_and_drained_once(&r2, &id);
}

/// Cluster t with the test control plane's kubeconfig; agents n0 and n1
/// join through r2 and connect, each with a simulated kubelet's Node.
fn two_agents_with_kubelets_join_through_r2(cp: &KubeControlPlane, r2: &Server) -> Vec<Agent> {
    r2.lksctl_ok(&["cluster", "create", "t"]);
    let conf = cp.admin_kubeconfig.to_str().unwrap().to_string();
    r2.lksctl_ok(&["cluster", "set", "t", "--kubeconfig", &conf]);
    let tok = r2.lksctl_json(&["token", "create", "--cluster", "t", "--uses", "2"]);
    let servers = tok["server"].as_str().unwrap().to_string();
    let mut agents = Vec::new();
    for name in ["n0", "n1"] {
        let mut a = Agent::new(name);
        let out = a.join_raw(
            &servers,
            tok["token"].as_str().unwrap(),
            tok["ca_cert_hash"].as_str().unwrap(),
            &[],
        );
        assert!(
            out.status.success(),
            "join {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        a.start();
        SimulatedKubelet::new(cp, name).register(true, "v1.37.2");
        agents.push(a);
    }
    wait_until(CONVERGE, "both agents connected", || {
        let v = r2.lksctl_json(&["node", "list"]);
        v.as_array()
            .is_some_and(|n| n.len() == 2 && n.iter().all(|x| x["connected"] == true))
    });

    agents
}

/// A pod on n0 whose budget allows no eviction: n0's drain waits, n0
/// cordoned by the rollout of kubelet@2. Returns the rollout's ID.
fn a_drain_a_budget_blocks_is_under_way_on_n0(cp: &KubeControlPlane, r2: &Server) -> String {
    cp.create_namespace(NS);
    cp.apply(&pod_manifest(NS, "db-1", "n0", "db", None));
    cp.apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: db\n  namespace: {NS}\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels: {{app: db}}\n"
    ));

    let dir = write_bundle(
        r2.work_dir(),
        "kubelet",
        "2",
        &[BundleFile {
            path: "/etc/kubernetes/kubelet.conf",
            content: b"kubelet 2\n",
            mode: "0600",
        }],
        "",
    );
    r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()]);
    let id = r2
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "t",
            "--bundle",
            "kubelet@2",
            "--batch-size",
            "1",
            "--drain",
            "--drain-timeout",
            "10m",
        ])
        .trim()
        .to_string();
    wait_until(Duration::from_secs(30), "n0 cordoned by the rollout", || {
        let n = node(cp, "n0");
        n["spec"]["unschedulable"] == true && n["metadata"]["annotations"][CORDONED_BY] == id.as_str()
    });

    id
}

/// The budget is lifted: the new leader's drain evicts the pod (and the
/// simulated kubelet confirms it), the rollout goes on to the end, no
/// node stays cordoned, both nodes hold kubelet 2.
fn the_new_leader_finishes_the_drain_and_leaves_no_cordon(
    cp: &KubeControlPlane,
    r2: &Server,
    id: &str,
    agents: &[Agent],
) {
    cp.kubectl_ok(&["delete", "pdb", "db", "-n", NS]);
    wait_until(Duration::from_secs(90), "the rollout completed", || {
        if let Some(p) = cp
            .kubectl(&["get", "pod", "db-1", "-n", NS, "-o", "json"])
            .status
            .success()
            .then(|| cp.get_json(&["get", "pod", "db-1", "-n", NS]))
            && p["metadata"]["deletionTimestamp"].is_string()
        {
            let _ = cp.kubectl(&["delete", "pod", "db-1", "-n", NS, "--grace-period=0", "--force"]);
        }
        r2.lksctl_json(&["rollout", "status", id])["state"] == "completed"
    });
    wait_until(Duration::from_secs(20), "no node cordoned", || {
        ["n0", "n1"]
            .iter()
            .all(|n| node(cp, n)["spec"]["unschedulable"] != true)
    });
    for n in ["n0", "n1"] {
        assert!(
            node(cp, n)["metadata"]["annotations"][CORDONED_BY].is_null(),
            "{n}"
        );
    }
    for a in agents {
        assert_eq!(
            a.read("/etc/kubernetes/kubelet.conf").map(|(c, _)| c),
            Some(b"kubelet 2\n".to_vec()),
            "{}",
            a.name
        );
    }
}

/// One start and one drain per node: the new leader resumed, it did not
/// begin again.
fn each_node_started_and_drained_once(r2: &Server, id: &str) {
    let ev = rollout_events(r2, id);
    for n in ["n0", "n1"] {
        let count = |k: &str| ev.iter().filter(|(kind, node)| kind == k && node == n).count();
        assert_eq!(count("node_started"), 1, "{n}: {ev:?}");
        assert_eq!(count("drained"), 1, "{n}: {ev:?}");
        assert_eq!(count("node_ready"), 1, "{n}: {ev:?}");
    }
}
