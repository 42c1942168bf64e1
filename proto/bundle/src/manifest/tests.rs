//! Tests of the manifest rules.

use super::*;

pub fn sample() -> Manifest {
    Manifest {
        name: "kubelet".into(),
        version: "1.29.3-1".into(),
        files: vec![
            FileSpec {
                chunks: None,
                arch: None,
                path: BundlePath::new("/etc/kubernetes/kubelet.conf").unwrap(),
                digest: Digest::of(b"conf"),
                size: 4,
                mode: 0o600,
                url: None,
            },
            FileSpec {
                chunks: None,
                arch: None,
                path: BundlePath::new("/usr/local/bin/kubelet").unwrap(),
                digest: Digest::of(b"binary"),
                size: 6,
                mode: 0o755,
                url: Some("https://mirror.internal/kubelet-1.29.3".into()),
            },
        ],
        steps: vec![Step {
            name: "restart kubelet".into(),
            run: vec!["systemctl".into(), "restart".into(), "kubelet".into()],
            timeout: Duration::from_secs(60),
            on_heal: false,
        }],
        health: Some(HealthCheck {
            run: vec!["/usr/local/bin/kubelet-healthy".into()],
            timeout: Duration::from_secs(10),
            retries: 5,
            interval: Duration::from_secs(2),
        }),
        ..Default::default()
    }
}

/// `sample()` with a kubelet client and a named server certificate and
/// a kubeconfig.
pub fn sample_with_identity() -> Manifest {
    use crate::certs::{CertificateSpec, KubeconfigSpec, Profile};
    let p = |s: &str| BundlePath::new(s).unwrap();
    Manifest {
        certificates: vec![
            CertificateSpec {
                path: p("/var/lib/kubelet/pki/kubelet-client.crt"),
                key_path: p("/var/lib/kubelet/pki/kubelet-client.key"),
                profile: Profile::KubeletClient,
                common_name: String::new(),
                organizations: Vec::new(),
                dns_names: Vec::new(),
                ip_addresses: Vec::new(),
                ttl: crate::certs::DEFAULT_TTL,
                ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
            },
            CertificateSpec {
                path: p("/etc/proxy/tls.crt"),
                key_path: p("/etc/proxy/tls.key"),
                profile: Profile::Server,
                common_name: "{node}".into(),
                organizations: Vec::new(),
                dns_names: vec!["{node}.proxy".into()],
                ip_addresses: vec!["10.0.0.1".into()],
                ttl: Duration::from_secs(3600),
                ca_path: Some(p("/etc/kubernetes/pki/ca.crt")),
            },
        ],
        kubeconfigs: vec![KubeconfigSpec {
            path: p("/etc/kubernetes/kubelet.conf.d/node.conf"),
            certificate: p("/var/lib/kubelet/pki/kubelet-client.crt"),
        }],
        ..sample()
    }
}

#[test]
fn identity_files_are_validated_with_every_path() {
    let m = sample_with_identity();
    m.validate().unwrap();
    assert_eq!(m.generated_paths().len(), 6, "the shared CA path counts once");
    assert_eq!(m.owned_paths().len(), 8);
    type Case = (fn(&mut Manifest), &'static str);
    let cases: Vec<Case> = vec![
        (
            |m| m.certificates[1].path = m.files[0].path.clone(),
            "certificate[1].path",
        ),
        (
            |m| m.kubeconfigs[0].path = m.certificates[0].key_path.clone(),
            "kubeconfig[0].path",
        ),
        (
            |m| m.certificates[1].ca_path = Some(BundlePath::new("/etc/proxy/tls.crt/ca").unwrap()),
            "certificate[1].ca_path",
        ),
        (
            |m| m.kubeconfigs[0].certificate = BundlePath::new("/nope").unwrap(),
            "kubeconfig[0].certificate",
        ),
        (
            |m| m.kubeconfigs[0].certificate = m.certificates[1].path.clone(),
            "kubeconfig[0].certificate",
        ),
        (
            |m| m.certificates[0].common_name = "x".into(),
            "certificate[0].common_name",
        ),
        (|m| m.issued.push(m.files[0].clone()), "issued[0].path"),
    ];
    for (mutate, field) in cases {
        let mut m = sample_with_identity();
        mutate(&mut m);
        let err = m.validate().expect_err(field);
        assert_eq!(err.field, field, "{err}");
    }
    let mut made = sample_with_identity();
    let mut f = made.files[0].clone();
    f.path = made.certificates[0].key_path.clone();
    made.issued.push(f);
    made.validate().unwrap();
    assert!(made.same_request(&sample_with_identity()));
    assert_eq!(made.requested(), sample_with_identity());
    assert_eq!(made.all_files().count(), 3);
    let text = toml::to_string(&made).unwrap();
    assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), made);
}

