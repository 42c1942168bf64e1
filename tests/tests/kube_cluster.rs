//! A cluster names its tenant API (`lksctl cluster set NAME --kubeconfig
//! FILE`) against a real kube-apiserver (tests/src/kube.rs): the
//! ServiceAccount kubeconfig minted from packaging/kubernetes/tenant/rbac.yaml
//! is accepted and tried, never printed back; what a server must not run,
//! read or skip is refused in one line; and `node list` shows each node as
//! its tenant cluster sees it (the KUBE column, `-o json`'s `kube`).
//!
//! Node objects are written by the tests' simulated kubelet: there is no
//! kubelet here.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet, kube_version};
use lks_e2e::server::{Server, TestNode, node_json};
use lks_e2e::{one_line_error, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_names_its_tenant_api_and_node_list_shows_kubernetes_state() {
    let cp = KubeControlPlane::start();
    let s = Server::start();
    s.create_cluster("t");
    s.create_cluster("other");
    let t = s.token("t", &[]);
    let _a = TestNode::enroll(&s, &t, "node-a", &[]).await;
    let _b = TestNode::enroll(&s, &t, "node-b", &[]).await;

    // Before a kubeconfig: no KUBE column, `kube` null.
    let table = s.lksctl_ok(&["node", "list"]);
    assert!(!table.lines().next().unwrap().contains("KUBE"), "{table}");
    let list = s.lksctl_json(&["node", "list"]);
    assert!(node_json(&list, "node-a")["kube"].is_null(), "{list}");

    let (kubeconfig, token) = cp.lksadmin_kubeconfig();
    let file = s.work_dir().join("t.kubeconfig");
    std::fs::write(&file, &kubeconfig).unwrap();
    let file = file.to_str().unwrap();

    the_kubeconfig_is_accepted_and_tried_and_its_token_never_printed(&s, file, &token);
    node_list_shows_each_node_as_its_tenant_cluster_sees_it(&cp, &s);
    a_kubeconfig_a_server_must_not_run_read_or_skip_is_refused(&s, &kubeconfig, &token);

    // Removing the kubeconfig while drain is on would strand rollouts.
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "t", "--kubeconfig", "none"]),
        "remove while draining",
    );
    assert!(e.contains("--drain off"), "{e}");
    let out = s.lksctl_ok(&["cluster", "set", "t", "--kubeconfig", "none", "--drain", "off"]);
    assert!(out.contains("kubeconfig removed"), "{out}");
    let list = s.lksctl_json(&["node", "list"]);
    assert!(node_json(&list, "node-a")["kube"].is_null(), "{list}");
    assert!(
        !s.lksctl_ok(&["node", "list"])
            .lines()
            .next()
            .unwrap()
            .contains("KUBE")
    );
}

/// Drain needs the tenant API: refused without a kubeconfig. With it the
/// API is tried and drain turned on; the token shows nowhere (get, list,
/// audit, events), the event and the audit name the server only.
fn the_kubeconfig_is_accepted_and_tried_and_its_token_never_printed(s: &Server, file: &str, token: &str) {
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "t", "--drain", "on"]),
        "drain without a kubeconfig",
    );
    assert!(e.contains("--kubeconfig"), "{e}");

    let out = s.lksctl_ok(&["cluster", "set", "t", "--kubeconfig", file, "--drain", "on"]);
    assert!(
        out.contains(&format!("reachable, Kubernetes {}", kube_version())),
        "{out}"
    );
    assert!(out.contains("rollouts drain nodes by default"), "{out}");
    assert!(!out.contains(token), "the token is never printed back");

    let j = s.lksctl_json(&["cluster", "get", "t"]);
    assert_eq!(j["kubeconfig"], true, "{j}");
    assert_eq!(j["drain"], true, "{j}");
    let other = s.lksctl_json(&["cluster", "get", "other"]);
    assert_eq!(other["kubeconfig"], false, "{other}");
    for args in [
        &["cluster", "get", "t"][..],
        &["cluster", "list", "-o", "json"],
        &["audit", "-o", "json"],
        &["event", "list", "--cluster", "t"],
    ] {
        let text = s.lksctl_ok(args);
        assert!(!text.contains(token), "lksctl {args:?} prints the token");
    }

    let events = s.lksctl_ok(&["event", "list", "--cluster", "t"]);
    assert!(
        events.contains("kubeconfig set (tenant API https://127.0.0.1:"),
        "{events}"
    );
    let audit = s.lksctl_ok(&["audit", "-o", "json"]);
    assert!(
        audit.contains("credential") && audit.contains("<redacted>"),
        "the audit record names the kubeconfig's server, not its credential: {audit}"
    );
}

