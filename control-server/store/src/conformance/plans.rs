//! Conformance cases: release plans and cluster labels.

use crate::{
    EventFilter, EventRow, Kind, NewCluster, OnHalt, PlanClusterRow, PlanClusterState, PlanGroupRow, PlanRow,
    PlanState, Store, StoreError,
};

fn event(kind: &str) -> EventRow {
    EventRow {
        id: 0,
        at_ms: 5,
        cluster: String::new(),
        node: String::new(),
        rollout_id: String::new(),
        kind: kind.into(),
        bundle: "k".into(),
        version: "2".into(),
        message: "plan p".into(),
    }
}

pub fn plan(name: &str) -> PlanRow {
    PlanRow {
        name: name.into(),
        bundle: "k".into(),
        version: "2".into(),
        selector: [("role".to_string(), "worker".to_string())].into(),
        policy: vec![8, 3, 0, 0xff],
        soak_ms: 1000,
        max_in_flight: 2,
        failure_budget: 1,
        on_halt: OnHalt::Finish,
        alert_after_ms: 3_600_000,
        state: PlanState::Running,
        groups: vec![
            PlanGroupRow {
                name: "canary".into(),
                selector: "a".into(),
                done_at_ms: 0,
                clusters: vec![PlanClusterRow::waiting("a", 3)],
            },
            PlanGroupRow {
                name: "rest".into(),
                selector: "*".into(),
                done_at_ms: 0,
                clusters: vec![PlanClusterRow::waiting("b", 0)],
            },
        ],
        failures: 0,
        failures_at_resume: 0,
        message: String::new(),
        created_at_ms: 5,
        updated_at_ms: 5,
        state_since_ms: 5,
        started_by: "admin".into(),
        revision: 0,
    }
}

pub async fn plans_are_stored_whole_and_compared_on_their_revision(s: &dyn Store) {
    let p = s.create_plan(plan("p"), event("plan_created")).await.unwrap();
    assert!(p.revision > 0);
    assert!(matches!(
        s.create_plan(plan("p"), event("plan_created")).await,
        Err(StoreError::AlreadyExists(m)) if m == "plan p already exists"
    ));
    let read = s.get_plan("p").await.unwrap().unwrap();
    assert_eq!(read, p, "a plan reads back as stored, with its revision");
    assert!(s.get_plan("q").await.unwrap().is_none());

    let mut next = read.clone();
    next.groups[0].clusters[0].state = PlanClusterState::Running;
    next.groups[0].clusters[0].rollout_id = "abc".into();
    next.groups[0].clusters[0].seq = 1;
    let stored = s
        .update_plan(next.clone(), vec![event("plan_cluster_started")])
        .await
        .unwrap();
    assert!(stored.revision > read.revision);
    assert_eq!(s.get_plan("p").await.unwrap().unwrap(), stored);

    // A write from the old read is refused and changes nothing.
    let mut stale = read.clone();
    stale.state = PlanState::Paused;
    assert!(matches!(
        s.update_plan(stale, Vec::new()).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(s.get_plan("p").await.unwrap().unwrap(), stored);
    let mut gone = plan("nope");
    gone.revision = stored.revision;
    assert!(matches!(
        s.update_plan(gone, Vec::new()).await,
        Err(StoreError::NotFound { kind: Kind::Plan, .. })
    ));

    s.create_plan(plan("a-first"), event("plan_created"))
        .await
        .unwrap();
    let names: Vec<String> = s
        .list_plans()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["a-first", "p"]);
    let listed = s.list_plans().await.unwrap();
    assert_eq!(listed[1], stored, "a listed plan carries its revision");
    let revisions = s.plan_revisions().await.unwrap();
    assert_eq!(
        revisions,
        listed
            .iter()
            .map(|p| (p.name.clone(), p.revision))
            .collect::<Vec<_>>(),
        "the revisions alone, by name, are those the plans carry"
    );
    let again = s.update_plan(stored.clone(), Vec::new()).await.unwrap();
    assert_eq!(
        s.plan_revisions().await.unwrap()[1],
        ("p".to_string(), again.revision),
        "a write moves the listed revision"
    );
    assert_ne!(again.revision, stored.revision);

    let events = s.list_events(EventFilter::default()).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["plan_created", "plan_cluster_started", "plan_created"]);
}

pub async fn clusters_carry_labels(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    assert!(s.get_cluster("a").await.unwrap().unwrap().labels.is_empty());
    let labels: lks_proto::labels::Labels = [("tier".to_string(), "early".to_string())].into();
    let row = s
        .set_cluster_labels("a", labels.clone(), event("cluster_labels"))
        .await
        .unwrap();
    assert_eq!(row.labels, labels);
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().labels, labels);
    assert_eq!(s.list_clusters().await.unwrap()[0].labels, labels);
    assert!(matches!(
        s.set_cluster_labels("zz", labels, event("cluster_labels")).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
}
