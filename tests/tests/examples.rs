//! The example bundles under `examples/bundles/` are publishable as they are:
//! each loads with the same loader `lksctl bundle publish` uses (a mirrored
//! file without `size` is sized by a stand-in here: tests have no mirror), the kubeadm and kubelet bundles have the shape
//! their READMEs promise and can be assigned to one node together, and the
//! kubeadm-join step renders its JoinConfiguration under a sandbox root.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use lks_proto::Digest;
use lks_proto::authoring::{AuthoredBundle, FileSource, SizeError, UrlSizer, load_bundle_dir};
use lks_proto::manifest::check_paths_disjoint;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bundles")
}

/// Stands in for lksctl's mirror download: records which URLs needed a size.
#[derive(Default)]
struct OfflineSizer(Vec<String>);

impl UrlSizer for OfflineSizer {
    fn size_of(&mut self, url: &str, _digest: &Digest) -> Result<u64, SizeError> {
        self.0.push(url.to_string());
        Ok(1)
    }
}

fn load(name: &str) -> AuthoredBundle {
    let dir = examples().join(name);
    load_bundle_dir(&dir, &mut OfflineSizer::default()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// path -> mode, for every file of a bundle.
fn modes(b: &AuthoredBundle) -> BTreeMap<&str, u32> {
    b.manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.mode))
        .collect()
}

#[test]
fn every_example_bundle_loads() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(examples()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("bundle.toml").is_file() {
            continue;
        }
        let b = load_bundle_dir(&dir, &mut OfflineSizer::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            dir.join("README.md").is_file(),
            "{} has no README.md",
            dir.display()
        );
        names.push(b.manifest.name);
    }
    names.sort();
    for want in ["hello", "kubeadm-join", "kubelet", "kubelet-node-identity"] {
        assert!(
            names.iter().any(|n| n == want),
            "bundle {want} missing: {names:?}"
        );
    }
}

#[test]
fn kubeadm_join_bundle_shape() {
    let b = load("kubeadm-join");
    assert_eq!(
        modes(&b),
        BTreeMap::from([
            ("/etc/kubernetes/lks/kubeadm-join.env", 0o600),
            ("/usr/local/bin/lks-kubeadm-join", 0o755),
        ])
    );
    assert!(b.sources.iter().all(|s| matches!(s, FileSource::Local(_))));
    assert_eq!(b.manifest.steps.len(), 1);
    assert!(b.manifest.steps[0].run.join(" ").contains("lks-kubeadm-join"));
    let health = b.manifest.health.as_ref().expect("a health check");
    assert_eq!(
        health.run,
        ["curl", "-sf", "--max-time", "3", "http://127.0.0.1:10248/healthz"]
    );
}

