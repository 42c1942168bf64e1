//! Tests of the etcd store that need more than one aggregate, and the
//! throwaway etcd they run on (also used by other modules' tests).

use super::*;

use lks_proto::labels::Labels;

use lks_store::{
    BundleStore, ClusterRow, ClusterStore, DesiredStore, Dump, EventFilter, EventRow, EventStore,
    IssuedCertRow, Kind, NewCluster, NewNode, NewRollout, NodeState, NodeStatusStore, NodeStore,
    PeerSettings, ReleaseStore, RolloutCommit, RolloutStore, StoredCa, StoredRelease, StoredRoot,
    TargetChange, TokenRefusal, TokenRow, TokenStore, Unreadable,
};

use crate::docs::{BundleDoc, ClusterDoc};
pub(crate) use crate::testing::TestEtcd;

impl TestEtcd {
    /// [`TestEtcd::start_with`] on ports the end-to-end harness picks.
    pub(crate) fn start() -> TestEtcd {
        TestEtcd::start_with(|| lks_e2e::free_addr().port())
    }
}
use lks_store::conformance;

// Every conformance case against a throwaway etcd of its own.
conformance::conformance_suite!({
    let etcd = TestEtcd::start();
    let store = etcd.store("r1").await;
    (etcd, store)
});

impl conformance::WriteStored for EtcdStore {
    async fn write_stored_bundle(&self, name: &str, version: &str, bytes: &[u8], digest: &str) {
        let key = self.key(&format!("bundles/{name}/{version}"));
        let mut doc = self.get::<BundleDoc>(&key).await.unwrap().value.unwrap();
        doc.signed_bundle = hex::encode(bytes);
        doc.manifest_digest = digest.into();
        kv_of(&self.client)
            .put(key, json(&doc).unwrap(), None)
            .await
            .unwrap();
    }
}

#[test]
fn the_prefix_ends_with_a_slash() {
    let cfg = |p: &str| EtcdConfig {
        prefix: p.into(),
        ..Default::default()
    };
    assert_eq!(cfg("/lks").normalized_prefix(), "/lks/");
    assert_eq!(cfg("/lks/").normalized_prefix(), "/lks/");
}

/// Sealed values stay bound to the same bytes as before the store owned
/// them (the key and the field): a key sealed by an older server opens.
#[tokio::test]
async fn sealed_values_are_bound_to_their_key_and_field() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    let p = s.prefix().to_string();
    assert_eq!(
        s.sealed_aad("a", lks_store::SealedField::CaKey),
        format!("{p}clusters/a#ca_key").into_bytes()
    );
    assert_eq!(
        s.sealed_aad("a", lks_store::SealedField::Kubeconfig),
        format!("{p}clusterkube/a#kubeconfig").into_bytes()
    );
}

/// A bundle document whose bundle is not hex reads as corrupt too.
#[tokio::test]
async fn a_bundle_document_that_is_not_hex_is_corrupt() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    s.put_bundle(conformance::bundle("k", "1", "d1")).await.unwrap();
    let key = s.key("bundles/k/1");
    let mut doc = s.get::<BundleDoc>(&key).await.unwrap().value.unwrap();
    doc.signed_bundle = "not hex".into();
    kv_of(&s.client)
        .put(key, json(&doc).unwrap(), None)
        .await
        .unwrap();
    assert!(matches!(
        s.get_bundle("k", "1").await,
        Err(StoreError::Corrupt {
            kind: Kind::Bundle,
            why: Unreadable::Hex(_),
            ..
        })
    ));
}

pub(crate) fn token(id: &str, uses: Option<u32>) -> TokenRow {
    TokenRow {
        id: id.into(),
        secret_hash: [7; 32],
        cluster: "c".into(),
        expires_at_ms: i64::MAX,
        remaining_uses: uses,
        labels: Labels::new(),
        created_at_ms: 0,
    }
}

