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
use lks_e2e::etcd::Etcd;
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

fn lks_control_server(args: &[&str]) -> Output {
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(args);
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
    let (bytes, node4) = a_backup_under_load_prints_its_sha256_and_is_private(&server, &work, &archive);
    agents.push(node4);
    // Enrolled after the backup: unknown to the restored server.
    let mut late = join_and_start(&server, "node-late");
    late.wait_connected();
    for a in &agents {
        a.wait_connected();
    }
    server.stop();

    truncated_altered_and_non_empty_target_restores_write_nothing(&work, &archive, &bytes);

    // Restored into a new dir, on the old address.
    let restored = Server::start_at_prepared(server.addr, &[], |dir| {
        let out = restore(&archive, dir);
        let text = ok_stdout(&out, "restore");
        assert!(text.contains("restored the backup of"), "{text}");
    });
    the_restored_server_has_the_backups_nodes_and_rollout(&restored, &late, &rollout);

    assert_every_bundle_served(&restored);

    // The operator's way back for a node enrolled after the backup: join again.
    late.stop();
    std::fs::remove_dir_all(&late.state_dir).unwrap();
    late.join(&restored, "c1", &[]);
    late.start();
    late.wait_connected();
}

/// A backup taken while extras are published and node-4 enrols: it
/// prints the archive's SHA-256, holds the CA key and is 0600. Returns
/// the archive's bytes and node-4.
fn a_backup_under_load_prints_its_sha256_and_is_private(
    server: &Server,
    work: &Path,
    archive: &Path,
) -> (Vec<u8>, Agent) {
    let (taken, node4) = std::thread::scope(|s| {
        let publisher = s.spawn(|| {
            for k in 1..=4 {
                publish(server, work, &format!("extra-{k}"), "1");
            }
        });
        let enrol = s.spawn(|| join_and_start(server, "node-4"));
        std::thread::sleep(Duration::from_millis(300));
        let taken = backup(&server.data_dir, archive);
        publisher.join().unwrap();
        (taken, enrol.join().unwrap())
    });
    let summary = ok_stdout(&taken, "backup");
    eprintln!("{summary}");
    assert!(summary.contains("holds the CA private key"), "{summary}");
    let sha = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("sha256"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let bytes = std::fs::read(archive).unwrap();
    assert_eq!(
        sha,
        lks_proto::Digest::of(&bytes).hex(),
        "the printed SHA-256 is the file's"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(archive).unwrap().permissions().mode() & 0o777,
        0o600,
        "the archive holds the CA key"
    );
    (bytes, node4)
}

/// Refusals leave the target untouched: a truncated archive, an altered
/// one (at three places), a target that is not empty.
fn truncated_altered_and_non_empty_target_restores_write_nothing(work: &Path, archive: &Path, bytes: &[u8]) {
    let bad = work.join("bad");
    let truncated = work.join("truncated.lksbak");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let e = one_line_error(&restore(&truncated, &bad), "restore of a truncated archive");
    assert!(e.contains("truncated"), "{e}");
    assert!(!bad.exists(), "nothing written for a truncated archive");
    for at in [bytes.len() / 2, 40, bytes.len() - 5] {
        let mut altered = bytes.to_vec();
        altered[at] ^= 0x01;
        let file = work.join(format!("altered-{at}.lksbak"));
        std::fs::write(&file, &altered).unwrap();
        let e = one_line_error(&restore(&file, &bad), "restore of an altered archive");
        assert!(e.contains("altered"), "byte {at}: {e}");
        assert!(!bad.exists(), "nothing written for an altered archive");
    }
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("keep"), b"x").unwrap();
    let e = one_line_error(&restore(archive, &bad), "restore into a non-empty dir");
    assert!(e.contains("is not empty"), "{e}");
    assert_eq!(std::fs::read_dir(&bad).unwrap().count(), 1);
}