fn arch(s: &str) -> Arch {
    Arch::parse(s).unwrap()
}

/// `sample()` with its binary for amd64 and arm64.
pub fn sample_multi_arch() -> Manifest {
    let mut m = sample();
    let mut arm = m.files[1].clone();
    m.files[1].arch = Some(arch("amd64"));
    arm.arch = Some(arch("arm64"));
    arm.digest = Digest::of(b"arm binary");
    arm.url = Some("https://mirror.internal/kubelet-1.29.3-arm64".into());
    m.files.push(arm);
    m
}

#[test]
fn each_node_selects_its_variant() {
    let m = sample_multi_arch();
    m.validate().unwrap();
    assert!(m.is_multi_arch() && !sample().is_multi_arch());
    assert_eq!(m.required_features(), vec![FEATURE_MULTI_ARCH]);
    assert!(sample().required_features().is_empty());
    assert_eq!(arch::list(&m.arches()), "amd64, arm64");
    let arm = m.for_arch(Some(arch("arm64"))).unwrap();
    assert_eq!(arm.files.len(), 2);
    assert_eq!(arm.files[1].digest, Digest::of(b"arm binary"));
    assert_eq!(arm.architectures, vec![arch("arm64")]);
    arm.validate().unwrap();
    assert_eq!(
        arm.for_arch(Some(arch("arm64"))).unwrap(),
        arm,
        "selecting again changes nothing"
    );
    assert!(!arm.same_request(&m.for_arch(Some(arch("amd64"))).unwrap()));
    assert_eq!(
        m.for_arch(Some(arch("riscv64"))).unwrap_err().to_string(),
        "kubelet@1.29.3-1 has no files for architecture riscv64 (it is for amd64, arm64)"
    );
    assert_eq!(
        m.for_arch(None).unwrap_err().to_string(),
        "kubelet@1.29.3-1 is for amd64, arm64, and the node reported no architecture"
    );
    match m.for_arch(Some(arch("riscv64"))) {
        Err(ArchRefusal::NoFiles { arch: a, .. }) => assert_eq!(a, arch("riscv64")),
        other => panic!("{other:?}"),
    }
    // An arch-neutral bundle goes to every node, even one reporting none.
    assert_eq!(sample().for_arch(None).unwrap(), sample());
    assert_eq!(sample().arch_refusal(Some(arch("s390x"))), None);
    // Declared architectures limit a bundle without per-arch files.
    let mut only = sample();
    only.architectures = vec![arch("amd64")];
    only.validate().unwrap();
    assert!(only.for_arch(Some(arch("arm64"))).is_err());
    assert_eq!(only.for_arch(Some(arch("amd64"))).unwrap().files.len(), 2);
    // Records on the node keep the labels.
    let text = toml::to_string(&arm).unwrap();
    assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), arm);
}

#[test]
fn a_node_is_judged_by_its_features_then_its_architecture() {
    let needs = Needs::of(&sample_multi_arch());
    let new = vec![FEATURE_MULTI_ARCH.to_string()];
    assert_eq!(needs.node_refusal(&new, Some(arch("arm64"))), None);
    let old = needs
        .node_refusal(&["certificates".to_string()], Some(arch("arm64")))
        .unwrap();
    assert!(
        old.starts_with("its agent does not announce the \"multi-arch\" feature kubelet@1.29.3-1 needs"),
        "{old}"
    );
    assert_eq!(
        needs.node_refusal(&new, Some(arch("s390x"))).unwrap(),
        "kubelet@1.29.3-1 has no files for architecture s390x (it is for amd64, arm64)"
    );
    assert!(
        needs
            .node_refusal(&new, None)
            .unwrap()
            .contains("reported no architecture")
    );
    let neutral = Needs::of(&sample());
    assert!(neutral.is_empty());
    assert_eq!(
        neutral.node_refusal(&[], None),
        None,
        "old agents keep arch-neutral bundles"
    );
}

