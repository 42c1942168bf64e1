//! Tests of `authoring.rs`.

use super::*;
use crate::manifest::FileSpec;
use lks_wire::pb;
use proptest::prelude::*;

const GOOD: &str = r#"
name = "kubelet"
version = "1.29.3-1"

[[file]]
path = "/etc/kubernetes/kubelet.conf"
source = "kubelet.conf"
mode = "0600"

[[file]]
path = "/usr/local/bin/kubelet"
url = "https://mirror.internal/kubelet-1.29.3"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
size = 4
mode = "0755"

[[step]]
name = "restart kubelet"
run = ["systemctl", "restart", "kubelet"]
timeout = "60s"

[health]
run = ["/usr/local/bin/kubelet-healthy"]
timeout = "10s"
retries = 5
interval = "2s"
"#;

fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(d.path().join(name), bytes).unwrap();
    }
    d
}

#[test]
fn loads_the_design_example() {
    let d = dir_with(&[("kubelet.conf", b"conf"), (BUNDLE_TOML, GOOD.as_bytes())]);
    let b = load_bundle_dir(d.path(), &mut RequireSize).unwrap();
    let m = &b.manifest;
    assert_eq!(m.id(), "kubelet@1.29.3-1");
    assert_eq!(m.files[0].digest, Digest::of(b"conf"));
    assert_eq!(m.files[0].mode, 0o600);
    assert_eq!(
        m.files[1].url.as_deref(),
        Some("https://mirror.internal/kubelet-1.29.3")
    );
    assert_eq!(m.steps[0].timeout, Duration::from_secs(60));
    assert_eq!(m.health.as_ref().unwrap().retries, 5);
    assert_eq!(b.sources[1], FileSource::Url);
    assert_eq!(b.uploads().len(), 1);
}