pub(crate) fn new_node(name: &str, tok: &str) -> NewNode {
    NewNode {
        name: name.into(),
        cluster: "c".into(),
        labels: Labels::new(),
        cert_serial: format!("s-{name}"),
        key_hash: String::new(),
        token_id: tok.into(),
        now_ms: 1,
    }
}

/// A range larger than gRPC's default 4 MiB message (every node
/// document of a 10,000-node fleet is ~5.5 MiB) is read whole.
#[tokio::test]
async fn ranges_larger_than_four_mib_are_read() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    // etcd takes requests up to 1.5 MiB: six documents of 1 MiB each.
    let doc = serde_json::to_string(&"x".repeat(1 << 20)).unwrap();
    for i in 0..6 {
        kv_of(&s.client)
            .put(s.key(&format!("big/{i}")), doc.clone(), None)
            .await
            .unwrap();
    }
    let got: Vec<(String, String, i64)> = s.range(&s.key("big/")).await.unwrap();
    assert_eq!(got.len(), 6);
    assert!(got.iter().all(|(_, v, _)| v.len() == 1 << 20));
}

#[tokio::test]
async fn a_decision_larger_than_one_transaction_is_stored_in_consistent_steps() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    s.create_token(token("tok000", None)).await.unwrap();
    let n = rollouts::ROWS_PER_TXN * 2 + 30;
    for i in 0..n {
        s.enroll_node(new_node(&format!("n{i:04}"), "tok000"))
            .await
            .unwrap();
    }
    s.put_bundle(conformance::bundle("b", "1", "d1")).await.unwrap();
    let r = s
        .start_rollout(NewRollout {
            id: "r".into(),
            cluster: "c".into(),
            bundle: "b".into(),
            version: "1".into(),
            selector: Labels::new(),
            batch_size: n as u32,
            failure_threshold: 1,
            offline_deadline_ms: 1000,
            policy: Default::default(),
            started_by: String::new(),
            now_ms: 3,
        })
        .await
        .unwrap();
    assert_eq!(r.nodes.len(), n);
    let mut next = r.clone();
    for x in &mut next.nodes {
        x.state = NodeState::Applying;
        x.touched = true;
    }
    let assign = next
        .nodes
        .iter()
        .map(|x| (x.name.clone(), Some("1".to_string())))
        .collect();
    let (stored, changed) = s
        .commit_rollout(RolloutCommit {
            rollout: next,
            assign,
            target: TargetChange::Keep,
            events: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(changed.len(), n);
    assert_eq!(stored.revision, 3, "three transactions: 60 + 60 + the rest");
    assert!(
        stored
            .nodes
            .iter()
            .all(|x| x.state == NodeState::Applying && x.generation > 0)
    );
    for x in &stored.nodes {
        let d = s.desired_state(&x.name).await.unwrap();
        assert_eq!(d.generation, x.generation);
        assert_eq!(d.bundles, vec![conformance::encoded("b", "1", "d1")]);
    }
    // A decision based on the old revision is refused.
    let e = s
        .commit_rollout(RolloutCommit {
            rollout: r,
            assign: Vec::new(),
            target: TargetChange::Keep,
            events: Vec::new(),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
}

#[tokio::test]
async fn connection_state_follows_the_replica_lease() {
    let etcd = TestEtcd::start();
    let a = etcd.store("ra").await;
    a.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    a.create_token(token("tok000", None)).await.unwrap();
    a.enroll_node(new_node("n1", "tok000")).await.unwrap();
    a.enroll_node(new_node("n2", "tok000")).await.unwrap();
    // Replica ra (registered under its lease) holds n1's and n2's streams.
    let id = *a.lease.lock().unwrap();
    let mut lease = a.client.lease_client();
    a.node_connected("n1", "{}", Vec::new(), 500).await.unwrap();
    a.node_connected("n2", "{}", Vec::new(), 500).await.unwrap();
    a.touch_nodes(vec![("n1".into(), 900)]).await.unwrap();
    let b = etcd.store("rb").await;
    let n = b.get_node("n1").await.unwrap().unwrap();
    assert!(n.connected, "seen from another replica");
    assert_eq!(n.last_seen_ms, 900, "batched last-seen");
    // Every node on ra was seen when ra last heard one of them: one small
    // document for the replica, no time per node.
    assert_eq!(b.get_node("n2").await.unwrap().unwrap().last_seen_ms, 900);
    let (doc, _) = b.get_bytes("heard/ra").await.unwrap().unwrap();
    assert_eq!(doc, br#"{"at_ms":900}"#);
    // Nothing heard since: nothing written.
    a.touch_nodes(Vec::new()).await.unwrap();
    a.touch_nodes(vec![("n1".into(), 800)]).await.unwrap();
    let (_, rev) = b.get_bytes("heard/ra").await.unwrap().unwrap();
    a.touch_nodes(Vec::new()).await.unwrap();
    assert_eq!(b.get_bytes("heard/ra").await.unwrap().unwrap().1, rev);
    // A disconnect reported by another replica does not touch ra's stream.
    b.node_disconnected("n1", 950).await.unwrap();
    assert!(b.get_node("n1").await.unwrap().unwrap().connected);
    // ra dies: its lease goes, and with it the nodes' connection; the time
    // it last heard them stays.
    lease.revoke(id).await.unwrap();
    let n = b.get_node("n1").await.unwrap().unwrap();
    assert!(!n.connected);
    assert_eq!(n.last_seen_ms, 900, "last-seen survives its replica");
    // n2 comes back on rb; n1 does not.
    b.node_connected("n2", "{}", Vec::new(), 2000).await.unwrap();
    // Before SETTLE_AFTER has passed since ra last heard them, nothing is
    // settled: ra may only have lost etcd for a while.
    let after = super::SETTLE_AFTER;
    let soon = 900 + after.as_millis() as i64 - 1;
    assert_eq!(b.settle_gone_replicas(soon, after).await.unwrap(), 0);
    assert!(b.get_bytes("heard/ra").await.unwrap().is_some());
    // After it: n1's document gets the time and names no replica, and
    // ra's document goes.
    assert_eq!(b.settle_gone_replicas(soon + 1, after).await.unwrap(), 1);
    assert!(b.get_bytes("heard/ra").await.unwrap().is_none());
    let n = b.get_node("n1").await.unwrap().unwrap();
    assert_eq!((n.connected, n.last_seen_ms), (false, 900));
    let (doc, _) = b.get_bytes("nodes/n1").await.unwrap().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&doc).unwrap();
    assert_eq!(
        (doc["replica"].as_str(), doc["last_seen_ms"].as_i64()),
        (Some(""), Some(900))
    );
    let n = b.get_node("n2").await.unwrap().unwrap();
    assert!(n.connected && n.last_seen_ms == 2000, "n2 is rb's now");
    // A live replica's document is never settled.
    b.touch_nodes(vec![("n2".into(), 2100)]).await.unwrap();
    assert_eq!(b.settle_gone_replicas(10_000_000, after).await.unwrap(), 0);
    assert!(b.get_bytes("heard/rb").await.unwrap().is_some());
}

#[tokio::test]
async fn last_seen_documents_of_the_version_before_are_read_then_folded_away() {
    let etcd = TestEtcd::start();
    let s = etcd.store("rb").await;
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    s.create_token(token("tok000", None)).await.unwrap();
    s.enroll_node(new_node("n1", "tok000")).await.unwrap();
    s.enroll_node(new_node("n2", "tok000")).await.unwrap();
    // A replica of the version before wrote one time per node, then died
    // hard; its document names a node deleted since as well.
    let mut kv = s.client.kv_client();
    kv.put(
        s.key("seen/old"),
        br#"{"n1":5000,"n2":100,"gone":7000}"#.to_vec(),
        None,
    )
    .await
    .unwrap();
    s.node_connected("n2", "{}", Vec::new(), 3000).await.unwrap();
    let seen = async |n: &str| s.get_node(n).await.unwrap().unwrap().last_seen_ms;
    assert_eq!((seen("n1").await, seen("n2").await), (5000, 3000), "read");
    // Its replica is gone: the times go into the node documents (no wait,
    // nothing names it) and the document is deleted.
    let settle = async || s.settle_gone_replicas(6000, super::SETTLE_AFTER).await.unwrap();
    assert_eq!(settle().await, 1);
    assert!(s.get_bytes("seen/old").await.unwrap().is_none());
    assert_eq!((seen("n1").await, seen("n2").await), (5000, 3000), "kept");
    assert_eq!(settle().await, 0);
}

/// Event `i` of cluster `c`, at 1000 + `i` ms, saying "e`i`".
fn numbered_event(i: i64) -> EventRow {
    EventRow {
        id: 0,
        at_ms: 1000 + i,
        cluster: "c".into(),
        node: String::new(),
        rollout_id: String::new(),
        kind: "k".into(),
        bundle: String::new(),
        version: String::new(),
        message: format!("e{i}"),
    }
}

#[tokio::test]
async fn the_oldest_events_are_pruned_and_the_newest_kept() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    for i in 0..5 {
        s.add_event(numbered_event(i)).await.unwrap();
    }
    assert_eq!(s.prune_events_to(3).await.unwrap(), 2);
    assert_eq!(s.prune_events_to(3).await.unwrap(), 0);
    let left = s.list_events(EventFilter::default()).await.unwrap();
    let msgs: Vec<&str> = left.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(msgs, ["e2", "e3", "e4"], "oldest first, the newest three kept");
    let two = s
        .list_events(EventFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        two.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        ["e3", "e4"]
    );
}

#[tokio::test]
async fn events_stored_under_the_old_prefix_are_listed_and_pruned_first() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    let ev = numbered_event;
    // Two documents of the version before, under `events/`.
    let mut kv = s.client.kv_client();
    for i in 0..2 {
        let doc = serde_json::to_vec(&[super::events::EventDoc::from_row(&ev(i))]).unwrap();
        kv.put(s.key(&format!("events/{:016}-x", 1000 + i)), doc, None)
            .await
            .unwrap();
    }
    for i in 2..5 {
        s.add_event(ev(i)).await.unwrap();
    }
    assert!(s.get_bytes("events/0000000000001000-x").await.unwrap().is_some());
    let msgs = |v: Vec<EventRow>| v.into_iter().map(|e| e.message).collect::<Vec<_>>();
    let all = s.list_events(EventFilter::default()).await.unwrap();
    assert_eq!(
        msgs(all),
        ["e0", "e1", "e2", "e3", "e4"],
        "both prefixes, in order"
    );
    let newest = s
        .list_events(EventFilter {
            limit: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(msgs(newest), ["e2", "e3", "e4"]);
    // New documents are not under `events/`, which the replicas watch.
    assert_eq!(s.keys(&s.key("events/")).await.unwrap().len(), 2);
    // The old ones go first, all of them, then the oldest new one.
    assert_eq!(s.prune_events_to(2).await.unwrap(), 3);
    assert!(s.keys(&s.key("events/")).await.unwrap().is_empty());
    let left = s.list_events(EventFilter::default()).await.unwrap();
    assert_eq!(msgs(left), ["e3", "e4"]);
}

#[tokio::test]
async fn a_boot_storm_on_one_token_enrols_every_node_once() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    s.create_token(token("tok064", Some(64))).await.unwrap();
    let tasks: Vec<_> = (0..72)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.enroll_node(new_node(&format!("n{i:02}"), "tok064")).await })
        })
        .collect();
    let mut ok = 0;
    let mut used_up = 0;
    let mut generations = BTreeSet::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(g) => {
                ok += 1;
                generations.insert(g);
            }
            Err(StoreError::Token(TokenRefusal::UsedUp)) => used_up += 1,
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    assert_eq!((ok, used_up), (64, 8), "every use taken exactly once");
    assert_eq!(s.list_nodes(Some("c")).await.unwrap().len(), 64);
    assert_eq!(
        s.get_token("tok064").await.unwrap().unwrap().remaining_uses,
        Some(0)
    );
    assert!(generations.iter().all(|g| *g > 0));
}

