//! Signed releases end to end, as an operator runs them: the real server,
//! `lksctl release|root`, and a real agent that requires releases
//! (`join --trust-key … --trust-threshold 1`).
//!
//! - A bundle version is applied once a published release names it.
//! - `rollout rollback` to a version the node's release no longer names is
//!   refused by the node (it keeps its files) until the publisher signs a
//!   newer release naming the old version; then it goes through.
//! - A release that expires turns the node `stale-release` in `node list`;
//!   `release resign` makes it fresh again.
//! - A trust-root rotation retires a key: a release signed by it alone is
//!   refused, one signed by the new key is accepted.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, BundleFile, wait_node_bundle, write_bundle};
use lks_e2e::one_line_error;
use lks_e2e::server::Server;

const CONF: &str = "/etc/app.conf";

fn keygen(server: &Server, name: &str) -> (PathBuf, PathBuf) {
    let prefix = server.work_dir().join(name);
    server.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    (prefix.with_extension("key"), prefix.with_extension("pub"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Publishes `app@version` (content `app vVERSION`) signed with `key`.
fn publish_app(server: &Server, version: &str, key: &Path) -> String {
    let content = format!("app v{version}\n");
    let files = [BundleFile {
        path: CONF,
        content: content.as_bytes(),
        mode: "0644",
    }];
    let dir = write_bundle(server.work_dir(), "app", version, &files, "");
    server
        .lksctl_ok(&["bundle", "publish", s(&dir), "--sign-key", s(key)])
        .trim()
        .to_string()
}

/// The node's `trust` object in `node list -o json`.
fn trust(server: &Server, node: &str) -> serde_json::Value {
    let list = server.lksctl_json(&["node", "list"]);
    list.as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == node))
        .map(|n| n["trust"].clone())
        .unwrap_or_default()
}

fn wait_trust(
    server: &Server,
    node: &str,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let last = trust(server, node);
        if ok(&last) {
            return last;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}: last trust {last:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn content(agent: &Agent) -> String {
    String::from_utf8(agent.read(CONF).map(|(b, _)| b).unwrap_or_default()).unwrap()
}

#[test]
fn a_node_follows_signed_releases_and_a_rollback_is_a_signed_act() {
    let server = Server::start();
    server.create_cluster("c1");
    let (key, public) = keygen(&server, "publisher");
    let mut agent = Agent::new("n1");
    agent.join(
        &server,
        "c1",
        &["--trust-key", s(&public), "--trust-threshold", "1"],
    );
    agent.start();

    let b1 = release_1_names_app_1_and_the_rollout_applies_it(&server, &agent, &key);
    let (file, id2) = release_2_is_drafted_signed_checked_and_published(&server, &agent, &key, &public);
    a_rollback_is_refused_until_the_publisher_signs_it(&server, &agent, &key, &b1, &id2);
    a_stale_release_is_reported_and_resigning_freshens_it(&server, &agent, &key);

    // Publishing a stored record again changes nothing; a different record
    // under a stored version is refused by the server.
    server.lksctl_ok(&["release", "publish", s(&file)]);
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    doc["release"]["expires_at_ms"] =
        serde_json::json!(doc["release"]["expires_at_ms"].as_i64().unwrap() + 1000);
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    server.lksctl_ok(&["release", "sign", s(&file), "--key", s(&key)]);
    let other = server.lksctl(&["release", "publish", s(&file)]);
    let e = one_line_error(&other, "publish another release 2 after 5");
    assert!(e.contains("already stored with other content"), "{e}");

    let shown = server.lksctl_json(&["release", "show", "--cluster", "c1"]);
    let versions: Vec<u64> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![5, 4, 3, 2, 1], "{shown:#}");

    let audit = server.lksctl_ok(&["audit"]);
    assert!(audit.contains("PublishRelease"), "{audit}");
    assert_eq!(agent.stop(), Some(0));
}

/// Release 1 names app@1; the rollout applies it and the node's trust is
/// ok at release 1, root 1. Returns app@1's ID.
fn release_1_names_app_1_and_the_rollout_applies_it(server: &Server, agent: &Agent, key: &Path) -> String {
    let b1 = publish_app(server, "1", key);
    let out = server.lksctl_ok(&[
        "release",
        "create",
        "--cluster",
        "c1",
        "--bundle",
        &b1,
        "--key",
        s(key),
        "--publish",
    ]);
    assert!(out.contains("published release 1 of c1"), "{out}");
    server.lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", &b1]);
    wait_node_bundle(server, "n1", "app", "1", "applied");
    assert_eq!(content(agent), "app v1\n");
    let t = wait_trust(server, "n1", "trust ok at release 1", |t| {
        t["state"] == "ok" && t["release_version"] == 1
    });
    assert_eq!(t["root_version"], 1, "{t:#}");

    b1
}

/// Release 2 names app@2, drafted to a file, refused unsigned, signed,
/// checked, published and rolled out. Returns the file and the rollout.
fn release_2_is_drafted_signed_checked_and_published(
    server: &Server,
    agent: &Agent,
    key: &Path,
    public: &Path,
) -> (PathBuf, String) {
    let b2 = publish_app(server, "2", key);
    let file = server.work_dir().join("release-2.json");
    server.lksctl_ok(&[
        "release",
        "create",
        "--cluster",
        "c1",
        "--bundle",
        &b2,
        "--out",
        s(&file),
    ]);
    let unsigned = server.lksctl(&["release", "publish", s(&file)]);
    let e = one_line_error(&unsigned, "publish an unsigned release");
    assert!(e.contains("is not signed"), "{e}");
    server.lksctl_ok(&["release", "sign", s(&file), "--key", s(key)]);
    let ok = server.lksctl_ok(&["release", "check", s(&file), "--trust-key", s(public)]);
    assert!(ok.contains("accepts release 2 of c1"), "{ok}");
    server.lksctl_ok(&["release", "publish", s(&file)]);
    let id2 = server
        .lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", &b2])
        .trim()
        .to_string();
    wait_node_bundle(server, "n1", "app", "2", "applied");
    assert_eq!(content(agent), "app v2\n");

    (file, id2)
}

/// A rollback to app@1 is refused by the node: release 2 does not name
/// it and release 1 is older than what it accepted. The publisher signs
/// the rollback: release 3 names app@1 again, and the node takes it.
fn a_rollback_is_refused_until_the_publisher_signs_it(
    server: &Server,
    agent: &Agent,
    key: &Path,
    b1: &str,
    id2: &str,
) {
    let rb = server.lksctl(&["rollout", "rollback", id2]);
    assert!(rb.status.success(), "{rb:?}");
    let note = String::from_utf8_lossy(&rb.stderr);
    assert!(
        note.contains("release 2 of c1 names app@2; nodes of c1 that require signed releases"),
        "{note}"
    );
    let msg = wait_node_bundle(server, "n1", "app", "1", "failed");
    assert!(msg.starts_with("not released: "), "{msg}");
    assert_eq!(content(agent), "app v2\n", "the node keeps its version");

    // The publisher signs the rollback: release 3 names app@1 again.
    server.lksctl_ok(&[
        "release",
        "create",
        "--cluster",
        "c1",
        "--bundle",
        b1,
        "--key",
        s(key),
        "--publish",
    ]);
    wait_node_bundle(server, "n1", "app", "1", "applied");
    assert_eq!(content(agent), "app v1\n");
    wait_trust(server, "n1", "trust ok at release 3", |t| {
        t["state"] == "ok" && t["release_version"] == 3
    });
}

/// Freshness: a release that expires in 2 s leaves the node stale (it
/// keeps what it has); re-signing is one command.
fn a_stale_release_is_reported_and_resigning_freshens_it(server: &Server, agent: &Agent, key: &Path) {
    server.lksctl_ok(&[
        "release",
        "resign",
        "--cluster",
        "c1",
        "--key",
        s(key),
        "--expires",
        "2s",
    ]);
    let t = wait_trust(server, "n1", "stale-release", |t| t["state"] == "stale-release");
    assert_eq!(t["release_version"], 4, "{t:#}");
    assert_eq!(content(agent), "app v1\n", "a stale node keeps what it has");
    server.lksctl_ok(&["release", "resign", "--cluster", "c1", "--key", s(key)]);
    wait_trust(server, "n1", "fresh again at release 5", |t| {
        t["state"] == "ok" && t["release_version"] == 5
    });
}

#[test]
fn a_rotated_out_key_signs_nothing_a_node_accepts() {
    let server = Server::start();
    server.create_cluster("c1");
    let (old_key, old_pub) = keygen(&server, "old");
    let (new_key, new_pub) = keygen(&server, "new");
    let mut agent = Agent::new("n1");
    agent.join(
        &server,
        "c1",
        &["--trust-key", s(&old_pub), "--trust-threshold", "1"],
    );
    agent.start();
    let b1 = publish_app(&server, "1", &old_key);
    server.lksctl_ok(&[
        "release",
        "create",
        "--cluster",
        "c1",
        "--bundle",
        &b1,
        "--key",
        s(&old_key),
        "--publish",
    ]);
    server.lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", &b1]);
    wait_node_bundle(&server, "n1", "app", "1", "applied");

    // Root 2 holds only the new key, signed by the old (the node's current
    // threshold) and the new (its own).
    let root = server.work_dir().join("root-2.json");
    server.lksctl_ok(&[
        "root",
        "create",
        "--cluster",
        "c1",
        "--trust-key",
        s(&new_pub),
        "--key",
        s(&old_key),
        "--out",
        s(&root),
    ]);
    server.lksctl_ok(&["root", "sign", s(&root), "--key", s(&new_key)]);
    server.lksctl_ok(&["root", "publish", s(&root)]);
    let shown = server.lksctl_json(&["root", "show", "--cluster", "c1"]);
    assert_eq!(shown[0]["version"], 2, "{shown:#}");
    // The node rotates with the next desired state (a fresh release).
    server.lksctl_ok(&["release", "resign", "--cluster", "c1", "--key", s(&old_key)]);
    let t = wait_trust(&server, "n1", "root 2 accepted", |t| t["root_version"] == 2);
    // Release 2 was signed by the old key only: refused after the rotation.
    assert_eq!(t["state"], "refused", "{t:#}");
    assert!(
        t["message"]
            .as_str()
            .unwrap_or_default()
            .contains("signatures needed"),
        "{t:#}"
    );

    server.lksctl_ok(&["release", "resign", "--cluster", "c1", "--key", s(&new_key)]);
    wait_trust(&server, "n1", "release 3 by the new key", |t| {
        t["state"] == "ok" && t["release_version"] == 3
    });
    assert_eq!(agent.stop(), Some(0));
}
