//! Failover between control-server replicas, from the client side: the agent
//! joins and runs with a list of server URLs and uses whichever one answers,
//! moving on when its server goes away; `lksctl` tries every replica listed
//! in `admin.conf`; a refusal is final and a list of dead servers is one
//! error, never a loop.
//!
//! "Dead" replicas are loopback ports nothing listens on. The second live
//! replica is a server started on a copy of the first one's data dir (same
//! CA, same nodes), which stands in for a replica sharing the store.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use lks_e2e::agent::{
    Agent, BundleFile, CONVERGE, join_info, node_connected, publish_and_roll_out, wait_node_bundle,
    write_bundle,
};
use lks_e2e::server::Server;
use lks_e2e::{bin, free_addr, ok_stdout, one_line_error, run, wait_until};

/// An https URL on a loopback port nothing listens on.
fn dead_url() -> String {
    format!("https://{}", free_addr())
}

fn motd(server: &Server, version: &str) -> PathBuf {
    write_bundle(
        server.work_dir(),
        "motd",
        version,
        &[BundleFile {
            path: "/etc/motd",
            content: format!("motd v{version}\n").as_bytes(),
            mode: "0644",
        }],
        "",
    )
}

/// Writes a copy of `server`'s admin.conf with `server = primary` and
/// `servers = replicas`, into `dir`.
fn admin_conf_with(server: &Server, dir: &Path, primary: &str, replicas: &[&str]) -> PathBuf {
    let text = std::fs::read_to_string(server.admin_conf_path()).expect("read admin.conf");
    let mut v: toml::Table = toml::from_str(&text).expect("parse admin.conf");
    v.insert("server".into(), primary.into());
    v.insert(
        "servers".into(),
        toml::Value::Array(replicas.iter().map(|&u| u.into()).collect()),
    );
    let path = dir.join(format!("admin-{}.conf", replicas.len()));
    std::fs::write(&path, toml::to_string(&v).expect("serialise admin.conf")).expect("write admin.conf");
    path
}

fn lksctl_with(config: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(bin("lksctl"));
    cmd.arg("--config")
        .arg(config)
        .args(args)
        .env_remove("LKSCTL_CONFIG");
    run(cmd)
}

#[test]
fn agent_joins_past_a_dead_server_and_takes_a_rollout() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("node-f");
    let j = join_info(&server, "c1", &[]);
    let list = format!("{},{}", dead_url(), j.server);
    let out = ok_stdout(
        &agent.join_raw(&list, &j.token, &j.ca_cert_hash, &[]),
        "join with a dead server first",
    );
    assert!(out.contains("node-f joined cluster c1"), "{out}");
    let cfg = std::fs::read_to_string(agent.state_dir.join("join.toml")).unwrap();
    let stored: toml::Table = toml::from_str(&cfg).unwrap();
    let want: Vec<toml::Value> = list.split(',').map(|u| u.into()).collect();
    assert_eq!(stored["servers"], toml::Value::Array(want), "{cfg}");

    agent.start();
    agent.wait_connected();
    let status = agent.status();
    assert_eq!(status["connection"]["server"], j.server.as_str(), "{status}");
    assert_eq!(status["servers"].as_array().map(Vec::len), Some(2), "{status}");
    wait_until(CONVERGE, "server sees node-f connected", || {
        node_connected(&server, "node-f")
    });

    publish_and_roll_out(&server, "c1", &motd(&server, "1"), None);
    wait_node_bundle(&server, "node-f", "motd", "1", "applied");
    assert_eq!(agent.read("/etc/motd"), Some((b"motd v1\n".to_vec(), 0o644)));
    let log = agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("connected") && l.contains(&j.server)),
        "the agent logs the server it connected to:\n{log}"
    );
    assert_eq!(agent.stop(), Some(0), "clean exit on SIGTERM");
}

