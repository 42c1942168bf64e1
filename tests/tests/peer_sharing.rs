//! Peer sharing on loopback: real agents, each listening for peers on its
//! own port (`--peer-listen`), one real server as tracker and seed.
//!
//! - a batch that starts at once pulls at most two copies from the server
//!   (one seed; the bound)
//!   (its own `lks_blob_bytes_served_total`), the rest from peers, and
//!   every node ends with the right bytes;
//! - a peer that flips a byte in what it serves is caught at the piece,
//!   reported (`bad_peer`) and not used again; no node applies a bad byte;
//! - sharing off: no listener; a node of another cluster is refused;
//! - connections to peers close once the fetches are over.
//!
//! The same in network namespaces behind a rate-limited link, with the
//! benchmark, is `bash scripts/bench.sh --only swarm` (BENCHMARKS.md).

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use lks_e2e::agent::Agent;
use lks_e2e::hostile::{Answer, frame, message, raw_grpc};
use lks_e2e::server::{Server, TestNode};
use lks_e2e::{free_addr, noise, wait_until};
use lks_proto::Digest;
use lks_proto::pb;

const FILE: &str = "/usr/local/bin/kubelet";
/// What the server sent (not what nodes took from peers).
const SERVED: &str = "lks_blob_bytes_served_total{source=\"server\"}";
/// Six 4 MiB pieces.
const SIZE: usize = 24 << 20;

struct Node {
    agent: Agent,
    peer: SocketAddr,
}

fn served_bytes(s: &Server) -> u64 {
    s.metric(SERVED)
}

fn start_nodes(s: &Server, cluster: &str, n: usize, fault_on: Option<usize>) -> Vec<Node> {
    (1..=n)
        .map(|i| {
            let mut agent = Agent::new(&format!("{cluster}-n{i}"));
            agent.join(s, cluster, &[]);
            let peer = free_addr();
            agent.run_args = vec!["--peer-listen".into(), peer.to_string()];
            if fault_on == Some(i) {
                agent.run_env = vec![("LKS_AGENT_FAULT".into(), "peer-corrupt".into())];
            }
            agent.start();
            Node { agent, peer }
        })
        .collect()
}

/// `n` nodes of `cluster` with sharing on, each listening for peers.
fn sharing_nodes(s: &Server, cluster: &str, n: usize, fault_on: Option<usize>) -> Vec<Node> {
    let nodes = start_nodes(s, cluster, n, fault_on);
    sharing(s, cluster, "on");
    for n in &nodes {
        wait_until(Duration::from_secs(20), "peer listener up", || listening(n.peer));
    }
    nodes
}

fn listening(a: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok()
}

fn sharing(s: &Server, cluster: &str, on: &str) {
    s.lksctl_ok(&["cluster", "set", cluster, "--peer-sharing", on]);
}

fn publish(s: &Server, version: &str, bytes: &[u8]) -> String {
    s.publish(&s.write_bundle(
        &format!("kubelet-{version}"),
        "kubelet",
        version,
        &[(FILE, bytes, "0755")],
    ))
}

fn roll_out(s: &Server, cluster: &str, bundle: &str, batch: &str) {
    s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        cluster,
        "--bundle",
        bundle,
        "--batch-size",
        batch,
        "--wait",
    ]);
}

fn assert_holds(n: &Node, bytes: &[u8]) {
    n.agent.wait_bundle("kubelet", "1", "applied");
    let got = std::fs::read(n.agent.root.join(FILE.trim_start_matches('/'))).unwrap();
    assert!(
        got == bytes,
        "{}: the file differs from what was published",
        n.agent.name
    );
}