#[tokio::test]
async fn generations_rise_per_node_and_respect_a_migrated_floor() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    // As migrate leaves it: generations up to 5000 were handed out.
    s.put_bytes("meta/generation", b"5000".to_vec()).await.unwrap();
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    s.create_token(token("tok000", None)).await.unwrap();
    let g1 = s.enroll_node(new_node("n1", "tok000")).await.unwrap();
    assert!(g1 > 5000, "{g1}");
    // Deleted and enrolled again: still higher than before.
    assert!(s.delete_node("n1").await.unwrap());
    let g2 = s.enroll_node(new_node("n1", "tok000")).await.unwrap();
    assert!(g2 > g1, "{g2} > {g1}");
}

#[test]
fn a_cluster_document_from_before_peer_sharing_reads_the_defaults() {
    let doc: ClusterDoc =
        serde_json::from_str(r#"{"created_at_ms":1,"api_server":"https://k:6443"}"#).unwrap();
    let row = doc.into_row("old", 0);
    assert_eq!(row.peer, PeerSettings::default());
    assert_eq!(row.api_server.as_deref(), Some("https://k:6443"));
}

#[tokio::test]
async fn an_imported_dump_carries_cluster_cas_api_servers_peer_settings_and_certificates() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    let ca = StoredCa {
        cert_pem: "cert".into(),
        key: "sealed".into(),
    };
    let cert = IssuedCertRow {
        cluster: "a".into(),
        node: "n1".into(),
        serial: "0a".into(),
        profile: "kubelet-client".into(),
        bundle: "k".into(),
        version: "1".into(),
        path: "/p".into(),
        not_before_ms: 1,
        not_after_ms: 2,
        issued_at_ms: 1,
    };
    let d = Dump {
        clusters: vec![
            ClusterRow {
                peer: PeerSettings {
                    enabled: true,
                    port: 7555,
                    upload_rate: 1 << 20,
                    max_uploads: 8,
                },
                ..NewCluster {
                    api_server: Some("https://a.example:6443".into()),
                    ..NewCluster::new("a", 1)
                }
                .row()
            },
            NewCluster::new("b", 1).row(),
        ],
        cluster_cas: vec![("a".into(), ca.clone())],
        certificates: vec![cert.clone()],
        ..Default::default()
    };
    s.import(&d).await.unwrap();
    assert_eq!(s.cluster_ca("a").await.unwrap(), Some(ca));
    assert_eq!(s.cluster_ca("b").await.unwrap(), None);
    let a = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(a.api_server.as_deref(), Some("https://a.example:6443"));
    assert_eq!(a.ca_cert_pem.as_deref(), Some("cert"));
    assert_eq!((a.peer.enabled, a.peer.port, a.peer.max_uploads), (true, 7555, 8));
    let b = s.get_cluster("b").await.unwrap().unwrap();
    assert_eq!(b.peer, PeerSettings::default());
    assert_eq!(s.list_certificates(Some("a"), None).await.unwrap(), [cert]);
}

