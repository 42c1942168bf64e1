//! lks-kube-controller as the end-to-end tests run it: the shipped CRDs
//! applied to a test kube0, the controller's ServiceAccount with the
//! shipped RBAC, and a copy of the controller started against a real
//! lks-control-server.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::kube::KubeControlPlane;
use crate::server::Server;
use crate::{Proc, bin};

/// The namespace the controller runs in.
pub const NAMESPACE: &str = "lksadmin";

fn packaging(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(rel)
}

/// Applies packaging/kubernetes/crds and waits until kube0 serves them.
pub fn apply_crds(cp: &KubeControlPlane) {
    cp.kubectl_ok(&["apply", "-f", packaging("crds").to_str().unwrap()]);
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);
}

/// Creates the controller's namespace, its ServiceAccount with the
/// shipped RBAC and a token for it; returns a kubeconfig file that reaches
/// kube0 as that ServiceAccount.
pub fn service_account_kubeconfig(cp: &KubeControlPlane) -> PathBuf {
    cp.create_namespace(NAMESPACE);
    cp.kubectl_ok(&["apply", "-f", packaging("controller/rbac.yaml").to_str().unwrap()]);
    cp.apply(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: lks-kube-controller-token\n  namespace: lksadmin\n  \
         annotations:\n    kubernetes.io/service-account.name: lks-kube-controller\n\
         type: kubernetes.io/service-account-token\n",
    );
    let token = cp.service_account_token(NAMESPACE, "lks-kube-controller-token");
    let path = cp.dir().join("controller.kubeconfig");
    std::fs::write(&path, cp.token_kubeconfig("lks-kube-controller", &token)).unwrap();
    path
}

/// A copy of lks-kube-controller named `identity` (its Lease holder
/// identity), reaching kube0 with `kubeconfig` and the server `s` with
/// its admin credentials; it reconciles every second and retries a
/// refused object after at most 2 s.
pub fn spawn(cp: &KubeControlPlane, s: &Server, identity: &str, kubeconfig: &Path) -> Proc {
    let mut c = Command::new(bin("lks-kube-controller"));
    c.args([
        "run",
        "--namespace",
        NAMESPACE,
        "--interval",
        "1s",
        "--identity",
        identity,
        "--retry-interval",
        "2s",
    ])
    .arg("--admin-conf")
    .arg(s.admin_conf_path())
    .env("KUBECONFIG", kubeconfig)
    .env("RUST_LOG", "info");
    Proc::spawn(&format!("controller-{identity}"), c, cp.dir())
}

/// The condition `type_` of an object's status: (status, reason,
/// message), empty strings when it has none.
pub fn condition(obj: &serde_json::Value, type_: &str) -> (String, String, String) {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .map(|c| {
            let f = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (f("status"), f("reason"), f("message"))
        })
        .unwrap_or_default()
}
