//! Multi-arch bundles (issue #32) with real agents: agents reporting amd64
//! and arm64 (the test-only `LKS_AGENT_TEST_ONLY_ARCH`) take one rollout of
//! one `name@version` and each installs its own variant, byte for byte; a
//! version without arm64 fails the arm64 nodes at their turn with the
//! reason while the amd64 ones complete, and `--dry-run` lists them first;
//! publish refuses a mislabelled executable or a missing variant with one
//! line; an agent without the `multi-arch` feature is refused at its turn;
//! and a node may fetch only the blobs of its own architecture.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use lks_e2e::agent::{Agent, CONVERGE};
use lks_e2e::rollout::{Fleet, first_line};
use lks_e2e::server::{Server, TestNode};
use lks_e2e::{ok_stdout, one_line_error, wait_until};
use lks_proto::{Digest, pb};
use tokio_stream::StreamExt;

const KUBELET: &str = "/usr/bin/kubelet";
const CONF: &str = "/etc/kubernetes/kubelet.conf";

/// An ELF executable header for `machine` (62 x86_64, 183 aarch64) and a
/// body naming it, so each variant's bytes differ.
fn elf(machine: u16, body: &str) -> Vec<u8> {
    let mut h = lks_proto::elf::fixture_header(machine, 2);
    h.extend_from_slice(body.as_bytes());
    h
}

/// A kubelet bundle: one kubelet per architecture in `variants`
/// (arch, bytes) and one arch-neutral config.
fn kubelet_bundle(parent: &Path, version: &str, variants: &[(&str, &[u8])], declared: &str) -> PathBuf {
    let d = parent.join(format!("kubelet-{version}"));
    std::fs::create_dir_all(&d).unwrap();
    let mut toml = format!("name = \"kubelet\"\nversion = \"{version}\"\n{declared}\n");
    for (arch, bytes) in variants {
        std::fs::write(d.join(format!("kubelet-{arch}")), bytes).unwrap();
        toml.push_str(&format!(
            "[[file]]\npath = \"{KUBELET}\"\nsource = \"kubelet-{arch}\"\narch = \"{arch}\"\nmode = \"0755\"\n\n"
        ));
    }
    std::fs::write(d.join("kubelet.conf"), format!("conf {version}\n")).unwrap();
    toml.push_str(&format!(
        "[[file]]\npath = \"{CONF}\"\nsource = \"kubelet.conf\"\n"
    ));
    std::fs::write(d.join("bundle.toml"), toml).unwrap();
    d
}

/// A fleet of real agents, each told to act as the given architecture.
fn mixed_fleet(nodes: &[(&str, &str)]) -> Fleet {
    let server = Server::start();
    server.create_cluster("c1");
    let log = server.work_dir().join("steps.log");
    let mut f = Fleet {
        server,
        cluster: "c1".into(),
        agents: Vec::new(),
        log,
    };
    for (name, arch) in nodes {
        let mut a = Agent::new(name);
        a.run_env
            .push(("LKS_AGENT_TEST_ONLY_ARCH".into(), (*arch).to_string()));
        a.join(&f.server, &f.cluster, &[]);
        a.start();
        f.agents.push(a);
    }
    for a in &f.agents {
        a.wait_connected();
    }
    f
}

fn node<'a>(st: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    st["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name))
        .unwrap_or_else(|| panic!("no node {name} in {st:#}"))
}

#[test]
fn one_rollout_gives_each_architecture_its_variant_and_a_missing_one_fails_at_its_turn() {
    let f = mixed_fleet(&[
        ("amd-1", "amd64"),
        ("amd-2", "amd64"),
        ("arm-1", "arm64"),
        ("arm-2", "arm64"),
    ]);
    each_node_reports_its_architecture(&f);
    let amd = elf(62, "kubelet 1.31.2 for amd64\n");
    let arm = elf(183, "kubelet 1.31.2 for arm64\n");
    let b = one_signed_manifest_lists_every_variant(&f, &amd, &arm);
    each_node_installs_its_own_variant(&f, &b, &amd, &arm);

    // 1.31.3 exists for amd64 only.
    let amd3 = elf(62, "kubelet 1.31.3 for amd64\n");
    let dir = kubelet_bundle(f.server.work_dir(), "1.31.3", &[("amd64", &amd3)], "");
    let b3 = f.server.publish(&dir);
    let reason = "kubelet@1.31.3 has no files for architecture arm64 (it is for amd64)";
    the_dry_run_lists_the_nodes_that_would_fail_first(&f, &b3, reason);
    the_arm_nodes_fail_at_their_turn_and_keep_their_variant(&f, &b3, reason, &arm, &amd3);
}