#[test]
fn architecture_rules_name_their_field() {
    type Case = (fn(&mut Manifest), &'static str, &'static str);
    let cases: Vec<Case> = vec![
        (
            |m| m.files[2].arch = Some(arch("amd64")),
            "file[2].path",
            "listed twice",
        ),
        (
            |m| m.files[2].arch = None,
            "file[2].path",
            "both arch-neutral (file[2]) and for amd64 (file[1])",
        ),
        (
            |m| m.architectures = vec![arch("amd64"), arch("arm64"), arch("s390x")],
            "file[1].path",
            "the bundle is for s390x, but /usr/local/bin/kubelet has no file for it",
        ),
        (
            |m| m.architectures = vec![arch("amd64")],
            "file[2].arch",
            "arm64 is not one of the bundle's architectures (amd64)",
        ),
        (
            |m| m.architectures = vec![arch("amd64"), arch("arm64"), arch("amd64")],
            "architectures[2]",
            "amd64 is listed twice",
        ),
        (
            |m| {
                // Another arch-specific path that only amd64 has.
                let mut f = m.files[1].clone();
                f.path = BundlePath::new("/usr/local/bin/kubeadm").unwrap();
                m.files.push(f);
            },
            "file[3].path",
            "the bundle is for arm64, but /usr/local/bin/kubeadm has no file for it (amd64 has one)",
        ),
        (
            |m| {
                // Nested paths collide within one architecture too.
                for i in [1, 2] {
                    let mut f = m.files[i].clone();
                    f.path = BundlePath::new("/usr/local/bin/kubelet/x").unwrap();
                    m.files.push(f);
                }
            },
            "file[3].path",
            "cannot both be files",
        ),
    ];
    for (mutate, field, why) in cases {
        let mut m = sample_multi_arch();
        mutate(&mut m);
        let err = m.validate().expect_err(field);
        assert_eq!(err.field, field, "{err}");
        assert!(err.reason.contains(why), "{err}");
    }
}

#[test]
fn a_self_update_may_carry_one_binary_per_architecture() {
    let mut m = sample_multi_arch();
    m.files.remove(0);
    m.steps.clear();
    m.health = None;
    m.self_update = true;
    m.validate().unwrap();
    m.files.pop();
    m.architectures = vec![arch("amd64"), arch("arm64")];
    let err = m.validate().unwrap_err();
    assert!(err.reason.contains("no file for it"), "{err}");
    let mut two = sample_multi_arch();
    two.steps.clear();
    two.health = None;
    two.self_update = true;
    let err = two.validate().unwrap_err();
    assert!(err.reason.contains("exactly one file for amd64"), "{err}");
}

#[test]
fn sample_is_valid() {
    sample().validate().unwrap();
    assert_eq!(sample().id(), "kubelet@1.29.3-1");
    assert_eq!(sample().total_size(), 10);
}

#[test]
fn each_rule_names_its_field() {
    type Case = (fn(&mut Manifest), &'static str);
    let cases: Vec<Case> = vec![
        (|m| m.name = "Bad".into(), "name"),
        (|m| m.version = String::new(), "version"),
        (|m| m.files[1].mode = 0o10000, "file[1].mode"),
        (|m| m.files[0].size = MAX_FILE_SIZE + 1, "file[0].size"),
        (|m| m.files[0].size = 0, "file[0].size"),
        (|m| m.files[1].url = Some("ftp://x".into()), "file[1].url"),
        (|m| m.files[1].path = m.files[0].path.clone(), "file[1].path"),
        (
            |m| m.files[1].path = BundlePath::new("/etc/kubernetes/kubelet.conf/x").unwrap(),
            "file[1].path",
        ),
        (|m| m.steps[0].run.clear(), "step[0].run"),
        (|m| m.steps[0].name.clear(), "step[0].name"),
        (|m| m.steps[0].timeout = Duration::ZERO, "step[0].timeout"),
        (|m| m.steps[0].run.push("a\0b".into()), "step[0].run"),
        (|m| m.health.as_mut().unwrap().retries = 0, "health.retries"),
        (
            |m| m.health.as_mut().unwrap().timeout = Duration::from_secs(7200),
            "health.timeout",
        ),
    ];
    for (mutate, field) in cases {
        let mut m = sample();
        mutate(&mut m);
        let err = m.validate().expect_err(field);
        assert_eq!(err.field, field, "{err}");
    }
}

#[test]
fn serde_round_trip_validates_on_the_way_in() {
    let m = sample();
    let text = toml::to_string(&m).unwrap();
    assert!(text.contains("timeout_ms = 60000"), "{text}");
    assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), m);
    let bad = text.replace("name = \"kubelet\"", "name = \"Kubelet\"");
    let err = toml::from_str::<Manifest>(&bad).unwrap_err().to_string();
    assert!(err.contains("name"), "{err}");
}

