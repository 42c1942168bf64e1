//! The agent side of a real control server, driven by a test gRPC client:
//! desired state pushed over `Connect`, status reports feeding rollouts and
//! `node list`, and `FetchBlob` authorisation.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::server::{Server, TestNode, bundle_ids, channel, next_desired, node_json, status_msg};
use lks_e2e::{one_line_error, wait_until};
use lks_proto::Digest;
use lks_proto::pb::{self, BundleState};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(15);

fn node_bundles(s: &Server, node: &str) -> serde_json::Value {
    let list = s.lksctl_json(&["node", "list"]);
    node_json(&list, node)["bundles"].clone()
}

fn rollout_state(s: &Server, id: &str) -> serde_json::Value {
    s.lksctl_json(&["rollout", "status", id])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn desired_state_out_status_back_and_rollouts_follow() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &[]);
    let w1 = TestNode::enroll(&s, &t, "w1", &[("role", "worker")]).await;
    let _w2 = TestNode::enroll(&s, &t, "w2", &[("role", "db")]).await;
    let v1 = s.write_bundle(
        "v1",
        "demo",
        "1",
        &[
            ("/etc/demo.conf", b"one", "0644"),
            ("/usr/bin/demo", b"bin1", "0755"),
        ],
    );
    let v2 = s.write_bundle("v2", "demo", "2", &[("/etc/demo.conf", b"two", "0644")]);
    s.publish(&v1);
    s.publish(&v2);

    let (tx, mut stream) = w1.connect(vec![]).await.expect("connect");
    let d0 = next_desired(&mut stream).await;
    assert!(d0.bundles.is_empty());
    wait_until(WAIT, "w1 connected", || {
        let list = s.lksctl_json(&["node", "list"]);
        let n = node_json(&list, "w1");
        n["connected"] == true && n["last_seen"].is_string()
    });
    let got = s.lksctl_json(&["node", "get", "w1"]);
    assert_eq!(got["facts"]["hostname"], "w1.test");
    assert_eq!(got["facts"]["agent_version"], "test-agent/0");

    a_selected_rollout_is_pushed_and_completes_on_the_nodes_status(&s, &tx, &mut stream, &d0).await;
    let id2 = a_failing_bundle_ends_rollout_wait_with_one_line(&s, &w1, &tx, &mut stream).await;
    a_rollback_ends_when_the_node_reports_it_applied(&s, &tx, &mut stream, &id2).await;
    node_events_and_metrics_are_recorded(&s, &tx).await;

    drop(tx);
    drop(stream);
    wait_until(WAIT, "w1 disconnected", || {
        node_json(&s.lksctl_json(&["node", "list"]), "w1")["connected"] == false
    });
}

/// A rollout of demo@1 to role=worker: pushed to w1 (not w2) with a new
/// generation and the manifest, pending in `node list`, completed once
/// w1 reports it applying, then applied.
async fn a_selected_rollout_is_pushed_and_completes_on_the_nodes_status(
    s: &Server,
    tx: &tokio::sync::mpsc::Sender<pb::AgentMessage>,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    d0: &pb::DesiredState,
) {
    let r = s.lksctl_json(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "demo@1",
        "--selector",
        "role=worker",
    ]);
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(r["total"], 1);
    let d1 = next_desired(stream).await;
    assert!(d1.generation > d0.generation, "generations only grow");
    assert_eq!(bundle_ids(&d1), ["demo@1"]);
    let m = d1.bundles[0].manifest.as_ref().unwrap();
    let conf = m.files.iter().find(|f| f.path == "/etc/demo.conf").unwrap();
    assert_eq!(conf.digest, Digest::of(b"one").to_string());
    assert_eq!(conf.size, 3);
    assert_eq!(
        node_bundles(s, "w1"),
        serde_json::json!([{"name": "demo", "version": "1", "state": "pending", "message": "",
            "fetched_from_server": 0, "fetched_from_peers": 0, "fetched_as_delta": 0}])
    );
    assert_eq!(
        node_bundles(s, "w2"),
        serde_json::json!([]),
        "selector excluded w2"
    );
    let st = rollout_state(s, &id);
    assert_eq!(
        (st["state"].as_str(), st["pending"].as_u64()),
        (Some("running"), Some(1))
    );

    tx.send(status_msg(d1.generation, "demo", "1", BundleState::Applying, ""))
        .await
        .unwrap();
    wait_until(WAIT, "applying shown", || {
        node_bundles(s, "w1")[0]["state"] == "applying"
    });
    tx.send(status_msg(d1.generation, "demo", "1", BundleState::Applied, ""))
        .await
        .unwrap();
    wait_until(WAIT, "rollout completed", || {
        rollout_state(s, &id)["state"] == "completed"
    });
    let st = rollout_state(s, &id);
    assert_eq!(
        (
            st["total"].as_u64(),
            st["updated"].as_u64(),
            st["failed"].as_u64(),
            st["pending"].as_u64()
        ),
        (Some(1), Some(1), Some(0), Some(0))
    );
    assert_eq!(node_bundles(s, "w1")[0]["state"], "applied");
}

