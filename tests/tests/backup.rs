//! `lks-control-server backup` / `restore` (issue [ops] 1): a backup taken
//! while bundles are published, a node enrols and a rollout runs is
//! restored into a new data dir; a server started on it (same address)
//! gets every node of the backup back with its identity, serves every
//! bundle of the backup byte-exact, and refuses a node enrolled after the
//! backup until it joins again. A truncated, an altered archive and a
//! non-empty target are refused with nothing written.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, write_bundle};
use lks_e2e::server::Server;
use lks_e2e::{bin, noise, ok_stdout, one_line_error, run, wait_until};

/// The bytes of `name@version`'s one file: distinct per version.
fn content(name: &str, version: &str) -> Vec<u8> {
    let seed = name
        .bytes()
        .chain(version.bytes())
        .fold(7u64, |h, b| h * 31 + u64::from(b));
    let mut c = format!("{name}@{version}\n").into_bytes();
    c.extend(noise(48 * 1024, seed));
    c
}

fn target(name: &str) -> String {
    format!("/etc/{name}.conf")
}

fn publish(server: &Server, parent: &Path, name: &str, version: &str) -> String {
    let bytes = content(name, version);
    let path = target(name);
    let dir = write_bundle(
        parent,
        name,
        version,
        &[BundleFile {
            path: &path,
            content: &bytes,
            mode: "0644",
        }],
        "",
    );
    server.publish(&dir)
}

fn backup(data_dir: &Path, out: &Path) -> Output {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("backup")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--out")
        .arg(out)
        .arg("--with-blobs");
    run(cmd)
}

fn restore(from: &Path, data_dir: &Path) -> Output {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.arg("restore")
        .arg("--from")
        .arg(from)
        .arg("--data-dir")
        .arg(data_dir);
    run(cmd)
}

fn names(list: &serde_json::Value, key: &str) -> BTreeSet<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|n| n[key].as_str().unwrap().to_string())
        .collect()
}

fn join_and_start(server: &Server, name: &str) -> Agent {
    let mut a = Agent::new(name);
    a.join(server, "c1", &[]);
    a.start();
    a
}

#[test]
fn a_backup_taken_under_load_restores_nodes_and_bundles() {
    let mut server = Server::start();
    server.create_cluster("c1");
    let work = server.work_dir().to_path_buf();
    let mut agents: Vec<Agent> = (1..=3)
        .map(|i| join_and_start(&server, &format!("node-{i}")))
        .collect();
    for a in &agents {
        a.wait_connected();
    }
    let app1 = publish(&server, &work, "app", "1");
    server.lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", &app1, "--wait"]);
    let app2 = publish(&server, &work, "app", "2");

    // Under way while the backup is taken: a rollout, publishes, an enrolment.
    let rollout = server.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        &app2,
        "--batch-size",
        "1",
    ]);
    let archive = work.join("backup.lksbak");
    let (taken, node4) = std::thread::scope(|s| {
        let publisher = s.spawn(|| {
            for k in 1..=4 {
                publish(&server, &work, &format!("extra-{k}"), "1");
            }
        });
        let enrol = s.spawn(|| join_and_start(&server, "node-4"));
        std::thread::sleep(Duration::from_millis(300));
        let taken = backup(&server.data_dir, &archive);
        publisher.join().unwrap();
        (taken, enrol.join().unwrap())
    });
    let summary = ok_stdout(&taken, "backup");
    eprintln!("{summary}");
    agents.push(node4);
    assert!(summary.contains("holds the CA private key"), "{summary}");
    let sha = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("sha256"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let bytes = std::fs::read(&archive).unwrap();
    assert_eq!(
        sha,
        lks_proto::Digest::of(&bytes).hex(),
        "the printed SHA-256 is the file's"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777,
        0o600,
        "the archive holds the CA key"
    );
    // Enrolled after the backup: unknown to the restored server.
    let mut late = join_and_start(&server, "node-late");
    late.wait_connected();
    for a in &agents {
        a.wait_connected();
    }
    server.stop();

    // Refusals leave the target untouched.
    let bad = work.join("bad");
    let truncated = work.join("truncated.lksbak");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let e = one_line_error(&restore(&truncated, &bad), "restore of a truncated archive");
    assert!(e.contains("truncated"), "{e}");
    assert!(!bad.exists(), "nothing written for a truncated archive");
    for at in [bytes.len() / 2, 40, bytes.len() - 5] {
        let mut altered = bytes.clone();
        altered[at] ^= 0x01;
        let file = work.join(format!("altered-{at}.lksbak"));
        std::fs::write(&file, &altered).unwrap();
        let e = one_line_error(&restore(&file, &bad), "restore of an altered archive");
        assert!(e.contains("altered"), "byte {at}: {e}");
        assert!(!bad.exists(), "nothing written for an altered archive");
    }
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("keep"), b"x").unwrap();
    let e = one_line_error(&restore(&archive, &bad), "restore into a non-empty dir");
    assert!(e.contains("is not empty"), "{e}");
    assert_eq!(std::fs::read_dir(&bad).unwrap().count(), 1);

    // Restored into a new dir, on the old address.
    let restored = Server::start_at_prepared(server.addr, &[], |dir| {
        let out = restore(&archive, dir);
        let text = ok_stdout(&out, "restore");
        assert!(text.contains("restored the backup of"), "{text}");
    });
    let nodes = restored.lksctl_json(&["node", "list"]);
    let in_backup = names(&nodes, "name");
    for n in ["node-1", "node-2", "node-3"] {
        assert!(
            in_backup.contains(n),
            "{n} enrolled before the backup: {in_backup:?}"
        );
    }
    assert!(!in_backup.contains("node-late"), "{in_backup:?}");
    for n in &in_backup {
        wait_until(CONVERGE, &format!("{n} reconnects with its identity"), || {
            lks_e2e::agent::node_connected(&restored, n)
        });
    }
    wait_until(CONVERGE, "node-late is refused as not enrolled", || {
        late.log().contains("not enrolled")
    });
    assert!(!lks_e2e::agent::node_connected(&restored, "node-late"));
    let rollouts = names(&restored.lksctl_json(&["rollout", "list"]), "id");
    assert!(
        rollouts.contains(rollout.trim()),
        "the rollout under way is in the backup: {rollouts:?}"
    );

    // Every bundle of the backup is served byte-exact: a new node of a new
    // cluster takes each version in turn.
    restored.create_cluster("verify");
    let mut verifier = Agent::new("verifier");
    verifier.join(&restored, "verify", &[]);
    verifier.start();
    verifier.wait_connected();
    let bundles = restored.lksctl_json(&["bundle", "list"]);
    let ids: BTreeSet<(String, String)> = bundles
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().into(),
                b["version"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(ids.contains(&("app".into(), "1".into())) && ids.contains(&("app".into(), "2".into())));
    for (name, version) in &ids {
        let id = format!("{name}@{version}");
        restored.lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "verify",
            "--bundle",
            &id,
            "--wait",
        ]);
        let (got, _) = verifier
            .read(&target(name))
            .unwrap_or_else(|| panic!("{id} not installed"));
        assert!(got == content(name, version), "{id}: served bytes differ");
    }

    // The operator's way back for a node enrolled after the backup: join again.
    late.stop();
    std::fs::remove_dir_all(&late.state_dir).unwrap();
    late.join(&restored, "c1", &[]);
    late.start();
    late.wait_connected();
}
