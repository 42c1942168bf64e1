//! Enrolment with the real agent: join, re-join, and bad input refused with
//! nothing written.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use lks_e2e::agent::{Agent, join_info, node_connected};
use lks_e2e::server::Server;
use lks_e2e::{ok_stdout, one_line_error, wait_until};

#[test]
fn join_stores_an_identity_and_the_node_connects() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("node-a");
    let j = join_info(&server, "c1", &[]);
    let out = ok_stdout(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &["--labels", "zone=a"]),
        "join",
    );
    assert!(out.contains("node-a joined cluster c1"), "{out}");
    let key = agent.state_dir.join("pki/node.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let cfg = std::fs::read_to_string(agent.state_dir.join("join.toml")).unwrap();
    assert!(
        cfg.contains("cluster = \"c1\"") && cfg.contains("zone = \"a\""),
        "{cfg}"
    );
    // The private key never left the node: the server has no copy of it.
    let key_pem = std::fs::read_to_string(&key).unwrap();
    let body: String = key_pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!server.log().contains(&body[..40]));

    // Re-running the same join is harmless.
    let again = ok_stdout(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &["--labels", "zone=a"]),
        "join again",
    );
    assert!(again.contains("already joined"), "{again}");
    assert_eq!(
        std::fs::read_to_string(&key).unwrap(),
        key_pem,
        "identity unchanged"
    );
    // With other parameters it refuses, in one line.
    let err = one_line_error(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &["--labels", "zone=b"]),
        "join with other labels",
    );
    assert!(err.contains("already holds the identity of node node-a"), "{err}");

    agent.start();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "server sees node-a connected", || {
        node_connected(&server, "node-a")
    });
    let list = server.lksctl_json(&["node", "list"]);
    let n = &list.as_array().unwrap()[0];
    assert_eq!(n["cluster"], "c1");
    assert_eq!(n["labels"]["zone"], "a");
    assert_eq!(n["facts"]["agent_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        n["agent_version"],
        env!("CARGO_PKG_VERSION"),
        "DESIGN §6: node list carries agent_version"
    );
    let table = server.lksctl_ok(&["node", "list"]);
    assert!(table.lines().next().unwrap().contains("AGENT"), "{table}");
    assert!(table.contains(env!("CARGO_PKG_VERSION")), "{table}");
    assert_eq!(agent.stop(), Some(0), "clean exit on SIGTERM");
    assert!(
        !agent.state_dir.join("agent.toml").exists(),
        "join writes join.toml only: agent.toml is run's settings file in /etc/lksadmin"
    );

    // A state dir joined before the rename keeps working from its agent.toml,
    // which is left as it is (an older agent put back must still find it).
    std::fs::rename(
        agent.state_dir.join("join.toml"),
        agent.state_dir.join("agent.toml"),
    )
    .unwrap();
    let again = ok_stdout(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &["--labels", "zone=a"]),
        "join again on a state dir from before",
    );
    assert!(again.contains("already joined"), "{again}");
    wait_until(lks_e2e::agent::CONVERGE, "server sees node-a gone", || {
        !node_connected(&server, "node-a")
    });
    agent.start();
    wait_until(lks_e2e::agent::CONVERGE, "node-a back from agent.toml", || {
        node_connected(&server, "node-a")
    });
    assert!(!agent.state_dir.join("join.toml").exists());
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn wrong_token_is_refused_and_leaves_no_identity() {
    let server = Server::start();
    server.create_cluster("c1");
    let agent = Agent::new("node-b");
    let j = join_info(&server, "c1", &[]);
    let err = one_line_error(
        &agent.join_raw(&j.server, "abcdef.0123456789abcdef", &j.ca_cert_hash, &[]),
        "join with an unknown token",
    );
    assert!(err.contains("refused the join"), "{err}");
    assert!(!agent.has_identity(), "a failed join leaves no identity");

    let err = one_line_error(
        &agent.join_raw(&j.server, "not-a-token", &j.ca_cert_hash, &[]),
        "join with a malformed token",
    );
    assert!(err.contains("invalid bootstrap token"), "{err}");
    assert!(!agent.has_identity());
}

#[test]
fn wrong_ca_pin_is_refused_before_the_token_is_sent() {
    let server = Server::start();
    server.create_cluster("c1");
    let agent = Agent::new("node-c");
    // A single-use token: if the refused join had sent it, the good join
    // below could not use it any more.
    let j = join_info(&server, "c1", &["--uses", "1"]);
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let err = one_line_error(
        &agent.join_raw(&j.server, &j.token, &wrong, &[]),
        "join with a wrong pin",
    );
    assert!(err.contains("no CA matching --ca-cert-hash"), "{err}");
    assert!(err.contains("refusing to send the token"), "{err}");
    assert!(!agent.has_identity());

    let out = ok_stdout(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &[]),
        "join with the right pin",
    );
    assert!(out.contains("joined cluster c1"), "{out}");
}

/// The server enrolled the node but its answer never reached the agent (the
/// server was killed, the link cut): the next `join` of that VM sends the
/// same key, kept in the state dir, and gets the enrolment back — with a
/// token that has no use left — instead of "already enrolled".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_answer_was_lost_succeeds_when_run_again() {
    let server = Server::start();
    server.create_cluster("c1");
    let j = join_info(&server, "c1", &["--uses", "1"]);
    let mut agent = Agent::new("node-l");

    // A join that reaches no server writes nothing.
    one_line_error(
        &agent.join_raw("https://127.0.0.1:1", &j.token, &j.ca_cert_hash, &[]),
        "join with no server reachable",
    );
    assert!(!agent.state_dir.exists());
    // A join whose request went out keeps its key in the state dir until it
    // knows the outcome: here, as such a join left it.
    let key_path = agent.state_dir.join(".join.key");
    std::fs::create_dir_all(&agent.state_dir).unwrap();
    let key_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    std::fs::write(&key_path, &key_pem).unwrap();

    // The server takes the enrolment with that key; the answer is dropped.
    let key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name.push(rcgen::DnType::CommonName, "node-l");
    let csr = p.serialize_request(&key).unwrap().pem().unwrap();
    lks_e2e::server::enroll_raw(&server, &j.token, "node-l", &csr, &[])
        .await
        .expect("enrolled");
    let nodes = || server.lksctl_json(&["node", "list"]).as_array().unwrap().len();
    assert_eq!(nodes(), 1);

    // Run again (cloud-init re-run, an operator): it gets the node back.
    let out = ok_stdout(
        &agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &[]),
        "join again after the lost answer",
    );
    assert!(out.contains("node-l joined cluster c1"), "{out}");
    assert!(
        !key_path.exists(),
        "the pending key is gone once the identity is stored"
    );
    assert_eq!(
        std::fs::read_to_string(agent.state_dir.join("pki/node.key")).unwrap(),
        key_pem,
        "the identity uses the key the server enrolled"
    );
    assert_eq!(nodes(), 1, "still one node");
    agent.start();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "server sees node-l", || {
        node_connected(&server, "node-l")
    });
    let ev = lks_e2e::agent::node_events(&server, "node-l");
    assert!(
        ev.iter()
            .any(|(k, m)| k == "enrolled" && m.contains("enrolment repeated")),
        "{ev:?}"
    );

    // Another VM with that name (another key) is still refused.
    let other = Agent::new("node-l");
    let e = one_line_error(
        &other.join_raw(&j.server, &server.token("c1", &[]), &j.ca_cert_hash, &[]),
        "another key with the name",
    );
    assert!(e.contains("already enrolled"), "{e}");
    assert!(
        !other.state_dir.join(".join.key").exists(),
        "a refusal keeps no key"
    );
}