/// The restored server knows the nodes enrolled before the backup (each
/// reconnects with its identity), refuses node-late as not enrolled, and
/// has the rollout that was under way.
fn the_restored_server_has_the_backups_nodes_and_rollout(restored: &Server, late: &Agent, rollout: &str) {
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
            lks_e2e::agent::node_connected(restored, n)
        });
    }
    wait_until(CONVERGE, "node-late is refused as not enrolled", || {
        late.log().contains("not enrolled")
    });
    assert!(!lks_e2e::agent::node_connected(restored, "node-late"));
    let rollouts = names(&restored.lksctl_json(&["rollout", "list"]), "id");
    assert!(
        rollouts.contains(rollout.trim()),
        "the rollout under way is in the backup: {rollouts:?}"
    );
}

/// Every bundle the restored server lists is served byte-exact: a new node
/// of a new cluster takes each version in turn; app@1 and app@2 are among
/// them.
fn assert_every_bundle_served(restored: &Server) {
    restored.create_cluster("verify");
    let mut verifier = Agent::new("verifier");
    verifier.join(restored, "verify", &[]);
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
}

/// `backup --store etcd` (issue [ops] 1): taken from a replica's prefix
/// while a rollout and publishes run, restored into an empty prefix; a
/// replica started on it (on the old address) gets every node of the
/// backup back and serves every bundle byte-exact. An altered archive, a
/// prefix in use and a data dir as target are refused, nothing written.
#[test]
fn an_etcd_backup_restores_into_an_empty_prefix() {
    let etcd = Etcd::start();
    let url = etcd.url();
    // An etcd that has served a while: its revision (which the replicas'
    // generations follow) is far above a new etcd's.
    for k in 0..400 {
        etcd.put("/elsewhere/k", &k.to_string());
    }
    let mut server = etcd.replica("/lks-a/", &[]);
    server.create_cluster("c1");
    let work = server.work_dir().to_path_buf();
    let agents: Vec<Agent> = (1..=2)
        .map(|i| join_and_start(&server, &format!("node-{i}")))
        .collect();
    for a in &agents {
        a.wait_connected();
    }
    let app1 = publish(&server, &work, "app", "1");
    server.lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", &app1, "--wait"]);
    let app2 = publish(&server, &work, "app", "2");
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
    // Paused while the backup is taken, so that no node moves on after it:
    // every generation a node holds is one the archive knows.
    server.lksctl_ok(&["rollout", "pause", rollout.trim()]);
    let archive = work.join("etcd.lksbak");
    an_etcd_backup_taken_while_publishing_holds_both_nodes_and_the_ca_key(&server, &work, &url, &archive);
    let mut late = join_and_start(&server, "node-late");
    late.wait_connected();
    server.stop();

    // A new etcd, as after the loss of the old one: its revisions start
    // low again, below the generations the nodes hold.
    let new_etcd = Etcd::start();
    let new_url = new_etcd.url();
    altered_in_use_and_data_dir_restores_are_refused(&new_etcd, &archive, &url, &new_url, &work);
    restored_into_the_new_etcds_empty_prefix(&new_etcd, &archive, &new_url);
    let restored = Server::start_at(
        server.addr,
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &new_url,
            "--etcd-prefix",
            "/lks-b/",
            "--lease-ttl",
            "3s",
        ],
    );
    the_restored_replica_has_the_backups_nodes_and_its_rollout_goes_on(&restored, &late, &rollout, &agents);
    assert_every_bundle_served(&restored);
    late.stop();
    drop(agents);
}