#[tokio::test]
async fn a_migrated_dump_carries_releases_and_roots() {
    use std::collections::BTreeMap;

    use lks_proto::release::{Release, SignedRelease, SignedRoot, TrustRoot};
    use lks_proto::sign::SigningKey;

    let sqlite = lks_store_sqlite::SqliteStore::open_in_memory().unwrap();
    sqlite.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    let k = SigningKey::generate();
    for v in [1, 4] {
        let r = SignedRelease::sign(
            Release {
                channel: "a".into(),
                version: v,
                expires_at_ms: 9,
                bundles: BTreeMap::new(),
            },
            &[&k],
        );
        sqlite
            .put_release(StoredRelease::new(r), v as i64 * 10)
            .await
            .unwrap();
    }
    let root = SignedRoot::sign(
        TrustRoot {
            version: 2,
            keys: vec![k.public()],
            threshold: 1,
            expires_at_ms: 0,
        },
        &[&k],
    );
    sqlite.put_root("a", StoredRoot::new(root), 50).await.unwrap();
    let d = sqlite.dump().await.unwrap();
    assert_eq!(
        d.releases.iter().map(|r| r.release.version()).collect::<Vec<_>>(),
        [1, 4],
        "oldest first, so an import stores them in order"
    );

    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    s.import(&d).await.unwrap();
    assert_eq!(
        s.list_releases("a", 0).await.unwrap(),
        sqlite.list_releases("a", 0).await.unwrap()
    );
    assert_eq!(
        s.list_roots("a").await.unwrap(),
        sqlite.list_roots("a").await.unwrap()
    );
}

