//! lks-kube-controller against a real kube-apiserver (tests/src/kube.rs,
//! the CRDs of packaging/kubernetes/crds/) and a real lks-control-server
//! (issue [kube-front], item 2, first part):
//! - two copies run; one holds the Lease and mirrors every node as an
//!   LksNode (status from the server) and every published version as an
//!   LksBundleVersion;
//! - `LksNode.spec.hold` holds and releases the node on the server, and
//!   wins over a hold lifted with lksctl;
//! - a node deleted on the server loses its LksNode; killed, the leading
//!   copy is replaced by the other, which goes on mirroring;
//!
//! And (item 2, reconciling; the controller as its ServiceAccount with the
//! shipped RBAC):
//! - an LksCluster creates and converges the server's cluster, its
//!   reboot policy and labels too (drift is put back, a second pass
//!   changes nothing, a refused spec is Ready=False with the server's
//!   line, deletion waits for its nodes);
//! - an LksRollout starts once (refused until its bundle is published),
//!   pauses and resumes with spec.paused, refuses other changes, aborts on
//!   deletion; spec.rollbackOf rolls back; a rollout started with lksctl
//!   (idempotent with --request-id) is mirrored, marked outside Git.
//!
//! And (issue [shape-3], item 4): one object the controller cannot finish
//! (kube0 refuses its status writes) holds up no other: the valid ones
//! are carried out and the mirrors written meanwhile, and the broken one
//! is tried again until it goes through, started once. A copy that loses
//! the Lease stops reconciling until it holds it again.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use lks_e2e::kube::KubeControlPlane;
use lks_e2e::kube_controller;
use lks_e2e::server::{Server, TestNode, node_json};
use lks_e2e::{Proc, wait_until};

const WAIT: Duration = Duration::from_secs(40);

fn controller(cp: &KubeControlPlane, s: &Server, identity: &str) -> Proc {
    kube_controller::spawn(cp, s, identity, &cp.admin_kubeconfig)
}

