//! lks-kube-controller against a real kube-apiserver (tests/src/kube.rs,
//! the CRDs of packaging/kubernetes/crds/) and a real lks-control-server
//! (issue [kube-front], item 2, first part):
//! - two copies run; one holds the Lease and mirrors every node as an
//!   LksNode (status from the server) and every published version as an
//!   LksBundleVersion;
//! - `LksNode.spec.hold` holds and releases the node on the server, and
//!   wins over a hold lifted with lksctl;
//! - a node deleted on the server loses its LksNode; killed, the leading
//!   copy is replaced by the other, which goes on mirroring.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use lks_e2e::kube::KubeControlPlane;
use lks_e2e::server::{Server, TestNode, node_json};
use lks_e2e::{Proc, bin, wait_until};

const WAIT: Duration = Duration::from_secs(40);

fn controller(cp: &KubeControlPlane, s: &Server, identity: &str) -> Proc {
    let mut c = Command::new(bin("lks-kube-controller"));
    c.args([
        "run",
        "--namespace",
        "lksadmin",
        "--interval",
        "1s",
        "--identity",
        identity,
    ])
    .arg("--admin-conf")
    .arg(s.admin_conf_path())
    .env("KUBECONFIG", &cp.admin_kubeconfig)
    .env("RUST_LOG", "info");
    Proc::spawn(&format!("controller-{identity}"), c, cp.dir())
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
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds");
    cp.kubectl_ok(&["apply", "-f", crds.to_str().unwrap()]);
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);
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
