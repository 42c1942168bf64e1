//! Tests of `cache.rs`.

use super::*;

use lks_store::{
    BundleStore, ClusterStore, DesiredStore, NewCluster, NewNode, NodeState, NodeStatusStore, NodeStore,
    RolloutState, RolloutStore, TargetChange, TokenRow, TokenStore,
};

use crate::json;
use crate::tests::TestEtcd;
use std::sync::Mutex;

mod node_docs;
mod writes;

/// The copy's answer for every node next to etcd's own.
async fn same_as_etcd(s: &EtcdStore) {
    let (cached, rev) = {
        let c = s.cache.state.read().unwrap();
        let mut v: Vec<(String, Option<String>, bool)> = c
            .nodes()
            .map(|(n, d)| {
                let desired = c.desired(n).and_then(|d| d.bundles.get("k").map(String::from));
                (n.to_string(), desired, c.liveness().connected(d))
            })
            .collect();
        v.sort();
        (v, c.rev)
    };
    assert!(rev > 0, "loaded");
    let mut direct: Vec<(String, Option<String>, bool)> = s
        .nodes_from_etcd(None)
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.name.clone(), n.desired.get("k").cloned(), n.connected))
        .collect();
    direct.sort();
    assert_eq!(cached, direct);
}

/// How many reads of `kind` ("range", "get", "watch") under key prefix
/// `prefix` this process made of etcd so far.
fn reads_of(kind: &str, prefix: &str) -> u64 {
    reads::snapshot()
        .iter()
        .find(|r| r.0 == kind && r.1 == prefix)
        .map_or(0, |r| r.2)
}

async fn wait_rev(s: &EtcdStore, at_least: i64) {
    let mut rx = s.cache.rev.subscribe();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&r| r >= at_least))
        .await
        .expect("the copy catches up")
        .unwrap();
}

async fn current_rev(s: &EtcdStore) -> i64 {
    let mut kv = crate::kv_of(&s.client);
    kv.get("x", None).await.unwrap().header().unwrap().revision()
}

/// A store with cluster `c` and nodes n0 … n(count-1) enrolled.
async fn store_with_nodes(etcd: &TestEtcd, count: usize) -> EtcdStore {
    let s = etcd.store("r1").await;
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    s.create_token(super::super::tests::token("tok000", None))
        .await
        .unwrap();
    for i in 0..count {
        s.enroll_node(super::super::tests::new_node(&format!("n{i}"), "tok000"))
            .await
            .unwrap();
    }
    s
}

/// [`store_with_nodes`] with bundle k@1 published and the watch running
/// with its copy loaded; cancel the token and await the task to stop it.
async fn watched_with_bundle(
    etcd: &TestEtcd,
    count: usize,
) -> (EtcdStore, CancellationToken, tokio::task::JoinHandle<()>) {
    let s = store_with_nodes(etcd, count).await;
    s.put_bundle(lks_store::conformance::bundle("k", "1", "d1"))
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let task = {
        let (s, cancel) = (s.clone(), cancel.clone());
        tokio::spawn(async move { s.watch_changes(&cancel, |_| {}).await })
    };
    wait_rev(&s, 1).await;
    (s, cancel, task)
}