#[test]
fn kubelet_bundle_mirrors_each_architectures_binary_and_restarts_the_kubelet() {
    let dir = examples().join("kubelet-upgrade");
    let mut sizer = OfflineSizer::default();
    let b = load_bundle_dir(&dir, &mut sizer).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sizer.0,
        [
            "https://dl.k8s.io/release/v1.33.3/bin/linux/amd64/kubelet",
            "https://dl.k8s.io/release/v1.33.3/bin/linux/arm64/kubelet"
        ],
        "publish learns each binary's size from the mirror"
    );
    assert_eq!(b.manifest.name, "kubelet");
    let arches: Vec<&str> = b.manifest.arches().iter().map(|a| a.as_str()).collect();
    assert_eq!(arches, ["amd64", "arm64"], "one version for both");
    for arch in ["amd64", "arm64"] {
        let (kubelet, source) = b
            .manifest
            .files
            .iter()
            .zip(&b.sources)
            .find(|(f, _)| {
                f.path.as_str() == "/usr/local/bin/kubelet" && f.arch.is_some_and(|a| a.as_str() == arch)
            })
            .unwrap_or_else(|| panic!("/usr/local/bin/kubelet for {arch}"));
        assert_eq!(source, &FileSource::Url, "the binary comes from a mirror");
        let url = kubelet.url.as_deref().unwrap_or_default();
        assert!(
            url.starts_with("https://") && url.ends_with(&format!("/bin/linux/{arch}/kubelet")),
            "{arch}: {url}"
        );
        assert_eq!(kubelet.mode, 0o755);
        // What a node of that architecture installs: its kubelet and the
        // shared files, one file per path.
        let node = b
            .manifest
            .for_arch(Some(lks_proto::arch::Arch::parse(arch).unwrap()))
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let kubelets: Vec<_> = node
            .files
            .iter()
            .filter(|f| f.path.as_str() == "/usr/local/bin/kubelet")
            .collect();
        assert_eq!(kubelets.len(), 1, "{arch}");
        assert_eq!(kubelets[0].digest, kubelet.digest, "{arch}");
        assert_eq!(
            node.files.len(),
            3,
            "{arch}: the kubelet, the drop-in and the probe"
        );
    }
    let b = &b;
    assert!(
        modes(b).contains_key("/etc/systemd/system/kubelet.service.d/20-lksadmin-kubelet.conf"),
        "the drop-in"
    );
    let steps: Vec<Vec<&str>> = b
        .manifest
        .steps
        .iter()
        .map(|s| s.run.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(
        steps,
        [
            vec!["systemctl", "daemon-reload"],
            vec!["systemctl", "restart", "kubelet"]
        ]
    );
    assert!(
        b.manifest.steps.iter().all(|s| s.on_heal),
        "a restored drop-in or binary restarts the kubelet"
    );
    let probe = std::fs::read_to_string(examples().join("kubelet-upgrade/lks-kubelet-healthy")).unwrap();
    assert!(probe.contains("curl -sf") && probe.contains("http://127.0.0.1:10248/healthz"));
}

#[test]
fn kubeadm_and_kubelet_bundles_fit_on_one_node() {
    let join = load("kubeadm-join");
    let kubelet = load("kubelet-upgrade");
    for arch in ["amd64", "arm64"] {
        let kubelet = kubelet
            .manifest
            .for_arch(Some(lks_proto::arch::Arch::parse(arch).unwrap()))
            .unwrap();
        let paths = join.manifest.files.iter().chain(&kubelet.files).map(|f| &f.path);
        check_paths_disjoint(paths).unwrap_or_else(|(i, e)| panic!("{arch}: file {i}: {e}"));
    }
}

/// The node-identity bundle asks for the kubelet's two certificates and a
/// kubeconfig, and fits on a node with the kubelet-upgrade bundle (it leaves
/// ExecStart to that bundle's drop-in).
#[test]
fn kubelet_node_identity_bundle_shape() {
    use lks_proto::certs::Profile;
    let b = load("kubelet-node-identity");
    let m = &b.manifest;
    let profiles: Vec<Profile> = m.certificates.iter().map(|c| c.profile).collect();
    assert_eq!(profiles, [Profile::KubeletClient, Profile::KubeletServing]);
    assert_eq!(m.kubeconfigs.len(), 1);
    assert_eq!(m.kubeconfigs[0].path.as_str(), "/etc/kubernetes/kubelet.conf");
    assert_eq!(m.kubeconfigs[0].certificate, m.certificates[0].path);
    let dropin =
        std::fs::read_to_string(examples().join("kubelet-node-identity/30-lks-node-identity.conf")).unwrap();
    for flag in [
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        &format!("--tls-cert-file={}", m.certificates[1].path),
        &format!("--tls-private-key-file={}", m.certificates[1].key_path),
    ] {
        assert!(dropin.contains(flag), "the drop-in lacks {flag}");
    }
    assert!(
        !dropin.contains("ExecStart"),
        "ExecStart is the kubelet-upgrade bundle's"
    );
    let kubelet = load("kubelet-upgrade");
    for arch in ["amd64", "arm64"] {
        let kubelet = kubelet
            .manifest
            .for_arch(Some(lks_proto::arch::Arch::parse(arch).unwrap()))
            .unwrap();
        let paths = m.owned_paths().into_iter().chain(kubelet.owned_paths());
        check_paths_disjoint(paths).unwrap_or_else(|(i, e)| panic!("{arch}: path {i}: {e}"));
    }
    // The step leaves systemd alone under a sandbox root.
    let out = Command::new(examples().join("kubelet-node-identity/lks-kubelet-restart"))
        .env("LKS_ROOT", "/tmp/sandbox")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("not touching systemd"));
}

