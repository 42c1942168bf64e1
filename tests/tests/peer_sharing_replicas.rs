//! Peer sharing with three replicas on etcd (issue [swarm-speed] 2): the
//! agents of one cluster spread over the replicas still take about one
//! copy of a file from the control plane, not one per replica. The
//! replicas share through etcd which nodes fetch the file (so a node is
//! named to nodes on any replica) and the one seed of the fleet.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use lks_e2e::agent::{Agent, CONVERGE};
use lks_e2e::etcd::Etcd;
use lks_e2e::server::Server;
use lks_e2e::{free_addr, noise, wait_until};

const FILE: &str = "/usr/local/bin/kubelet";
/// What a replica sent (not what nodes took from peers).
const SERVED: &str = "lks_blob_bytes_served_total{source=\"server\"}";
/// Eight 4 MiB pieces.
const SIZE: usize = 32 << 20;
const NODES: usize = 6;

#[test]
fn a_fleet_spread_over_three_replicas_takes_about_one_copy_from_them() {
    let etcd = Etcd::start();
    let replicas: Vec<Server> = (0..3).map(|_| etcd.replica("/lks-swarm/", &[])).collect();
    let r0 = &replicas[0];
    r0.create_cluster("c1");
    let urls: Vec<String> = replicas.iter().map(Server::url).collect();
    let tok = r0.lksctl_json(&["token", "create", "--cluster", "c1", "--uses", "6"]);
    let agents: Vec<(Agent, SocketAddr)> = (0..NODES)
        .map(|i| {
            let mut a = Agent::new(&format!("n{i}"));
            // Each agent starts on another replica.
            a.join_spread(&urls, i, &tok);
            let peer = free_addr();
            a.run_args = vec!["--peer-listen".into(), peer.to_string()];
            a.start();
            (a, peer)
        })
        .collect();
    r0.lksctl_ok(&["cluster", "set", "c1", "--peer-sharing", "on"]);
    for (a, peer) in &agents {
        wait_until(CONVERGE, &format!("{} shares", a.name), || {
            a.log().contains("peer sharing on")
                && std::net::TcpStream::connect_timeout(peer, Duration::from_millis(300)).is_ok()
        });
    }
    wait_until(CONVERGE, "every replica holds agents", || {
        replicas.iter().all(|r| r.connected_agents() >= 1)
            && replicas.iter().map(Server::connected_agents).sum::<u64>() == NODES as u64
    });

    let bytes = noise(SIZE, 11);
    let id = r0.publish(&r0.write_bundle("kubelet-1", "kubelet", "1", &[(FILE, &bytes, "0755")]));
    let before: u64 = replicas.iter().map(|r| r.metric(SERVED)).sum();
    let batch = NODES.to_string();
    r0.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        &id,
        "--batch-size",
        &batch,
        "--wait",
    ]);
    let (mut from_server, mut from_peers) = (0, 0);
    for (a, _) in &agents {
        a.wait_bundle("kubelet", "1", "applied");
        let got = std::fs::read(a.root.join(FILE.trim_start_matches('/'))).unwrap();
        assert!(
            got == bytes,
            "{}: the file differs from what was published",
            a.name
        );
        let (s, p) = a.fetched_bytes();
        (from_server, from_peers) = (from_server + s, from_peers + p);
    }
    let egress: u64 = replicas.iter().map(|r| r.metric(SERVED)).sum::<u64>() - before;
    eprintln!(
        "replicas sent {egress} bytes for a {SIZE}-byte file to {NODES} nodes; agents: {from_server} from the replicas, {from_peers} from peers"
    );
    assert_eq!(from_server + from_peers, (NODES * SIZE) as u64);
    assert!(
        egress <= 2 * SIZE as u64,
        "three replicas sent {egress} bytes for a {SIZE}-byte file (at most 2 copies): one seed for the fleet, not one per replica"
    );
    assert!(
        from_peers >= (NODES as u64 - 2) * SIZE as u64,
        "peers gave {from_peers} bytes"
    );
}