/// A step's `on_heal` needs the agent feature, and agent records written
/// before the field existed still load (as `false`).
#[test]
fn heal_steps_need_their_feature_and_old_records_load() {
    let mut m = sample();
    assert!(!m.has_heal_steps());
    assert!(!m.required_features().contains(&FEATURE_HEAL_STEPS));
    let old_json = serde_json::to_string(&m).unwrap();
    assert!(!old_json.contains("on_heal"), "{old_json}");
    assert_eq!(serde_json::from_str::<Manifest>(&old_json).unwrap(), m);

    m.steps.push(Step {
        name: "reload".into(),
        run: vec!["systemctl".into(), "daemon-reload".into()],
        timeout: Duration::from_secs(30),
        on_heal: true,
    });
    m.validate().unwrap();
    assert_eq!(m.required_features(), vec![FEATURE_HEAL_STEPS]);
    assert_eq!(
        m.heal_steps().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec!["reload"]
    );
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains("\"on_heal\":true"), "{json}");
    assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
    let text = toml::to_string(&m).unwrap();
    assert_eq!(toml::from_str::<Manifest>(&text).unwrap(), m);

    let refusal = Needs::of(&m)
        .node_refusal(&[FEATURE_MULTI_ARCH.to_string()], None)
        .unwrap();
    assert!(
        refusal.starts_with("its agent does not announce the \"heal-steps\" feature kubelet@1.29.3-1 needs"),
        "{refusal}"
    );
    assert!(refusal.ends_with("update the agent first"), "{refusal}");
    assert_eq!(
        Needs::of(&m).node_refusal(&[FEATURE_HEAL_STEPS.to_string()], None),
        None
    );
}

#[test]
fn disjoint_paths() {
    let p = |s: &str| BundlePath::new(s).unwrap();
    let ok = [p("/a/b"), p("/a/c"), p("/ab")];
    assert!(check_paths_disjoint(ok.iter()).is_ok());
    let nested = [p("/a/b/c"), p("/x"), p("/a/b")];
    assert_eq!(check_paths_disjoint(nested.iter()).unwrap_err().0, 2);
}

#[test]
fn states_round_trip() {
    for s in [
        BundleState::Pending,
        BundleState::Applying,
        BundleState::Applied,
        BundleState::Failed,
        BundleState::RolledBack,
    ] {
        assert_eq!(s.as_str().parse::<BundleState>().unwrap(), s);
        assert_eq!(serde_json_like(s), format!("\"{}\"", s.as_str()));
    }
}

fn serde_json_like(s: BundleState) -> String {
    // toml cannot serialise a bare enum; a one-field table shows the tag.
    #[derive(serde::Serialize)]
    struct W {
        s: BundleState,
    }
    toml::to_string(&W { s })
        .unwrap()
        .trim()
        .trim_start_matches("s = ")
        .to_string()
}

/// `reboot = "required"` needs the agent feature; records from before the
/// field load as not required, and it is left out of them when unset.
#[test]
fn a_reboot_needs_its_feature_and_old_records_load() {
    let mut m = sample();
    assert_eq!(m.reboot, Reboot::NotRequired);
    let old_json = serde_json::to_string(&m).unwrap();
    assert!(!old_json.contains("reboot"), "{old_json}");
    m.reboot = Reboot::Required;
    assert_eq!(m.required_features(), vec![FEATURE_REBOOT]);
    let json = serde_json::to_string(&m).unwrap();
    assert!(json.contains("\"reboot\":\"required\""), "{json}");
    assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
    assert!(!m.same_request(&sample()));
    let refusal = Needs::of(&m)
        .node_refusal(&[FEATURE_HEAL_STEPS.to_string()], None)
        .unwrap();
    assert!(
        refusal.starts_with("its agent does not announce the \"reboot\" feature kubelet@1.29.3-1 needs"),
        "{refusal}"
    );
    assert_eq!(
        Needs::of(&m).node_refusal(&[FEATURE_REBOOT.to_string()], None),
        None
    );
    assert_eq!("required".parse::<Reboot>(), Ok(Reboot::Required));
    let err = "yes".parse::<Reboot>().unwrap_err().to_string();
    assert_eq!(
        err,
        "\"yes\" is not a reboot policy; the one value is \"required\" (leave `reboot` out otherwise)"
    );
}