/// Each node reports its architecture, shown by node list (JSON and table).
fn each_node_reports_its_architecture(f: &Fleet) {
    wait_until(CONVERGE, "architectures reported", || {
        let list = f.server.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .all(|n| n["architecture"].is_string())
    });
    let list = f.server.lksctl_json(&["node", "list"]);
    for n in list.as_array().unwrap() {
        let want = if n["name"].as_str().unwrap().starts_with("arm") {
            "arm64"
        } else {
            "amd64"
        };
        assert_eq!(n["architecture"], want, "{n:#}");
        assert_eq!(n["facts"]["architecture"], want);
        assert!(
            n["facts"]["features"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == "multi-arch")
        );
    }
    let table = ok_stdout(&f.server.lksctl(&["node", "list"]), "node list");
    assert!(table.lines().next().unwrap().contains("ARCH"), "{table}");
}

/// kubelet@1.31.2 with an amd64 and an arm64 variant: one signed manifest
/// lists every variant. Returns its ID.
fn one_signed_manifest_lists_every_variant(f: &Fleet, amd: &[u8], arm: &[u8]) -> String {
    let dir = kubelet_bundle(
        f.server.work_dir(),
        "1.31.2",
        &[("amd64", amd), ("arm64", arm)],
        "architectures = [\"amd64\", \"arm64\"]",
    );
    let b = f.server.publish(&dir);
    assert_eq!(b, "kubelet@1.31.2");
    let got = f.server.lksctl_json(&["bundle", "get", &b]);
    assert_eq!(
        got["architectures"],
        serde_json::json!(["amd64", "arm64"]),
        "{got:#}"
    );
    let files = got["manifest"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "one signed manifest lists every variant");
    let text = ok_stdout(&f.server.lksctl(&["bundle", "get", &b]), "bundle get");
    assert!(text.contains("Arch:       amd64,arm64"), "{text}");

    b
}

/// Nothing would fail: the dry run starts nothing; the rollout gives
/// each node its own variant, byte for byte.
fn each_node_installs_its_own_variant(f: &Fleet, b: &str, amd: &[u8], arm: &[u8]) {
    let plan = f
        .server
        .lksctl_json(&["rollout", "start", "--cluster", "c1", "--bundle", b, "--dry-run"]);
    assert_eq!(
        (&plan["total"], &plan["fails"]),
        (&4.into(), &0.into()),
        "{plan:#}"
    );
    assert!(
        f.server
            .lksctl_json(&["rollout", "list"])
            .as_array()
            .unwrap()
            .is_empty()
    );

    let out = f.start_rollout(b, &["--batch-size", "2", "--wait"]);
    let id = first_line(&ok_stdout(&out, "rollout of the multi-arch bundle"));
    let st = f.status(&id);
    assert_eq!(
        (&st["state"], &st["updated"]),
        (&"completed".into(), &4.into()),
        "{st:#}"
    );
    for a in &f.agents {
        let want = if a.name.starts_with("arm") { arm } else { amd };
        assert_eq!(a.read(KUBELET), Some((want.to_vec(), 0o755)), "{}", a.name);
        assert_eq!(a.read(CONF).unwrap().0, b"conf 1.31.2\n");
    }
}

