//! One set of behavioural tests every `Store` must pass: the SQLite store
//! runs them in its unit tests, the etcd store against a throwaway etcd.

#![allow(clippy::unwrap_used)]

use lks_proto::BundleState;
use lks_proto::labels::Labels;

use super::*;

fn token(id: &str, cluster: &str, uses: Option<u32>, expires_at_ms: i64) -> TokenRow {
    TokenRow {
        id: id.into(),
        secret_hash: [7; 32],
        cluster: cluster.into(),
        expires_at_ms,
        remaining_uses: uses,
        labels: Labels::new(),
        created_at_ms: 0,
    }
}

fn node(name: &str, cluster: &str, token: &str, labels: &[(&str, &str)]) -> NewNode {
    NewNode {
        name: name.into(),
        cluster: cluster.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cert_serial: format!("serial-{name}"),
        key_hash: format!("sha256:key-{name}"),
        token_id: token.into(),
        now_ms: 1000,
    }
}

pub(crate) fn bundle(name: &str, version: &str, digest: &str) -> NewBundle {
    NewBundle {
        name: name.into(),
        version: version.into(),
        signed_bundle: format!("{name}@{version}").into_bytes(),
        manifest_digest: digest.into(),
        signed: false,
        files: 1,
        total_size: 3,
        blob_digests: vec![format!("blob-{name}-{version}")],
        now_ms: 5,
    }
}

pub(crate) fn rollout(id: &str, cluster: &str, b: &str, v: &str, selector: &[(&str, &str)]) -> NewRollout {
    NewRollout {
        id: id.into(),
        cluster: cluster.into(),
        bundle: b.into(),
        version: v.into(),
        selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        batch_size: 0,
        failure_threshold: 1,
        offline_deadline_ms: 600_000,
        policy: Default::default(),
        started_by: String::new(),
        now_ms: 10,
    }
}

pub(crate) fn commit(r: &RolloutRow, assign: &[(&str, Option<&str>)], target: TargetChange) -> RolloutCommit {
    RolloutCommit {
        rollout: r.clone(),
        assign: assign
            .iter()
            .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
            .collect(),
        target,
        events: Vec::new(),
    }
}

fn held(version: &str, generation: u64) -> BundleStatusRow {
    BundleStatusRow {
        fetched_from_server: 0,
        fetched_from_peers: 0,
        name: "k".into(),
        version: version.into(),
        state: BundleState::Applied,
        message: String::new(),
        updated_at_ms: 1,
        generation,
    }
}

