//! Conformance cases: Rollouts and their policies.

use crate::conformance::{blob, bundle, commit, encoded, held, node, rollout, token};
use crate::{
    DrainPolicy, DrainTimeout, EventFilter, EventRow, Hint, Kind, NewCluster, NodeState, OfflinePolicy,
    RolloutPacing, RolloutPolicy, RolloutRow, RolloutState, Store, StoreError, TargetChange,
};

/// What a rollout assigns is what the controller commits, nothing more:
/// the steps below, in order, on one store.
pub async fn rollouts_assign_only_what_the_controller_decides(s: &dyn Store) {
    let g0 = a_rollout_starts_without_assigning(s).await;
    let r = a_joiner_is_taken_into_a_running_rollout(s).await;
    let r1 = a_commit_assigns_what_it_decides(s, &r, g0).await;
    let done = completion_makes_the_version_the_target(s, &r1).await;
    a_rollback_restores_the_previous_target(s, &done).await;
}

/// Clusters `a` (nodes a1 role=w, a2 role=db) and `b` (b1), bundle k@1;
/// rollout r1 of k@1 to role=w in `a` (and rb in `b`) started, assigning
/// nothing. Returns a1's generation before.
async fn a_rollout_starts_without_assigning(s: &dyn Store) -> u64 {
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
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            hint: Some(Hint::PublishBundle),
            ..
        })
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
    g0
}

/// A joiner while r1 runs is taken into it, with nothing assigned yet.
async fn a_joiner_is_taken_into_a_running_rollout(s: &dyn Store) -> RolloutRow {
    s.enroll_node(node("a3", "a", "toka00", &[("role", "w")]))
        .await
        .unwrap();
    let r = s.get_rollout("r1").await.unwrap().unwrap();
    assert_eq!(
        r.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["a1", "a3"]
    );
    assert!(s.desired_state("a3").await.unwrap().bundles.is_empty());
    r
}

/// A commit assigns what it names, at a new generation, and grants its
/// blobs to those nodes only; a commit on an old revision is refused.
async fn a_commit_assigns_what_it_decides(s: &dyn Store, r: &RolloutRow, g0: u64) -> RolloutRow {
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
    assert_eq!(d.bundles, vec![encoded("k", "1", "d1")]);
    assert!(s.blob_allowed("a1", &blob("k", "1")).await.unwrap());
    assert!(!s.blob_allowed("a2", &blob("k", "1")).await.unwrap());
    assert!(!s.blob_allowed("b1", &blob("k", "1")).await.unwrap());
    // The versions it is granted through (each file's architecture is
    // checked against them by the caller).
    assert_eq!(
        s.blob_grants("a1", &blob("k", "1")).await.unwrap(),
        vec![("k".to_string(), "1".to_string())]
    );
    assert!(s.blob_grants("a2", &blob("k", "1")).await.unwrap().is_empty());
    // Claiming to hold a bundle that was never assigned grants nothing.
    s.node_connected("b1", "{}", vec![held("1", 0)], 1).await.unwrap();
    assert!(!s.blob_allowed("b1", &blob("k", "1")).await.unwrap());

    // A decision based on an old revision is refused.
    assert!(matches!(
        s.commit_rollout(commit(&next, &[], TargetChange::Keep)).await,
        Err(StoreError::Conflict(_))
    ));

    let views = s.rollout_views("r1").await.unwrap();
    assert_eq!(views.len(), 2);
    assert_eq!(views["a1"].desired.as_deref(), Some("1"));
    assert_eq!(views["a3"].desired, None);
    r1
}

/// Completion makes the version the cluster's target.
async fn completion_makes_the_version_the_target(s: &dyn Store, r1: &RolloutRow) -> RolloutRow {
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
    done
}

/// Rolling back from an ended state is refused while another rollout
/// of the bundle is active; restoring the target removes it.
async fn a_rollback_restores_the_previous_target(s: &dyn Store, done: &RolloutRow) {
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
    assert!(s.blob_allowed("a1", &blob("k", "1")).await.unwrap());
}

/// Windows, holds, and a rollout's policy, pacing, canaries and deferred
/// nodes survive the store; a completed rollout with a deferred node is
/// still driven: the steps below, in order, on one store.
pub async fn rollout_policies_are_stored(s: &dyn Store) {
    maintenance_windows_are_stored(s).await;
    a_hold_is_stored_and_survives_a_report(s).await;
    let (r, policy) = a_rollouts_policy_is_stored(s).await;
    a_completed_rollout_with_unsettled_nodes_is_still_driven(s, &r, &policy).await;
}

/// Cluster `a`'s maintenance windows are set, read back and cleared.
async fn maintenance_windows_are_stored(s: &dyn Store) {
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
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
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
}

/// Nodes a1 (held: "disk swap") and a2 of `a`; the hold survives a report
/// and is recorded as an event.
async fn a_hold_is_stored_and_survives_a_report(s: &dyn Store) {
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
}

/// Rollout r1 of k@1 to `a`, started with every policy option; returns it
/// and its policy.
async fn a_rollouts_policy_is_stored(s: &dyn Store) -> (RolloutRow, RolloutPolicy) {
    s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
    let mut new = rollout("r1", "a", "k", "1", &[]);
    new.policy = RolloutPolicy {
        offline: OfflinePolicy::Defer,
        canary: 1,
        canary_soak_ms: 60_000,
        canary_seed: 7,
        batch_interval_ms: 5_000,
        ignore_windows: true,
        drain: Some(DrainPolicy {
            timeout_ms: 120_000,
            ready_timeout_ms: 30_000,
            delete_local_data: true,
            on_timeout: DrainTimeout::Skip,
            kubelet_version: "v1.37.2".into(),
        }),
        request_id: "kube:0b7c".into(),
    };
    let r = s.start_rollout(new.clone()).await.unwrap();
    assert_eq!(r.policy, new.policy);
    assert_eq!(
        s.get_rollout("r1").await.unwrap().unwrap().policy.request_id,
        "kube:0b7c",
        "the request ID is kept"
    );
    let views = s.rollout_views("r1").await.unwrap();
    assert!(views["a1"].held && !views["a2"].held);
    (r, new.policy)
}

/// a1 held, a2 deferred (offline): the rollout completes and is still
/// driven for them.
async fn a_completed_rollout_with_unsettled_nodes_is_still_driven(
    s: &dyn Store,
    r: &RolloutRow,
    policy: &RolloutPolicy,
) {
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
    assert_eq!(&got.policy, policy);
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

/// A start is refused for the first precondition it fails, in the order
/// an operator meets them: the cluster, the bundle version, then another
/// rollout of the bundle still active ([`NewRollout::may_start`]).
pub async fn a_start_is_refused_for_the_first_precondition_it_fails(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.put_bundle(bundle("k", "1", "d1")).await.unwrap();
    assert!(matches!(
        s.start_rollout(rollout("r0", "z", "k", "9", &[])).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    s.start_rollout(rollout("r1", "a", "k", "1", &[])).await.unwrap();
    assert!(matches!(
        s.start_rollout(rollout("r2", "a", "k", "9", &[])).await,
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            ..
        })
    ));
    let e = s
        .start_rollout(rollout("r3", "a", "k", "1", &[]))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rollout r1 of k in cluster a is still running; abort it or wait for it to end"
    );
    assert!(s.get_rollout("r3").await.unwrap().is_none());
}