#[tokio::test]
async fn a_migrated_dump_carries_plans_and_cluster_labels() {
    use lks_store::{EventRow, PlanStore};

    let sqlite = lks_store_sqlite::SqliteStore::open_in_memory().unwrap();
    sqlite.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    let labels: lks_proto::labels::Labels = [("tier".to_string(), "early".to_string())].into();
    let event = |kind: &str| EventRow::bundle(kind, "k", "2", String::new(), 1);
    sqlite
        .set_cluster_labels("a", labels.clone(), event("cluster_labels"))
        .await
        .unwrap();
    let plan = sqlite
        .create_plan(lks_store::conformance::plan("p"), event("plan_created"))
        .await
        .unwrap();
    let d = sqlite.dump().await.unwrap();
    assert_eq!(d.plans.len(), 1);

    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    s.import(&d).await.unwrap();
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().labels, labels);
    let moved = s.get_plan("p").await.unwrap().unwrap();
    assert_eq!(
        lks_store::PlanRow {
            revision: 0,
            ..moved.clone()
        },
        lks_store::PlanRow { revision: 0, ..plan },
        "the plan as it was, its revision etcd's"
    );
    assert!(moved.revision > 0);
    // The moved plan is written on its new revision.
    s.update_plan(moved, Vec::new()).await.unwrap();
}

