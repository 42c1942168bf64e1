//! The tenant control plane the Kubernetes tests run against
//! (tests/src/kube.rs) is the real thing, and the RBAC the server is given in
//! a tenant cluster (packaging/kubernetes/tenant/rbac.yaml) is enough to
//! drain and no more:
//! - kube-apiserver reports the pinned release;
//! - the disruption controller computes a PodDisruptionBudget's status, and
//!   the Eviction API honours it (the second eviction is refused with 429);
//! - the ServiceAccount the manifest makes can do exactly what draining
//!   needs, and cannot delete pods, read Secrets or change workloads.
//!
//! Node objects and pod status are written by the tests' simulated kubelet:
//! there is no kubelet here.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet, kube_version, pod_manifest, set_pod_ready};
use lks_e2e::wait_until;

const NS: &str = "work";

fn evict(cp: &KubeControlPlane, name: &str) -> std::process::Output {
    let body = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    });
    cp.kubectl_stdin(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{NS}/pods/{name}/eviction"),
            "-f",
            "-",
        ],
        &body.to_string(),
    )
}

#[test]
fn real_control_plane_computes_budgets_and_the_tenant_rbac_is_enough_to_drain() {
    let cp = KubeControlPlane::start();

    let version = cp.get_json(&["version"]);
    assert_eq!(
        version["serverVersion"]["gitVersion"].as_str(),
        Some(kube_version().as_str()),
        "{version}"
    );

    a_budget_keeps_one_of_two_pods_up(&cp);
    the_first_eviction_is_allowed_and_the_second_refused_by_the_budget(&cp);
    the_tenant_rbac_can_drain_and_no_more(&cp);
}

/// Two pods of one app on node-a, a budget keeping one of them up: the
/// disruption controller allows one disruption.
fn a_budget_keeps_one_of_two_pods_up(cp: &KubeControlPlane) {
    SimulatedKubelet::new(cp, "node-a").register(true, &kube_version());
    cp.create_namespace(NS);
    for p in ["web-1", "web-2"] {
        cp.apply(&pod_manifest(NS, p, "node-a", "web", None));
        assert!(set_pod_ready(cp, NS, p));
    }
    cp.apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: {NS}\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      app: web\n"
    ));
    wait_until(
        Duration::from_secs(60),
        "the disruption controller to allow one disruption",
        || {
            let pdb = cp.get_json(&["get", "pdb", "web", "-n", NS]);
            pdb["status"]["currentHealthy"] == 2 && pdb["status"]["disruptionsAllowed"] == 1
        },
    );
}

/// The first eviction is allowed; the pod is bound to a node, so it is
/// deleted gracefully and stays until its kubelet confirms. The second
/// would leave none: 429 Too Many Requests, naming the budget.
fn the_first_eviction_is_allowed_and_the_second_refused_by_the_budget(cp: &KubeControlPlane) {
    let first = evict(cp, "web-1");
    assert!(
        first.status.success(),
        "first eviction: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let web1 = cp.get_json(&["get", "pod", "web-1", "-n", NS]);
    assert!(
        web1["metadata"]["deletionTimestamp"].is_string(),
        "web-1 not being deleted: {web1}"
    );
    // The second would leave none: 429 Too Many Requests, naming the budget.
    let second = evict(cp, "web-2");
    let err = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(!second.status.success(), "the second eviction was allowed");
    assert!(
        err.contains("429") || err.contains("disruption budget"),
        "second eviction refused, but not by the budget: {err}"
    );
}

/// Whether the kubeconfig `conf` may `verb` `what` (in `ns`), as
/// `kubectl auth can-i` answers.
fn can(conf: &Path, verb: &str, what: &str, ns: Option<&str>) -> bool {
    // `pods/eviction` is the resource `pods`, subresource `eviction`
    // (kubectl would read the part after the slash as a name).
    let (resource, sub) = what.split_once('/').unwrap_or((what, ""));
    let mut args = vec![
        format!("--kubeconfig={}", conf.display()),
        "auth".into(),
        "can-i".into(),
        verb.into(),
        resource.into(),
    ];
    if !sub.is_empty() {
        args.push(format!("--subresource={sub}"));
    }
    if let Some(ns) = ns {
        args.extend(["-n".into(), ns.into()]);
    }
    let out = lks_e2e::run({
        let mut c = std::process::Command::new(lks_e2e::kube::kube_bin_dir().join("kubectl"));
        c.args(&args);
        c
    });
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl auth can-i {verb} {what}: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// The tenant RBAC: a ServiceAccount that can drain and no more; and the
/// token works against the API, not just in a review.
fn the_tenant_rbac_can_drain_and_no_more(cp: &KubeControlPlane) {
    let (kubeconfig, _) = cp.lksadmin_kubeconfig();
    let conf = cp.dir().join("lksadmin.conf");
    std::fs::write(&conf, kubeconfig).expect("write lksadmin.conf");
    for (verb, what) in [
        ("get", "nodes"),
        ("list", "nodes"),
        ("watch", "nodes"),
        ("patch", "nodes"),
        ("list", "pods"),
        ("create", "pods/eviction"),
        ("list", "poddisruptionbudgets.policy"),
    ] {
        assert!(
            can(&conf, verb, what, Some(NS)),
            "the tenant RBAC does not allow {verb} {what}"
        );
    }
    for (verb, what) in [
        ("delete", "pods"),
        ("create", "pods"),
        ("delete", "nodes"),
        ("get", "secrets"),
        ("patch", "deployments.apps"),
        ("update", "poddisruptionbudgets.policy"),
    ] {
        assert!(
            !can(&conf, verb, what, Some(NS)),
            "the tenant RBAC allows {verb} {what}"
        );
    }
    // And the token works against the API, not just in a review.
    let out = lks_e2e::run({
        let mut c = std::process::Command::new(lks_e2e::kube::kube_bin_dir().join("kubectl"));
        c.arg(format!("--kubeconfig={}", conf.display()))
            .args(["get", "nodes", "-o", "name"]);
        c
    });
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "node/node-a",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
