//! Tests of `rollouts.rs`.

use super::*;

use lks_proto::labels::Labels;

use lks_store::{
    BundleStore, ClusterStore, DesiredStore, EventFilter, EventStore, NewCluster, NodeStore, RolloutState,
    TokenStore,
};

use crate::smallmap::SmallMap;

fn commit(nodes: Vec<RolloutNodeRow>, assign: &[&str]) -> RolloutCommit {
    RolloutCommit {
        rollout: RolloutRow {
            nodes,
            ..test_row("r")
        },
        assign: assign.iter().map(|n| (n.to_string(), Some("2".into()))).collect(),
        target: TargetChange::Keep,
        events: Vec::new(),
    }
}

#[test]
fn a_plan_takes_assignments_first_then_changed_rows_and_skips_what_is_done() {
    let stored_nodes: Vec<RolloutNodeRow> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| RolloutNodeRow::waiting(n, "1"))
        .collect();
    let stored = RolloutRow {
        nodes: stored_nodes.clone(),
        ..test_row("r")
    };
    let mut decided = stored_nodes.clone();
    decided[0].state = NodeState::Updated; // a: a report
    decided[2].state = NodeState::Applying; // c: assigned
    decided.push(RolloutNodeRow::waiting("z", "1")); // not stored: ignored
    let c = commit(decided, &["c"]);
    let got = plan(&c, &stored, &HashSet::new());
    assert_eq!(
        got,
        vec![
            ("c".to_string(), Some(Some("2".to_string()))),
            ("a".to_string(), None)
        ]
    );
    // Once c is assigned, only a is left.
    let done: HashSet<String> = ["c".to_string()].into();
    assert_eq!(plan(&c, &stored, &done), vec![("a".to_string(), None)]);
    // Nothing changed: nothing to write but the header.
    assert!(plan(&commit(stored_nodes, &[]), &stored, &HashSet::new()).is_empty());
}