/// The rollout's first decision, through `s`: n0 gets version 1.
async fn assign_n0(s: &EtcdStore, r: &RolloutRow) {
    let mut next = r.clone();
    next.nodes[0].state = NodeState::Applying;
    next.nodes[0].touched = true;
    s.commit_rollout(lks_store::conformance::commit(
        &next,
        &[("n0", Some("1"))],
        TargetChange::Keep,
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_follows_etcd_through_a_compaction_and_mends_a_missed_event() {
    let etcd = TestEtcd::start();
    let s = store_with_nodes(&etcd, 5).await;
    let cancel = CancellationToken::new();
    let changes = Arc::new(Mutex::new(Vec::<String>::new()));
    let task = {
        let (s, cancel, changes) = (s.clone(), cancel.clone(), changes.clone());
        tokio::spawn(async move {
            s.watch_changes(&cancel, |c| changes.lock().unwrap().push(format!("{c:?}")))
                .await;
        })
    };
    wait_rev(&s, 1).await;
    same_as_etcd(&s).await;
    assert_eq!(changes.lock().unwrap()[0], "Resync");

    // Changes through another replica reach the copy.
    let other = etcd.store("r2").await;
    other.node_connected("n1", "{}", Vec::new(), 10).await.unwrap();
    other.delete_node("n2").await.unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    same_as_etcd(&s).await;
    assert!(
        changes
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.contains("\"n2\", deleted: true"))
    );

    // A view read holds this replica's own writes.
    s.node_connected("n3", "{}", Vec::new(), 20).await.unwrap();
    let connected = s
        .with_cache(|c, live| live.connected(c.node("n3").unwrap()))
        .await;
    assert_eq!(connected, Some(true), "read-your-writes");

    // The watch falls behind a compaction: the copy is loaded afresh.
    cancel.cancel();
    task.await.unwrap();
    let resume_at = s.cache.state.read().unwrap().rev + 1;
    for i in 0..3 {
        other
            .node_connected("n4", "{}", Vec::new(), 30 + i)
            .await
            .unwrap();
    }
    other.delete_node("n0").await.unwrap();
    let now = current_rev(&s).await;
    crate::kv_of(&s.client).compact(now, None).await.unwrap();
    // A copy that missed events (its watch was gone) and is behind.
    assert!(s.cache.state.read().unwrap().node("n0").is_some(), "stale");
    s.node_connected("n1", "{}", Vec::new(), 40).await.unwrap();
    assert!(
        s.with_cache(|_, _| ()).await.is_none(),
        "no watch: the copy misses this replica's own write and is not used"
    );
    let cancel = CancellationToken::new();
    let task = {
        let (s, cancel) = (s.clone(), cancel.clone());
        // Resumes where the old watch stopped: etcd says that is compacted.
        tokio::spawn(async move { s.watch_from(resume_at, &cancel, |_| {}).await })
    };
    wait_rev(&s, now).await;
    same_as_etcd(&s).await;
    assert!(s.cache.state.read().unwrap().node("n0").is_none());
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_step_reads_its_views_from_the_copy() {
    use lks_store::conformance::rollout;
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    let r = s.start_rollout(rollout("r1", "c", "k", "1", &[])).await.unwrap();
    assign_n0(&s, &r).await;
    s.node_connected("n1", "{}", Vec::new(), 5).await.unwrap();
    // The step right after its own decision: the copy holds it.
    let cached = s
        .with_cache(|c, _| c.desired("n0").and_then(|d| d.bundles.get("k").map(String::from)))
        .await;
    assert_eq!(cached, Some(Some("1".to_string())), "read-your-writes");
    let via_copy = s.rollout_views("r1").await.unwrap();
    // A replica without a watch reads the same from etcd.
    let direct = etcd.store("r2").await.rollout_views("r1").await.unwrap();
    assert_eq!(via_copy, direct);
    assert_eq!(via_copy["n0"].desired.as_deref(), Some("1"));
    assert!(via_copy["n1"].connected && !via_copy["n2"].connected);
    cancel.cancel();
    task.await.unwrap();
}

/// The leader's question at every step, "which rollouts do I drive?",
/// is answered from the copy as etcd answers it: through a start on
/// another replica, a decision, a reload of the copy, and the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driven_rollouts_come_from_the_copy_as_etcd_has_them() {
    use lks_store::conformance::{commit, rollout};
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    // r2 has no watch: it reads etcd.
    let other = etcd.store("r2").await;
    let same = |s: EtcdStore, other: EtcdStore| async move {
        let (a, b) = (
            s.rollouts_to_drive().await.unwrap(),
            other.rollouts_to_drive().await.unwrap(),
        );
        assert_eq!(a, b);
        let copy = s
            .cache
            .state
            .read()
            .unwrap()
            .rollouts
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>();
        assert_eq!(
            copy,
            a.iter().map(|r| r.id.clone()).collect(),
            "only driven ones kept"
        );
        a
    };

    let r = other
        .start_rollout(rollout("r1", "c", "k", "1", &[]))
        .await
        .unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    let driven = same(s.clone(), other.clone()).await;
    assert_eq!(driven.len(), 1);

    assign_n0(&s, &r).await;
    let driven = same(s.clone(), other.clone()).await;
    assert_eq!(driven[0].nodes[0].state, NodeState::Applying, "read-your-writes");
    assert_eq!(
        s.rollout_views("r1").await.unwrap(),
        other.rollout_views("r1").await.unwrap()
    );

    // A reload loads the driven rollouts' documents at its revision.
    s.cache_load().await.unwrap();
    same(s.clone(), other.clone()).await;

    // Ended: no longer driven, forgotten by the copy; its views are
    // still read (from etcd).
    let mut done = driven[0].clone();
    done.state = RolloutState::Aborted;
    done.nodes[0].state = NodeState::Failed;
    s.commit_rollout(commit(&done, &[], TargetChange::Keep))
        .await
        .unwrap();
    assert!(same(s.clone(), other.clone()).await.is_empty());
    assert_eq!(
        s.rollout_views("r1").await.unwrap(),
        other.rollout_views("r1").await.unwrap()
    );
    assert_eq!(s.rollout_views("r1").await.unwrap().len(), 3);
    cancel.cancel();
    task.await.unwrap();
}

/// A rollout read (admin `rollout status`, the leader's commit) takes
/// the copy's document only while etcd says it is the current one, and
/// otherwise reads etcd: after a write the copy has not seen, after
/// the rollout ended (not kept), after a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_read_uses_the_copy_only_while_it_is_current() {
    use lks_store::conformance::{commit, rollout};
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    let other = etcd.store("r2").await;
    let r = other
        .start_rollout(rollout("r1", "c", "k", "1", &[]))
        .await
        .unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    let plain = || async {
        let (r, rev, _) = s.rollout_from_etcd_as_stored("r1").await.unwrap().unwrap();
        (r, rev)
    };
    let (stored, stored_rev) = plain().await;
    let (read, rev) = s.rollout("r1").await.unwrap().unwrap();
    assert_eq!(rev, stored_rev);
    assert_eq!(read, stored, "the copy is what etcd holds");

    // Proof that the copy is what was read: doctored at the current
    // revision, the doctored one comes back (a header and a row).
    let doctor = |rev: i64| {
        let mut d = RolloutDoc::header(&stored);
        d.message = "from the copy".into();
        let bytes: Arc<[u8]> = Arc::from(json(&d).unwrap().as_slice());
        let mut c = s.cache.state.write().unwrap();
        c.rollouts.insert("r1".into(), (rev, bytes));
        let row = c.rows.get_mut("r1").unwrap().get_mut("n0").unwrap();
        row.message = "row from the copy".into();
    };
    doctor(stored_rev);
    let (read, _) = s.rollout("r1").await.unwrap().unwrap();
    assert_eq!(read.message, "from the copy");
    assert_eq!(read.nodes[0].message, "row from the copy");
    assert_eq!(
        s.get_rollout("r1").await.unwrap().unwrap().message,
        "from the copy"
    );

    // Stop the watch: the copy no longer follows etcd.
    cancel.cancel();
    task.await.unwrap();
    doctor(stored_rev);
    assign_n0(&other, &r).await;
    let (now, now_rev) = plain().await;
    assert!(now_rev > stored_rev);
    let (read, rev) = s.rollout("r1").await.unwrap().unwrap();
    assert_eq!(rev, now_rev, "a copy behind etcd is not used");
    assert_eq!(read, now);
    // The leader's commit on such a copy reads etcd too: its decision
    // (on the current revision) is stored.
    let mut row = s.get_rollout("r1").await.unwrap().unwrap();
    assert_eq!(row.nodes[0].state, NodeState::Applying);
    row.state = RolloutState::Aborted;
    row.nodes[0].state = NodeState::Failed;
    s.commit_rollout(commit(&row, &[], TargetChange::Keep))
        .await
        .unwrap();
    let ended = other.get_rollout("r1").await.unwrap().unwrap();
    assert_eq!(ended.state, RolloutState::Aborted);
    assert_eq!(ended.nodes[0].state, NodeState::Failed);

    // Deleted while the copy still has it: gone.
    doctor(plain().await.1);
    let mut kv = kv_of(&s.client);
    kv.delete(s.key("rollouts/r1"), None).await.unwrap();
    assert!(s.rollout("r1").await.unwrap().is_none());
    assert!(s.get_rollout("r1").await.unwrap().is_none());
}

/// A start takes its nodes from the copy, and no node enrolled through
/// another replica just before it is left out (the copy may not have it
/// yet: the start's compare of node creations fails, and it reads etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_takes_its_nodes_from_the_copy_and_misses_none_enrolled_meanwhile() {
    use lks_store::conformance::{bundle, rollout};
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    s.put_bundle(bundle("z", "1", "d1")).await.unwrap();
    let other = etcd.store("r2").await;
    for i in 0..20 {
        let name = format!("late{i}");
        other
            .enroll_node(super::super::tests::new_node(&name, "tok000"))
            .await
            .unwrap();
        let id = format!("r{i}");
        let b = if i % 2 == 0 { "k" } else { "z" };
        // Each start right after an enrolment elsewhere.
        let r = s.start_rollout(rollout(&id, "c", b, "1", &[])).await.unwrap();
        assert!(r.nodes.iter().any(|n| n.name == name), "{id} misses {name}");
        assert_eq!(r.nodes.len(), 3 + i + 1, "{id}");
        // Ended at once, so the next start of the bundle may begin.
        let mut done = r.clone();
        done.state = RolloutState::Aborted;
        s.commit_rollout(lks_store::conformance::commit(&done, &[], TargetChange::Keep))
            .await
            .unwrap();
    }
    // A copy surely behind: its watch stopped before an enrolment
    // elsewhere. The start taken on it loses its compare and reads etcd.
    cancel.cancel();
    task.await.unwrap();
    other
        .enroll_node(super::super::tests::new_node("unseen", "tok000"))
        .await
        .unwrap();
    assert!(s.cache.state.read().unwrap().node("unseen").is_none());
    let r = s
        .start_rollout(rollout("last", "c", "k", "1", &[]))
        .await
        .unwrap();
    assert!(r.nodes.iter().any(|n| n.name == "unseen"), "{:?}", r.nodes);
}