fn lksnodes(cp: &KubeControlPlane) -> Vec<serde_json::Value> {
    cp.get_json(&["get", "lksnodes"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn held(s: &Server, node: &str) -> (bool, String) {
    let list = s.lksctl_json(&["node", "list"]);
    let n = node_json(&list, node);
    (
        n["held"] == true,
        n["hold_reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_bundle_versions_are_mirrored_holds_converge_and_a_second_copy_takes_over() {
    let cp = KubeControlPlane::start();
    kube_controller::apply_crds(&cp);
    cp.kubectl_ok(&["create", "namespace", "lksadmin"]);

    let s = Server::start();
    s.create_cluster("a");
    let t = s.token("a", &["--uses", "3"]);
    let _w1 = TestNode::enroll(&s, &t, "w1", &[("pool", "workers")]).await;
    let _w2 = TestNode::enroll(&s, &t, "w2", &[]).await;
    let dir = s.write_bundle("b", "app", "1.0+build_7", &[("/etc/app.conf", b"a=1\n", "0644")]);
    s.publish(&dir);

    let mut copies = [controller(&cp, &s, "c1"), controller(&cp, &s, "c2")];
    wait_until(WAIT, "both nodes mirrored with their status", || {
        let n = lksnodes(&cp);
        n.len() == 2 && n.iter().all(|o| o["status"]["cluster"] == "a")
    });
    let w1 = cp.get_json(&["get", "lksnode", "w1"]);
    assert_eq!(w1["status"]["labels"]["pool"], "workers", "{w1}");
    assert_eq!(w1["status"]["connected"], false, "{w1}");
    assert!(w1["spec"]["hold"].is_null(), "not held on the server: {w1}");
    wait_until(WAIT, "the bundle version mirrored", || {
        let b = cp.get_json(&["get", "lksbundleversions"]);
        b["items"].as_array().is_some_and(|i| {
            i.iter()
                .any(|o| o["spec"]["bundle"] == "app" && o["spec"]["version"] == "1.0+build_7")
        })
    });
    let table = cp.kubectl_ok(&["get", "lksbundleversions"]);
    assert!(
        table.contains("app-1.0-build-7-"),
        "a DNS name with a hash: {table}"
    );

    // One copy leads.
    let lease = cp.get_json(&["get", "lease", "lks-kube-controller", "-n", "lksadmin"]);
    let leader = lease["spec"]["holderIdentity"].as_str().unwrap().to_string();
    assert!(leader == "c1" || leader == "c2", "{lease}");

    // A hold declared on the LksNode reaches the server ...
    cp.kubectl_ok(&[
        "patch",
        "lksnode",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"hold":{"reason":"disk check"}}}"#,
    ]);
    wait_until(WAIT, "w1 held on the server", || {
        held(&s, "w1") == (true, "disk check".into())
    });
    // ... and wins over lksctl: the spec is the user's.
    s.lksctl_ok(&["node", "unhold", "w1"]);
    wait_until(WAIT, "w1 held again, as its spec says", || held(&s, "w1").0);
    cp.kubectl_ok(&[
        "patch",
        "lksnode",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"hold":null}}"#,
    ]);
    wait_until(WAIT, "w1 released on the server", || !held(&s, "w1").0);

    // The leader dies; the other copy takes the Lease over and mirrors on.
    let (idx, other) = if leader == "c1" { (0, "c2") } else { (1, "c1") };
    copies[idx].kill9();
    s.lksctl_ok(&["node", "delete", "w2"]);
    let _w3 = TestNode::enroll(&s, &t, "w3", &[]).await;
    wait_until(
        Duration::from_secs(60),
        "w3 mirrored and w2 gone, by the other copy",
        || {
            let names: Vec<String> = lksnodes(&cp)
                .iter()
                .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
                .collect();
            names.contains(&"w3".to_string()) && !names.contains(&"w2".to_string())
        },
    );
    let lease = cp.get_json(&["get", "lease", "lks-kube-controller", "-n", "lksadmin"]);
    assert_eq!(lease["spec"]["holderIdentity"], other, "{lease}");
    assert!(lease["spec"]["leaseTransitions"].as_i64() >= Some(1), "{lease}");
}

/// The `Ready` condition of a status: (status, reason, message).
fn ready(obj: &serde_json::Value) -> (String, String, String) {
    kube_controller::condition(obj, "Ready")
}

/// Server audit records of `verb` so far.
fn audited(s: &Server, verb: &str) -> usize {
    s.lksctl_json(&["audit"])
        .as_array()
        .map_or(0, |a| a.iter().filter(|r| r["verb"] == verb).count())
}

fn rollout_state(s: &Server, id: &str) -> serde_json::Value {
    s.lksctl_json(&["rollout", "status", id])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_and_rollouts_declared_in_kube0_are_carried_out_by_the_server() {
    let cp = KubeControlPlane::start();
    kube_controller::apply_crds(&cp);
    let (sa_kubeconfig, tenant) = controller_service_account_and_tenant_secret(&cp);

    let s = Server::start();
    let _c = kube_controller::spawn(&cp, &s, "c1", &sa_kubeconfig);

    // --- LksCluster: created on the server, converged, idempotent --------
    an_lkscluster_is_created_converged_and_drift_put_back(&cp, &s, &tenant);
    a_refused_cluster_spec_is_ready_false_until_fixed(&cp, &s);

    // --- LksRollout -------------------------------------------------------
    let (_w1, _w2, id) = an_lksrollout_is_refused_until_published_then_started_once(&cp, &s).await;
    paused_pauses_and_resumes_other_changes_are_refused_deletion_aborts(&cp, &s, &id);
    a_rollback_is_a_new_lksrollout(&cp, &id);
    an_lksctl_rollout_with_a_request_id_is_started_once_and_mirrored(&cp, &s);

    // --- LksCluster deletion waits for its nodes --------------------------
    cluster_deletion_waits_for_its_nodes(&cp, &s);
}

/// The controller's ServiceAccount with the shipped RBAC, and the tenant
/// cluster's kubeconfig as a Secret. Returns the controller's kubeconfig
/// file and the tenant kubeconfig.
fn controller_service_account_and_tenant_secret(cp: &KubeControlPlane) -> (PathBuf, String) {
    // The controller runs as its ServiceAccount, with the shipped RBAC.
    let sa_kubeconfig = kube_controller::service_account_kubeconfig(cp);

    // The tenant cluster's API (the same test API server) for draining,
    // as a Secret beside the controller.
    let (tenant, _) = cp.lksadmin_kubeconfig();
    let tenant_file = cp.dir().join("tenant-a.kubeconfig");
    std::fs::write(&tenant_file, &tenant).unwrap();
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "tenant-a-kube",
        "-n",
        "lksadmin",
        &format!("--from-file=kubeconfig={}", tenant_file.display()),
    ]);
    (sa_kubeconfig, tenant)
}