#[test]
fn a_batch_takes_at_most_two_copies_from_the_server_and_the_rest_from_peers() {
    let s = Server::start();
    s.create_cluster("c1");
    let nodes = sharing_nodes(&s, "c1", 6, None);
    let bytes = noise(SIZE, 7);
    let id = publish(&s, "1", &bytes);
    let before = served_bytes(&s);
    roll_out(&s, "c1", &id, "6");
    for n in &nodes {
        assert_holds(n, &bytes);
    }
    let egress = served_bytes(&s) - before;
    let (mut from_server, mut from_peers) = (0, 0);
    for n in &nodes {
        let (a, b) = n.agent.fetched_bytes();
        from_server += a;
        from_peers += b;
    }
    assert_eq!(
        from_server + from_peers,
        6 * SIZE as u64,
        "every node fetched the file once, counted by source"
    );
    assert!(
        (SIZE as u64..=2 * SIZE as u64).contains(&egress),
        "server sent {egress} bytes for a {SIZE}-byte file to 6 nodes (at most 2 copies); agents: {from_server} from the server, {from_peers} from peers"
    );
    assert!(from_peers >= 4 * SIZE as u64, "peers gave {from_peers} bytes");
    // What operators see: per node and version in `node get`, in all in
    // the metrics.
    let (mut seen_server, mut seen_peers) = (0, 0);
    for n in &nodes {
        let v = s.lksctl_json(&["node", "get", &n.agent.name]);
        let b = &v["bundles"][0];
        let (a, p) = (
            b["fetched_from_server"].as_u64().unwrap(),
            b["fetched_from_peers"].as_u64().unwrap(),
        );
        assert_eq!(a + p, SIZE as u64, "{v:#}");
        assert_eq!(
            (a, p),
            n.agent.fetched_bytes(),
            "node get says what the agent logged"
        );
        (seen_server, seen_peers) = (seen_server + a, seen_peers + p);
        let text = s.lksctl_ok(&["node", "get", &n.agent.name]);
        assert!(text.contains("FETCHED") && text.contains("24.0 MiB"), "{text}");
    }
    assert_eq!((seen_server, seen_peers), (from_server, from_peers));
    wait_until(Duration::from_secs(10), "the applied events counted", || {
        s.metric("lks_blob_bytes_served_total{source=\"peer\"}") == from_peers
    });
}

/// Established TCP connections on IPv4 (`/proc/net/tcp`) from or to one
/// of `ports`: (dialled, accepted).
fn connections(ports: &[u16]) -> (usize, usize) {
    let (mut dialled, mut accepted) = (0, 0);
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    for l in tcp.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
        if f[3] != "01" {
            continue; // not ESTABLISHED
        }
        dialled += usize::from(ports.contains(&port(f[2])));
        accepted += usize::from(ports.contains(&port(f[1])));
    }
    (dialled, accepted)
}

#[test]
fn connections_to_peers_close_once_the_fetches_are_over() {
    let s = Server::start();
    s.create_cluster("c1");
    let nodes = sharing_nodes(&s, "c1", 3, None);
    let ports: Vec<u16> = nodes.iter().map(|n| n.peer.port()).collect();
    let bytes = noise(SIZE, 11);
    let id = publish(&s, "1", &bytes);
    roll_out(&s, "c1", &id, "3");
    let (dialled, accepted) = connections(&ports);
    for n in &nodes {
        assert_holds(n, &bytes);
    }
    let (_, from_peers) = nodes.iter().fold((0, 0), |(a, b), n| {
        let (x, y) = n.agent.fetched_bytes();
        (a + x, b + y)
    });
    assert!(from_peers > 0, "nodes took pieces from each other");
    assert!(
        dialled > 0 && accepted > 0,
        "right after the rollout the nodes are still connected to their peers: {dialled} dialled, {accepted} accepted"
    );
    // n3 stops dead (as a VM that went away without closing anything):
    // its own connections to n1 and n2 stay open on its side, so n1 and
    // n2 must close them (a ping unanswered, `peer::KEEPALIVE_*`). The
    // rest close 30 s after the last fetch ended (`swarm::conns::
    // IDLE_CLOSE`), both ends. The listeners stay up.
    let n3 = nix::unistd::Pid::from_raw(nodes[2].agent.pid().unwrap() as i32);
    nix::sys::signal::kill(n3, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_until(Duration::from_secs(60), "connections to peers closed", || {
        connections(&ports) == (0, 0)
    });
    nix::sys::signal::kill(n3, nix::sys::signal::Signal::SIGCONT).unwrap();
    for n in &nodes[..2] {
        assert!(listening(n.peer), "{}: still listening", n.agent.name);
    }
}

#[test]
fn a_lying_peer_is_caught_reported_and_never_used_again() {
    let s = Server::start();
    s.create_cluster("c1");
    // n1 flips a byte in every piece it serves.
    let nodes = sharing_nodes(&s, "c1", 4, Some(1));
    let bytes = noise(SIZE, 11);
    let id = publish(&s, "1", &bytes);
    // One node at a time: n1 first (from the server), then each next node
    // is named the nodes before it, n1 among them.
    roll_out(&s, "c1", &id, "1");
    for n in &nodes {
        assert_holds(n, &bytes);
    }
    let events = s.lksctl_json(&["event", "list", "--limit", "1000"]);
    let bad: Vec<&serde_json::Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "bad_peer")
        .collect();
    assert!(!bad.is_empty(), "the lie was reported: {events:#}");
    assert!(
        bad.iter()
            .all(|e| e["message"].as_str().unwrap_or_default().contains("c1-n1")),
        "only n1 lied: {bad:#?}"
    );
    // Reported once: the tracker names it to nobody afterwards.
    assert_eq!(bad.len(), 1, "{bad:#?}");
    let lied_to: Vec<&str> = bad.iter().filter_map(|e| e["node"].as_str()).collect();
    assert_eq!(lied_to, ["c1-n2"], "the first node after n1 met the lie");
}

