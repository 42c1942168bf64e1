//! An `LksPlan` (issue [fleet-plans], item 3) carried out by a real
//! lks-kube-controller (as its ServiceAccount, with the shipped RBAC)
//! against a real kube-apiserver and a real lks-control-server: the plan
//! is created once, named as the object, and shows in `lksctl plan
//! status`; its status mirrors the plan's groups and clusters (with the
//! cluster's rollout ID, and conditions); `spec.paused` pauses and resumes it; deleting
//! the object aborts the plan.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::kube::KubeControlPlane;
use lks_e2e::kube_controller;
use lks_e2e::server::{Server, TestNode};
use lks_e2e::{Proc, wait_until};

const WAIT: Duration = Duration::from_secs(40);

/// The controller as its ServiceAccount with the shipped RBAC.
fn controller(cp: &KubeControlPlane, s: &Server) -> Proc {
    kube_controller::apply_crds(cp);
    let kubeconfig = kube_controller::service_account_kubeconfig(cp);
    kube_controller::spawn(cp, s, "c1", &kubeconfig)
}

fn plan(s: &Server) -> serde_json::Value {
    s.lksctl_json(&["plan", "status", "fleet"])
}

fn lksplan(cp: &KubeControlPlane) -> serde_json::Value {
    cp.get_json(&["get", "lksplan", "fleet"])
}

/// The condition `type_` of an object's status: (status, reason).
fn condition(obj: &serde_json::Value, type_: &str) -> (String, String) {
    let (status, reason, _) = kube_controller::condition(obj, type_);
    (status, reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lksplan_is_created_once_mirrored_paused_and_aborted_on_deletion() {
    let cp = KubeControlPlane::start();
    let s = Server::start();
    let _c = controller(&cp, &s);
    s.create_cluster("a");
    s.lksctl_ok(&["cluster", "set", "a", "--labels", "tier=early"]);
    // An enrolled node whose agent never applies: the plan's rollout of
    // cluster a stays running.
    let t = s.token("a", &[]);
    let _w1 = TestNode::enroll(&s, &t, "w1", &[]).await;
    assert_eq!(
        s.publish(&s.write_bundle("b1", "app", "1", &[("/etc/app.conf", b"a=1\n", "0644")])),
        "app@1"
    );

    cp.apply(
        "apiVersion: lksadmin.io/v1alpha1\nkind: LksPlan\nmetadata:\n  name: fleet\nspec:\n  \
         bundle: app@1\n  groups:\n  - {name: early, selector: tier=early}\n  \
         soak: 1m\n  failureBudget: 2\n  onHalt: finish\n  alertAfter: 12h\n  \
         rollout: {batchSize: 1, offline: wait, drain: {enabled: false}}\n",
    );
    let mut id = String::new();
    wait_until(WAIT, "LksPlan fleet created and mirrored", || {
        let o = lksplan(&cp);
        id = o["status"]["groups"][0]["clusters"][0]["rolloutId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        o["status"]["state"] == "running" && !id.is_empty() && condition(&o, "Ready").0 == "True"
    });
    let p = plan(&s);
    assert_eq!(p["state"], "running", "{p}");
    assert_eq!(p["bundle"], "app@1", "{p}");
    assert_eq!(p["failure_budget"], 2, "{p}");
    assert_eq!(p["on_halt"], "finish", "{p}");
    assert_eq!(p["groups"][0]["clusters"][0]["name"], "a", "{p}");
    assert_eq!(p["groups"][0]["clusters"][0]["rollout_id"], id.as_str(), "{p}");
    let o = lksplan(&cp);
    assert_eq!(o["status"]["groups"][0]["name"], "early", "{o}");
    assert_eq!(o["status"]["groups"][0]["clusters"][0]["name"], "a", "{o}");
    assert_eq!(o["metadata"]["finalizers"][0], "lksadmin.io/plan", "{o}");

    // spec.paused pauses and resumes the plan.
    cp.kubectl_ok(&[
        "patch",
        "lksplan",
        "fleet",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ]);
    wait_until(WAIT, "plan paused", || {
        let o = lksplan(&cp);
        plan(&s)["state"] == "paused"
            && o["status"]["state"] == "paused"
            && condition(&o, "Progressing") == ("False".into(), "Paused".into())
    });
    cp.kubectl_ok(&[
        "patch",
        "lksplan",
        "fleet",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":false}}"#,
    ]);
    wait_until(WAIT, "plan resumed", || plan(&s)["state"] == "running");

    // Another change is refused: the plan stays as created.
    cp.kubectl_ok(&[
        "patch",
        "lksplan",
        "fleet",
        "--type=merge",
        "-p",
        r#"{"spec":{"failureBudget":5}}"#,
    ]);
    wait_until(WAIT, "a changed spec is Ready=False SpecChanged", || {
        condition(&lksplan(&cp), "Ready") == ("False".into(), "SpecChanged".into())
    });
    assert_eq!(plan(&s)["failure_budget"], 2);

    // Deleting the object aborts the plan, then the object goes.
    cp.kubectl_ok(&["delete", "lksplan", "fleet", "--wait=false"]);
    wait_until(WAIT, "plan aborted and LksPlan gone", || {
        plan(&s)["state"] == "aborted"
            && !cp
                .kubectl(&["get", "lksplan", "fleet", "-o", "name"])
                .status
                .success()
    });
}