#[test]
fn a_header_has_no_rows_and_an_inline_document_reads_its_own() {
    let mut r = test_row("r");
    r.nodes = vec![
        RolloutNodeRow::waiting("b", "1"),
        RolloutNodeRow::waiting("a", ""),
    ];
    let header = serde_json::to_value(RolloutDoc::header(&r)).unwrap();
    assert!(
        header.get("nodes").is_none(),
        "an older replica must not read a header as a rollout"
    );
    assert_eq!(header["rows"], true);
    let rows: Vec<RolloutNodeDoc> = r.nodes.iter().map(RolloutNodeDoc::from_row).collect();
    let back = RolloutDoc::header(&r).into_row("r", rows.clone()).unwrap();
    assert_eq!(
        back.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // A document stored before: rows inline, `rows` absent.
    let mut inline = header;
    inline.as_object_mut().unwrap().remove("rows");
    inline["nodes"] = serde_json::to_value(&rows).unwrap();
    let doc: RolloutDoc = serde_json::from_value(inline).unwrap();
    assert!(!doc.rows);
    let back = doc.into_row("r", Vec::new()).unwrap();
    assert_eq!(back.nodes.len(), 2);
    assert_eq!(back.nodes[0].name, "a");
}

use crate::tests::{TestEtcd, new_node, token};

/// `n` nodes of cluster `c` written straight into etcd (a node document
/// and a desired state each, 60 nodes per transaction), a bundle b@1
/// and b@2.
async fn region(s: &EtcdStore, n: usize) -> Vec<String> {
    s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
    for v in ["1", "2"] {
        s.put_bundle(lks_store::conformance::bundle("b", v, "d"))
            .await
            .unwrap();
    }
    let names: Vec<String> = (0..n).map(|i| format!("node-{i:05}")).collect();
    for chunk in names.chunks(60) {
        let mut ops = Vec::new();
        for name in chunk {
            let doc = NodeDoc {
                cluster: "c".into(),
                labels: Labels::new(),
                cert_serial: format!("s-{name}").into(),
                facts_json: Box::default(),
                last_seen_ms: 0,
                enrolled_at_ms: 1,
                replica: String::new(),
                actual: SmallMap::new(),
                hold: None,
                key_hash: Box::default(),
                trust: None,
                reboot: None,
            };
            ops.push(s.put(&format!("nodes/{name}"), json(&doc).unwrap()));
            let d = DesiredDoc {
                generation: 1,
                bundles: [("b".to_string(), Name::from("1"))].into(),
                retry: SmallMap::new(),
                reboot: 0,
            };
            ops.push(s.put(&format!("desired/{name}"), json(&d).unwrap()));
        }
        assert!(s.txn(Vec::new(), ops).await.unwrap());
    }
    names
}

fn new_rollout(id: &str) -> NewRollout {
    NewRollout {
        id: id.into(),
        cluster: "c".into(),
        bundle: "b".into(),
        version: "2".into(),
        selector: Labels::new(),
        batch_size: 0,
        failure_threshold: 1,
        offline_deadline_ms: 1000,
        policy: Default::default(),
        started_by: String::new(),
        now_ms: 3,
    }
}

/// A rollout past the old bound of one document (about 4,900 nodes: a
/// decision on 10,000 was a 2.4 MB request etcd refused on every try):
/// started, every node assigned in one decision and every node's report
/// taken in another, each stored in steps within etcd's limits.
#[tokio::test]
async fn a_rollout_of_six_thousand_nodes_is_started_assigned_and_finished() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    let n = 6_000;
    let names = region(&s, n).await;
    let mut r = s.start_rollout(new_rollout("big")).await.unwrap();
    assert_eq!(r.nodes.len(), n);
    assert!(r.nodes.iter().all(|x| x.previous_version == "1"));
    r.batch_size = n as u32;
    for x in &mut r.nodes {
        x.state = NodeState::Applying;
        x.touched = true;
    }
    let assign = names.iter().map(|x| (x.clone(), Some("2".to_string()))).collect();
    let events = names
        .iter()
        .map(|x| EventRow {
            id: 0,
            at_ms: 4,
            cluster: "c".into(),
            node: x.clone(),
            rollout_id: "big".into(),
            kind: "node_started".into(),
            bundle: "b".into(),
            version: "2".into(),
            message: String::new(),
        })
        .collect();
    let (stored, changed) = s
        .commit_rollout(RolloutCommit {
            rollout: r,
            assign,
            target: TargetChange::SetToRollout,
            events,
        })
        .await
        .unwrap();
    assert_eq!(changed.len(), n);
    assert_eq!(stored.revision, n.div_ceil(ROWS_PER_TXN) as u64);
    let read = s.get_rollout("big").await.unwrap().unwrap();
    assert_eq!(read, stored, "what a reader gets is what was stored");
    assert_eq!(
        read.batch_size, n as u32,
        "the decision's own fields, in its last step"
    );
    assert!(
        read.nodes
            .iter()
            .all(|x| x.state == NodeState::Applying && x.generation > 1)
    );
    for name in [&names[0], &names[n / 2], &names[n - 1]] {
        let d = s.desired_state(name).await.unwrap();
        assert_eq!(d.bundles, vec![lks_store::conformance::encoded("b", "2", "d")]);
    }
    // Every node's event, once.
    let started = s
        .list_events(EventFilter {
            limit: 20_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "node_started")
        .count();
    assert_eq!(started, n);
    // Every report in one decision: the rollout completes.
    let mut done = read.clone();
    for x in &mut done.nodes {
        x.state = NodeState::Updated;
    }
    done.state = RolloutState::Completed;
    let (stored, changed) = s
        .commit_rollout(RolloutCommit {
            rollout: done,
            assign: Vec::new(),
            target: TargetChange::Keep,
            events: Vec::new(),
        })
        .await
        .unwrap();
    assert!(changed.is_empty());
    assert_eq!(stored.state, RolloutState::Completed);
    let read = s.get_rollout("big").await.unwrap().unwrap();
    assert!(read.nodes.iter().all(|x| x.state == NodeState::Updated));
    assert!(
        s.list_rollouts(None, true).await.unwrap().is_empty(),
        "no longer active"
    );
    assert!(s.rollouts_to_drive().await.unwrap().is_empty());
    // A new rollout of the bundle may start.
    s.start_rollout(new_rollout("next")).await.unwrap();
}

/// A node enrolled while a large decision is being stored: the step that
/// lost its race reads the rollout again and goes on; the new node is in
/// the rollout, waiting, and every decided node is stored as decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrolment_between_the_steps_of_a_decision_is_kept() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    let names = region(&s, 400).await;
    s.create_token(token("tok000", None)).await.unwrap();
    let mut r = s.start_rollout(new_rollout("r")).await.unwrap();
    for x in &mut r.nodes {
        x.state = NodeState::Applying;
        x.touched = true;
    }
    let assign = names.iter().map(|x| (x.clone(), Some("2".to_string()))).collect();
    let other = etcd.store("r2").await;
    let joins = tokio::spawn(async move {
        for i in 0..10 {
            other
                .enroll_node(new_node(&format!("late{i}"), "tok000"))
                .await
                .unwrap();
        }
    });
    let (stored, changed) = s
        .commit_rollout(RolloutCommit {
            rollout: r,
            assign,
            target: TargetChange::Keep,
            events: Vec::new(),
        })
        .await
        .unwrap();
    joins.await.unwrap();
    assert_eq!(changed.len(), 400);
    let read = s.get_rollout("r").await.unwrap().unwrap();
    assert_eq!(read.revision, stored.revision);
    assert_eq!(read.nodes.len(), 410, "the late nodes joined the rollout");
    for x in &read.nodes {
        if x.name.starts_with("late") {
            assert_eq!(x.state, NodeState::Waiting, "{}", x.name);
        } else {
            assert_eq!(x.state, NodeState::Applying, "{}", x.name);
            assert!(x.generation > 1);
        }
    }
}