#[allow(clippy::too_many_lines)]
pub async fn clusters_and_tokens(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    assert!(matches!(
        s.create_cluster(NewCluster::new("a", 2)).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        s.create_token(token("tok001", "nope", None, 10)).await,
        Err(StoreError::NotFound(_))
    ));
    s.create_token(token("tok001", "a", Some(1), 10_000))
        .await
        .unwrap();
    assert_eq!(
        s.get_token("tok001").await.unwrap().unwrap().remaining_uses,
        Some(1)
    );
    assert!(s.get_token("zzz").await.unwrap().is_none());
    assert_eq!(s.list_clusters().await.unwrap()[0].name, "a");
}

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
pub async fn bundles_are_immutable(s: &dyn Store) {
    assert_eq!(
        s.put_bundle(bundle("k", "1", "d1")).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(
        s.put_bundle(bundle("k", "1", "d1")).await.unwrap(),
        PutOutcome::Unchanged
    );
    assert!(matches!(
        s.put_bundle(bundle("k", "1", "d2")).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(s.list_bundles(None).await.unwrap().len(), 1);
}

#[allow(clippy::too_many_lines)]
pub async fn rollouts_assign_only_what_the_controller_decides(s: &dyn Store) {
    for c in ["a", "b"] {
        s.create_cluster(NewCluster::new(c, 1)).await.unwrap();
    }
    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    s.create_token(token("tokb00", "b", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka00", &[("role", "w")]))
        .await
        .unwrap();
    s.enroll_node(node("a2", "a", "toka00", &[("role", "db")]))
        .await
        .unwrap();
    s.enroll_node(node("b1", "b", "tokb00", &[("role", "w")]))
        .await
        .unwrap();
    s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
    assert!(matches!(
        s.start_rollout(rollout("r0", "a", "k", "9", &[])).await,
        Err(StoreError::NotFound(_))
    ));
    let g0 = s.desired_state("a1").await.unwrap().generation;
    let r = s
        .start_rollout(rollout("r1", "a", "k", "1", &[("role", "w")]))
        .await
        .unwrap();
    assert_eq!(r.nodes.len(), 1);
    assert_eq!(r.batch_size, 1, "default batch for one node");
    assert_eq!(r.offline_deadline_ms, 600_000);
    assert_eq!(r.nodes[0].state, NodeState::Waiting);
    assert!(
        s.desired_state("a1").await.unwrap().bundles.is_empty(),
        "starting assigns nothing by itself"
    );
    let e = s
        .start_rollout(rollout("r1b", "a", "k", "1", &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Conflict(m) if m == "rollout r1 of k in cluster a is still running; abort it or wait for it to end"),
        "{e}"
    );
    // Another cluster is independent.
    s.start_rollout(rollout("rb", "b", "k", "1", &[])).await.unwrap();

    // A joiner while r1 runs is taken into it, with nothing assigned yet.
    s.enroll_node(node("a3", "a", "toka00", &[("role", "w")]))
        .await
        .unwrap();
    let r = s.get_rollout("r1").await.unwrap().unwrap();
    assert_eq!(
        r.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["a1", "a3"]
    );
    assert!(s.desired_state("a3").await.unwrap().bundles.is_empty());

    let mut next = r.clone();
    next.nodes[0].state = NodeState::Applying;
    next.nodes[0].touched = true;
    let (r1, changed) = s
        .commit_rollout(commit(&next, &[("a1", Some("1"))], TargetChange::Keep))
        .await
        .unwrap();
    assert_eq!(changed, ["a1"]);
    assert_eq!(r1.revision, 1);
    let d = s.desired_state("a1").await.unwrap();
    assert!(d.generation > g0);
    assert_eq!(r1.nodes[0].generation, d.generation);
    assert_eq!(d.bundles, vec![b"k@1".to_vec()]);
    assert!(s.blob_allowed("a1", "blob-k-1").await.unwrap());
    assert!(!s.blob_allowed("a2", "blob-k-1").await.unwrap());
    assert!(!s.blob_allowed("b1", "blob-k-1").await.unwrap());
    // The versions it is granted through (each file's architecture is
    // checked against them by the caller).
    assert_eq!(
        s.blob_grants("a1", "blob-k-1").await.unwrap(),
        vec![("k".to_string(), "1".to_string())]
    );
    assert!(s.blob_grants("a2", "blob-k-1").await.unwrap().is_empty());
    // Claiming to hold a bundle that was never assigned grants nothing.
    s.node_connected("b1", "{}", vec![held("1", 0)], 1).await.unwrap();
    assert!(!s.blob_allowed("b1", "blob-k-1").await.unwrap());

    // A decision based on an old revision is refused.
    assert!(matches!(
        s.commit_rollout(commit(&next, &[], TargetChange::Keep)).await,
        Err(StoreError::Conflict(_))
    ));

    let views = s.rollout_views("r1").await.unwrap();
    assert_eq!(views.len(), 2);
    assert_eq!(views["a1"].desired.as_deref(), Some("1"));
    assert_eq!(views["a3"].desired, None);

    // Completion makes the version the cluster's target.
    let mut done = r1.clone();
    done.state = RolloutState::Completed;
    for n in &mut done.nodes {
        n.state = NodeState::Updated;
    }
    let (done, _) = s
        .commit_rollout(commit(&done, &[], TargetChange::SetToRollout))
        .await
        .unwrap();
    s.enroll_node(node("a4", "a", "toka00", &[("role", "w")]))
        .await
        .unwrap();
    assert_eq!(
        s.desired_state("a4").await.unwrap().bundles.len(),
        1,
        "joiner gets the target"
    );
    assert_eq!(
        s.get_rollout("r1").await.unwrap().unwrap().nodes.len(),
        2,
        "ended: no joiners"
    );

    // Rolling back from an ended state is refused while another rollout
    // of the bundle is active; restoring the target removes it.
    s.put_bundle(bundle("k", "2", "d2")).await.unwrap();
    s.start_rollout(rollout("r2", "a", "k", "2", &[])).await.unwrap();
    let mut back = done.clone();
    back.state = RolloutState::RollingBack;
    assert!(matches!(
        s.commit_rollout(commit(&back, &[], TargetChange::Keep)).await,
        Err(StoreError::Conflict(m)) if m.contains("rollout r2")
    ));
    let r2 = s.get_rollout("r2").await.unwrap().unwrap();
    let mut aborted = r2.clone();
    aborted.state = RolloutState::Aborted;
    s.commit_rollout(commit(&aborted, &[], TargetChange::Keep))
        .await
        .unwrap();
    let (back, changed) = s
        .commit_rollout(commit(&back, &[("a1", None)], TargetChange::RestorePrevious))
        .await
        .unwrap();
    assert_eq!(changed, ["a1"]);
    assert_eq!(back.state, RolloutState::RollingBack);
    assert!(s.get_node("a1").await.unwrap().unwrap().desired.is_empty());
    s.enroll_node(node("a5", "a", "toka00", &[("role", "w")]))
        .await
        .unwrap();
    assert!(
        s.desired_state("a5").await.unwrap().bundles.is_empty(),
        "target restored to none"
    );
    // The version a node held before stays readable while it moves.
    s.node_connected("a1", "{}", vec![held("1", 0)], 1).await.unwrap();
    assert!(s.blob_allowed("a1", "blob-k-1").await.unwrap());
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
    let st = BundleStatusRow {
        fetched_from_server: 0,
        fetched_from_peers: 0,
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

/// Windows, holds, and a rollout's policy, pacing, canaries and deferred
/// nodes survive the store; a completed rollout with a deferred node is
/// still driven.
#[allow(clippy::too_many_lines)]
pub async fn rollout_policies_are_stored(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    let w = vec![
        "Sat,Sun 02:00-06:00 Europe/Berlin".to_string(),
        "daily 23:00-01:00 UTC".to_string(),
    ];
    let c = s
        .set_cluster_windows("a", w.clone(), EventRow::windows_set("a", &w, "admin", 2))
        .await
        .unwrap();
    assert_eq!(c.maintenance_windows, w);
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().maintenance_windows, w);
    assert_eq!(s.list_clusters().await.unwrap()[0].maintenance_windows, w);
    assert!(s.get_cluster("zz").await.unwrap().is_none());
    assert!(matches!(
        s.set_cluster_windows("zz", Vec::new(), EventRow::windows_set("zz", &[], "admin", 2))
            .await,
        Err(StoreError::NotFound(_))
    ));
    s.set_cluster_windows("a", Vec::new(), EventRow::windows_set("a", &[], "admin", 3))
        .await
        .unwrap();
    assert!(
        s.get_cluster("a")
            .await
            .unwrap()
            .unwrap()
            .maintenance_windows
            .is_empty()
    );

    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    for n in ["a1", "a2"] {
        s.enroll_node(node(n, "a", "toka00", &[])).await.unwrap();
    }
    assert!(
        s.set_node_hold(
            "a1",
            Some("disk swap".into()),
            EventRow::hold("", "a1", Some("disk swap"), "admin", 4)
        )
        .await
        .unwrap()
    );
    assert!(
        !s.set_node_hold("zz", None, EventRow::hold("", "zz", None, "admin", 4))
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_node("a1").await.unwrap().unwrap().hold.as_deref(),
        Some("disk swap")
    );
    assert_eq!(s.get_node("a2").await.unwrap().unwrap().hold, None);
    // A report rewrites the node: the hold stays.
    s.record_status("a1", vec![held("1", 0)]).await.unwrap();
    assert_eq!(
        s.get_node("a1").await.unwrap().unwrap().hold.as_deref(),
        Some("disk swap")
    );
    let events = s
        .list_events(EventFilter {
            node: Some("a1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = events.iter().find(|e| e.kind == "held").unwrap();
    assert_eq!(
        (e.cluster.as_str(), e.message.as_str()),
        ("a", "held by admin: disk swap")
    );

    s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
    let mut new = rollout("r1", "a", "k", "1", &[]);
    new.policy = RolloutPolicy {
        offline: OfflinePolicy::Defer,
        canary: 1,
        canary_soak_ms: 60_000,
        canary_seed: 7,
        batch_interval_ms: 5_000,
        ignore_windows: true,
    };
    let r = s.start_rollout(new.clone()).await.unwrap();
    assert_eq!(r.policy, new.policy);
    let views = s.rollout_views("r1").await.unwrap();
    assert!(views["a1"].held && !views["a2"].held);

    // a1 held, a2 deferred (offline): the rollout completes and is still
    // driven for them.
    let mut next = r.clone();
    next.state = RolloutState::Completed;
    next.nodes[0].state = NodeState::Held;
    next.nodes[1].state = NodeState::Deferred;
    next.nodes[1].canary = true;
    next.pacing = RolloutPacing {
        next_batch_at_ms: 11,
        canaries_committed_at_ms: 12,
        canaries_passed: true,
        waiting_for_window: true,
        next_window_ms: 13,
    };
    let (stored, _) = s
        .commit_rollout(commit(&next, &[], TargetChange::SetToRollout))
        .await
        .unwrap();
    let got = s.get_rollout("r1").await.unwrap().unwrap();
    assert_eq!(got.pacing, next.pacing);
    assert_eq!(got.policy, new.policy);
    assert!(got.nodes[1].canary && !got.nodes[0].canary);
    assert_eq!(
        got.nodes.iter().map(|n| n.state).collect::<Vec<_>>(),
        [NodeState::Held, NodeState::Deferred]
    );
    assert!(got.needs_driving());
    let drive = s.rollouts_to_drive().await.unwrap();
    assert_eq!(drive.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r1"]);
    assert!(
        s.list_rollouts(None, true).await.unwrap().is_empty(),
        "completed is not active"
    );

    // Once they are settled, it is no longer driven.
    let mut done = stored.clone();
    done.nodes[0].state = NodeState::Skipped;
    done.nodes[1].state = NodeState::Skipped;
    s.commit_rollout(commit(&done, &[], TargetChange::Keep))
        .await
        .unwrap();
    assert!(s.rollouts_to_drive().await.unwrap().is_empty());
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

fn cert(cluster: &str, node: &str, serial: &str, path: &str, issued_at_ms: i64) -> IssuedCertRow {
    IssuedCertRow {
        cluster: cluster.into(),
        node: node.into(),
        serial: serial.into(),
        profile: "kubelet-client".into(),
        bundle: "kubelet".into(),
        version: "1".into(),
        path: path.into(),
        not_before_ms: issued_at_ms - 300_000,
        not_after_ms: issued_at_ms + 3_600_000,
        issued_at_ms,
    }
}

pub async fn peer_settings_are_stored_per_cluster(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    // A new cluster: off, with the defaults.
    let a = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(a.peer, PeerSettings::default());
    assert_eq!(
        a.peer,
        PeerSettings {
            enabled: false,
            port: 7444,
            upload_rate: 0,
            max_uploads: 4
        }
    );

    s.set_cluster_windows(
        "a",
        vec!["Sat 02:00-06:00 UTC".into()],
        EventRow::windows_set("a", &["Sat 02:00-06:00 UTC".into()], "admin", 2),
    )
    .await
    .unwrap();
    let on = PeerSettings {
        enabled: true,
        port: 7555,
        // Above i64::MAX: the whole u64 range is kept.
        upload_rate: u64::MAX - 1,
        max_uploads: 64,
    };
    let set = s
        .set_cluster_peer("a", on, EventRow::peer_sharing_set("a", &on, "admin", 3))
        .await
        .unwrap();
    assert_eq!(set.peer, on);
    assert_eq!(
        set.maintenance_windows,
        ["Sat 02:00-06:00 UTC"],
        "other settings stay"
    );
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().peer, on);
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.peer).collect::<Vec<_>>(),
        [on, PeerSettings::default()]
    );

    // Off: the other settings keep their values.
    let off = PeerSettings { enabled: false, ..on };
    let set = s
        .set_cluster_peer("a", off, EventRow::peer_sharing_set("a", &off, "admin", 4))
        .await
        .unwrap();
    assert_eq!(set.peer, off);
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().peer, off);
    assert_eq!(
        s.get_cluster("b").await.unwrap().unwrap().peer,
        PeerSettings::default()
    );

    assert!(matches!(
        s.set_cluster_peer("nope", on, EventRow::peer_sharing_set("nope", &on, "admin", 5))
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.get_cluster("nope").await.unwrap().is_none());
    let events = s
        .list_events(EventFilter {
            cluster: Some("a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let peer: Vec<&EventRow> = events.iter().filter(|e| e.kind == "peer_sharing").collect();
    assert_eq!(peer.len(), 2, "{events:?}");
    assert!(
        peer.iter()
            .any(|e| e.message.contains("peer sharing on by admin: port 7555")),
        "{peer:?}"
    );
    assert!(
        peer.iter()
            .any(|e| e.message.contains("peer sharing off by admin")),
        "{peer:?}"
    );
}

#[allow(clippy::too_many_lines)]
pub async fn cluster_cas_and_issued_certificates(s: &dyn Store) {
    let ca = StoredCa {
        cert_pem: "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n".into(),
        key: "sealed-or-pem".into(),
    };
    let c = s
        .create_cluster(NewCluster {
            ca: Some(ca.clone()),
            api_server: Some("https://10.0.0.1:6443".into()),
            ..NewCluster::new("a", 1)
        })
        .await
        .unwrap();
    assert_eq!(c.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(c.api_server.as_deref(), Some("https://10.0.0.1:6443"));
    // A refused create changes nothing: the first CA stays.
    assert!(matches!(
        s.create_cluster(NewCluster {
            ca: Some(StoredCa {
                cert_pem: "other".into(),
                key: "other".into()
            }),
            ..NewCluster::new("a", 2)
        })
        .await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(s.cluster_ca("a").await.unwrap(), Some(ca.clone()));
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(listed[0].ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(listed[0].api_server.as_deref(), Some("https://10.0.0.1:6443"));
    let got = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(got.api_server.as_deref(), Some("https://10.0.0.1:6443"));

    // A cluster made before CAs: none, until one is set, once.
    s.create_cluster(NewCluster::new("old", 1)).await.unwrap();
    let old = s.get_cluster("old").await.unwrap().unwrap();
    assert_eq!((old.ca_cert_pem, old.api_server), (None, None));
    assert_eq!(s.cluster_ca("old").await.unwrap(), None);
    assert_eq!(s.cluster_ca("nope").await.unwrap(), None);
    let ev = |kind: &str| EventRow {
        id: 0,
        at_ms: 5,
        cluster: "old".into(),
        node: String::new(),
        rollout_id: String::new(),
        kind: kind.into(),
        bundle: String::new(),
        version: String::new(),
        message: kind.into(),
    };
    let set = s
        .set_cluster_ca("old", ca.clone(), ev("cluster_ca"))
        .await
        .unwrap();
    assert_eq!(set.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    assert_eq!(s.cluster_ca("old").await.unwrap(), Some(ca.clone()));
    let again = StoredCa {
        cert_pem: "x".into(),
        key: "y".into(),
    };
    assert!(matches!(
        s.set_cluster_ca("old", again.clone(), ev("cluster_ca")).await,
        Err(StoreError::Conflict(m)) if m.contains("already has a CA")
    ));
    assert_eq!(s.cluster_ca("old").await.unwrap(), Some(ca.clone()));
    assert!(matches!(
        s.set_cluster_ca("nope", again, ev("cluster_ca")).await,
        Err(StoreError::NotFound(_))
    ));

    // The API server is set and cleared; windows stay as they were.
    s.set_cluster_windows(
        "old",
        vec!["Sat 02:00-06:00 UTC".into()],
        ev("maintenance_windows"),
    )
    .await
    .unwrap();
    let set = s
        .set_cluster_api_server("old", Some("https://k.example:6443".into()), ev("api_server"))
        .await
        .unwrap();
    assert_eq!(set.api_server.as_deref(), Some("https://k.example:6443"));
    assert_eq!(set.maintenance_windows, ["Sat 02:00-06:00 UTC"]);
    assert_eq!(set.ca_cert_pem.as_deref(), Some(ca.cert_pem.as_str()));
    let cleared = s
        .set_cluster_api_server("old", None, ev("api_server"))
        .await
        .unwrap();
    assert_eq!(cleared.api_server, None);
    assert_eq!(
        s.cluster_ca("old").await.unwrap(),
        Some(ca.clone()),
        "the CA survives"
    );
    assert!(matches!(
        s.set_cluster_api_server("nope", None, ev("api_server")).await,
        Err(StoreError::NotFound(_))
    ));
    let kinds: Vec<String> = s
        .list_events(EventFilter {
            cluster: Some("old".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "cluster_ca"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "api_server").count(),
        2,
        "{kinds:?}"
    );

    // Issued certificates: ordered by node, path, issue time; filtered.
    s.record_certificate(cert("a", "n2", "03", "/b", 30))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "02", "/b", 20))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "01", "/a", 40))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "04", "/a", 10))
        .await
        .unwrap();
    s.record_certificate(cert("old", "n1", "05", "/a", 50))
        .await
        .unwrap();
    assert!(matches!(
        s.record_certificate(cert("a", "n1", "01", "/z", 60)).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        s.record_certificate(cert("nope", "n1", "09", "/a", 60)).await,
        Err(StoreError::NotFound(_))
    ));
    let serials = |rows: Vec<IssuedCertRow>| rows.into_iter().map(|r| r.serial).collect::<Vec<_>>();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["04", "01", "02", "03"]
    );
    assert_eq!(
        serials(s.list_certificates(Some("a"), Some("n1")).await.unwrap()),
        ["04", "01", "02"]
    );
    assert_eq!(
        serials(s.list_certificates(None, Some("n1")).await.unwrap()),
        ["04", "01", "05", "02"]
    );
    assert_eq!(s.list_certificates(None, None).await.unwrap().len(), 5);
    assert!(
        s.list_certificates(Some("a"), Some("n"))
            .await
            .unwrap()
            .is_empty()
    );
    let one = &s.list_certificates(Some("a"), Some("n2")).await.unwrap()[0];
    assert_eq!(one, &cert("a", "n2", "03", "/b", 30));
}

/// A new certificate drops its node's records of the same path that
/// expired more than the retention before it; nothing else.
pub async fn certificate_records_expire_with_renewals(s: &dyn Store) {
    use crate::store::CERT_RECORD_RETENTION_MS as KEEP;
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    // cert(): valid for an hour from its issue time.
    s.record_certificate(cert("a", "n1", "01", "/a", 0))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n1", "02", "/b", 0))
        .await
        .unwrap();
    s.record_certificate(cert("a", "n2", "03", "/a", 0))
        .await
        .unwrap();
    // Issued just within the retention of 01's expiry: 01 stays.
    let hour = 3_600_000;
    s.record_certificate(cert("a", "n1", "04", "/a", hour + KEEP))
        .await
        .unwrap();
    let serials = |rows: Vec<IssuedCertRow>| rows.into_iter().map(|r| r.serial).collect::<Vec<_>>();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["01", "04", "02", "03"]
    );
    // Past it: 01 goes; n1's /b and n2's /a are not this node and path.
    s.record_certificate(cert("a", "n1", "05", "/a", hour + KEEP + 1))
        .await
        .unwrap();
    assert_eq!(
        serials(s.list_certificates(Some("a"), None).await.unwrap()),
        ["04", "05", "02", "03"]
    );
}

/// Deleting a node keeps the record of its certificates (audit).
pub async fn certificate_records_outlive_their_node(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("tok001", "a", None, i64::MAX))
        .await
        .unwrap();
    s.enroll_node(node("n1", "a", "tok001", &[])).await.unwrap();
    s.record_certificate(cert("a", "n1", "0a", "/a", 10))
        .await
        .unwrap();
    assert!(s.delete_node("n1").await.unwrap());
    assert_eq!(s.list_certificates(Some("a"), Some("n1")).await.unwrap().len(), 1);
}

/// A bundle whose one served blob is `d`.
fn bundle_with_blob(name: &str, version: &str, d: &lks_proto::Digest) -> NewBundle {
    NewBundle {
        blob_digests: vec![d.to_string()],
        ..bundle(name, version, &format!("m-{name}-{version}"))
    }
}

fn rec(claimed_at_ms: i64) -> BlobRecord {
    BlobRecord {
        size: 3,
        claimed_at_ms,
        deleting: false,
        owner: String::new(),
    }
}

fn mark(claimed_at_ms: i64) -> BlobRecord {
    BlobRecord {
        deleting: true,
        owner: "me".into(),
        ..rec(claimed_at_ms)
    }
}

/// Blob records change only at the revision they were read at, and a blob
/// a bundle references (or may reference, recorded after the collector
/// looked) is never marked for deletion.
pub async fn blob_records_are_compared_on_revisions(s: &dyn Store) {
    let d = lks_proto::Digest::of(b"one");
    assert!(s.blob_record(&d).await.unwrap().is_none());
    let r1 = s.put_blob_record(&d, &rec(1), 0).await.unwrap().expect("created");
    assert!(
        s.put_blob_record(&d, &rec(2), 0).await.unwrap().is_none(),
        "exists already"
    );
    let r2 = s
        .put_blob_record(&d, &rec(2), r1)
        .await
        .unwrap()
        .expect("claimed");
    assert!(r2 > r1);
    assert!(
        s.put_blob_record(&d, &rec(3), r1).await.unwrap().is_none(),
        "stale revision"
    );
    let got = s.blob_record(&d).await.unwrap().unwrap();
    assert_eq!((got.record.claimed_at_ms, got.rev), (2, r2));

    // Referenced by a bundle recorded after the collector looked: refused.
    let (_, brev) = s.referenced_blobs().await.unwrap();
    s.put_bundle(bundle_with_blob("k", "1", &d)).await.unwrap();
    let (refs, _) = s.referenced_blobs().await.unwrap();
    assert!(refs.contains(&d));
    assert!(
        s.mark_blob_deleting(&d, &mark(2), r2, brev)
            .await
            .unwrap()
            .is_none()
    );

    // Unreferenced when the collector looked, referenced since: refused.
    let d2 = lks_proto::Digest::of(b"two");
    let q1 = s.put_blob_record(&d2, &rec(1), 0).await.unwrap().unwrap();
    let (refs, brev) = s.referenced_blobs().await.unwrap();
    assert!(!refs.contains(&d2));
    s.put_bundle(bundle_with_blob("k", "2", &d2)).await.unwrap();
    assert!(
        s.mark_blob_deleting(&d2, &mark(1), q1, brev)
            .await
            .unwrap()
            .is_none()
    );
    s.delete_bundle("k", "2").await.unwrap();

    // Claimed after the collector read it: refused.
    let (_, brev) = s.referenced_blobs().await.unwrap();
    let q2 = s.put_blob_record(&d2, &rec(9), q1).await.unwrap().unwrap();
    assert!(
        s.mark_blob_deleting(&d2, &mark(1), q1, brev)
            .await
            .unwrap()
            .is_none()
    );
    // Nothing changed since: marked.
    let (_, brev) = s.referenced_blobs().await.unwrap();
    let q3 = s
        .mark_blob_deleting(&d2, &mark(9), q2, brev)
        .await
        .unwrap()
        .expect("marked");
    assert!(s.blob_record(&d2).await.unwrap().unwrap().record.deleting);
    assert!(!s.delete_blob_record(&d2, q2).await.unwrap(), "stale revision");
    assert!(s.delete_blob_record(&d2, q3).await.unwrap());
    assert!(s.blob_record(&d2).await.unwrap().is_none());
    // A record made again never repeats a revision.
    let q4 = s.put_blob_record(&d2, &rec(1), 0).await.unwrap().unwrap();
    assert!(q4 > q3);
    // A blob the store holds without a record is marked only while it has none.
    let d3 = lks_proto::Digest::of(b"three");
    let (_, brev) = s.referenced_blobs().await.unwrap();
    let m = s
        .mark_blob_deleting(&d3, &mark(0), 0, brev)
        .await
        .unwrap()
        .expect("marked");
    let got = s.blob_record(&d3).await.unwrap().unwrap();
    assert!(got.record.deleting && got.record.owner == "me" && got.rev == m);
    assert!(
        s.mark_blob_deleting(&d3, &mark(0), 0, brev)
            .await
            .unwrap()
            .is_none()
    );
    assert!(s.delete_blob_record(&d3, m).await.unwrap());
    let mut all: Vec<_> = s
        .blob_records()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.digest)
        .collect();
    all.sort();
    let mut want = vec![d, d2];
    want.sort();
    assert_eq!(all, want);
}

/// A bundle version is deleted only when no node, cluster target or
/// rollout still uses it.
pub async fn bundle_versions_in_use_are_not_deleted(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("toka00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("a1", "a", "toka00", &[])).await.unwrap();
    let (d1, d2) = (lks_proto::Digest::of(b"v1"), lks_proto::Digest::of(b"v2"));
    s.put_bundle(bundle_with_blob("k", "1", &d1)).await.unwrap();
    s.put_bundle(bundle_with_blob("k", "2", &d2)).await.unwrap();
    assert!(matches!(
        s.delete_bundle("k", "9").await,
        Err(StoreError::NotFound(_))
    ));

    let in_use = |e: StoreError, who: &str| match e {
        StoreError::Conflict(m) => {
            assert!(m.contains(who) && m.starts_with("bundle k@1 is in use by"), "{m}")
        }
        other => panic!("{other}"),
    };
    // Node a1 moves to `version` through rollout `id`: started, a1
    // assigned, completed; `who` uses k@1 at each of the three points.
    let move_to = async |id: &str, version: &str, who: [&str; 3]| {
        let r = s
            .start_rollout(rollout(id, "a", "k", version, &[]))
            .await
            .unwrap();
        in_use(s.delete_bundle("k", "1").await.unwrap_err(), who[0]);
        let mut next = r.clone();
        next.nodes[0].state = NodeState::Applying;
        next.nodes[0].touched = true;
        let (r, _) = s
            .commit_rollout(commit(&next, &[("a1", Some(version))], TargetChange::Keep))
            .await
            .unwrap();
        in_use(s.delete_bundle("k", "1").await.unwrap_err(), who[1]);
        let mut done = r.clone();
        done.nodes[0].state = NodeState::Updated;
        done.state = RolloutState::Completed;
        s.commit_rollout(commit(&done, &[], TargetChange::SetToRollout))
            .await
            .unwrap();
        if !who[2].is_empty() {
            in_use(s.delete_bundle("k", "1").await.unwrap_err(), who[2]);
        }
    };
    move_to("r1", "1", ["rollout r1", "node a1", "cluster a"]).await;
    // Everything moves to k@2; k@1 is then free, k@2 is not.
    move_to("r2", "2", ["node a1", "rollout r2", ""]).await;
    s.delete_bundle("k", "1").await.unwrap();
    assert!(s.get_bundle("k", "1").await.unwrap().is_none());
    assert!(matches!(
        s.delete_bundle("k", "1").await,
        Err(StoreError::NotFound(_))
    ));
    let (refs, _) = s.referenced_blobs().await.unwrap();
    assert!(!refs.contains(&d1) && refs.contains(&d2));
    assert!(matches!(
        s.delete_bundle("k", "2").await,
        Err(StoreError::Conflict(_))
    ));
    // A deleted version cannot be rolled out.
    assert!(matches!(
        s.start_rollout(rollout("r3", "a", "k", "1", &[])).await,
        Err(StoreError::NotFound(_))
    ));
}