#[test]
fn agent_moves_to_another_replica_when_its_server_goes_away() {
    let mut first = Server::start();
    first.create_cluster("c1");
    let second_addr = free_addr();
    let second_url = format!("https://{second_addr}");
    let mut agent = Agent::new("node-g");
    let j = join_info(&first, "c1", &[]);
    // The second replica is not up yet: join uses the first.
    ok_stdout(
        &agent.join_raw(
            &format!("{},{second_url}", j.server),
            &j.token,
            &j.ca_cert_hash,
            &[],
        ),
        "join",
    );
    agent.start();
    agent.wait_connected();
    publish_and_roll_out(&first, "c1", &motd(&first, "1"), None);
    wait_node_bundle(&first, "node-g", "motd", "1", "applied");

    // The first server goes away; a replica with the same CA and store
    // takes over on the second URL.
    assert_eq!(first.stop(), Some(0));
    let second = Server::start_copy_of(&first, second_addr);
    wait_until(CONVERGE, "the agent connects to the second replica", || {
        let s = agent.status();
        s["connection"]["connected"] == true && s["connection"]["server"] == second_url.as_str()
    });
    wait_until(CONVERGE, "the second replica sees node-g connected", || {
        node_connected(&second, "node-g")
    });

    // Blobs now come from the second replica.
    publish_and_roll_out(&second, "c1", &motd(&second, "2"), None);
    wait_node_bundle(&second, "node-g", "motd", "2", "applied");
    assert_eq!(agent.read("/etc/motd"), Some((b"motd v2\n".to_vec(), 0o644)));
    assert_eq!(agent.stop(), Some(0), "clean exit on SIGTERM");
}

#[test]
fn lksctl_tries_every_replica_in_admin_conf() {
    let server = Server::start();
    server.create_cluster("c1");
    let dir = tempfile::tempdir().unwrap();
    let (dead1, dead2) = (dead_url(), dead_url());

    // `server` is dead; the live replica is further down `servers`.
    let conf = admin_conf_with(&server, dir.path(), &dead1, &[&dead1, &dead2, &server.url()]);
    let out = ok_stdout(
        &lksctl_with(&conf, &["cluster", "list"]),
        "cluster list via the third replica",
    );
    assert!(out.contains("c1"), "{out}");

    // An answer from a replica is final: a not-found is not retried on the
    // dead one listed after it (whose error would be the last otherwise).
    let conf = admin_conf_with(&server, dir.path(), &server.url(), &[&dead1]);
    let err = one_line_error(
        &lksctl_with(&conf, &["node", "get", "no-such-node"]),
        "node get of an unknown node",
    );
    assert!(err.contains("no-such-node"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");

    // All dead: one line naming what was tried and the last error.
    let conf = admin_conf_with(&server, dir.path(), &dead1, &[&dead2]);
    let err = one_line_error(
        &lksctl_with(&conf, &["cluster", "list"]),
        "cluster list with no live replica",
    );
    assert!(err.contains(&format!("(tried {dead1}, {dead2})")), "{err}");
    assert!(
        err.contains(&format!("cannot reach control server at {dead2}")),
        "{err}"
    );
}

#[test]
fn join_against_a_list_refuses_once_and_writes_nothing() {
    let server = Server::start();
    server.create_cluster("c1");
    let agent = Agent::new("node-h");
    let j = join_info(&server, "c1", &[]);
    let list = format!("{},{},{}", dead_url(), j.server, dead_url());

    // A bad token is refused by the live server; the dead one after it is
    // not tried and nothing loops.
    let err = one_line_error(
        &agent.join_raw(&list, "abcdef.0123456789abcdef", &j.ca_cert_hash, &[]),
        "join with an unknown token",
    );
    assert!(err.contains(&format!("{} refused the join", j.server)), "{err}");
    assert!(!agent.has_identity());

    // A CA pin mismatch is final too.
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let err = one_line_error(
        &agent.join_raw(&list, &j.token, &wrong, &[]),
        "join with a wrong pin",
    );
    assert!(err.contains("refusing to send the token"), "{err}");
    assert!(!agent.has_identity());

    // Nothing answers: one line naming each server.
    let (a, b) = (dead_url(), dead_url());
    let err = one_line_error(
        &agent.join_raw(&format!("{a},{b}"), &j.token, &j.ca_cert_hash, &[]),
        "join with only dead servers",
    );
    assert!(err.contains("could not reach any server"), "{err}");
    assert!(err.contains(&a) && err.contains(&b), "{err}");
    assert!(!agent.has_identity());

    // A malformed list is refused before anything is dialled.
    for bad in [format!("{},", j.server), format!("{0},{0}", j.server)] {
        let err = one_line_error(
            &agent.join_raw(&bad, &j.token, &j.ca_cert_hash, &[]),
            "join with a malformed list",
        );
        assert!(err.contains("invalid --server"), "{bad}: {err}");
        assert!(!agent.state_dir.exists(), "{bad}: nothing written");
    }

    // The token is still good: none of the above used it.
    let out = ok_stdout(
        &agent.join_raw(&list, &j.token, &j.ca_cert_hash, &[]),
        "join with the right token",
    );
    assert!(out.contains("node-h joined cluster c1"), "{out}");
}
