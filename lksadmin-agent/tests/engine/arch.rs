//! Bundles for several architectures.

use super::*;

fn elf_for(machine: u16) -> Vec<u8> {
    let mut h = lks_proto::elf::fixture_header(machine, 2);
    h.resize(128, 0);
    h
}

/// `m` with the file at `path` in a second variant: the one given for
/// amd64, `arm` for arm64.
fn with_arm_variant(f: &Fixture, mut m: Manifest, path: &str, arm: &[u8]) -> Manifest {
    use lks_proto::arch::Arch;
    f.source.add(arm);
    let i = m.files.iter().position(|x| x.path.as_str() == path).unwrap();
    let mut v = m.files[i].clone();
    m.files[i].arch = Some(Arch::parse("amd64").unwrap());
    v.arch = Some(Arch::parse("arm64").unwrap());
    v.digest = Digest::of(arm);
    v.size = arm.len() as u64;
    m.files.push(v);
    m.validate().unwrap();
    m
}

#[tokio::test]
async fn a_multi_arch_bundle_installs_this_nodes_variant_only() {
    let mut f = fixture();
    let amd = elf_for(62);
    let arm = elf_for(183);
    let m = f.manifest(
        "kubelet",
        "1",
        &[
            ("/usr/bin/kubelet", &amd, 0o755),
            ("/etc/kubelet.conf", b"conf", 0o644),
        ],
    );
    let m = with_arm_variant(&f, m, "/usr/bin/kubelet", &arm);
    f.desire(vec![unsigned(m.clone())]).await;
    assert_eq!(
        f.status("kubelet").1,
        BundleState::Applied,
        "{:?}",
        f.status("kubelet")
    );
    assert_eq!(f.read("/usr/bin/kubelet").unwrap(), (amd.clone(), 0o755));
    assert_eq!(f.read("/etc/kubelet.conf").unwrap().0, b"conf");
    // What the node records is its own variant: drift repair and rollback
    // know only those files.
    let installed = f.engine.state().bundles["kubelet"].installed.clone().unwrap();
    assert_eq!(installed.files.len(), 2);
    assert!(installed.files.iter().all(|x| x.digest != Digest::of(&arm)));
    std::fs::remove_file(f.path("/usr/bin/kubelet")).unwrap();
    let report = f.engine.heal().await.unwrap();
    assert_eq!(report.repaired.len(), 1, "{report:?}");
    assert_eq!(f.read("/usr/bin/kubelet").unwrap().0, amd);
    // The same desired state again changes nothing.
    f.desire(vec![unsigned(m)]).await;
    assert_eq!(f.status("kubelet").1, BundleState::Applied);
}

#[tokio::test]
async fn a_bundle_without_this_nodes_architecture_is_refused_and_nothing_written() {
    let mut f = fixture();
    let mut m = f.manifest("kubelet", "2", &[("/usr/bin/kubelet", &elf_for(183), 0o755)]);
    m.files[0].arch = Some(lks_proto::arch::Arch::parse("arm64").unwrap());
    f.desire(vec![unsigned(m)]).await;
    let (v, state, message) = f.status("kubelet");
    assert_eq!((v.as_str(), state), ("2", BundleState::Failed));
    assert_eq!(
        message,
        "refused: kubelet@2 has no files for architecture amd64 (it is for arm64)"
    );
    assert!(f.tree().is_empty(), "{:?}", f.tree());
}

#[tokio::test]
async fn an_executable_labelled_for_this_node_but_built_for_another_is_refused() {
    let mut f = fixture();
    // The amd64 variant holds an arm64 executable (a mirror URL publish
    // could not check): the node reads the header before staging.
    let m = f.manifest("kubelet", "3", &[("/usr/bin/kubelet", &elf_for(183), 0o755)]);
    let m = with_arm_variant(&f, m, "/usr/bin/kubelet", &elf_for(183));
    f.desire(vec![unsigned(m)]).await;
    let (_, state, message) = f.status("kubelet");
    assert_eq!(state, BundleState::Failed);
    assert_eq!(
        message,
        "refused: /usr/bin/kubelet is an executable for aarch64 (arm64), and this node is amd64"
    );
    assert!(f.tree().is_empty(), "{:?}", f.tree());
}
