//! Peer sharing per cluster: `lksctl cluster set --peer-…` against a real
//! control server, what `cluster get`/`list` show, the refusals, and the
//! settings reaching a connected agent in its desired state.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::one_line_error;
use lks_e2e::server::{Server, TestNode, next_desired};
use lks_proto::pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_sharing_is_set_shown_refused_and_pushed() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    s.create_cluster("tenant-b");
    let t = s.token("tenant-a", &[]);
    let w1 = TestNode::enroll(&s, &t, "w1", &[]).await;
    let (_tx, mut stream) = w1.connect(vec![]).await.expect("connect");
    let d0 = next_desired(&mut stream).await;
    assert_eq!(d0.peer_sharing, None, "off for a new cluster");

    turned_on_shown_and_pushed_at_once(&s, &mut stream, &d0).await;
    refusals_are_one_line_and_change_nothing(&s).await;
    off_is_pushed_and_the_settings_are_kept_while_off(&s, &mut stream).await;

    // Recorded as events.
    let events = s.lksctl_json(&["event", "list", "--cluster", "tenant-a"]);
    let n = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "peer_sharing")
        .count();
    assert_eq!(n, 4, "{events}");
}

/// Off for every new cluster, shown as such; turned on, shown by get and
/// list (other clusters stay off), and the connected agent hears of it at
/// once, with the same generation.
async fn turned_on_shown_and_pushed_at_once(
    s: &Server,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
    d0: &pb::DesiredState,
) {
    let j = s.lksctl_json(&["cluster", "get", "tenant-a"]);
    assert!(j["peer_sharing"].is_null(), "{j}");
    let get = s.lksctl_ok(&["cluster", "get", "tenant-a"]);
    assert!(get.contains("Peer sharing:") && get.contains("off"), "{get}");

    let out = s.lksctl_ok(&[
        "cluster",
        "set",
        "tenant-a",
        "--peer-sharing",
        "on",
        "--peer-port",
        "7555",
        "--peer-upload-rate",
        "10MiB",
    ]);
    assert_eq!(
        out.trim(),
        "cluster tenant-a: peer sharing on :7555 4 uploads 10 MiB/s"
    );
    let j = s.lksctl_json(&["cluster", "get", "tenant-a"]);
    assert_eq!(
        j["peer_sharing"],
        serde_json::json!({"port": 7555, "upload_rate": 10u64 << 20, "max_uploads": 4}),
        "{j}"
    );
    // The connected agent hears of it at once, with the same generation.
    let d1 = next_desired(stream).await;
    assert_eq!(
        d1.peer_sharing,
        Some(pb::PeerSharing {
            port: 7555,
            upload_rate: 10 << 20,
            max_uploads: 4
        })
    );
    assert_eq!(d1.generation, d0.generation);

    let list = s.lksctl_json(&["cluster", "list"]);
    let b = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tenant-b")
        .unwrap();
    assert!(b["peer_sharing"].is_null(), "other clusters stay off: {list}");
    let table = s.lksctl_ok(&["cluster", "list"]);
    assert!(table.lines().next().unwrap().contains("PEER SHARING"), "{table}");
    let row = table.lines().find(|l| l.starts_with("tenant-a")).unwrap();
    // PEER SHARING, then REBOOTS (issue [reboots]).
    assert!(row.ends_with("on :7555 4 uploads 10 MiB/s  off"), "{table}");
}