/// `backup --store etcd --with-blobs` taken while extras are published:
/// its summary names etcd and the prefix, both nodes and the CA key; a
/// second backup to the same file is refused.
fn an_etcd_backup_taken_while_publishing_holds_both_nodes_and_the_ca_key(
    server: &Server,
    work: &Path,
    url: &str,
    archive: &Path,
) {
    let backup_args = [
        "backup",
        "--store",
        "etcd",
        "--etcd-endpoints",
        url,
        "--etcd-prefix",
        "/lks-a/",
        "--with-blobs",
        "--out",
        archive.to_str().unwrap(),
    ];
    let taken = std::thread::scope(|s| {
        let publisher = s.spawn(|| {
            for k in 1..=3 {
                publish(server, work, &format!("extra-{k}"), "1");
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let taken = lks_control_server(&backup_args);
        publisher.join().unwrap();
        taken
    });
    let summary = ok_stdout(&taken, "backup --store etcd");
    eprintln!("{summary}");
    assert!(
        summary.contains("(etcd)") && summary.contains("/lks-a/@"),
        "{summary}"
    );
    assert!(summary.contains("nodes       2"), "{summary}");
    assert!(summary.contains("holds the CA private key"), "{summary}");
    let e = one_line_error(
        &lks_control_server(&backup_args),
        "a second backup to the same file",
    );
    assert!(e.contains("exists already"), "{e}");
}

/// `restore --store etcd` of `from` into `prefix` of the etcd at `url`.
fn restore_into(from: &Path, url: &str, prefix: &str) -> Output {
    lks_control_server(&[
        "restore",
        "--from",
        from.to_str().unwrap(),
        "--store",
        "etcd",
        "--etcd-endpoints",
        url,
        "--etcd-prefix",
        prefix,
    ])
}

/// An altered archive (nothing written under /lks-b/), the prefix in use
/// and a data dir as target are refused.
fn altered_in_use_and_data_dir_restores_are_refused(
    new_etcd: &Etcd,
    archive: &Path,
    url: &str,
    new_url: &str,
    work: &Path,
) {
    let bytes = std::fs::read(archive).unwrap();
    for at in [bytes.len() / 2, bytes.len() - 5] {
        let mut altered = bytes.clone();
        altered[at] ^= 0x01;
        let file = work.join(format!("altered-{at}.lksbak"));
        std::fs::write(&file, &altered).unwrap();
        let e = one_line_error(
            &restore_into(&file, new_url, "/lks-b/"),
            "restore of an altered archive",
        );
        assert!(
            e.contains("altered") && e.contains("nothing was restored"),
            "byte {at}: {e}"
        );
        assert_eq!(
            new_etcd.keys_under("/lks-b/"),
            0,
            "nothing written for an altered archive"
        );
    }
    let e = one_line_error(
        &restore_into(archive, url, "/lks-a/"),
        "restore into the prefix in use",
    );
    assert!(e.contains("is in use"), "{e}");
    let e = one_line_error(
        &restore(archive, &work.join("as-a-dir")),
        "restore of an etcd archive into a data dir",
    );
    assert!(e.contains("etcd installation"), "{e}");
    assert!(!work.join("as-a-dir").exists());
}

/// Restored into the new etcd's empty prefix, blobs and all.
fn restored_into_the_new_etcds_empty_prefix(new_etcd: &Etcd, archive: &Path, new_url: &str) {
    let text = ok_stdout(&restore_into(archive, new_url, "/lks-b/"), "restore --store etcd");
    eprintln!("{text}");
    assert!(
        text.contains("restored the backup of") && text.contains("under /lks-b/"),
        "{text}"
    );
    assert!(
        new_etcd.keys_under("/lks-b/blobs/") > 0,
        "the blobs went into etcd's chunks"
    );
}

/// The restored replica has the backup's nodes (each reconnects with its
/// identity; node-late is refused); the rollout under way goes on: each
/// node is given app@2 with a generation above the one it reports,
/// applies it and is counted, and no node sees its generation go back.
fn the_restored_replica_has_the_backups_nodes_and_its_rollout_goes_on(
    restored: &Server,
    late: &Agent,
    rollout: &str,
    agents: &[Agent],
) {
    let in_backup = names(&restored.lksctl_json(&["node", "list"]), "name");
    assert!(
        in_backup.contains("node-1") && in_backup.contains("node-2") && !in_backup.contains("node-late"),
        "{in_backup:?}"
    );
    for n in &in_backup {
        wait_until(CONVERGE, &format!("{n} reconnects with its identity"), || {
            lks_e2e::agent::node_connected(restored, n)
        });
    }
    wait_until(CONVERGE, "node-late is refused as not enrolled", || {
        late.log().contains("not enrolled")
    });
    let rollouts = names(&restored.lksctl_json(&["rollout", "list"]), "id");
    assert!(rollouts.contains(rollout.trim()), "{rollouts:?}");
    // The rollout under way goes on: each node is given app@2 with a
    // generation above the one it reports, applies it and is counted.
    restored.lksctl_ok(&["rollout", "resume", rollout.trim()]);
    wait_until(CONVERGE, "the restored rollout completes", || {
        restored.lksctl_json(&["rollout", "status", rollout.trim()])["state"] == "completed"
    });
    for n in ["node-1", "node-2"] {
        lks_e2e::agent::wait_node_bundle(restored, n, "app", "2", "applied");
    }
    for a in agents {
        assert!(
            !a.log().contains("went backwards"),
            "{}: the restored replicas handed out a generation below one the node held",
            a.name
        );
    }
}

/// An installation whose private keys are sealed (`--encryption-key-file`):
/// its etcd archive says so and names the key, restores only under the
/// prefix the keys were sealed for (another prefix is refused, nothing
/// written), and replicas given the key serve from the restored prefix.
#[test]
fn a_sealed_etcd_backup_restores_only_under_its_prefix() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("etcd.key");
    std::fs::write(&key, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = key.to_str().unwrap();
    let mut server = etcd.replica("/lks-s/", &["--encryption-key-file", key]);
    server.create_cluster("c1");
    let archive = work.path().join("sealed.lksbak");
    let archive = archive.to_str().unwrap();
    let backup = |extra: &[&str]| {
        let mut args = vec![
            "backup",
            "--store",
            "etcd",
            "--etcd-endpoints",
            &url,
            "--etcd-prefix",
            "/lks-s/",
            "--out",
            archive,
        ];
        args.extend_from_slice(extra);
        lks_control_server(&args)
    };
    let wrong = work.path().join("wrong.key");
    std::fs::write(&wrong, "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=\n").unwrap();
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let e = one_line_error(
        &backup(&["--encryption-key-file", wrong.to_str().unwrap()]),
        "backup with the wrong key",
    );
    assert!(e.contains("CA and admin credential"), "{e}");
    assert!(!Path::new(archive).exists(), "no archive for a refused backup");
    let summary = ok_stdout(
        &backup(&["--encryption-key-file", key]),
        "backup of a sealed installation",
    );
    assert!(summary.contains("private keys sealed with the key"), "{summary}");
    server.stop();

    let new_etcd = Etcd::start();
    let new_url = new_etcd.url();
    let restore_into = |prefix: &str| {
        lks_control_server(&[
            "restore",
            "--from",
            archive,
            "--store",
            "etcd",
            "--etcd-endpoints",
            &new_url,
            "--etcd-prefix",
            prefix,
        ])
    };
    let e = one_line_error(
        &restore_into("/elsewhere/"),
        "restore of sealed keys under another prefix",
    );
    assert!(e.contains("sealed") && e.contains("/lks-s/"), "{e}");
    assert_eq!(new_etcd.keys_under("/elsewhere/"), 0);
    ok_stdout(
        &restore_into("/lks-s/"),
        "restore under the prefix it was sealed for",
    );
    let restored = Server::start_at(
        server.addr,
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &new_url,
            "--etcd-prefix",
            "/lks-s/",
            "--lease-ttl",
            "3s",
            "--encryption-key-file",
            key,
        ],
    );
    let clusters = names(&restored.lksctl_json(&["cluster", "list"]), "name");
    assert!(clusters.contains("c1"), "{clusters:?}");
}