#[test]
fn a_rollout_document_without_its_drive_key_is_not_kept() {
    let mut c = CacheState {
        rev: 1,
        ..Default::default()
    };
    // A start: the rollout, then its drive key, in one answer.
    c.apply("rollouts/a", Some(b"{}"), 1).unwrap();
    c.apply("drive/a", Some(b""), 3).unwrap();
    // An ended one: its drive key deleted before its last document.
    c.apply("rollouts/b", Some(b"{}"), 2).unwrap();
    c.apply("drive/b", Some(b""), 3).unwrap();
    c.apply("drive/b", None, 3).unwrap();
    c.apply("rollouts/b", Some(b"{}"), 2).unwrap();
    c.keep_driven();
    assert_eq!(c.rollouts.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(c.drive.iter().collect::<Vec<_>>(), ["a"]);
}

/// A listing (`node list`, a `rollout start`'s count and path check,
/// the peer tracker) comes from the copy, without reading the region's
/// node documents from etcd, and is what etcd holds: another
/// cluster's nodes left out, another replica's enrolment included once
/// the copy has it, and this replica's own writes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_comes_from_the_copy_and_is_what_etcd_holds() {
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    let other = etcd.store("r2").await;
    other.create_cluster(NewCluster::new("d", 1)).await.unwrap();
    other
        .create_token(TokenRow {
            cluster: "d".into(),
            ..super::super::tests::token("tokd00", None)
        })
        .await
        .unwrap();
    other
        .enroll_node(NewNode {
            cluster: "d".into(),
            ..super::super::tests::new_node("elsewhere", "tokd00")
        })
        .await
        .unwrap();
    other
        .enroll_node(super::super::tests::new_node("late", "tok000"))
        .await
        .unwrap();
    wait_rev(&s, current_rev(&s).await).await;
    s.node_connected("n1", "{}", Vec::new(), 5).await.unwrap();
    let ranges = || reads_of("range", "nodes");
    let before = ranges();
    let listed = s.list_nodes(Some("c")).await.unwrap();
    let all = s.list_nodes(None).await.unwrap();
    assert_eq!(ranges(), before, "no node range read from etcd");
    assert_eq!(listed, s.nodes_from_etcd(Some("c")).await.unwrap());
    assert_eq!(all, s.nodes_from_etcd(None).await.unwrap());
    assert_eq!(ranges(), before + 2);
    assert_eq!(
        listed.len(),
        4,
        "n0..n2 and the one enrolled through r2, not cluster d's"
    );
    assert!(
        listed.iter().any(|n| n.name == "n1" && n.connected),
        "this replica's own write"
    );
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
    // Without the copy: read from etcd.
    cancel.cancel();
    task.await.unwrap();
    s.cache_invalidate();
    assert_eq!(s.list_nodes(Some("c")).await.unwrap(), listed);
    assert_eq!(ranges(), before + 3);
}