/// demo@2 fails on the node: `--wait` exits non-zero with one line, and
/// the node may re-fetch the version it holds meanwhile. Returns the
/// failed rollout's ID.
async fn a_failing_bundle_ends_rollout_wait_with_one_line(
    s: &Server,
    w1: &TestNode,
    tx: &tokio::sync::mpsc::Sender<pb::AgentMessage>,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
) -> String {
    let s_url = s.admin_conf_path();
    let waiter = std::thread::spawn(move || {
        let mut cmd = std::process::Command::new(lks_e2e::bin("lksctl"));
        cmd.arg("--config").arg(s_url).args([
            "rollout",
            "start",
            "--cluster",
            "tenant-a",
            "--bundle",
            "demo@2",
            "--wait",
        ]);
        lks_e2e::run(cmd)
    });
    let d2 = next_desired(stream).await;
    assert_eq!(bundle_ids(&d2), ["demo@2"]);
    // While moving to demo@2 the node still holds demo@1 and may re-fetch it.
    let (old, _) = w1
        .fetch_blob(&Digest::of(b"one").to_string(), 0)
        .await
        .expect("held version");
    assert_eq!(old, b"one");
    tx.send(status_msg(
        d2.generation,
        "demo",
        "2",
        BundleState::RolledBack,
        "health check failed",
    ))
    .await
    .unwrap();
    let out = waiter.join().unwrap();
    let e = one_line_error(&out, "rollout --wait of a failing bundle");
    assert!(
        e.contains("ended failed") && e.contains("health check failed"),
        "{e}"
    );
    // stdout: the ID, then one progress line per change.
    let id2 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_string();
    let st = rollout_state(s, &id2);
    assert_eq!(st["state"], "failed");
    assert_eq!(st["failed"], 1);
    assert_eq!(st["nodes"][0]["previous_version"], "1");
    assert_eq!(node_bundles(s, "w1")[0]["state"], "rolled_back");
    id2
}

/// Rolling back returns the node to demo@1; the rollback ends when the
/// node reports it applied.
async fn a_rollback_ends_when_the_node_reports_it_applied(
    s: &Server,
    tx: &tokio::sync::mpsc::Sender<pb::AgentMessage>,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    id2: &str,
) {
    let out = s.lksctl_ok(&["rollout", "rollback", id2]);
    assert!(out.contains("rolling_back"), "{out}");
    let d3 = next_desired(stream).await;
    assert_eq!(bundle_ids(&d3), ["demo@1"]);
    assert_eq!(rollout_state(s, id2)["state"], "rolling_back");
    tx.send(status_msg(d3.generation, "demo", "1", BundleState::Applied, ""))
        .await
        .unwrap();
    wait_until(WAIT, "rolled back", || {
        rollout_state(s, id2)["state"] == "rolled_back"
    });
}

