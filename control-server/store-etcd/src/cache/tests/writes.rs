//! Writes through the copy: last-seen times from `heard/ID`, the settling
//! of a gone replica, and status batches computed from the copy.

use super::*;

use lks_proto::BundleState;

use lks_store::{BundleStatusRow, NodeStatusStore, NodeStore};

#[tokio::test]
async fn last_seen_comes_from_the_replicas_heard_times_in_the_copy_and_a_gone_one_is_settled_from_it() {
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    // Replica r2 holds n1 and n2 and last heard one of them at 900.
    let r2 = etcd.store("r2").await;
    let r2_lease = *r2.lease.lock().unwrap();
    r2.node_connected("n1", "{}", Vec::new(), 500).await.unwrap();
    r2.node_connected("n2", "{}", Vec::new(), 500).await.unwrap();
    r2.touch_nodes(vec![("n2".into(), 900)]).await.unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    let seen = |c: &CacheState, n: &str| {
        let live = c.liveness();
        let d = c.node(n).unwrap();
        (live.connected(d), live.last_seen(n, d))
    };
    {
        let c = s.cache.state.read().unwrap();
        assert_eq!(c.heard.get("r2"), Some(&900));
        assert_eq!(seen(&c, "n1"), (true, 900));
        assert_eq!(seen(&c, "n0"), (false, 0));
    }
    assert_eq!(
        s.list_nodes(None).await.unwrap(),
        s.nodes_from_etcd(None).await.unwrap()
    );
    // r2 dies hard; SETTLE_AFTER later the leader settles its nodes from
    // the copy (no range of the region's nodes) and its document goes.
    r2.client.lease_client().revoke(r2_lease).await.unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    assert_eq!(seen(&s.cache.state.read().unwrap(), "n1"), (false, 900));
    let ranges = || reads_of("range", "nodes");
    let before = ranges();
    let later = 900 + crate::SETTLE_AFTER.as_millis() as i64;
    assert_eq!(
        s.settle_gone_replicas(later, crate::SETTLE_AFTER).await.unwrap(),
        1
    );
    assert_eq!(ranges(), before, "the nodes to settle came from the copy");
    wait_rev(&s, current_rev(&s).await).await;
    {
        let c = s.cache.state.read().unwrap();
        assert!(c.heard.is_empty());
        assert_eq!(seen(&c, "n1"), (false, 900));
        assert_eq!(seen(&c, "n2"), (false, 900));
        assert!(c.node("n1").unwrap().replica.is_empty());
    }
    assert_eq!(
        s.list_nodes(None).await.unwrap(),
        s.nodes_from_etcd(None).await.unwrap()
    );
    cancel.cancel();
    task.await.unwrap();
}

#[test]
fn heard_times_are_applied_and_forgotten() {
    let mut c = CacheState::default();
    c.apply("heard/r1", Some(br#"{"at_ms":42}"#), 3).unwrap();
    assert_eq!(c.heard.get("r1"), Some(&42));
    assert!(c.apply("heard/r1", Some(b"[]"), 4).is_err(), "unreadable");
    c.apply("heard/r1", None, 5).unwrap();
    assert!(c.heard.is_empty());
}

fn applied(version: &str) -> BundleStatusRow {
    BundleStatusRow {
        name: "k".into(),
        version: version.into(),
        state: BundleState::Applied,
        message: String::new(),
        updated_at_ms: 7,
        generation: 1,
        fetched_from_server: 0,
        fetched_from_peers: 0,
        fetched_as_delta: 0,
    }
}

#[tokio::test]
async fn a_status_batch_takes_its_documents_from_the_copy_and_a_stale_one_costs_a_retry_not_a_loss() {
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    let other = etcd.store("r2").await;
    let gets = || reads_of("get", "nodes");
    s.node_connected("n1", "{}", Vec::new(), 10).await.unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    // The copy holds the Hello this replica wrote: the report's batch
    // reads nothing from etcd.
    let g0 = gets();
    s.record_status("n1", vec![applied("1")]).await.unwrap();
    assert_eq!(gets(), g0, "from the copy");
    assert_eq!(
        other.get_node("n1").await.unwrap().unwrap().actual["k"].version,
        "1"
    );
    // Right after its own write, before the copy holds it, a report of
    // the same node is not computed from the copy's older document.
    s.record_status("n1", vec![applied("2")]).await.unwrap();
    s.record_status("n1", vec![applied("3")]).await.unwrap();
    assert_eq!(
        other.get_node("n1").await.unwrap().unwrap().actual["k"].version,
        "3"
    );
    // Another replica changes the document; this replica's copy is made to
    // lag (the document as it was): the batch's compare fails, the same
    // round trip reads the document, and the retry keeps both changes.
    wait_rev(&s, current_rev(&s).await).await;
    let (before, rev) = s.get_bytes("nodes/n1").await.unwrap().unwrap();
    let serial = other.get_node("n1").await.unwrap().unwrap().cert_serial;
    other.replace_cert_serial("n1", &serial, "renewed").await.unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    s.cache
        .state
        .write()
        .unwrap()
        .apply("nodes/n1", Some(&before), rev)
        .unwrap();
    s.record_status("n1", vec![applied("4")]).await.unwrap();
    let n = other.get_node("n1").await.unwrap().unwrap();
    assert_eq!(
        (n.cert_serial.as_str(), n.actual["k"].version.as_str()),
        ("renewed", "4")
    );
    assert!(n.connected, "the Hello's replica kept");
    // A node enrolled a moment ago that the copy does not hold yet: its
    // Hello is written all the same (read from etcd), not taken for a
    // deleted node's.
    other
        .enroll_node(crate::tests::new_node("fresh", "tok000"))
        .await
        .unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    let rev = current_rev(&s).await;
    s.cache
        .state
        .write()
        .unwrap()
        .apply("nodes/fresh", None, rev)
        .unwrap();
    s.node_connected("fresh", "{}", Vec::new(), 20).await.unwrap();
    assert!(
        other.get_node("fresh").await.unwrap().unwrap().connected,
        "recorded"
    );
    cancel.cancel();
    task.await.unwrap();
}
