//! The CRDs generated from control-server/kube-controller/src/crd.rs
//! (packaging/kubernetes/crds/, issue [kube-front]) against a real
//! kube-apiserver (tests/src/kube.rs): they are accepted and established,
//! without a warning, a manifest of each kind is stored with its spec, the
//! schema refuses a rollout without its cluster, with a wrong type or a
//! choice that is none of its words, `kubectl get` shows
//! the printer columns, and status is a subresource (a spec write cannot
//! set it).

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::kube::KubeControlPlane;
use lks_e2e::wait_until;

#[test]
fn the_crds_are_accepted_and_validate_what_users_write() {
    let cp = KubeControlPlane::start();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds");
    let out = cp.kubectl(&["apply", "-f", dir.to_str().unwrap()]);
    lks_e2e::ok_stdout(&out, "kubectl apply -f packaging/kubernetes/crds");
    // Every format is one Kubernetes knows (schemars' `uint32`, `uint64`
    // are mapped to int32/int64): the CRDs apply without a warning.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("unrecognized format"), "{stderr}");
    for crd in [
        "lksclusters.lksadmin.io",
        "lksnodes.lksadmin.io",
        "lksrollouts.lksadmin.io",
        "lksbundleversions.lksadmin.io",
    ] {
        wait_until(Duration::from_secs(30), &format!("{crd} established"), || {
            cp.get_json(&["get", "crd", crd])["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                })
        });
    }

    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksCluster\nmetadata:\n  name: tenant-a\nspec:\n  drain: true\n  maintenanceWindows: [\"Sat,Sun 02:00-06:00 Europe/Berlin\"]\n  kubeconfig: {name: tenant-a-lksadmin, namespace: lksadmin, key: kubeconfig}\n  peerSharing: {port: 7444, uploadRate: 50MiB}\n",
    );
    cp.kubectl_ok(&["create", "namespace", "lksadmin"]);
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: kubelet-1-37-2\n  namespace: lksadmin\nspec:\n  cluster: tenant-a\n  bundle: kubelet@1.37.2\n  batchSize: 2\n  selector: {pool: workers}\n  canary: {count: 1, soak: 10m}\n  drain: {enabled: true, timeout: 10m, onTimeout: skip}\n",
    );
    let r = cp.get_json(&["get", "lksrollout", "kubelet-1-37-2", "-n", "lksadmin"]);
    assert_eq!(r["spec"]["bundle"], "kubelet@1.37.2", "{r}");
    assert_eq!(r["spec"]["drain"]["onTimeout"], "skip", "{r}");
    assert_eq!(r["spec"]["paused"], false, "defaults are filled in: {r}");
    let c = cp.get_json(&["get", "lkscluster", "tenant-a"]);
    assert_eq!(c["spec"]["peerSharing"]["uploadRate"], "50MiB", "{c}");

    // The schema refuses what the server could not take.
    for (bad, why) in [
        (
            "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: no-cluster\n  namespace: lksadmin\nspec:\n  bundle: kubelet@1\n",
            "cluster",
        ),
        (
            "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: bad-batch\n  namespace: lksadmin\nspec:\n  cluster: a\n  bundle: kubelet@1\n  batchSize: many\n",
            "batchSize",
        ),
        (
            "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: bad-offline\n  namespace: lksadmin\nspec:\n  cluster: a\n  bundle: kubelet@1\n  offline: later\n",
            "spec.offline",
        ),
        (
            "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: bad-on-timeout\n  namespace: lksadmin\nspec:\n  cluster: a\n  bundle: kubelet@1\n  drain: {enabled: true, onTimeout: retry}\n",
            "onTimeout",
        ),
    ] {
        let out = cp.kubectl_stdin(&["apply", "-f", "-"], bad);
        assert!(!out.status.success(), "accepted: {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{why}: {err}");
    }

    // Status is the controller's: a spec write does not set it.
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksNode\nmetadata:\n  name: w1\nspec:\n  hold: {reason: disk check}\nstatus:\n  cluster: tenant-a\n  connected: true\n",
    );
    let n = cp.get_json(&["get", "lksnode", "w1"]);
    assert_eq!(n["spec"]["hold"]["reason"], "disk check", "{n}");
    assert!(n["status"].is_null(), "status set through the spec: {n}");
    let status = serde_json::json!({"status": {"cluster": "tenant-a", "connected": true, "kube": {"state": "Ready"}, "agentVersion": "0.1.0"}});
    cp.kubectl_ok(&[
        "patch",
        "lksnode",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    let table = cp.kubectl_ok(&["get", "lksnodes"]);
    let header = table.lines().next().unwrap();
    for col in ["CLUSTER", "CONNECTED", "KUBE", "AGENT"] {
        assert!(header.contains(col), "{table}");
    }
    let row = table.lines().nth(1).unwrap();
    assert!(
        row.contains("tenant-a") && row.contains("Ready") && row.contains("0.1.0"),
        "{table}"
    );
    let table = cp.kubectl_ok(&["get", "lksrollouts", "-A"]);
    assert!(table.lines().next().unwrap().contains("PHASE"), "{table}");
    assert!(table.contains("kubelet@1.37.2"), "{table}");
}
