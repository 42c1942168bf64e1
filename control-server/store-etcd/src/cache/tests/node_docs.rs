//! What the copy keeps of a node: its memory per node, and documents
//! that read and write back as the same bytes.

use super::*;

use crate::docs::ActualDoc;

/// Resident memory of this process, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// What the copy costs per node at 30,000 nodes shaped like the load
/// generator's (connected to one of three replicas, its Hello's facts, one
/// reported bundle and one desired; a version's file count is not in
/// these documents), applied as JSON as the watch delivers them. Measured
/// as the growth of the process's resident memory (the crate forbids the
/// unsafe code a counting allocator needs), so it includes what malloc
/// spends around each block and varies by ~±15 bytes between runs; run it
/// alone: `cargo test -p lks-control-server --lib copy_memory_per_node --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn copy_memory_per_node() {
    const NODES: usize = 30_000;
    const REPLICAS: [&str; 3] = ["3f2a9c01d4e5b687", "a07c55e1b2d3f490", "5e6d7c8b9a0f1e2d"];
    let node = |i: usize| {
        let facts = serde_json::json!({
            "hostname": format!("loadgen-{i}"),
            "os": "", "kernel": "", "arch": "", "architecture": "",
            "cpus": 0, "memory_bytes": 0,
            "agent_version": "lks-loadgen", "boot_id": "",
            "features": [], "peer_listen": "", "addresses": [], "disks": [],
        })
        .to_string();
        serde_json::json!({
            "cluster": "loadgen",
            "labels": {},
            "cert_serial": format!("{:032x}", 0x4000_0000_0000_0000_0000_0000_0000_0000u128 + i as u128 * 7919),
            "facts_json": facts,
            "last_seen_ms": 1_790_000_000_000i64 + i as i64,
            "enrolled_at_ms": 1_789_000_000_000i64 + i as i64,
            "replica": REPLICAS[i % 3],
            "actual": {"loadgen-bundle": {
                "version": "v1", "state": "applied", "message": "",
                "updated_at_ms": 1_790_000_000_000i64 + i as i64, "generation": 7,
            }},
            "key_hash": format!("sha256:{:064x}", i as u128 * 104_729),
        })
        .to_string()
    };
    let desired = |_i: usize| r#"{"generation":7,"bundles":{"loadgen-bundle":"v1"}}"#.to_string();
    let nodes: Vec<(String, String, String)> = (0..NODES)
        .map(|i| (format!("loadgen-{i:05}"), node(i), desired(i)))
        .collect();
    let before = rss();
    let mut c = CacheState {
        rev: 1,
        ..Default::default()
    };
    for (i, (name, n, _)) in nodes.iter().enumerate() {
        // As a load sends them: nodes/ first, then desired/.
        c.apply(&format!("nodes/{name}"), Some(n.as_bytes()), 2 + i as i64)
            .unwrap();
    }
    for (i, (name, _, d)) in nodes.iter().enumerate() {
        c.apply(
            &format!("desired/{name}"),
            Some(d.as_bytes()),
            2 + (NODES + i) as i64,
        )
        .unwrap();
    }
    let after = rss();
    println!(
        "COPYMEM bytes_per_node={} nodes={NODES}",
        (after as isize - before as isize) / NODES as isize
    );
    println!(
        "SIZES held={} node={} desired={} actual={}",
        std::mem::size_of::<Held>(),
        std::mem::size_of::<NodeDoc>(),
        std::mem::size_of::<DesiredDoc>(),
        std::mem::size_of::<ActualDoc>()
    );
    assert_eq!(c.nodes().count(), NODES);
    drop(c);
}

