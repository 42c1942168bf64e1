//! The agent's stream survives restarts on both sides: it reconnects after
//! an agent restart and after a server restart, reports its state again, and
//! keeps enforcing its last desired state while the server is down.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::agent::{
    Agent, BundleFile, node_connected, publish_and_roll_out, wait_node_bundle, write_bundle,
};
use lks_e2e::server::Server;
use lks_e2e::wait_until;

#[test]
fn reconnects_after_agent_restart_and_server_restart() {
    let mut server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("steady");
    agent.heal_interval = "500ms".into();
    agent.join(&server, "c1", &[]);
    agent.start();
    let v1 = write_bundle(
        server.work_dir(),
        "motd",
        "1",
        &[BundleFile {
            path: "/etc/motd",
            content: b"welcome v1\n",
            mode: "0644",
        }],
        "",
    );
    publish_and_roll_out(&server, "c1", &v1, None);
    wait_node_bundle(&server, "steady", "motd", "1", "applied");

    // Agent restart: reconnects, reports the same state, changes nothing.
    assert_eq!(agent.stop(), Some(0));
    wait_until(lks_e2e::agent::CONVERGE, "server sees the node gone", || {
        !node_connected(&server, "steady")
    });
    agent.start();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "server sees the node back", || {
        node_connected(&server, "steady")
    });
    wait_node_bundle(&server, "steady", "motd", "1", "applied");

    // Server down: the agent keeps enforcing its last desired state.
    server.stop();
    wait_until(lks_e2e::agent::CONVERGE, "agent notices", || {
        agent.status()["connection"]["connected"] == false
    });
    std::fs::remove_file(agent.path("/etc/motd")).unwrap();
    wait_until(
        lks_e2e::agent::CONVERGE,
        "repaired while the server is down",
        || agent.read("/etc/motd") == Some((b"welcome v1\n".to_vec(), 0o644)),
    );

    // Server back: the agent reconnects and takes new work.
    server.start_again();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "server sees the node back", || {
        node_connected(&server, "steady")
    });
    let v2 = write_bundle(
        server.work_dir(),
        "motd",
        "2",
        &[BundleFile {
            path: "/etc/motd",
            content: b"welcome v2\n",
            mode: "0600",
        }],
        "",
    );
    publish_and_roll_out(&server, "c1", &v2, None);
    wait_node_bundle(&server, "steady", "motd", "2", "applied");
    assert_eq!(agent.read("/etc/motd"), Some((b"welcome v2\n".to_vec(), 0o600)));
    assert!(agent.running());
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn renews_its_certificate_before_expiry_and_stays_connected() {
    // Short-lived certificates put the 70–90 % renewal point within seconds.
    let server = Server::start_with(&["--node-cert-ttl", "10s"]);
    server.create_cluster("c1");
    let mut agent = Agent::new("renewer");
    agent.join(&server, "c1", &[]);
    let cert = agent.state_dir.join("pki/node.crt");
    let key = agent.state_dir.join("pki/node.key");
    let first_cert = std::fs::read_to_string(&cert).unwrap();
    let first_key = std::fs::read_to_string(&key).unwrap();
    agent.start();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "certificate renewed", || {
        std::fs::read_to_string(&cert).unwrap_or_default() != first_cert
    });
    assert_ne!(
        std::fs::read_to_string(&key).unwrap(),
        first_key,
        "a new key with the new certificate"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The renewed identity works: a restarted agent connects with it.
    assert_eq!(agent.stop(), Some(0));
    agent.start();
    agent.wait_connected();
    wait_until(lks_e2e::agent::CONVERGE, "server sees the node", || {
        node_connected(&server, "renewer")
    });
    assert!(agent.log().contains("renewed the node certificate"));
    assert_eq!(agent.stop(), Some(0));
}
