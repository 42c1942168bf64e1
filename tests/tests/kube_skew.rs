//! Kubernetes' version skew policy at `rollout start --drain
//! --kubelet-version V`, against a real kube-apiserver (tests/src/kube.rs,
//! v1.37.2): a kubelet newer than the tenant API server is refused in one
//! line and nothing starts; one more than three minors behind starts with a
//! warning line on stderr; one within the policy starts with none. (The
//! cluster has no node: what is checked is the start, not a drain.)

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::kube::{KubeControlPlane, kube_version};
use lks_e2e::one_line_error;
use lks_e2e::server::Server;

#[test]
fn the_kubelet_version_of_a_draining_start_is_held_to_the_skew_policy() {
    let cp = KubeControlPlane::start();
    let s = Server::start();
    s.create_cluster("t");
    let (kubeconfig, _token) = cp.lksadmin_kubeconfig();
    let file = s.work_dir().join("t.kubeconfig");
    std::fs::write(&file, &kubeconfig).unwrap();
    s.lksctl_ok(&[
        "cluster",
        "set",
        "t",
        "--kubeconfig",
        file.to_str().unwrap(),
        "--drain",
        "on",
    ]);
    let dir = s.write_bundle("b", "kubelet", "1", &[("/etc/k", b"k", "0644")]);
    let bundle = s.publish(&dir);
    let api = kube_version();
    let minor: u32 = api.split('.').nth(1).unwrap().parse().unwrap();
    let start = |kubelet: &str| {
        s.lksctl(&[
            "rollout",
            "start",
            "--cluster",
            "t",
            "--bundle",
            &bundle,
            "--drain",
            "--kubelet-version",
            kubelet,
        ])
    };

    // Newer than the API server: refused, nothing started.
    let newer = format!("v1.{}.0", minor + 1);
    let e = one_line_error(&start(&newer), "a kubelet newer than the API server");
    assert!(
        e.contains(&format!(
            "--kubelet-version {newer} is newer than cluster t's API server ({api})"
        )) && e.contains("version skew policy"),
        "{e}"
    );
    assert_eq!(s.lksctl_json(&["rollout", "list"]).as_array().unwrap().len(), 0);

    // Four minors behind: started, with one warning line.
    let old = format!("v1.{}.0", minor - 4);
    let out = start(&old);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().any(|l| l.starts_with("warning: ")
            && l.contains(&format!("--kubelet-version {old} would leave nodes 4 minor versions behind cluster t's API server ({api})"))),
        "{stderr}"
    );

    // Three behind and the same release: no warning.
    for ok in [format!("v1.{}.0", minor - 3), api.clone()] {
        let out = start(&ok);
        assert!(out.status.success(), "{ok}: {out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("warning"),
            "{ok}: {out:?}"
        );
    }
    // The cluster has no node: each start completed at once; the refused
    // one left none.
    assert_eq!(s.lksctl_json(&["rollout", "list"]).as_array().unwrap().len(), 3);
}