/// The copy's types write a node and a desired document back as the bytes
/// they were read from (and as the `String` fields before them wrote
/// them), whichever optional fields they hold; through `apply` (names
/// shared) too.
#[test]
fn documents_read_and_written_back_are_the_same_bytes() {
    let nodes = [
        r#"{"cluster":"c","labels":{},"cert_serial":"s-n0","facts_json":"","last_seen_ms":0,"enrolled_at_ms":1,"replica":"","actual":{}}"#,
        concat!(
            r#"{"cluster":"prod \"eu\"","labels":{"a":"1","b":"2"},"cert_serial":"4f00aa","#,
            r#""facts_json":"{\"hostname\":\"n1\",\"addresses\":[\"10.0.0.1\"]}","last_seen_ms":5,"#,
            r#""enrolled_at_ms":2,"replica":"3f2a9c01d4e5b687","actual":{"a":{"version":"1","state":"applied","#,
            r#""message":"","updated_at_ms":3,"generation":4},"b":{"version":"2","state":"failed","#,
            r#""message":"no space","updated_at_ms":3,"generation":4,"fetched_server":10,"fetched_peers":20}},"#,
            r#""hold":"maintenance","key_hash":"sha256:ab","trust":{"enabled":false,"release_version":0,"#,
            r#""release_expires_at_ms":0,"root_version":0}}"#
        ),
    ];
    let desired = [
        r#"{"generation":0,"bundles":{}}"#,
        r#"{"generation":7,"bundles":{"a":"1","b":"2"},"retry":{"b":6}}"#,
    ];
    let mut c = CacheState {
        rev: 1,
        ..Default::default()
    };
    for (i, (n, d)) in nodes.iter().zip(desired).enumerate() {
        let doc: NodeDoc = serde_json::from_str(n).unwrap();
        assert_eq!(serde_json::to_string(&doc).unwrap(), *n);
        let doc: DesiredDoc = serde_json::from_str(d).unwrap();
        assert_eq!(serde_json::to_string(&doc).unwrap(), d);
        c.apply(&format!("nodes/n{i}"), Some(n.as_bytes()), 2).unwrap();
        c.apply(&format!("desired/n{i}"), Some(d.as_bytes()), 2).unwrap();
        c.apply(&format!("desired/x{i}"), Some(d.as_bytes()), 2).unwrap();
    }
    for (i, (n, d)) in nodes.iter().zip(desired).enumerate() {
        let held = c.node(&format!("n{i}")).unwrap();
        assert_eq!(serde_json::to_string(held).unwrap(), *n);
        let held = c.desired(&format!("n{i}")).unwrap();
        assert_eq!(serde_json::to_string(held).unwrap(), d);
        assert_eq!(
            serde_json::to_string(c.desired(&format!("x{i}")).unwrap()).unwrap(),
            d
        );
    }
    // Both nodes' "a" and the two desired states' versions are one name.
    let a = |n: &str| c.desired(n).unwrap().bundles.get("a").cloned().unwrap();
    assert_eq!(a("n1"), a("x1"));
}

/// A desired state may come before its node document, or stay after it;
/// the copy keeps each as it comes and goes.
#[test]
fn a_node_and_its_desired_state_come_and_go_apart() {
    let node = br#"{"cluster":"c","labels":{},"cert_serial":"s","facts_json":"","last_seen_ms":0,"enrolled_at_ms":1,"replica":"","actual":{}}"#;
    let desired = br#"{"generation":3,"bundles":{"k":"1"}}"#;
    let mut c = CacheState {
        rev: 1,
        ..Default::default()
    };
    c.apply("desired/n", Some(desired), 2).unwrap();
    assert!(c.node("n").is_none() && c.nodes().next().is_none());
    assert_eq!(c.desired("n").map(|d| d.generation), Some(3));
    c.apply("nodes/n", Some(node), 3).unwrap();
    assert_eq!(c.nodes().map(|(n, _)| n).collect::<Vec<_>>(), ["n"]);
    assert_eq!(c.desired("n").map(|d| d.generation), Some(3));
    c.apply("nodes/n", None, 4).unwrap();
    assert!(c.node("n").is_none() && c.nodes().next().is_none());
    assert_eq!(c.desired("n").map(|d| d.generation), Some(3));
    c.apply("nodes/n", Some(node), 5).unwrap();
    c.apply("desired/n", None, 6).unwrap();
    assert!(c.node("n").is_some() && c.desired("n").is_none());
    c.apply("nodes/n", None, 7).unwrap();
    assert!(c.held.is_empty(), "an entry with neither document is removed");
    c.apply("nodes/gone", None, 8).unwrap();
    c.apply("desired/gone", None, 8).unwrap();
    assert!(c.held.is_empty());
}
