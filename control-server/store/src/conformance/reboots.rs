//! Conformance cases: reboot policies and reboot locks (issue [reboots]).

use crate::{
    AlertGate, EventFilter, EventRow, Kind, NewCluster, RebootLock, RebootMode, RebootPolicy, RebootSlot,
    RebootTimeout, SlotPhase, Store, StoreError,
};

fn event(cluster: &str, kind: &str) -> EventRow {
    EventRow {
        id: 0,
        at_ms: 5,
        cluster: cluster.into(),
        node: "n1".into(),
        rollout_id: String::new(),
        kind: kind.into(),
        bundle: String::new(),
        version: String::new(),
        message: kind.into(),
    }
}

pub async fn reboot_policies_and_locks_are_kept_and_written_on_revisions(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_cluster(NewCluster::new("b", 1)).await.unwrap();
    let a = s.get_cluster("a").await.unwrap().unwrap();
    assert_eq!(a.reboots, RebootPolicy::default(), "off until set");
    assert_eq!(a.reboots.mode, RebootMode::Off);

    let policy = RebootPolicy {
        mode: RebootMode::Auto,
        max_concurrent: 3,
        timeout_ms: 60_000,
        on_timeout: RebootTimeout::Keep,
        alert_gate: Some(AlertGate {
            url: "http://prometheus.example:9090".into(),
            filter: "^(KubeNodeNotReady|Etcd.*)$".into(),
        }),
        blocking_pod_selector: "app=db,tier in (a,b)".into(),
    };
    let row = s
        .set_cluster_reboots("a", policy.clone(), event("a", "reboot_policy"))
        .await
        .unwrap();
    assert_eq!(row.reboots, policy);
    assert_eq!(s.get_cluster("a").await.unwrap().unwrap().reboots, policy);
    let listed = s.list_clusters().await.unwrap();
    assert_eq!(listed.iter().find(|c| c.name == "a").unwrap().reboots, policy);
    assert_eq!(
        listed.iter().find(|c| c.name == "b").unwrap().reboots,
        RebootPolicy::default()
    );
    // Another setting keeps it.
    let row = s
        .set_cluster_windows(
            "a",
            vec!["daily 02:00-04:00 UTC".into()],
            event("a", "windows_set"),
        )
        .await
        .unwrap();
    assert_eq!(row.reboots, policy);
    assert!(matches!(
        s.set_cluster_reboots("nope", policy.clone(), event("nope", "reboot_policy"))
            .await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));

    // The lock: empty at revision 0 until written; each write only on the
    // revision read.
    let empty = s.reboot_lock("a").await.unwrap();
    assert_eq!((empty.lock.clone(), empty.revision), (RebootLock::default(), 0));
    let mut lock = RebootLock::default();
    lock.slots.push(RebootSlot {
        node: "n1".into(),
        phase: SlotPhase::Draining,
        taken_ms: 10,
        since_ms: 10,
        boot_id: "b1".into(),
        drained: true,
        request: 0,
        message: "draining".into(),
    });
    let r1 = s
        .put_reboot_lock("a", &lock, 0, vec![event("a", "reboot_slot_taken")])
        .await
        .unwrap()
        .expect("written at revision 0");
    let read = s.reboot_lock("a").await.unwrap();
    assert_eq!((read.lock.clone(), read.revision), (lock.clone(), r1));
    assert_eq!(
        s.put_reboot_lock("a", &RebootLock::default(), 0, vec![])
            .await
            .unwrap(),
        None,
        "stale"
    );
    let mut next = lock.clone();
    next.slots[0].phase = SlotPhase::Rebooting;
    next.slots[0].request = 7;
    let r2 = s
        .put_reboot_lock("a", &next, r1, vec![])
        .await
        .unwrap()
        .expect("at r1");
    assert!(r2 > r1);
    assert_eq!(
        s.put_reboot_lock("a", &lock, r1, vec![]).await.unwrap(),
        None,
        "r1 is gone"
    );
    assert_eq!(s.reboot_lock("a").await.unwrap().lock, next);
    assert!(matches!(
        s.put_reboot_lock("nope", &lock, 0, vec![]).await,
        Err(StoreError::NotFound {
            kind: Kind::Cluster,
            ..
        })
    ));
    let all = s.reboot_locks().await.unwrap();
    assert_eq!(all.len(), 1, "only written locks");
    assert_eq!(
        (all[0].0.as_str(), &all[0].1.lock, all[0].1.revision),
        ("a", &next, r2)
    );
    let events = s
        .list_events(EventFilter {
            cluster: Some("a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(events.iter().any(|e| e.kind == "reboot_slot_taken"), "{events:?}");
    assert!(events.iter().any(|e| e.kind == "reboot_policy"), "{events:?}");
}