/// A push after a change the watch delivered takes the desired
/// document from the copy when it is newer than what the stream sent;
/// a Hello (nothing sent) and a copy with nothing newer read etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_takes_a_newer_desired_state_from_the_copy() {
    use lks_store::conformance::rollout;
    let etcd = TestEtcd::start();
    let (s, cancel, task) = watched_with_bundle(&etcd, 3).await;
    let other = etcd.store("r2").await;
    let before = s.desired_state("n0").await.unwrap();
    let r = other
        .start_rollout(rollout("r1", "c", "k", "1", &[]))
        .await
        .unwrap();
    assign_n0(&other, &r).await;
    wait_rev(&s, current_rev(&s).await).await;
    let gets = || reads_of("get", "desired");
    let g0 = gets();
    let pushed = s
        .desired_state_after("n0", Some(before.generation))
        .await
        .unwrap();
    assert!(pushed.generation > before.generation);
    assert_eq!(gets(), g0, "taken from the copy");
    let direct = other.desired_state("n0").await.unwrap();
    assert_eq!(
        (pushed.generation, &pushed.bundles, &pushed.retry),
        (direct.generation, &direct.bundles, &direct.retry),
        "what etcd holds"
    );
    let g0 = gets();
    // Nothing newer than what was sent, or nothing sent: etcd.
    s.desired_state_after("n0", Some(pushed.generation))
        .await
        .unwrap();
    s.desired_state_after("n0", None).await.unwrap();
    assert_eq!(gets(), g0 + 2);
    // A Hello of an agent that has that generation (a reconnect after its
    // replica died) asks for what is not older: from the copy.
    let hello = s
        .desired_state_after("n0", Some(pushed.generation - 1))
        .await
        .unwrap();
    assert_eq!((hello.generation, gets()), (pushed.generation, g0 + 2));
    cancel.cancel();
    task.await.unwrap();
}