/// A dry run of a version without arm64 says 2 would fail at their turn,
/// and lists them first with the reason.
fn the_dry_run_lists_the_nodes_that_would_fail_first(f: &Fleet, b3: &str, reason: &str) {
    let plan = f
        .server
        .lksctl_json(&["rollout", "start", "--cluster", "c1", "--bundle", b3, "--dry-run"]);
    assert_eq!(plan["fails"], 2, "{plan:#}");
    let first: Vec<&serde_json::Value> = plan["nodes"].as_array().unwrap().iter().take(2).collect();
    for n in &first {
        assert!(
            n["name"].as_str().unwrap().starts_with("arm"),
            "failing nodes first: {plan:#}"
        );
        assert_eq!((&n["outcome"], &n["reason"]), (&"fails".into(), &reason.into()));
    }
    let text = ok_stdout(
        &f.server
            .lksctl(&["rollout", "start", "--cluster", "c1", "--bundle", b3, "--dry-run"]),
        "dry run",
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("2 would fail at their turn; nothing started"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("arm-1") && lines[3].starts_with("arm-2"),
        "{text}"
    );
    assert!(lines[2].contains(reason), "{text}");
}

/// The rollout completes with the arm64 nodes failed at their turn with
/// the reason: never assigned, they keep 1.31.2.
fn the_arm_nodes_fail_at_their_turn_and_keep_their_variant(
    f: &Fleet,
    b3: &str,
    reason: &str,
    arm: &[u8],
    amd3: &[u8],
) {
    let out = f.start_rollout(b3, &["--batch-size", "2", "--failure-threshold", "3", "--wait"]);
    let id = first_line(&ok_stdout(&out, "rollout without arm64"));
    let st = f.status(&id);
    assert_eq!(
        (&st["state"], &st["updated"], &st["failed"]),
        (&"completed".into(), &2.into(), &2.into()),
        "{st:#}"
    );
    for a in &f.agents {
        if a.name.starts_with("arm") {
            let n = node(&st, &a.name);
            assert_eq!(
                (&n["state"], &n["message"]),
                (&"failed".into(), &reason.into()),
                "{st:#}"
            );
            // Never assigned: it keeps 1.31.2, nothing of amd64 on it.
            assert_eq!(a.read(KUBELET).unwrap().0, arm, "{}", a.name);
            assert_eq!(a.bundle("kubelet").unwrap().0, "1.31.2");
        } else {
            assert_eq!(a.read(KUBELET).unwrap().0, amd3, "{}", a.name);
        }
    }
}

#[test]
fn publish_refuses_a_mislabelled_executable_and_a_missing_variant_with_one_line() {
    let s = Server::start();
    let amd = elf(62, "amd64\n");
    let arm = elf(183, "arm64\n");
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            kubelet_bundle(
                &s.work_dir().join("a"),
                "1",
                &[("amd64", &amd), ("arm64", &amd)],
                "",
            ),
            "is an executable for x86_64 (amd64), but the entry has arch = \"arm64\"",
        ),
        (
            kubelet_bundle(
                &s.work_dir().join("b"),
                "1",
                &[("amd64", &amd), ("arm64", &arm)],
                "architectures = [\"amd64\", \"arm64\", \"riscv64\"]",
            ),
            "the bundle is for riscv64, but /usr/bin/kubelet has no file for it (amd64 has one)",
        ),
    ];
    for (dir, want) in cases {
        let out = s.lksctl(&["bundle", "publish", &dir.display().to_string()]);
        let e = one_line_error(&out, "publish of a bad multi-arch bundle");
        assert!(e.contains(want), "expected {want:?}, got {e}");
    }
    // Nothing half-written: no version was stored.
    assert!(s.lksctl_json(&["bundle", "list"]).as_array().unwrap().is_empty());
    // The same files correctly labelled publish, and the list names them.
    let ok = kubelet_bundle(
        &s.work_dir().join("c"),
        "1",
        &[("amd64", &amd), ("arm64", &arm)],
        "",
    );
    assert_eq!(s.publish(&ok), "kubelet@1");
    let list = s.lksctl_json(&["bundle", "list"]);
    assert_eq!(list[0]["architectures"], serde_json::json!(["amd64", "arm64"]));
}

async fn fetch(n: &TestNode, digest: &Digest) -> Result<Vec<u8>, tonic::Status> {
    let mut s = n
        .client()
        .await
        .fetch_blob(pb::FetchBlobRequest {
            digest: digest.to_string(),
            offset: 0,
            length: 0,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c?.data);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_agent_is_refused_at_its_turn_and_a_node_fetches_only_its_architecture() {
    let s = Server::start();
    s.create_cluster("c1");
    let t = s.token("c1", &["--uses", "2"]);
    // "old" plays an agent from before multi-arch bundles: no feature, no
    // architecture reported.
    let old = TestNode::enroll(&s, &t, "old", &[]).await;
    let mut new = TestNode::enroll(&s, &t, "new", &[]).await;
    new.features.push("multi-arch".into());
    new.architecture = "amd64".into();
    let (_t1, _r1) = old.connect(vec![]).await.expect("connect old");
    let (_t2, _r2) = new.connect(vec![]).await.expect("connect new");
    wait_until(CONVERGE, "both connected", || {
        let list = s.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .filter(|n| n["connected"] == true)
            .count()
            == 2
    });
    let amd = elf(62, "amd64 bytes\n");
    let arm = elf(183, "arm64 bytes\n");
    let dir = kubelet_bundle(s.work_dir(), "1", &[("amd64", &amd), ("arm64", &arm)], "");
    let b = s.publish(&dir);
    let id = s
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c1",
            "--bundle",
            &b,
            "--failure-threshold",
            "2",
            "--batch-size",
            "2",
        ])
        .trim()
        .to_string();
    let deadline = std::time::Instant::now() + CONVERGE;
    let st = loop {
        let st = s.lksctl_json(&["rollout", "status", &id]);
        if node(&st, "old")["state"] == "failed" && node(&st, "new")["state"] == "applying" {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "old node not failed, new not assigned: {st:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let msg = node(&st, "old")["message"].as_str().unwrap().to_string();
    assert!(
        msg.starts_with("its agent does not announce the \"multi-arch\" feature kubelet@1 needs"),
        "{msg}"
    );
    // The amd64 node may fetch its kubelet and the neutral config, never
    // the arm64 kubelet of the same version.
    assert_eq!(fetch(&new, &Digest::of(&amd)).await.unwrap(), amd);
    assert_eq!(fetch(&new, &Digest::of(b"conf 1\n")).await.unwrap(), b"conf 1\n");
    let e = fetch(&new, &Digest::of(&arm)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // The old node was never assigned anything.
    assert_eq!(
        fetch(&old, &Digest::of(b"conf 1\n")).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
}