/// The simulated kubelet registers node-a, Ready; node-b has no Node. An
/// operator's cordon shows, with no rollout named as its owner; NotReady
/// shows.
fn node_list_shows_each_node_as_its_tenant_cluster_sees_it(cp: &KubeControlPlane, s: &Server) {
    let kubelet = SimulatedKubelet::new(cp, "node-a");
    kubelet.register(true, "v1.37.2");
    let mut list = serde_json::Value::Null;
    wait_until(Duration::from_secs(20), "node-a Ready in node list", || {
        list = s.lksctl_json(&["node", "list"]);
        node_json(&list, "node-a")["kube"]["state"] == "Ready"
    });
    let a = &node_json(&list, "node-a")["kube"];
    assert_eq!(a["ready"], true, "{a}");
    assert_eq!(a["kubelet_version"], "v1.37.2", "{a}");
    assert!(a["last_transition"].is_string(), "{a}");
    assert_eq!(node_json(&list, "node-b")["kube"]["state"], "absent", "{list}");
    let table = s.lksctl_ok(&["node", "list"]);
    let header = table.lines().next().unwrap();
    assert!(header.contains("KUBE"), "{table}");
    let col = header.find("KUBE").unwrap();
    let cell = |name: &str| {
        let row = table.lines().find(|l| l.starts_with(name)).unwrap();
        row[col..].split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(cell("node-a"), "Ready", "{table}");
    assert_eq!(cell("node-b"), "-", "{table}");

    // An operator's cordon shows, with no rollout named as its owner.
    cp.kubectl_ok(&["cordon", "node-a"]);
    wait_until(Duration::from_secs(20), "node-a cordoned in node list", || {
        list = s.lksctl_json(&["node", "list"]);
        node_json(&list, "node-a")["kube"]["state"] == "cordoned"
    });
    assert!(
        node_json(&list, "node-a")["kube"]["cordoned_by"].is_null(),
        "{list}"
    );
    let get = s.lksctl_json(&["node", "get", "node-a"]);
    assert_eq!(get["kube"]["state"], "cordoned", "{get}");
    kubelet.set_ready(false, "v1.37.2");
    wait_until(Duration::from_secs(20), "node-a NotReady", || {
        s.lksctl_json(&["node", "get", "node-a"])["kube"]["state"] == "NotReady"
    });
}

/// What a server must not run, read or skip: one line, nothing stored;
/// a missing file is named.
fn a_kubeconfig_a_server_must_not_run_read_or_skip_is_refused(s: &Server, kubeconfig: &str, token: &str) {
    let bad = s.work_dir().join("bad.kubeconfig");
    for (text, says) in [
        (
            kubeconfig.replace(
                &format!("    token: {token}\n"),
                "    exec:\n      command: /bin/sh\n      apiVersion: client.authentication.k8s.io/v1\n",
            ),
            "exec plugin",
        ),
        (
            kubeconfig.replace(&format!("token: {token}"), "tokenFile: /etc/shadow"),
            "tokenFile",
        ),
        (
            kubeconfig.replace(
                "certificate-authority-data:",
                "insecure-skip-tls-verify: true\n    x-ca:",
            ),
            "insecure-skip-tls-verify",
        ),
        ("not: [a kubeconfig".to_string(), "not a kubeconfig"),
    ] {
        std::fs::write(&bad, &text).unwrap();
        let e = one_line_error(
            &s.lksctl(&["cluster", "set", "other", "--kubeconfig", bad.to_str().unwrap()]),
            says,
        );
        assert!(e.contains(says), "{says}: {e}");
    }
    assert_eq!(s.lksctl_json(&["cluster", "get", "other"])["kubeconfig"], false);
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "other", "--kubeconfig", "/nonexistent/k.conf"]),
        "missing file",
    );
    assert!(e.contains("/nonexistent/k.conf"), "{e}");
}