/// An LksCluster creates the server's cluster, with its probe and CA
/// hash in the status; an unchanged spec sends nothing; drift made with
/// lksctl is put back.
fn an_lkscluster_is_created_converged_and_drift_put_back(cp: &KubeControlPlane, s: &Server, tenant: &str) {
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksCluster\nmetadata:\n  name: a\nspec:\n  \
         apiServer: https://10.0.0.1:6443\n  drain: true\n  \
         kubeconfig: {name: tenant-a-kube, namespace: lksadmin, key: kubeconfig}\n  \
         peerSharing: {uploadRate: 200Mbit}\n  \
         reboots: {mode: auto, maxConcurrent: 2, timeout: 45m, onTimeout: keep, \
         alertGate: {url: \"http://prometheus.monitoring:9090\", filter: ^Kube}, \
         blockingPodSelector: \"app in (db, cache)\"}\n  \
         labels: {env: prod}\n",
    );
    wait_until(WAIT, "LksCluster a Ready", || {
        ready(&cp.get_json(&["get", "lkscluster", "a"])).0 == "True"
    });
    let c = s.lksctl_json(&["cluster", "get", "a"]);
    assert_eq!(c["api_server"], "https://10.0.0.1:6443", "{c}");
    assert_eq!(c["drain"], true, "{c}");
    assert_eq!(c["kubeconfig"], true, "{c}");
    assert_eq!(c["peer_sharing"]["upload_rate"], 25_000_000, "{c}");
    assert_eq!(
        (
            &c["reboots"]["mode"],
            &c["reboots"]["max_concurrent"],
            &c["reboots"]["timeout"],
            &c["reboots"]["on_timeout"]
        ),
        (&"auto".into(), &2.into(), &"45m".into(), &"keep".into()),
        "spec.reboots reached the server: {c}"
    );
    assert_eq!(
        c["reboots"]["alert_gate"],
        serde_json::json!({"url": "http://prometheus.monitoring:9090", "filter": "^Kube"}),
        "{c}"
    );
    assert_eq!(c["reboots"]["blocking_pod_selector"], "app in (db,cache)", "{c}");
    assert_eq!(c["labels"]["env"], "prod", "{c}");
    let obj = cp.get_json(&["get", "lkscluster", "a"]);
    assert!(
        obj["status"]["kubeProbe"]
            .as_str()
            .unwrap_or_default()
            .contains(": reachable, Kubernetes v"),
        "the server tried the tenant API: {obj}"
    );
    assert_eq!(obj["status"]["caCertHash"], c["ca_cert_hash"], "{obj}");
    assert!(
        !obj.to_string().contains(&tenant[..40]),
        "the kubeconfig is never copied into the object"
    );
    assert_eq!(obj["metadata"]["finalizers"][0], "lksadmin.io/cluster", "{obj}");
    // Applying the same spec again, and the passes after, change nothing.
    let sets = audited(s, "SetCluster");
    assert_eq!(audited(s, "CreateCluster"), 1);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(audited(s, "SetCluster"), sets, "an unchanged spec sends nothing");
    // Drift made with lksctl is put back: the spec wins.
    s.lksctl_ok(&[
        "cluster",
        "set",
        "a",
        "--drain",
        "off",
        "--reboots",
        "off",
        "--no-reboot-alert-gate",
        "--no-labels",
    ]);
    wait_until(WAIT, "drain, reboots and labels again as the spec says", || {
        let c = s.lksctl_json(&["cluster", "get", "a"]);
        c["drain"] == true
            && c["reboots"]["mode"] == "auto"
            && c["reboots"]["alert_gate"]["filter"] == "^Kube"
            && c["labels"]["env"] == "prod"
    });
}

/// A spec the server refuses: Ready=False with its line, then fixed.
fn a_refused_cluster_spec_is_ready_false_until_fixed(cp: &KubeControlPlane, s: &Server) {
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksCluster\nmetadata:\n  name: b\nspec:\n  \
         maintenanceWindows: [\"whenever\"]\n",
    );
    wait_until(WAIT, "LksCluster b refused", || {
        let (st, reason, msg) = ready(&cp.get_json(&["get", "lkscluster", "b"]));
        st == "False" && reason == "Refused" && msg.contains("whenever")
    });
    cp.kubectl_ok(&[
        "patch",
        "lkscluster",
        "b",
        "--type=merge",
        "-p",
        r#"{"spec":{"maintenanceWindows":["Sat,Sun 02:00-06:00 UTC"]}}"#,
    ]);
    wait_until(WAIT, "LksCluster b Ready once fixed", || {
        ready(&cp.get_json(&["get", "lkscluster", "b"])).0 == "True"
    });
    assert_eq!(
        s.lksctl_json(&["cluster", "get", "b"])["maintenance_windows"][0],
        "Sat,Sun 02:00-06:00 UTC"
    );
}

/// An LksRollout declared before its bundle is published is refused and
/// retried, then started once, with no mirror beside it. Returns the
/// enrolled nodes and the rollout's ID.
async fn an_lksrollout_is_refused_until_published_then_started_once(
    cp: &KubeControlPlane,
    s: &Server,
) -> (TestNode, TestNode, String) {
    let t = s.token("a", &["--uses", "2"]);
    let _w1 = TestNode::enroll(s, &t, "w1", &[]).await;
    let _w2 = TestNode::enroll(s, &t, "w2", &[]).await;
    s.publish(&s.write_bundle("b1", "app", "1", &[("/etc/app.conf", b"a=1\n", "0644")]));
    // Declared before its bundle is published: refused, retried.
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: app-2\n  namespace: lksadmin\n\
         spec:\n  cluster: a\n  bundle: app@2\n  batchSize: 1\n  offline: wait\n  drain: {enabled: false}\n",
    );
    wait_until(WAIT, "app-2 refused: not published", || {
        let (st, reason, msg) = ready(&cp.get_json(&["get", "lksrollout", "app-2", "-n", "lksadmin"]));
        st == "False" && reason == "Refused" && msg.contains("not published")
    });
    s.publish(&s.write_bundle("b2", "app", "2", &[("/etc/app.conf", b"a=2\n", "0644")]));
    let mut id = String::new();
    wait_until(WAIT, "app-2 started once published", || {
        let o = cp.get_json(&["get", "lksrollout", "app-2", "-n", "lksadmin"]);
        id = o["status"]["id"].as_str().unwrap_or_default().to_string();
        !id.is_empty() && o["status"]["phase"] == "running" && ready(&o).0 == "True"
    });
    let r = rollout_state(s, &id);
    assert_eq!(
        r["request_id"].as_str().map(|x| x.starts_with("kube:")),
        Some(true),
        "{r}"
    );
    assert_eq!(r["batch_size"], 1, "{r}");
    let audit = s.lksctl_json(&["audit"]);
    let starts: Vec<&serde_json::Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["verb"] == "StartRollout")
        .collect();
    assert!(starts.len() >= 2, "refused, then tried again: {starts:?}");
    assert_eq!(
        starts.iter().filter(|a| a["outcome"] == "ok").count(),
        1,
        "started once: {starts:?}"
    );
    // One truth: the declared object, no mirror beside it.
    let all = cp.get_json(&["get", "lksrollouts", "-n", "lksadmin"]);
    let with_id = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["status"]["id"] == id.as_str())
        .count();
    assert_eq!(with_id, 1, "{all}");
    (_w1, _w2, id)
}

