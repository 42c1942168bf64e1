//! Tests of the output formats.

use super::*;

#[test]
fn tables_align() {
    let t = table(
        &["A", "BB"],
        &[vec!["xxx".into(), "y".into()], vec!["z".into(), "".into()]],
    );
    assert_eq!(t, "A    BB\nxxx  y\nz\n");
}

#[test]
fn timestamps() {
    assert_eq!(rfc3339_ms(0), None);
    assert_eq!(rfc3339_ms(1_700_000_000_123).unwrap(), "2023-11-14T22:13:20Z");
}

#[test]
fn peer_sharing_is_shown_only_while_on() {
    let mut c = pb::Cluster {
        name: "a".into(),
        ..Default::default()
    };
    assert_eq!(peer_text(&c), "off");
    assert!(cluster_json(&c)["peer_sharing"].is_null());
    assert!(cluster_detail(&c).contains("Peer sharing:         off\n"));
    c.peer_sharing = Some(pb::PeerSharing {
        port: 7444,
        upload_rate: 50 << 20,
        max_uploads: 4,
    });
    assert_eq!(peer_text(&c), "on :7444 4 uploads 50 MiB/s");
    assert_eq!(
        cluster_json(&c)["peer_sharing"],
        json!({"port": 7444, "upload_rate": 52_428_800u64, "max_uploads": 4})
    );
    c.peer_sharing = Some(pb::PeerSharing {
        port: 9000,
        upload_rate: 0,
        max_uploads: 1,
    });
    assert_eq!(peer_text(&c), "on :9000 1 upload unlimited");
}

#[test]
fn rates_read_as_people_write_them() {
    assert_eq!(rate_text(0), "unlimited");
    assert_eq!(rate_text(800), "800 B/s");
    assert_eq!(rate_text(10 << 10), "10 KiB/s");
    assert_eq!(rate_text(25_000_000), "23.8 MiB/s");
    assert_eq!(rate_text(3 << 29), "1.5 GiB/s");
}

#[test]
fn what_a_node_fetched_reads_by_source() {
    assert_eq!(fetched_text(0, 0), "-");
    assert_eq!(fetched_text(64 << 20, 0), "64.0 MiB");
    assert_eq!(fetched_text(4 << 20, 60 << 20), "64.0 MiB, 60.0 from peers");
    let n = pb::Node {
        bundles: vec![pb::BundleStatus {
            name: "k".into(),
            version: "1".into(),
            fetched_from_server: 4 << 20,
            fetched_from_peers: 60 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(
        node_text(&n).contains("64.0 MiB, 60.0 from peers"),
        "{}",
        node_text(&n)
    );
    assert_eq!(node_json(&n)["bundles"][0]["fetched_from_peers"], 60 << 20);
}

#[test]
fn node_json_has_the_contract_fields() {
    let n = pb::Node {
        name: "w1".into(),
        cluster: "a".into(),
        bundles: vec![pb::BundleStatus {
            name: "k".into(),
            version: "1".into(),
            state: pb::BundleState::RolledBack as i32,
            ..Default::default()
        }],
        ..Default::default()
    };
    let v = node_json(&n);
    for k in [
        "name",
        "cluster",
        "labels",
        "connected",
        "last_seen",
        "bundles",
        "agent_version",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert!(v["last_seen"].is_null());
    assert!(v["agent_version"].is_null(), "never connected: no version");
    let n = pb::Node {
        facts: Some(pb::NodeFactsView {
            agent_version: "0.1.0".into(),
            ..Default::default()
        }),
        ..n
    };
    assert_eq!(node_json(&n)["agent_version"], "0.1.0");
    assert!(nodes_table(&[n]).lines().nth(1).unwrap().contains("0.1.0"));
    assert!(v["labels"].is_object());
    assert_eq!(v["bundles"][0]["state"], "rolled_back");
}

#[test]
fn what_a_rollout_fetched_reads_by_source_in_lines_tables_and_status() {
    let mut r = pb::Rollout {
        id: "r1".into(),
        bundle: "k".into(),
        version: "2".into(),
        cluster: "c".into(),
        ..Default::default()
    };
    assert_eq!(rollout_fetched(&r), None);
    assert!(!rollout_line(&r).contains("fetched"));
    assert!(rollout_text(&r).contains("Fetched:    -\n"));
    assert!(
        rollouts_table(std::slice::from_ref(&r))
            .lines()
            .nth(1)
            .unwrap()
            .ends_with(" -")
    );
    (r.fetched_from_server, r.fetched_as_delta, r.fetched_from_peers) = (226, 226, 678);
    assert_eq!(
        rollout_fetched(&r).as_deref(),
        Some("226 B from the server (226 B as deltas), 678 B from peers")
    );
    assert!(
        rollout_line(&r).ends_with("; fetched 226 B from the server (226 B as deltas), 678 B from peers"),
        "{}",
        rollout_line(&r)
    );
    assert!(rollout_progress(&r).contains("; fetched 226 B"));
    let t = rollouts_table(std::slice::from_ref(&r));
    assert!(
        t.lines().next().unwrap().ends_with("FETCHED(SERVER/DELTA/PEERS)"),
        "{t}"
    );
    assert!(t.lines().nth(1).unwrap().ends_with("226 B/226 B/678 B"), "{t}");
    (r.fetched_from_server, r.fetched_as_delta, r.fetched_from_peers) = (64 << 20, 0, 3 << 29);
    assert_eq!(
        rollout_fetched(&r).as_deref(),
        Some("64.0 MiB from the server, 1.5 GiB from peers")
    );
    assert_eq!(bytes_text(1536), "1.5 KiB");
}