/// A rollout stored before rows were keys (its rows inline) reads as it
/// is, and its first write converts it: a header without rows and one
/// key per row, with the decision on top.
#[tokio::test]
async fn a_rollout_stored_with_its_rows_inline_is_read_and_converted_at_its_next_write() {
    let etcd = TestEtcd::start();
    let s = etcd.store("r1").await;
    region(&s, 150).await;
    let mut r = s.start_rollout(new_rollout("old")).await.unwrap();
    // As an older build stored it.
    kv_of(&s.client)
        .delete(
            s.key(&rows_prefix("old")),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let mut doc = serde_json::to_value(RolloutDoc::header(&r)).unwrap();
    doc.as_object_mut().unwrap().remove("rows");
    doc["nodes"] =
        serde_json::to_value(r.nodes.iter().map(RolloutNodeDoc::from_row).collect::<Vec<_>>()).unwrap();
    s.put_bytes(&header_key("old"), serde_json::to_vec(&doc).unwrap())
        .await
        .unwrap();
    assert_eq!(s.get_rollout("old").await.unwrap().unwrap(), r);
    assert_eq!(s.list_rollouts(None, false).await.unwrap(), vec![r.clone()]);
    // The next decision converts it.
    r.nodes[0].state = NodeState::Applying;
    r.nodes[0].touched = true;
    let (stored, _) = s
        .commit_rollout(RolloutCommit {
            rollout: r.clone(),
            assign: vec![(r.nodes[0].name.clone(), Some("2".into()))],
            target: TargetChange::Keep,
            events: Vec::new(),
        })
        .await
        .unwrap();
    let header: serde_json::Value =
        serde_json::from_slice(&s.get_bytes(&header_key("old")).await.unwrap().unwrap().0).unwrap();
    assert_eq!(header["rows"], true);
    assert!(header.get("nodes").is_none());
    assert_eq!(s.keys(&s.key(&rows_prefix("old"))).await.unwrap().len(), 150);
    assert_eq!(s.get_rollout("old").await.unwrap().unwrap(), stored);
    assert_eq!(stored.nodes[0].state, NodeState::Applying);
    assert!(stored.nodes[1..].iter().all(|x| x.state == NodeState::Waiting));
}