#[test]
fn reboot_required_or_one_clear_error() {
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let with = |v: &str| format!("reboot = {v}\n{GOOD}");
    let m = parse_bundle_toml(&with("\"required\""), d.path(), &mut RequireSize)
        .unwrap()
        .manifest;
    assert_eq!(m.reboot, crate::manifest::Reboot::Required);
    assert_eq!(m.required_features(), vec![crate::manifest::FEATURE_REBOOT]);
    let plain = parse_bundle_toml(GOOD, d.path(), &mut RequireSize)
        .unwrap()
        .manifest;
    assert_eq!(plain.reboot, crate::manifest::Reboot::NotRequired);
    let err = parse_bundle_toml(&with("\"always\""), d.path(), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "reboot: \"always\" is not a reboot policy; the one value is \"required\" (leave `reboot` out otherwise)"
    );
    let err = parse_bundle_toml(&with("true"), d.path(), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 1") && !err.contains('\n'), "{err}");
}

#[test]
fn on_heal_steps() {
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let text = GOOD.replace(
        "timeout = \"60s\"\n",
        "timeout = \"60s\"\non_heal = true\n\n[[step]]\nname = \"log\"\nrun = [\"true\"]\non_heal = false\n",
    );
    let m = parse_bundle_toml(&text, d.path(), &mut RequireSize)
        .unwrap()
        .manifest;
    assert_eq!(
        m.steps.iter().map(|s| s.on_heal).collect::<Vec<_>>(),
        vec![true, false]
    );
    assert_eq!(m.required_features(), vec![crate::manifest::FEATURE_HEAL_STEPS]);
    let plain = parse_bundle_toml(GOOD, d.path(), &mut RequireSize)
        .unwrap()
        .manifest;
    assert!(!plain.steps[0].on_heal, "the default");
    let err = parse_bundle_toml(
        &GOOD.replace("timeout = \"60s\"\n", "timeout = \"60s\"\non_heal = \"yes\"\n"),
        d.path(),
        &mut RequireSize,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("line 21") && err.contains("expected a boolean"),
        "{err}"
    );
    let err = parse_bundle_toml(
        &GOOD.replace("timeout = \"60s\"\n", "timeout = \"60s\"\non_heals = true\n"),
        d.path(),
        &mut RequireSize,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("on_heals"), "{err}");
}

#[test]
fn toml_to_manifest_to_protobuf_and_back() {
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let b = parse_bundle_toml(GOOD, d.path(), &mut RequireSize).unwrap();
    let back: Manifest = pb::Manifest::from(&b.manifest).try_into().unwrap();
    assert_eq!(back, b.manifest);
}

#[test]
fn field_order_in_toml_does_not_change_the_canonical_bytes() {
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let reordered = r#"
version = "1.29.3-1"
name = "kubelet"

[health]
interval = "2s"
retries = 5
timeout = "10s"
run = ["/usr/local/bin/kubelet-healthy"]

[[file]]
mode = "0755"
size = 4
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
url = "https://mirror.internal/kubelet-1.29.3"
path = "/usr/local/bin/kubelet"

[[file]]
mode = "0600"
source = "kubelet.conf"
path = "/etc/kubernetes/kubelet.conf"

[[step]]
timeout = "60s"
run = ["systemctl", "restart", "kubelet"]
name = "restart kubelet"
"#;
    let a = parse_bundle_toml(GOOD, d.path(), &mut RequireSize).unwrap();
    let b = parse_bundle_toml(reordered, d.path(), &mut RequireSize).unwrap();
    assert_eq!(
        crate::canonical::encode(&a.manifest),
        crate::canonical::encode(&b.manifest)
    );
}

#[test]
fn every_error_names_the_field() {
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let cases = [
        (
            GOOD.replace("source = \"kubelet.conf\"", "source = \"missing.conf\""),
            "file[0].source",
        ),
        (
            GOOD.replace("source = \"kubelet.conf\"", "source = \"../etc/passwd\""),
            "file[0].source",
        ),
        (
            GOOD.replace("source = \"kubelet.conf\"", "source = \"/etc/passwd\""),
            "file[0].source",
        ),
        (
            GOOD.replace("\"/etc/kubernetes/kubelet.conf\"", "\"/etc/../kubelet.conf\""),
            "file[0].path",
        ),
        (
            GOOD.replace("\"/etc/kubernetes/kubelet.conf\"", "\"etc/kubelet.conf\""),
            "file[0].path",
        ),
        (GOOD.replace("mode = \"0600\"", "mode = \"0999\""), "file[0].mode"),
        (GOOD.replace("mode = \"0600\"", "mode = \"rw\""), "file[0].mode"),
        (
            GOOD.replace("sha256 = \"9f86", "sha256 = \"XX86"),
            "file[1].sha256",
        ),
        (GOOD.replace("size = 4\n", ""), "file[1].size"),
        (
            GOOD.replace("timeout = \"60s\"", "timeout = \"60\""),
            "step[0].timeout",
        ),
        (GOOD.replace("retries = 5", "retries = 0"), "health.retries"),
        (GOOD.replace("name = \"kubelet\"", "name = \"Kubelet\""), "name"),
        (
            GOOD.replace("version = \"1.29.3-1\"", "version = \"\""),
            "version",
        ),
        (
            GOOD.replace("run = [\"systemctl\", \"restart\", \"kubelet\"]", "run = []"),
            "step[0].run",
        ),
        (
            GOOD.replace(
                "url = \"https://mirror.internal/kubelet-1.29.3\"",
                "source = \"kubelet.conf\"\nurl = \"https://x/y\"",
            ),
            "file[1].source",
        ),
    ];
    for (text, field) in cases {
        let e = parse_bundle_toml(&text, d.path(), &mut RequireSize)
            .expect_err(field)
            .to_string();
        assert!(e.starts_with(&format!("{field}: ")), "expected {field}, got {e}");
    }
}

const IDENTITY: &str = r#"
name = "kubelet-identity"
version = "1"

[[certificate]]
path = "/var/lib/kubelet/pki/kubelet-client.crt"
key_path = "/var/lib/kubelet/pki/kubelet-client.key"
profile = "kubelet-client"
ca_path = "/etc/kubernetes/pki/ca.crt"

[[certificate]]
path = "/var/lib/kubelet/pki/kubelet.crt"
key_path = "/var/lib/kubelet/pki/kubelet.key"
profile = "kubelet-serving"
ttl = "24h"
ca_path = "/etc/kubernetes/pki/ca.crt"

[[kubeconfig]]
path = "/etc/kubernetes/kubelet.conf"
certificate = "/var/lib/kubelet/pki/kubelet-client.crt"
"#;

#[test]
fn certificates_and_kubeconfigs() {
    let d = dir_with(&[]);
    let b = parse_bundle_toml(IDENTITY, d.path(), &mut RequireSize).unwrap();
    let m = &b.manifest;
    assert!(m.files.is_empty());
    assert_eq!(m.certificates.len(), 2);
    assert_eq!(m.certificates[0].ttl, DEFAULT_TTL);
    assert_eq!(m.certificates[1].ttl, Duration::from_secs(86400));
    assert_eq!(m.kubeconfigs[0].certificate, m.certificates[0].path);
    let back = Manifest::try_from(pb::Manifest::from(m)).unwrap();
    assert_eq!(&back, m);
    let cases = [
        (
            "profile = \"kubelet-client\"",
            "profile = \"kubelet\"",
            "certificate[0].profile: unknown profile",
        ),
        (
            "ttl = \"24h\"",
            "ttl = \"24\"",
            "certificate[1].ttl: invalid duration",
        ),
        (
            "ttl = \"24h\"",
            "ttl = \"1s\"",
            "certificate[1].ttl: 1s is outside",
        ),
        (
            "profile = \"kubelet-client\"",
            "profile = \"client\"\ncommon_name = \"{hostname}\"",
            "certificate[0].common_name: \"{hostname}\" uses {hostname}",
        ),
        (
            "certificate = \"/var/lib/kubelet/pki/kubelet-client.crt\"",
            "certificate = \"/var/lib/kubelet/pki/kubelet.crt\"",
            "kubeconfig[0].certificate: /var/lib/kubelet/pki/kubelet.crt has profile kubelet-serving",
        ),
        (
            "path = \"/etc/kubernetes/kubelet.conf\"",
            "path = \"/var/lib/kubelet/pki/kubelet.key\"",
            "kubeconfig[0].path: /var/lib/kubelet/pki/kubelet.key is listed twice",
        ),
        (
            "ttl = \"24h\"",
            "ttl = \"24h\"\nserial = 3",
            "unknown field `serial`",
        ),
    ];
    for (from, to, want) in cases {
        let text = IDENTITY.replacen(from, to, 1);
        let e = parse_bundle_toml(&text, d.path(), &mut RequireSize)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{to}: expected {want:?}, got {e}");
    }
}

#[test]
fn self_update_bundles_carry_one_executable_and_nothing_else() {
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let d = dir_with(&[
        ("agent", &me[..4096]),
        ("script", b"#!/bin/sh\n"),
        ("other", b"x"),
    ]);
    let good = "name = \"lksadmin-agent\"\nversion = \"2\"\nself_update = true\n\
                [[file]]\npath = \"/usr/bin/lksadmin-agent\"\nsource = \"agent\"\nmode = \"0755\"\n";
    let b = parse_bundle_toml(good, d.path(), &mut RequireSize).unwrap();
    assert!(b.manifest.self_update);
    let back = Manifest::try_from(pb::Manifest::from(&b.manifest)).unwrap();
    assert!(back.self_update);
    let cases = [
        (
            good.replace("source = \"agent\"", "source = \"script\""),
            "no ELF header",
        ),
        (
            good.replace("0755", "0644"),
            "file[0].mode: the agent's binary must be executable",
        ),
        (
            format!("{good}[[file]]\npath = \"/etc/x\"\nsource = \"other\"\n"),
            "exactly one file",
        ),
        (
            format!("{good}[[step]]\nname = \"x\"\nrun = [\"true\"]\n"),
            "step: a self_update bundle has no steps",
        ),
        (
            format!("{good}[health]\nrun = [\"true\"]\n"),
            "health: a self_update bundle has no health check",
        ),
    ];
    for (text, want) in cases {
        let e = parse_bundle_toml(&text, d.path(), &mut RequireSize)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "expected {want:?}, got {e}");
    }
}