/// spec.paused pauses and resumes; any other change is refused, not
/// carried out; deleting the LksRollout aborts the rollout.
fn paused_pauses_and_resumes_other_changes_are_refused_deletion_aborts(
    cp: &KubeControlPlane,
    s: &Server,
    id: &str,
) {
    let patch = |p: &str| {
        cp.kubectl_ok(&[
            "patch",
            "lksrollout",
            "app-2",
            "-n",
            "lksadmin",
            "--type=merge",
            "-p",
            p,
        ])
    };
    patch(r#"{"spec":{"paused":true}}"#);
    wait_until(WAIT, "paused on the server", || {
        rollout_state(s, id)["state"] == "paused"
    });
    wait_until(WAIT, "phase paused in kube0", || {
        cp.get_json(&["get", "lksrollout", "app-2", "-n", "lksadmin"])["status"]["phase"] == "paused"
    });
    patch(r#"{"spec":{"paused":false}}"#);
    wait_until(WAIT, "running again", || {
        rollout_state(s, id)["state"] == "running"
    });
    // Anything else is refused, not carried out.
    patch(r#"{"spec":{"batchSize":2}}"#);
    wait_until(WAIT, "SpecChanged", || {
        ready(&cp.get_json(&["get", "lksrollout", "app-2", "-n", "lksadmin"])).1 == "SpecChanged"
    });
    assert_eq!(rollout_state(s, id)["batch_size"], 1);
    // Deleting it aborts the rollout.
    cp.kubectl_ok(&["delete", "lksrollout", "app-2", "-n", "lksadmin", "--timeout=40s"]);
    assert_eq!(rollout_state(s, id)["state"], "aborted");
}

/// A rollback is a new LksRollout.
fn a_rollback_is_a_new_lksrollout(cp: &KubeControlPlane, id: &str) {
    cp.apply(&format!(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: app-2-back\n  namespace: lksadmin\n\
         spec:\n  cluster: a\n  bundle: app@2\n  rollbackOf: \"{id}\"\n"
    ));
    wait_until(WAIT, "rolling back (w1, offline, waits to return)", || {
        let o = cp.get_json(&["get", "lksrollout", "app-2-back", "-n", "lksadmin"]);
        o["status"]["id"] == id
            && matches!(
                o["status"]["phase"].as_str(),
                Some("rolling_back" | "rolled_back")
            )
            && ready(&o).0 == "True"
    });
}

/// lksctl with a request ID: started once, mirrored as outside Git (a
/// bundle of its own: app is still rolling back).
fn an_lksctl_rollout_with_a_request_id_is_started_once_and_mirrored(cp: &KubeControlPlane, s: &Server) {
    s.publish(&s.write_bundle("t1", "tool", "1", &[("/etc/tool.conf", b"t=1\n", "0644")]));
    let start = |version: &str| {
        s.lksctl(&[
            "rollout",
            "start",
            "--cluster",
            "a",
            "--bundle",
            &format!("tool@{version}"),
            "--no-drain",
            "--request-id",
            "ci-7",
            "-o",
            "json",
        ])
    };
    let json = |o: std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
    };
    let first = json(start("1"));
    let again = json(start("1"));
    assert_eq!(first["id"], again["id"], "one rollout for one request ID");
    let other = start("2");
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("already started rollout"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let mirror_id = first["id"].as_str().unwrap().to_string();
    wait_until(WAIT, "the lksctl rollout mirrored, marked outside Git", || {
        cp.get_json(&["get", "lksrollouts", "-n", "lksadmin"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| {
                o["status"]["id"] == mirror_id.as_str()
                    && o["metadata"]["annotations"]["lksadmin.io/created-outside-git"] == "true"
            })
    });
}

/// Deleting an LksCluster waits for its nodes.
fn cluster_deletion_waits_for_its_nodes(cp: &KubeControlPlane, s: &Server) {
    cp.kubectl_ok(&["delete", "lkscluster", "a", "--wait=false"]);
    wait_until(WAIT, "deletion refused while nodes are enrolled", || {
        ready(&cp.get_json(&["get", "lkscluster", "a"])).1 == "HasNodes"
    });
    s.lksctl_ok(&["node", "delete", "w1"]);
    s.lksctl_ok(&["node", "delete", "w2"]);
    wait_until(WAIT, "LksCluster a gone once its nodes are", || {
        !cp.kubectl(&["get", "lkscluster", "a"]).status.success()
    });
}

/// Refuses every status write of an LksCluster or LksRollout named
/// `broken` (a ValidatingAdmissionPolicy): an object the controller
/// cannot finish, however often it tries.
const REFUSE_BROKEN: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: refuse-broken-status
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [lksadmin.io]
        apiVersions: ["*"]
        operations: [UPDATE]
        resources: [lksclusters/status, lksrollouts/status]
  validations:
    - expression: "object.metadata.name != 'broken'"
      message: refused by the test
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: refuse-broken-status
spec:
  policyName: refuse-broken-status
  validationActions: [Deny]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_object_that_cannot_be_finished_holds_up_no_other() {
    let cp = KubeControlPlane::start();
    kube_controller::apply_crds(&cp);
    cp.create_namespace("lksadmin");
    let s = Server::start();
    s.publish(&s.write_bundle("b1", "app", "1", &[("/etc/app.conf", b"a=1\n", "0644")]));

    // kube0 refuses the status writes of the objects named broken (the
    // policy takes effect a moment after it is applied).
    cp.apply(REFUSE_BROKEN);
    cp.apply("apiVersion: lksadmin.io/v1alpha1\nkind: LksCluster\nmetadata:\n  name: broken\nspec:\n  apiServer: https://10.0.0.9:6443\n");
    wait_until(WAIT, "the policy refuses a status write", || {
        let out = cp.kubectl(&[
            "patch",
            "lkscluster",
            "broken",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"nodes":0}}"#,
        ]);
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("refused by the test")
    });
    // Each broken object sorts before its valid peer.
    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksCluster\nmetadata:\n  name: good\nspec:\n  apiServer: https://10.0.0.9:6443\n",
    );
    for (name, cluster) in [("broken", "broken"), ("good", "good")] {
        cp.apply(&format!(
            "apiVersion: lksadmin.io/v1alpha1\nkind: LksRollout\nmetadata:\n  name: {name}\n  namespace: lksadmin\n\
             spec:\n  cluster: {cluster}\n  bundle: app@1\n  drain: {{enabled: false}}\n"
        ));
    }

    let mut c = controller(&cp, &s, "c1");
    wait_until(WAIT, "the valid LksCluster carried out", || {
        ready(&cp.get_json(&["get", "lkscluster", "good"])).0 == "True"
    });
    assert_eq!(
        s.lksctl_json(&["cluster", "get", "good"])["api_server"],
        "https://10.0.0.9:6443"
    );
    wait_until(WAIT, "the valid LksRollout started", || {
        let o = cp.get_json(&["get", "lksrollout", "good", "-n", "lksadmin"]);
        o["status"]["id"].as_str().is_some_and(|id| !id.is_empty()) && ready(&o).0 == "True"
    });
    wait_until(WAIT, "the bundle version mirrored", || {
        cp.get_json(&["get", "lksbundleversions"])["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|o| o["spec"]["bundle"] == "app"))
    });
    // The broken ones were carried out on the server, but their status
    // could not be written: tried again, not given up.
    wait_until(WAIT, "the broken objects tried again", || {
        let log = c.log_text();
        log.matches("reconcile failed").count() >= 4 && log.contains("refused by the test")
    });
    for kind in ["lkscluster", "lksrollout"] {
        let o = cp.get_json(&["get", kind, "broken", "-n", "lksadmin"]);
        // (The probe above may have written a status before the policy
        // took effect; the controller's has conditions.)
        assert!(o["status"]["conditions"].is_null(), "{o}");
    }
    assert!(
        !c.log_text().contains("connection lost"),
        "refusals in kube0 drop no admin connection: {}",
        c.log_text()
    );

    // Once kube0 takes the writes, the broken objects go through; the
    // rollout was started once however often it was tried.
    cp.kubectl_ok(&[
        "delete",
        "validatingadmissionpolicybinding",
        "refuse-broken-status",
    ]);
    wait_until(WAIT, "the LksCluster once broken is Ready", || {
        ready(&cp.get_json(&["get", "lkscluster", "broken"])).0 == "True"
    });
    wait_until(WAIT, "the LksRollout once broken shows its rollout", || {
        let o = cp.get_json(&["get", "lksrollout", "broken", "-n", "lksadmin"]);
        o["status"]["id"].as_str().is_some_and(|id| !id.is_empty()) && ready(&o).0 == "True"
    });
    let started: Vec<serde_json::Value> = s
        .lksctl_json(&["rollout", "list"])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["cluster"] == "broken")
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");

    // SIGTERM stops the controllers and the poll, and the process exits.
    assert_eq!(c.terminate(Duration::from_secs(20)), Some(0), "{}", c.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_loses_the_lease_stops_reconciling_until_it_holds_it_again() {
    let cp = KubeControlPlane::start();
    kube_controller::apply_crds(&cp);
    cp.create_namespace("lksadmin");
    let s = Server::start();
    s.create_cluster("a");
    let t = s.token("a", &[]);
    let _w1 = TestNode::enroll(&s, &t, "w1", &[]).await;
    let c = controller(&cp, &s, "c1");
    wait_until(WAIT, "w1 mirrored", || {
        lksnodes(&cp).iter().any(|o| o["status"]["cluster"] == "a")
    });
    let give_lease_to = |holder: &str| {
        cp.kubectl_ok(&[
            "patch",
            "lease",
            "lks-kube-controller",
            "-n",
            "lksadmin",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"holderIdentity":"{holder}","leaseDurationSeconds":3600}}}}"#),
        ])
    };
    let changes = |c: &Proc, to: &str| {
        c.log_text()
            .lines()
            // `leading=false`, with the log's colours between the words.
            .filter(|l| l.contains("leadership changed") && l.contains(to))
            .count()
    };

    // Another copy holds the Lease (as one would after this copy missed
    // its renewals): this copy stops, and a hold declared meanwhile is not
    // carried out.
    give_lease_to("c2");
    wait_until(WAIT, "c1 stopped leading", || changes(&c, "false") == 1);
    cp.kubectl_ok(&[
        "patch",
        "lksnode",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"hold":{"reason":"disk check"}}}"#,
    ]);
    std::thread::sleep(Duration::from_secs(4));
    assert!(!held(&s, "w1").0, "a copy without the Lease changes nothing");

    // The Lease back: the controllers run again and catch up.
    give_lease_to("c1");
    wait_until(WAIT, "c1 leads again", || changes(&c, "true") == 2);
    wait_until(WAIT, "w1 held, as its spec says", || {
        held(&s, "w1") == (true, "disk check".into())
    });
}