/// Rows are kept only for a driven rollout the copy holds whole: one
/// that becomes driven is filled by the watch first, and rows that came
/// before its drive key (a start's) are not half a rollout.
#[test]
fn rows_are_kept_only_for_a_rollout_held_whole() {
    let mut c = CacheState {
        rev: 1,
        ..Default::default()
    };
    let row = |n: &str| format!(r#"{{"n":"{n}","p":"","s":"waiting"}}"#);
    let header = |rows: bool| {
        let mut r = super::super::rollouts::test_row("a");
        r.nodes.clear();
        let mut d = serde_json::to_value(RolloutDoc::header(&r)).unwrap();
        if !rows {
            d.as_object_mut().unwrap().remove("rows");
            d["nodes"] = serde_json::json!([{"n": "x", "p": "", "s": "waiting"}]);
        }
        serde_json::to_vec(&d).unwrap()
    };
    // A start: rows first, then header and drive key.
    c.apply("rnodes/a/n1", Some(row("n1").as_bytes()), 2).unwrap();
    c.apply("rollouts/a", Some(&header(true)), 3).unwrap();
    c.apply("drive/a", Some(b""), 3).unwrap();
    c.keep_driven();
    assert!(!c.rows.contains_key("a"), "not held whole");
    assert!(c.fill.contains("a"));
    assert!(c.driven_rollout("a").is_none(), "not used until filled");
    assert!(c.driven_rollouts().is_none());
    // Filled (as the watch does), then a row changes.
    c.fill.remove("a");
    c.rows.insert("a".into(), BTreeMap::new());
    c.apply("rnodes/a/n1", Some(row("n1").as_bytes()), 4).unwrap();
    c.apply("rnodes/a/n2", Some(row("n2").as_bytes()), 4).unwrap();
    c.apply("rnodes/a/n2", None, 5).unwrap();
    let (r, rev, inline) = c.driven_rollout("a").unwrap().unwrap();
    assert_eq!(rev, 3);
    assert!(!inline);
    assert_eq!(
        r.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["n1"]
    );
    assert_eq!(c.driven_rollouts().unwrap().unwrap().len(), 1);
    // Rows of a rollout not held are ignored.
    c.apply("rnodes/b/n1", Some(row("n1").as_bytes()), 6).unwrap();
    assert!(!c.rows.contains_key("b"));
    // A document stored before reads its inline rows.
    c.apply("rollouts/a", Some(&header(false)), 7).unwrap();
    let (r, _, inline) = c.driven_rollout("a").unwrap().unwrap();
    assert!(inline);
    assert_eq!(r.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["x"]);
    // Ended: all forgotten.
    c.apply("drive/a", None, 8).unwrap();
    c.keep_driven();
    assert!(c.rows.is_empty() && c.rollouts.is_empty() && c.fill.is_empty());
}

#[test]
fn events_the_snapshot_covers_are_skipped() {
    let mut c = CacheState {
        rev: 10,
        ..Default::default()
    };
    c.apply("replicas/a", Some(b"{}"), 3).unwrap();
    assert!(c.replicas.contains("a"));
    c.apply("replicas/a", None, 3).unwrap();
    assert!(c.replicas.is_empty());
    assert!(c.apply("nodes/x", Some(b"not json"), 3).is_err());
    c.apply("events/1", Some(b"ignored"), 3).unwrap();
}