fn elf(machine: u16) -> Vec<u8> {
    crate::elf::fixture_header(machine, 2)
}

const MULTI: &str = r#"
name = "kubelet"
version = "1.31.2"
architectures = ["amd64", "arm64"]

[[file]]
path = "/usr/bin/kubelet"
source = "kubelet-amd64"
arch = "amd64"
mode = "0755"

[[file]]
path = "/usr/bin/kubelet"
source = "kubelet-arm64"
arch = "arm64"
mode = "0755"

[[file]]
path = "/etc/kubelet.conf"
source = "conf"
"#;

#[test]
fn multi_arch_bundles_and_their_refusals() {
    let d = dir_with(&[
        ("kubelet-amd64", &elf(62)),
        ("kubelet-arm64", &elf(183)),
        ("conf", b"conf"),
        ("script", b"#!/bin/sh\n"),
    ]);
    let b = parse_bundle_toml(MULTI, d.path(), &mut RequireSize).unwrap();
    let m = &b.manifest;
    assert_eq!(crate::arch::list(&m.architectures), "amd64, arm64");
    assert_eq!(m.files[1].arch.map(|a| a.as_str()), Some("arm64"));
    assert_eq!(m.files[2].arch, None);
    assert_eq!(b.uploads().len(), 3);
    let back = Manifest::try_from(pb::Manifest::from(m)).unwrap();
    assert_eq!(&back, m);
    let cases = [
        (
            MULTI.replace("source = \"kubelet-arm64\"", "source = \"kubelet-amd64\""),
            "file[1].source: ",
            "is an executable for x86_64 (amd64), but the entry has arch = \"arm64\"",
        ),
        (
            MULTI.replace("source = \"conf\"", "source = \"kubelet-amd64\""),
            "file[2].source: ",
            "is an executable for x86_64 (amd64), but the entry has no arch and the bundle is also for arm64",
        ),
        (
            MULTI.replace("arch = \"arm64\"\n", "arch = \"aarch64\"\n"),
            "file[1].arch: ",
            "\"aarch64\" is not an architecture name",
        ),
        (
            MULTI.replace("[\"amd64\", \"arm64\"]", "[\"amd64\", \"arm64\", \"riscv64\"]"),
            "file[0].path: ",
            "the bundle is for riscv64, but /usr/bin/kubelet has no file for it (amd64 has one); add a file with arch = \"riscv64\"",
        ),
        (
            MULTI.replace("[\"amd64\", \"arm64\"]", "[\"amd64\", \"x\"]"),
            "architectures[1]: ",
            "not an architecture name",
        ),
        (
            MULTI.replace(
                "source = \"kubelet-arm64\"\narch = \"arm64\"\n",
                "source = \"kubelet-arm64\"\n",
            ),
            "file[1].path: ",
            "/usr/bin/kubelet is both arch-neutral (file[1]) and for amd64 (file[0])",
        ),
    ];
    for (text, field, want) in cases {
        let e = parse_bundle_toml(&text, d.path(), &mut RequireSize)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(field) && e.contains(want),
            "expected {field}{want:?}, got {e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
    }
    // Non-executables may carry an arch: a per-arch config or script.
    let script = MULTI.replace("source = \"kubelet-arm64\"", "source = \"script\"");
    parse_bundle_toml(&script, d.path(), &mut RequireSize).unwrap();
}

