//! The tracker's choices, without a store: a tracker whose index is set.

use super::*;

fn info(name: &str, ip: &str, applied: &[(&str, &str)]) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        connected: true,
        listen: None,
        addresses: vec![ip.parse().unwrap()],
        arch: None,
        applied: applied
            .iter()
            .map(|(b, v)| (b.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn subnets_and_addresses() {
    assert!(same_subnet(
        "10.0.1.5".parse().unwrap(),
        "10.0.1.200".parse().unwrap()
    ));
    assert!(!same_subnet(
        "10.0.1.5".parse().unwrap(),
        "10.0.2.5".parse().unwrap()
    ));
    assert!(same_subnet(
        "fd00::1".parse().unwrap(),
        "fd00::2".parse().unwrap()
    ));
    assert!(!same_subnet(
        "fd00::1".parse().unwrap(),
        "10.0.0.1".parse().unwrap()
    ));
    let mut n = info("a", "10.0.2.9", &[]);
    n.addresses.push("10.0.1.9".parse().unwrap());
    let near = ["10.0.1.1".parse().unwrap()];
    assert_eq!(
        dial_address(&n, &near, 7444),
        Some("10.0.1.9:7444".parse().unwrap())
    );
    assert_eq!(
        dial_address(&n, &[], 7444),
        Some("10.0.2.9:7444".parse().unwrap())
    );
    n.listen = Some("127.0.0.1:9000".parse().unwrap());
    assert_eq!(
        dial_address(&n, &near, 7444),
        Some("127.0.0.1:9000".parse().unwrap())
    );
    n.listen = Some("0.0.0.0:9001".parse().unwrap());
    assert_eq!(
        dial_address(&n, &near, 7444),
        Some("10.0.1.9:9001".parse().unwrap())
    );
    n.addresses.clear();
    assert_eq!(dial_address(&n, &near, 7444), None, "nowhere to dial");
}

#[test]
fn load_halves() {
    let now = Instant::now();
    let later = now + LOAD_HALF_LIFE;
    assert!((decayed(8.0, now, later) - 4.0).abs() < 1e-9);
}

#[test]
fn nodes_fetching_through_other_replicas_are_named_and_their_seed_counts() {
    let d = Digest::of(b"blob");
    let index = ClusterIndex {
        at: Instant::now(),
        nodes: vec![info("me", "10.0.0.1", &[]), info("far", "10.0.0.2", &[])],
    };
    let mut g = Inner::default();
    let now = Instant::now();
    // Alone, nobody to name: the server.
    let (peers, server) = g.answer(&index, "c", "me", (d, false), 7444, &[], now);
    assert!(peers.is_empty() && server);
    // "far" fetches through another replica, from the server: named,
    // and the fleet has its seed.
    let (peers, server) = g.answer(&index, "c", "me", (d, false), 7444, &[("far".into(), true)], now);
    assert_eq!(peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["far"]);
    assert!(!peers[0].whole);
    assert!(!server, "one seed for the fleet, not one per replica");
    // Fetching from its peers there: this node may seed.
    let (_, server) = g.answer(&index, "c", "me", (d, false), 7444, &[("far".into(), false)], now);
    assert!(server);
}

/// The part of `find` that needs no store: a tracker whose index is set.
fn tracker(nodes: Vec<NodeInfo>, contents: &[((&str, &str), Digest)]) -> Tracker {
    let t = Tracker::default();
    {
        let mut g = t.lock();
        g.clusters.insert(
            "c".into(),
            Arc::new(ClusterIndex {
                at: Instant::now() + Duration::from_secs(3600),
                nodes,
            }),
        );
        for ((b, v), d) in contents {
            g.contents
                .entry((b.to_string(), v.to_string()))
                .or_insert_with(|| Arc::new(Contents::default()));
            let set = g.contents.get_mut(&(b.to_string(), v.to_string())).unwrap();
            Arc::get_mut(set).unwrap().files.insert(*d, vec![None]);
        }
    }
    t
}

#[tokio::test]
async fn a_node_holds_and_is_named_for_its_own_architectures_files_only() {
    use lks_proto::FileSpec;
    let amd = Arch::parse("amd64").unwrap();
    let arm = Arch::parse("arm64").unwrap();
    let f = |bytes: &[u8], arch: Option<Arch>, path: &str| FileSpec {
        path: path.parse().unwrap(),
        digest: Digest::of(bytes),
        size: bytes.len() as u64,
        mode: 0o755,
        url: None,
        chunks: None,
        arch,
    };
    let m = lks_proto::Manifest {
        name: "kubelet".into(),
        version: "1".into(),
        files: vec![
            f(b"amd", Some(amd), "/usr/bin/kubelet"),
            f(b"arm", Some(arm), "/usr/bin/kubelet"),
            f(b"conf", None, "/etc/kubelet.conf"),
        ],
        ..Default::default()
    };
    m.validate().unwrap();
    let sb = lks_proto::SignedBundle {
        manifest: m,
        signature: None,
        chunks_signature: None,
    };
    let c = Contents::of(&sb.manifest);
    let (d_amd, d_arm, d_conf) = (Digest::of(b"amd"), Digest::of(b"arm"), Digest::of(b"conf"));
    assert!(c.is_for(&d_amd, Some(amd)) && !c.is_for(&d_amd, Some(arm)));
    assert!(
        !c.is_for(&d_arm, None),
        "a node that reported no architecture gets no variant"
    );
    assert!(c.is_for(&d_conf, Some(arm)) && c.is_for(&d_conf, None));

    let mut x = info("x86", "10.0.0.1", &[("kubelet", "1")]);
    x.arch = Some(amd);
    let mut a = info("arm-1", "10.0.0.2", &[("kubelet", "1")]);
    a.arch = Some(arm);
    let b = info("arm-2", "10.0.0.3", &[]);
    let t = tracker(vec![x, a, b], &[]);
    t.lock()
        .contents
        .insert(("kubelet".into(), "1".into()), Arc::new(c));
    let store = no_store();
    let named = |a: Answer| a.peers.into_iter().map(|p| p.node).collect::<Vec<_>>();
    // The amd64 node applied the version but holds no arm64 binary.
    let got = t.find(&store, "c", "arm-2", d_arm, 7444, false).await.unwrap();
    assert_eq!(named(got), ["arm-1"]);
    let mut both = named(t.find(&store, "c", "arm-2", d_conf, 7444, false).await.unwrap());
    both.sort();
    assert_eq!(both, ["arm-1", "x86"]);
}

fn no_store() -> lks_store_sqlite::SqliteStore {
    lks_store_sqlite::SqliteStore::open_in_memory().unwrap()
}

#[tokio::test]
async fn a_batch_gets_one_seed_then_peers_and_holders_come_first_near_and_least_loaded() {
    let d = Digest::of(b"blob");
    let store = no_store();
    let nodes: Vec<NodeInfo> = (0..10)
        .map(|i| info(&format!("n{i}"), &format!("10.0.0.{i}"), &[]))
        .collect();
    let t = tracker(nodes, &[]);
    // Nobody holds it: the first fetches from the server, the rest are
    // named the nodes fetching before them (so partial), not the server.
    let a0 = t.find(&store, "c", "n0", d, 7444, false).await.unwrap();
    assert!(a0.server && a0.peers.is_empty(), "{a0:?}");
    let a1 = t.find(&store, "c", "n1", d, 7444, false).await.unwrap();
    assert!(!a1.server, "a second seed: {a1:?}");
    assert_eq!(
        a1.peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(),
        ["n0"]
    );
    let a2 = t.find(&store, "c", "n2", d, 7444, false).await.unwrap();
    assert!(!a2.server, "a second seed: {a2:?}");
    assert_eq!(a2.peers.len(), 2);
    assert!(a2.peers.iter().all(|p| !p.whole));
    // A seed asking again stays a seed.
    assert!(t.find(&store, "c", "n0", d, 7444, false).await.unwrap().server);
    // Load spreads: n3..n9 asking each get the least named first.
    let mut firsts = HashSet::new();
    for i in 3..10 {
        let a = t
            .find(&store, "c", &format!("n{i}"), d, 7444, false)
            .await
            .unwrap();
        assert!(!a.server);
        firsts.insert(a.peers[0].node.clone());
    }
    assert!(firsts.len() >= 3, "first choices spread: {firsts:?}");
    // A blamed node is named to nobody.
    t.blame("c", "n0");
    let a = t.find(&store, "c", "n5", d, 7444, false).await.unwrap();
    assert!(a.peers.iter().all(|p| p.node != "n0"), "{a:?}");
    // The seed goes away: its place is free for the next to ask.
    t.lock().clusters.insert(
        "c".into(),
        Arc::new(ClusterIndex {
            at: Instant::now() + Duration::from_secs(3600),
            nodes: (0..10)
                .map(|i| NodeInfo {
                    connected: i != 0,
                    ..info(&format!("n{i}"), &format!("10.0.0.{i}"), &[])
                })
                .collect(),
        }),
    );
    assert!(t.find(&store, "c", "n7", d, 7444, false).await.unwrap().server);
}

#[tokio::test]
async fn whole_holders_end_server_fetches_and_the_near_ones_come_first() {
    let d = Digest::of(b"blob");
    let store = no_store();
    let mut nodes = vec![
        info("far", "10.9.9.9", &[("k", "1")]),
        info("near", "10.0.0.7", &[("k", "1")]),
        info("me", "10.0.0.1", &[]),
        info("other-version", "10.0.0.8", &[("k", "0")]),
    ];
    nodes.push(NodeInfo {
        connected: false,
        ..info("gone", "10.0.0.9", &[("k", "1")])
    });
    let t = tracker(nodes, &[(("k", "1"), d), (("k", "0"), Digest::of(b"old"))]);
    let a = t.find(&store, "c", "me", d, 7444, false).await.unwrap();
    assert!(!a.server, "someone holds it whole: {a:?}");
    let names: Vec<_> = a.peers.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(
        names,
        ["near", "far"],
        "near first; not the disconnected or the other version"
    );
    assert!(a.peers.iter().all(|p| p.whole));
    assert_eq!(a.peers[0].address, "10.0.0.7:7444".parse().unwrap());
    // A report from another cluster changes nothing here; one from
    // this cluster does.
    t.blame("other", "near");
    let a = t.find(&store, "c", "me", d, 7444, false).await.unwrap();
    assert_eq!(a.peers.len(), 2, "{a:?}");
    t.blame("c", "near");
    let a = t.find(&store, "c", "me", d, 7444, false).await.unwrap();
    assert_eq!(
        a.peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(),
        ["far"]
    );
}

#[tokio::test]
async fn a_patch_has_one_seed_and_its_askers_are_named_as_holders_once_they_stop_asking() {
    let p = Digest::of(b"patch");
    let store = no_store();
    let nodes: Vec<NodeInfo> = (0..4)
        .map(|i| info(&format!("n{i}"), &format!("10.0.0.{i}"), &[("k", "2")]))
        .collect();
    // The nodes applied the version the patch rebuilds a file of: that
    // does not make them holders of the patch.
    let t = tracker(nodes, &[(("k", "2"), Digest::of(b"file"))]);
    let a0 = t.find(&store, "c", "n0", p, 7444, true).await.unwrap();
    assert!(a0.server && a0.peers.is_empty(), "{a0:?}");
    let a1 = t.find(&store, "c", "n1", p, 7444, true).await.unwrap();
    assert!(!a1.server, "one seed: {a1:?}");
    assert_eq!(
        a1.peers
            .iter()
            .map(|p| (p.node.as_str(), p.whole))
            .collect::<Vec<_>>(),
        [("n0", false)]
    );
    // Long after they asked, the askers are named as holding it whole,
    // and a node asking now takes it from them, not from the server.
    {
        let mut g = t.lock();
        for asked in g.fetching.values_mut().flat_map(|m| m.values_mut()) {
            asked.0 -= FETCHING_TTL * 2;
        }
    }
    assert!(
        t.lock().fetchers_of("c", p).is_empty(),
        "not told to other replicas as fetching"
    );
    let a2 = t.find(&store, "c", "n2", p, 7444, true).await.unwrap();
    assert!(!a2.server, "{a2:?}");
    let mut held: Vec<_> = a2.peers.iter().map(|p| (p.node.as_str(), p.whole)).collect();
    held.sort();
    assert_eq!(held, [("n0", true), ("n1", true)]);
}

/// Two trackers on one etcd, as two replicas; both know the same 10 nodes.
async fn two_replicas(etcd: &lks_store_etcd::testing::TestEtcd) -> (Tracker, Tracker) {
    let nodes = || {
        (0..10)
            .map(|i| info(&format!("n{i}"), &format!("10.0.0.{i}"), &[]))
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for r in ["r1", "r2"] {
        let t = Tracker::new(Some(etcd.store(r).await));
        let plain = tracker(nodes(), &[]);
        let ix = plain.lock().clusters.get("c").cloned().unwrap();
        t.lock().clusters.insert("c".into(), ix);
        out.push(t);
    }
    let r2 = out.pop().unwrap();
    (out.pop().unwrap(), r2)
}

#[tokio::test]
async fn a_short_answer_reads_the_other_replicas_fetchers_fresher() {
    let etcd = lks_store_etcd::testing::TestEtcd::start_with(|| lks_e2e::free_addr().port());
    let (r1, r2) = two_replicas(&etcd).await;
    let store = no_store();
    let d = Digest::of(b"blob");
    let names = |a: &Answer| {
        let mut v: Vec<String> = a.peers.iter().map(|p| p.node.clone()).collect();
        v.sort();
        v
    };
    // n0 seeds through r1; n1 on r2 is told of it (the seed claim read).
    assert!(r1.find(&store, "c", "n0", d, 7444, false).await.unwrap().server);
    let a1 = r2.find(&store, "c", "n1", d, 7444, false).await.unwrap();
    assert!(!a1.server);
    assert_eq!(names(&a1), ["n0"]);
    // Meanwhile n2 and n3 start through r1.
    for n in ["n2", "n3"] {
        r1.find(&store, "c", n, d, 7444, false).await.unwrap();
    }
    // Within a second of r2's last read, a full answer would have used
    // what it read then; a short one reads again once that is older than
    // REMOTE_FRESH, so n4 is told of n2 and n3 at once.
    tokio::time::sleep(ledger::REMOTE_FRESH + Duration::from_millis(50)).await;
    assert!(ledger::REMOTE_FRESH + Duration::from_millis(50) < ledger::REMOTE_TTL);
    let a4 = r2.find(&store, "c", "n4", d, 7444, false).await.unwrap();
    assert!(!a4.server);
    assert_eq!(names(&a4), ["n0", "n1", "n2", "n3"]);
}