/// Node events are recorded, and the metrics count the connection,
/// the pushes and the Connect RPC.
async fn node_events_and_metrics_are_recorded(s: &Server, tx: &tokio::sync::mpsc::Sender<pb::AgentMessage>) {
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Event(pb::NodeEvent {
            fetched_from_server: 0,
            fetched_from_peers: 0,
            peer: String::new(),
            kind: "repaired".into(),
            bundle: "demo".into(),
            version: "1".into(),
            message: "restored /etc/demo.conf".into(),
            at_ms: 0,
        })),
    })
    .await
    .unwrap();
    wait_until(WAIT, "event recorded", || {
        s.lksctl_ok(&["event", "list", "--node", "w1"])
            .contains("restored /etc/demo.conf")
    });

    let m = s.http_get("/metrics");
    assert!(m.contains("lks_connected_agents 1"), "{m}");
    assert!(!m.contains("lks_desired_state_pushes_total 0"), "{m}");
    assert!(
        m.contains("lks_rpc_duration_seconds_count{method=\"Connect\"}"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_joining_later_get_the_cluster_target() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let v1 = s.write_bundle("v1", "kubelet", "1", &[("/etc/k", b"k", "0644")]);
    s.publish(&v1);
    let id = s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "kubelet@1",
        "--selector",
        "role=worker",
    ]);
    assert!(!id.trim().is_empty());
    let t = s.token("tenant-a", &[]);
    let late = TestNode::enroll(&s, &t, "late", &[("role", "worker")]).await;
    let other = TestNode::enroll(&s, &t, "other", &[("role", "db")]).await;
    let (_tx, mut st) = late.connect(vec![]).await.unwrap();
    assert_eq!(bundle_ids(&next_desired(&mut st).await), ["kubelet@1"]);
    let (_tx2, mut st2) = other.connect(vec![]).await.unwrap();
    assert!(
        next_desired(&mut st2).await.bundles.is_empty(),
        "selector applies to joiners too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_served_only_to_nodes_they_are_assigned_to() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    s.create_cluster("tenant-b");
    let a1 = TestNode::enroll(&s, &s.token("tenant-a", &[]), "a1", &[]).await;
    let b1 = TestNode::enroll(&s, &s.token("tenant-b", &[]), "b1", &[]).await;
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let dir = s.write_bundle(
        "sec",
        "secret",
        "1",
        &[
            ("/etc/secret", b"cluster-b-only", "0600"),
            ("/usr/bin/big", &big, "0755"),
        ],
    );
    s.publish(&dir);
    // b1 never opens a stream: it is assigned while offline (`wait`).
    s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-b",
        "--bundle",
        "secret@1",
        "--offline",
        "wait",
    ]);
    let small = Digest::of(b"cluster-b-only").to_string();
    let big_d = Digest::of(&big).to_string();

    let (data, total) = b1.fetch_blob(&small, 0).await.expect("b1 may fetch");
    assert_eq!((data.as_slice(), total), (&b"cluster-b-only"[..], 14));
    let (data, total) = b1.fetch_blob(&small, 8).await.expect("resume");
    assert_eq!((data.as_slice(), total), (&b"b-only"[..], 14));
    let (data, total) = b1.fetch_blob(&big_d, 0).await.expect("multi-chunk blob");
    assert_eq!(total, big.len() as u64);
    assert!(data == big, "blob bytes intact");
    let (data, _) = b1.fetch_blob(&big_d, 100_000).await.unwrap();
    assert!(data == big[100_000..]);
    let (data, total) = b1.fetch_blob(&small, 14).await.expect("offset at the end");
    assert!(data.is_empty() && total == 14);
    let e = b1.fetch_blob(&small, 15).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);

    // A node of cluster A cannot read cluster B's blobs.
    let e = a1.fetch_blob(&small, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("not part of any bundle assigned to node a1"),
        "{e:?}"
    );
    // Claiming to hold cluster B's bundle does not open its blobs either.
    let claim = pb::BundleStatus {
        fetched_from_server: 0,
        fetched_from_peers: 0,
        fetched_as_delta: 0,
        name: "secret".into(),
        version: "1".into(),
        state: BundleState::Applied as i32,
        message: String::new(),
        updated_at_ms: 0,
    };
    let (_tx, mut st) = a1.connect(vec![claim]).await.unwrap();
    next_desired(&mut st).await;
    let e = a1.fetch_blob(&small, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = a1
        .fetch_blob(&Digest::of(b"nothing").to_string(), 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = a1.fetch_blob("md5:abc", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // The admin certificate is not a node; no certificate is nobody.
    let conf = s.admin_conf();
    let admin_ch = channel(
        &s.url(),
        &conf.ca_cert,
        Some((&conf.client_cert, &conf.client_key)),
    )
    .await;
    let e = pb::agent_service_client::AgentServiceClient::new(admin_ch)
        .fetch_blob(pb::FetchBlobRequest {
            length: 0,
            digest: small.clone(),
            offset: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = pb::agent_service_client::AgentServiceClient::new(s.anonymous_channel().await)
        .fetch_blob(pb::FetchBlobRequest {
            length: 0,
            digest: small.clone(),
            offset: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // A blob missing from the store is not_found, not a crash.
    let hex = small.trim_start_matches("sha256:");
    std::fs::remove_file(s.data_dir.join("blobs/sha256").join(&hex[..2]).join(hex)).unwrap();
    let e = b1.fetch_blob(&small, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let m = s.http_get("/metrics");
    assert!(
        !m.contains("lks_blob_bytes_served_total{source=\"server\"} 0\n"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_protocol_is_enforced() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &[]);
    let n = TestNode::enroll(&s, &t, "w1", &[]).await;

    // The first message must be Hello.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq: 1 })),
    })
    .await
    .unwrap();
    let mut st = n
        .client()
        .await
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let e = st.message().await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("Hello"), "{e:?}");

    // A status with an unknown state ends the stream with invalid_argument.
    let (tx, mut st) = n.connect(vec![]).await.unwrap();
    next_desired(&mut st).await;
    tx.send(status_msg(1, "demo", "1", BundleState::Unspecified, ""))
        .await
        .unwrap();
    let e = loop {
        match st.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream closed without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // A newer stream of the same node replaces the older one.
    let (_tx1, mut first) = n.connect(vec![]).await.unwrap();
    next_desired(&mut first).await;
    let (_tx2, mut second) = n.connect(vec![]).await.unwrap();
    next_desired(&mut second).await;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match first.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("older stream ends");
    assert!(end.is_err() || matches!(end, Ok(None)));

    // The admin certificate cannot open an agent stream.
    let conf = s.admin_conf();
    let admin_ch = channel(
        &s.url(),
        &conf.ca_cert,
        Some((&conf.client_cert, &conf.client_key)),
    )
    .await;
    let (_t, rx) = tokio::sync::mpsc::channel(1);
    let e = pb::agent_service_client::AgentServiceClient::new(admin_ch)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bundles_on_one_node_may_not_share_a_path() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let _n = TestNode::enroll(&s, &s.token("tenant-a", &[]), "w1", &[]).await;
    let x = s.write_bundle("x", "x", "1", &[("/etc/shared.conf", b"x", "0644")]);
    let y = s.write_bundle("y", "y", "1", &[("/etc/shared.conf", b"y", "0644")]);
    s.publish(&x);
    s.publish(&y);
    // w1 never connects: x is deferred on it, and the version it will
    // catch up to counts as much as an assigned one.
    s.lksctl_ok(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "x@1"]);
    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "y@1"]),
        "path conflict",
    );
    assert!(e.contains("w1") && e.contains("conflicts with bundle x"), "{e}");
    let list = s.lksctl_json(&["node", "list"]);
    assert!(
        node_json(&list, "w1")["bundles"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["name"] != "y"),
        "y assigned: {list:#}"
    );
    // Assigned for real (`wait`), x conflicts just the same.
    s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "x@1",
        "--offline",
        "wait",
    ]);
    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "tenant-a", "--bundle", "y@1"]),
        "path conflict with an assigned bundle",
    );
    assert!(e.contains("conflicts with bundle x"), "{e}");
    let list = s.lksctl_json(&["node", "list"]);
    assert_eq!(
        node_json(&list, "w1")["bundles"].as_array().unwrap().len(),
        1,
        "only x assigned"
    );
}