#[test]
fn syntax_and_unknown_fields_report_a_line() {
    let d = dir_with(&[]);
    let e = parse_bundle_toml(
        "name = \"x\"\nversion = \"1\"\nbogus = 3\n",
        d.path(),
        &mut RequireSize,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("line 3:") && e.contains("bogus"), "{e}");
    let e = parse_bundle_toml("name = \n", d.path(), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 1:"), "{e}");
    let e = parse_bundle_toml("version = \"1\"\n", d.path(), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert!(e.contains("name"), "{e}");
}

#[test]
fn load_error_names_the_file() {
    let d = dir_with(&[(
        BUNDLE_TOML,
        b"name = \"x\"\nversion = \"1\"\n[[file]]\npath = \"/a/../b\"\nsource = \"s\"\n",
    )]);
    let e = load_bundle_dir(d.path(), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bundle.toml: file[0].path:"), "{e}");
    let e = load_bundle_dir(&d.path().join("nope"), &mut RequireSize)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bundle.toml: cannot read"), "{e}");
}

#[test]
fn declared_sha_of_a_local_file_must_match() {
    let d = dir_with(&[("kubelet.conf", b"other")]);
    let text = GOOD.replace(
        "mode = \"0600\"",
        "mode = \"0600\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"",
    );
    let e = parse_bundle_toml(&text, d.path(), &mut RequireSize).unwrap_err();
    assert!(e.to_string().starts_with("file[0].sha256:"), "{e}");
    match e {
        BundleTomlError::DigestMismatch { field, src, .. } => {
            assert_eq!((field.as_str(), src.as_str()), ("file[0].sha256", "kubelet.conf"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn integer_modes_and_sizer() {
    struct Four;
    impl UrlSizer for Four {
        fn size_of(&mut self, _: &str, _: &Digest) -> Result<u64, SizeError> {
            Ok(4)
        }
    }
    let d = dir_with(&[("kubelet.conf", b"conf")]);
    let text = GOOD
        .replace("mode = \"0600\"", "mode = 0o640")
        .replace("size = 4\n", "");
    let b = parse_bundle_toml(&text, d.path(), &mut Four).unwrap();
    assert_eq!(b.manifest.files[0].mode, 0o640);
    assert_eq!(b.manifest.files[1].size, 4);
}

proptest! {
    #[test]
    fn parser_never_panics(s in "\\PC{0,200}") {
        let d = std::env::temp_dir();
        let _ = parse_bundle_toml(&s, &d, &mut RequireSize);
    }

    /// Manifest → protobuf bytes → manifest is the identity for any valid manifest.
    #[test]
    fn protobuf_round_trip(
        name in "[a-z][a-z0-9-]{0,20}",
        version in "[0-9a-z.+-]{1,20}",
        paths in prop::collection::btree_set("(/[a-z0-9_]{1,8}){1,4}", 0..6),
        mode in 0u32..0o7777,
        size in 0u64..1_000_000,
        steps in prop::collection::vec(prop::collection::vec("[ -~]{1,10}", 1..4), 0..4),
    ) {
        use prost::Message;
        let paths: Vec<BundlePath> = paths.iter().map(|p| BundlePath::new(p).unwrap()).collect();
        prop_assume!(crate::manifest::check_paths_disjoint(paths.iter()).is_ok());
        let m = Manifest {
            name, version,
            files: paths.into_iter().enumerate().map(|(i, path)| FileSpec { chunks: None, arch: None,
                path, digest: Digest::of(&[i as u8]), size, mode,
                url: (i % 2 == 1).then(|| format!("https://m/{i}")),
            }).collect(),
            steps: steps.into_iter().enumerate().map(|(i, run)| Step {
                name: format!("s{i}"), run, timeout: Duration::from_millis(1 + i as u64), on_heal: i % 2 == 1,
            }).collect(),
            health: None,
            ..Default::default()
        };
        prop_assume!(m.validate().is_ok());
        let bytes = pb::Manifest::from(&m).encode_to_vec();
        let back: Manifest = pb::Manifest::decode(bytes.as_slice()).unwrap().try_into().unwrap();
        prop_assert_eq!(crate::canonical::encode(&back), crate::canonical::encode(&m));
        prop_assert_eq!(back, m);
    }
}