/// Installs the bundle's local files below `root` as the agent would
/// (`env_extra` appended to its env file), then runs the step exactly as
/// bundle.toml states it, with the agent's environment.
fn run_join_step(root: &Path, env_extra: &str) {
    let b = load("kubeadm-join");
    for (f, src) in b.manifest.files.iter().zip(&b.sources) {
        let FileSource::Local(src) = src else { continue };
        let dst = root.join(f.path.relative());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(src, &dst).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(f.mode)).unwrap();
    }
    if !env_extra.is_empty() {
        let env = root.join("etc/kubernetes/lks/kubeadm-join.env");
        let mut text = std::fs::read_to_string(&env).unwrap();
        text.push_str(env_extra);
        std::fs::write(&env, text).unwrap();
    }
    let step = &b.manifest.steps[0].run;
    let out = Command::new(&step[0])
        .args(&step[1..])
        .env("LKS_ROOT", root)
        .env("LKS_BUNDLE", &b.manifest.name)
        .env("LKS_VERSION", &b.manifest.version)
        .env("LKS_NODE", "Worker-7")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "step failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("not running kubeadm join"));
}

#[test]
fn kubeadm_join_step_renders_the_join_configuration_under_a_sandbox_root() {
    let root = tempfile::tempdir().unwrap();
    run_join_step(root.path(), "");

    let rendered = root.path().join("etc/kubernetes/kubeadm-join.yaml");
    let text = std::fs::read_to_string(&rendered).unwrap();
    for want in [
        // kubeadm >= 1.37 reads only v1beta4 (v1beta3 is refused).
        "apiVersion: kubeadm.k8s.io/v1beta4",
        "kind: JoinConfiguration",
        "apiServerEndpoint: \"tenant-a.kube0.example:6443\"",
        "token: \"abcdef.0123456789abcdef\"",
        "- \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"",
        // $LKS_NODE, lowercased as the kubelet requires.
        "name: \"worker-7\"",
        "criSocket: \"unix:///run/containerd/containerd.sock\"",
        "- name: node-labels\n      value: \"lksadmin.io/managed=true\"",
        "timeouts:\n  discovery: 5m0s",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let mode = std::fs::metadata(&rendered).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "it holds the bootstrap token");
    let leftovers: Vec<_> = std::fs::read_dir(rendered.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// What the step renders with every optional value set is a configuration
/// the kubeadm the tests build (tests/kube, the release the real-node VM
/// test joins with) accepts: `kubeadm config validate`.
#[test]
fn kubeadm_accepts_the_rendered_join_configuration() {
    let root = tempfile::tempdir().unwrap();
    run_join_step(
        root.path(),
        "NODE_IP=\"10.0.0.7\"\nIGNORE_PREFLIGHT_ERRORS=\"SystemVerification,Swap\"\n",
    );
    let rendered = root.path().join("etc/kubernetes/kubeadm-join.yaml");
    let text = std::fs::read_to_string(&rendered).unwrap();
    for want in [
        "- name: node-ip\n      value: \"10.0.0.7\"",
        "ignorePreflightErrors:\n    - \"SystemVerification\"\n    - \"Swap\"",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let kubeadm = lks_e2e::kube::kube_bin_dir().join("kubeadm");
    assert!(
        kubeadm.is_file(),
        "{} not found: build it with `bash scripts/kube.sh` (scripts/setup.sh runs it)",
        kubeadm.display()
    );
    let out = Command::new(&kubeadm)
        .args(["config", "validate", "--config"])
        .arg(&rendered)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubeadm config validate refused:\n{text}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