#[tokio::test]
async fn an_older_replica_is_named_until_it_is_gone() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    // r1 registered as a release before the contract ("{}"): format 0.
    let o = s.older_replica(1).await.unwrap().unwrap();
    assert_eq!((o.replica.as_str(), o.format, o.release.as_str()), ("r1", 0, ""));
    assert_eq!(s.older_replica(0).await.unwrap(), None);
    let put = |id: &str, doc: serde_json::Value| {
        let s = s.clone();
        let id = id.to_string();
        async move {
            s.client
                .kv_client()
                .put(s.key(&format!("replicas/{id}")), doc.to_string(), None)
                .await
                .unwrap();
        }
    };
    let now = |f: u32| serde_json::json!({"url": "https://x", "started_at_ms": 1, "release": "0.1.0", "store_format": f});
    put("r1", now(lks_store::STORE_FORMAT)).await;
    put("r2", now(lks_store::STORE_FORMAT)).await;
    assert_eq!(s.older_replica(lks_store::STORE_FORMAT).await.unwrap(), None);
    put("r3", serde_json::json!({"url": "https://y", "started_at_ms": 1})).await;
    let o = s.older_replica(lks_store::STORE_FORMAT).await.unwrap().unwrap();
    assert_eq!(o.replica, "r3");
    s.client
        .kv_client()
        .delete(s.key("replicas/r3"), None)
        .await
        .unwrap();
    assert_eq!(s.older_replica(lks_store::STORE_FORMAT).await.unwrap(), None);
}
