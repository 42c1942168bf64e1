//! Conformance cases: Enrolment, reports, status and events.

use lks_proto::BundleState;

use crate::conformance::{bundle, commit, encoded, held, node, rollout, token};
use crate::{
    BundleStatusRow, EventFilter, NewCluster, NewNode, NodeState, RolloutState, Store, StoreError,
    TargetChange, TokenRefusal,
};

#[allow(clippy::too_many_lines)]
pub async fn enrolment_consumes_uses_atomically_and_names_are_unique(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("once00", "a", Some(1), 10_000))
        .await
        .unwrap();
    s.create_token(token("old000", "a", None, 500)).await.unwrap();
    s.create_token(token("many00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("w1", "a", "once00", &[])).await.unwrap();
    assert!(matches!(
        s.enroll_node(node("w2", "a", "once00", &[])).await,
        Err(StoreError::Token(TokenRefusal::UsedUp))
    ));
    assert!(matches!(
        s.enroll_node(node("w2", "a", "old000", &[])).await,
        Err(StoreError::Token(TokenRefusal::Expired))
    ));
    assert!(matches!(
        s.enroll_node(node("w2", "a", "gone00", &[])).await,
        Err(StoreError::Token(TokenRefusal::Unknown))
    ));
    // Another node (another key) with a name in use.
    let other = NewNode {
        key_hash: "sha256:another-key".into(),
        ..node("w1", "a", "many00", &[])
    };
    let dup = s.enroll_node(other).await.unwrap_err();
    assert!(matches!(&dup, StoreError::AlreadyExists(m) if m.contains("lksctl node delete w1")));
    assert!(
        s.get_node("w2").await.unwrap().is_none(),
        "nothing stored for refused joins"
    );
    assert!(s.delete_node("w1").await.unwrap());
    assert!(!s.delete_node("w1").await.unwrap());
    s.enroll_node(node("w1", "a", "many00", &[])).await.unwrap();
}

#[allow(clippy::too_many_lines)]
pub async fn a_report_that_leaves_out_an_undesired_bundle_means_it_was_removed(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka00", &[])).await.unwrap();
    s.node_connected("a1", "{}", vec![held("1", 4)], 1).await.unwrap();
    let mut other = held("3", 4);
    other.name = "other".into();
    s.record_status("a1", vec![other.clone()]).await.unwrap();
    let n = s.get_node("a1").await.unwrap().unwrap();
    assert_eq!(n.actual.keys().collect::<Vec<_>>(), ["other"]);
    assert_eq!(n.actual["other"].generation, 4);
}

pub async fn enrolled_nodes_are_counted(s: &dyn Store) {
    assert_eq!(s.count_nodes().await.unwrap(), 0);
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    s.create_token(token("tokb00", "b", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka00", &[])).await.unwrap();
    s.enroll_node(node("a2", "a", "toka00", &[])).await.unwrap();
    s.enroll_node(node("b1", "b", "tokb00", &[])).await.unwrap();
    s.node_connected("a1", "{}", vec![held("1", 4)], 1).await.unwrap();
    assert_eq!(
        s.count_nodes().await.unwrap(),
        3,
        "every cluster, reports add nothing"
    );
    assert!(s.delete_node("a2").await.unwrap());
    assert_eq!(s.count_nodes().await.unwrap(), 2);
}

#[allow(clippy::too_many_lines)]
pub async fn status_and_events(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka00", &[])).await.unwrap();
    assert_eq!(
        s.node_identity("a1").await.unwrap(),
        Some(("a".to_string(), "serial-a1".to_string()))
    );
    assert_eq!(s.node_identity("nope").await.unwrap(), None);
    // What the node fetched reads back as reported, the patches' share too.
    let st = BundleStatusRow {
        fetched_from_server: 10,
        fetched_from_peers: 5,
        fetched_as_delta: 4,
        name: "k".into(),
        version: "1".into(),
        state: BundleState::Applied,
        message: String::new(),
        updated_at_ms: 3,
        generation: 2,
    };
    s.node_connected("a1", "{}", vec![st.clone()], 50).await.unwrap();
    let n = s.get_node("a1").await.unwrap().unwrap();
    assert!(n.connected);
    assert_eq!(n.actual["k"], st);
    s.touch_nodes(vec![("a1".into(), 60)]).await.unwrap();
    s.node_disconnected("a1", 55).await.unwrap();
    let n = s.get_node("a1").await.unwrap().unwrap();
    assert!(!n.connected);
    assert_eq!(n.last_seen_ms, 60);
    assert_eq!(n.actual["k"].generation, 2);
    let ev = s
        .list_events(EventFilter {
            node: Some("a1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ev[0].kind, "enrolled");
}

/// An enrolment repeated with the same key, before the node ever connected
/// (its first answer was lost), gets the node back without another token
/// use; any other enrolment of the name is refused.
pub async fn a_lost_enrolment_answer_can_be_repeated_with_the_same_key(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    s.create_token(token("toka01", "a", Some(1), 10_000))
        .await
        .unwrap();
    s.create_token(token("tokb01", "b", None, 10_000)).await.unwrap();
    let first = node("n1", "a", "toka01", &[]);
    let g = s.enroll_node(first.clone()).await.unwrap();
    assert_eq!(
        s.get_token("toka01").await.unwrap().unwrap().remaining_uses,
        Some(0)
    );
    assert_eq!(s.get_node("n1").await.unwrap().unwrap().key_hash, "sha256:key-n1");

    // The same key again: the node is kept, with the new certificate.
    let again = NewNode {
        cert_serial: "serial-n1-again".into(),
        ..first.clone()
    };
    assert_eq!(s.enroll_node(again.clone()).await.unwrap(), g);
    let n = s.get_node("n1").await.unwrap().unwrap();
    assert_eq!(n.cert_serial, "serial-n1-again");
    assert_eq!(
        s.get_token("toka01").await.unwrap().unwrap().remaining_uses,
        Some(0)
    );
    assert_eq!(s.list_nodes(None).await.unwrap().len(), 1);

    // Another key, or another cluster's token, is another node.
    let other_key = NewNode {
        key_hash: "sha256:thief".into(),
        ..first.clone()
    };
    assert!(matches!(
        s.enroll_node(other_key).await,
        Err(StoreError::AlreadyExists(_))
    ));
    let other_cluster = NewNode {
        cluster: "b".into(),
        token_id: "tokb01".into(),
        ..first.clone()
    };
    assert!(matches!(
        s.enroll_node(other_cluster).await,
        Err(StoreError::AlreadyExists(_))
    ));
    // Once it has connected, the identity is in use: no repeat.
    s.node_connected("n1", "{}", Vec::new(), 5).await.unwrap();
    s.node_disconnected("n1", 6).await.unwrap();
    assert!(matches!(
        s.enroll_node(again).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(
        s.get_node("n1").await.unwrap().unwrap().cert_serial,
        "serial-n1-again"
    );
}

/// A node with its stream open has connected, even before its Hello's
/// facts or time are written (on etcd last-seen times are written later,
/// in batches): an enrolment with its key is no repeat of a lost one
/// ([`never_connected`]).
pub async fn a_node_with_its_stream_open_is_not_enrolled_over(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("toka02", "a", None, 10_000)).await.unwrap();
    let first = node("n1", "a", "toka02", &[]);
    s.enroll_node(first.clone()).await.unwrap();
    s.node_connected("n1", "", Vec::new(), 0).await.unwrap();
    let again = NewNode {
        cert_serial: "serial-n1-again".into(),
        ..first
    };
    assert!(matches!(
        s.enroll_node(again).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(s.get_node("n1").await.unwrap().unwrap().cert_serial, "serial-n1");
}

/// A joiner starts on each of its cluster's targets its labels match, and
/// a running or paused rollout over it takes it in, waiting, on the
/// version that target gave it ([`NewNode::seed_desired`],
/// [`NewNode::adopted_by`]).
pub async fn a_joiner_starts_on_its_targets_and_joins_live_rollouts(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("toka03", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka03", &[("role", "w")]))
        .await
        .unwrap();
    s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
    s.put_bundle(bundle("k", "2", "d2")).await.unwrap();
    let mut r1 = s
        .start_rollout(rollout("r1", "a", "k", "1", &[("role", "w")]))
        .await
        .unwrap();
    r1.state = RolloutState::Completed;
    r1.nodes[0].state = NodeState::Updated;
    s.commit_rollout(commit(&r1, &[("a1", Some("1"))], TargetChange::SetToRollout))
        .await
        .unwrap();
    let mut r2 = s
        .start_rollout(rollout("r2", "a", "k", "2", &[("role", "w")]))
        .await
        .unwrap();
    r2.state = RolloutState::Paused;
    s.commit_rollout(commit(&r2, &[], TargetChange::Keep))
        .await
        .unwrap();

    s.enroll_node(node("a2", "a", "toka03", &[("role", "w")]))
        .await
        .unwrap();
    assert_eq!(
        s.desired_state("a2").await.unwrap().bundles,
        vec![encoded("k", "1", "d1")],
        "the target its labels match"
    );
    let r2 = s.get_rollout("r2").await.unwrap().unwrap();
    let a2 = r2.nodes.iter().find(|n| n.name == "a2").unwrap();
    assert_eq!(
        (a2.state, a2.previous_version.as_str()),
        (NodeState::Waiting, "1")
    );

    s.enroll_node(node("a3", "a", "toka03", &[("role", "db")]))
        .await
        .unwrap();
    assert!(s.desired_state("a3").await.unwrap().bundles.is_empty());
    let r2 = s.get_rollout("r2").await.unwrap().unwrap();
    assert!(
        !r2.nodes.iter().any(|n| n.name == "a3"),
        "its selector does not match"
    );
}

/// A node's reported reboot state is kept with it, and a reboot request
/// is a new generation whose desired state carries the request, with an
/// event; a node that does not exist gets none.
pub async fn a_nodes_reboot_state_and_requests_are_kept(s: &dyn Store) {
    use crate::{NodeReboot, RebootState};
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("tokr00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("r1", "a", "tokr00", &[])).await.unwrap();
    s.node_connected("r1", "{}", Vec::new(), 1_000).await.unwrap();
    let fresh = s.get_node("r1").await.unwrap().unwrap();
    assert_eq!((fresh.reboot.clone(), fresh.reboot_request), (None, 0));
    let required = NodeReboot {
        state: RebootState::Required,
        reason: "bundle kernel@6.1".into(),
        since_ms: 1_500,
        boot_id: "b-1".into(),
        request: 0,
    };
    s.record_reboot("r1", required.clone()).await.unwrap();
    assert_eq!(
        s.get_node("r1").await.unwrap().unwrap().reboot,
        Some(required.clone())
    );
    let listed = s.list_nodes(Some("a")).await.unwrap();
    assert_eq!(listed[0].reboot, Some(required));

    let before = s.desired_state("r1").await.unwrap();
    assert_eq!(before.reboot, 0);
    let id = s.request_reboot("r1", "alice", 2_000).await.unwrap().unwrap();
    let after = s.desired_state("r1").await.unwrap();
    assert!(
        after.generation > before.generation,
        "pushed with a new generation"
    );
    assert_eq!(after.reboot, id);
    let n = s.get_node("r1").await.unwrap().unwrap();
    assert_eq!(n.reboot_request, id);
    let again = s.request_reboot("r1", "alice", 3_000).await.unwrap().unwrap();
    assert!(again > id, "each request is a new id");
    let events = s
        .list_events(EventFilter {
            node: Some("r1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "reboot_requested" && e.message == "reboot requested by alice"),
        "{events:?}"
    );
    assert_eq!(s.request_reboot("gone", "alice", 2_000).await.unwrap(), None);

    let rebooting = NodeReboot {
        state: RebootState::Rebooting,
        reason: String::new(),
        since_ms: 3_100,
        boot_id: "b-1".into(),
        request: again,
    };
    s.record_reboot("r1", rebooting.clone()).await.unwrap();
    assert_eq!(s.get_node("r1").await.unwrap().unwrap().reboot, Some(rebooting));

    // A Hello carries the state in its own write (a new boot: none owed);
    // one without it (an older agent) leaves none shown.
    let back = NodeReboot {
        state: RebootState::None,
        reason: String::new(),
        since_ms: 0,
        boot_id: "b-2".into(),
        request: again,
    };
    s.node_hello("r1", "{}", Vec::new(), None, Some(back.clone()), 4_000)
        .await
        .unwrap();
    assert_eq!(s.get_node("r1").await.unwrap().unwrap().reboot, Some(back));
    s.node_hello("r1", "{}", Vec::new(), None, None, 5_000)
        .await
        .unwrap();
    assert_eq!(s.get_node("r1").await.unwrap().unwrap().reboot, None);

    // Carried out: the request leaves the desired state (a new generation),
    // but only the request still standing.
    assert!(
        !s.clear_reboot_request("r1", id).await.unwrap(),
        "not the standing request"
    );
    assert!(!s.clear_reboot_request("r1", 0).await.unwrap());
    let standing = s.desired_state("r1").await.unwrap();
    assert_eq!(standing.reboot, again);
    assert!(s.clear_reboot_request("r1", again).await.unwrap());
    let cleared = s.desired_state("r1").await.unwrap();
    assert_eq!(cleared.reboot, 0);
    assert!(cleared.generation > standing.generation, "pushed again");
    assert_eq!(s.get_node("r1").await.unwrap().unwrap().reboot_request, 0);
    assert!(!s.clear_reboot_request("r1", again).await.unwrap(), "once");
    assert!(!s.clear_reboot_request("gone", again).await.unwrap());
    let next = s.request_reboot("r1", "alice", 6_000).await.unwrap().unwrap();
    assert!(next > again, "a later request is above the cleared one");
}