/// Refusals: one line, non-zero exit, nothing changed; the server checks
/// too (another client than lksctl).
async fn refusals_are_one_line_and_change_nothing(s: &Server) {
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "tenant-a", "--peer-port", "0"]),
        "peer port 0",
    );
    assert!(e.starts_with("error: ") && e.contains("--peer-port"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "tenant-a", "--peer-max-uploads", "65"]),
        "65 uploads",
    );
    assert!(e.contains("--peer-max-uploads"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "tenant-a", "--peer-upload-rate", "10Mb"]),
        "ambiguous rate",
    );
    assert!(e.contains("ambiguous"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["cluster", "set", "nope", "--peer-sharing", "on"]),
        "unknown cluster",
    );
    assert!(e.contains("does not exist"), "{e}");
    // The server checks too (another client than lksctl).
    let mut admin = s.admin_client().await;
    for (port, uploads) in [
        (Some(0), None),
        (Some(65_536), None),
        (None, Some(0)),
        (None, Some(65)),
    ] {
        let st = admin
            .set_cluster(pb::SetClusterRequest {
                name: "tenant-a".into(),
                peer_port: port,
                peer_max_uploads: uploads,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
        assert_eq!(st.message().lines().count(), 1, "{st:?}");
    }
    let j = s.lksctl_json(&["cluster", "get", "tenant-a"]);
    assert_eq!(j["peer_sharing"]["port"], 7555, "refusals change nothing: {j}");
}

/// Off: absent from the agent's desired state; the settings are kept
/// and can be changed while off, with nothing sent; on again, they are.
async fn off_is_pushed_and_the_settings_are_kept_while_off(
    s: &Server,
    stream: &mut tonic::Streaming<pb::ServerMessage>,
) {
    let out = s.lksctl_ok(&["cluster", "set", "tenant-a", "--peer-sharing", "off"]);
    assert_eq!(out.trim(), "cluster tenant-a: peer sharing off");
    let j = s.lksctl_json(&["cluster", "get", "tenant-a"]);
    assert!(j["peer_sharing"].is_null(), "{j}");
    let d2 = next_desired(stream).await;
    assert_eq!(d2.peer_sharing, None);
    s.lksctl_ok(&["cluster", "set", "tenant-a", "--peer-max-uploads", "8"]);
    let j = s.lksctl_json(&["cluster", "get", "tenant-a"]);
    assert!(j["peer_sharing"].is_null(), "still off: {j}");
    // Nothing the agent receives changed: no desired state is sent.
    let quiet = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let m = stream.message().await.expect("stream healthy").expect("open");
            if let Some(pb::server_message::Msg::Desired(d)) = m.msg {
                return d;
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "unexpected desired state: {quiet:?}");
    s.lksctl_ok(&["cluster", "set", "tenant-a", "--peer-sharing", "on"]);
    let d3 = next_desired(stream).await;
    assert_eq!(
        d3.peer_sharing,
        Some(pb::PeerSharing {
            port: 7555,
            upload_rate: 10 << 20,
            max_uploads: 8
        }),
        "kept while off"
    );
}

/// On etcd, a replica other than the one that took the change tells its
/// agents within its cache's TTL (5 s), without a restart or a new
/// generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_replicas_push_the_change_within_seconds() {
    let etcd = lks_e2e::etcd::Etcd::start();
    let r1 = etcd.replica("/lks-peer/", &[]);
    let r2 = etcd.replica("/lks-peer/", &[]);
    r1.create_cluster("tenant-a");
    let t = r1.token("tenant-a", &[]);
    let mut w1 = TestNode::enroll(&r1, &t, "w1", &[]).await;
    w1.url = r2.url();
    let (_tx, mut stream) = w1.connect(vec![]).await.expect("connect to r2");
    let d0 = next_desired(&mut stream).await;
    assert_eq!(d0.peer_sharing, None);

    let started = std::time::Instant::now();
    r1.lksctl_ok(&["cluster", "set", "tenant-a", "--peer-sharing", "on"]);
    let d1 = next_desired(&mut stream).await;
    assert_eq!(
        d1.peer_sharing,
        Some(pb::PeerSharing {
            port: 7444,
            upload_rate: 0,
            max_uploads: 4
        })
    );
    assert_eq!(d1.generation, d0.generation);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    r1.lksctl_ok(&["cluster", "set", "tenant-a", "--peer-sharing", "off"]);
    assert_eq!(next_desired(&mut stream).await.peer_sharing, None);
}