#[test]
fn a_peer_killed_mid_transfer_only_sends_its_nodes_elsewhere() {
    let s = Server::start();
    s.create_cluster("c1");
    let mut nodes = start_nodes(&s, "c1", 4, None);
    // Slow uploads (the whole file takes the canary about 8 s to serve), so
    // it dies in the middle of them.
    s.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--peer-sharing",
        "on",
        "--peer-upload-rate",
        "3MiB",
    ]);
    for n in &nodes {
        wait_until(Duration::from_secs(20), "peer listener up", || listening(n.peer));
    }
    let bytes = noise(SIZE, 5);
    let id = publish(&s, "1", &bytes);
    // A canary first (from the server), then the other three at once,
    // which the tracker sends to the canary, which holds it whole.
    let rollout = s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        &id,
        "--canary",
        "1",
        "--canary-soak",
        "1s",
        "--batch-size",
        "3",
    ]);
    let rollout = rollout.lines().next().unwrap_or_default().trim().to_string();
    let mut canary = None;
    wait_until(Duration::from_secs(60), "the canary applied", || {
        canary = nodes.iter().position(|n| {
            n.agent
                .bundle("kubelet")
                .is_some_and(|(v, st, _)| v == "1" && st == "applied")
        });
        canary.is_some()
    });
    let canary = canary.unwrap();
    let t = std::time::Instant::now();
    while !nodes[canary].agent.log().contains("serving a piece to a peer") {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the canary served nothing; logs:\n{}",
            nodes
                .iter()
                .map(|n| n.agent.log())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes[canary].agent.kill9();
    let others: Vec<&Node> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != canary)
        .map(|(_, n)| n)
        .collect();
    for n in &others {
        assert_holds(n, &bytes);
    }
    // The files land before the node's status report reaches the server.
    let t = std::time::Instant::now();
    let st = loop {
        let st = s.lksctl_json(&["rollout", "status", &rollout]);
        if st["state"] == "completed" || t.elapsed() > Duration::from_secs(20) {
            break st;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(st["state"], "completed", "{st:#}");
    let (mut from_server, mut from_peers) = (0, 0);
    for n in &others {
        let (a, b) = n.agent.fetched_bytes();
        (from_server, from_peers) = (from_server + a, from_peers + b);
    }
    assert_eq!(from_server + from_peers, 3 * SIZE as u64);
    assert!(
        from_server > 0,
        "the canary's nodes went to the server for what it no longer gave"
    );
    assert!(from_peers > 0, "the canary gave pieces before it died");
}

#[test]
fn no_listener_while_off_and_nodes_of_other_clusters_are_refused() {
    let s = Server::start();
    s.create_cluster("c1");
    s.create_cluster("c2");
    let nodes = start_nodes(&s, "c1", 1, None);
    let n1 = &nodes[0];
    wait_until(Duration::from_secs(20), "n1 connected", || {
        n1.agent.log().contains("desired state received")
    });
    assert!(!listening(n1.peer), "peer sharing is off by default: no listener");
    sharing(&s, "c1", "on");
    wait_until(Duration::from_secs(20), "listener up once on", || {
        listening(n1.peer)
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ask = |ch| async move {
            pb::peer_service_client::PeerServiceClient::new(ch)
                .fetch_chunk(pb::FetchChunkRequest {
                    digest: Digest::of(b"x").to_string(),
                    offset: 0,
                    length: 0,
                    queue_ms: 0,
                })
                .await
                .map(|_| ())
        };
        let watch = |ch| async move {
            pb::peer_service_client::PeerServiceClient::new(ch)
                .watch_pieces(pb::WatchPiecesRequest {
                    digest: Digest::of(b"x").to_string(),
                })
                .await
                .map(|_| ())
        };
        // A node of cluster c2, with a certificate from the same server CA.
        let token = s.token("c2", &[]);
        let other = TestNode::enroll(&s, &token, "intruder", &[]).await;
        let creds = lksadmin_agent::link::client::NodeCredentials {
            ca_pem: other.ca_pem.clone(),
            cert_pem: other.cert_pem.clone(),
            key_pem: other.key_pem.clone(),
        };
        let ch = lksadmin_agent::link::swarm::dial_peer(&creds, "c1", "c1-n1", n1.peer)
            .await
            .expect("TLS with a valid node certificate works");
        let e = ask(ch.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains("intruder") && e.message().contains("c2"),
            "{e:?}"
        );
        // Nor may it learn what n1 holds.
        let e = watch(ch).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

        // A node of c1 asking for a blob that is not in n1's bundles.
        let token = s.token("c1", &[]);
        let mate = TestNode::enroll(&s, &token, "mate", &[]).await;
        let creds = lksadmin_agent::link::client::NodeCredentials {
            ca_pem: mate.ca_pem.clone(),
            cert_pem: mate.cert_pem.clone(),
            key_pem: mate.key_pem.clone(),
        };
        let ch = lksadmin_agent::link::swarm::dial_peer(&creds, "c1", "c1-n1", n1.peer)
            .await
            .unwrap();
        let e = ask(ch.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        let e = watch(ch.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

        // Malformed requests from a node of the cluster: refused, and the
        // listener goes on serving.
        let base = format!("http://{}", n1.peer);
        for (what, body) in [
            ("bad-varint", message(&[0xff; 16])),
            ("length-past-end", message(&[0x0a, 0x7f, b'x'])),
            ("truncated-frame", frame(0, 100, &[0x0a, 0x02, b'h', b'i'])),
            ("length-4GiB", frame(0, u32::MAX, &[0x08, 0x01])),
        ] {
            let a = raw_grpc(&ch, &base, "/lks.v1.PeerService/FetchChunk", body, &[]).await;
            assert!(
                matches!(
                    a,
                    Answer::Grpc(
                        tonic::Code::InvalidArgument
                            | tonic::Code::OutOfRange
                            | tonic::Code::ResourceExhausted,
                        _
                    )
                ),
                "{what}: {a:?}"
            );
        }
        let e = ask(ch).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "still serving: {e:?}");

        // The dialler checks who answers: n1 is not "someone-else".
        let e = lksadmin_agent::link::swarm::dial_peer(&creds, "c1", "someone-else", n1.peer)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not someone-else"), "{e}");
    });

    sharing(&s, "c1", "off");
    wait_until(Duration::from_secs(20), "listener closed once off", || {
        !listening(n1.peer)
    });
    let log = n1.agent.log();
    assert!(log.contains("refused node intruder of cluster c2"), "{log}");
}
