//! Conformance cases: the audit trail.

use crate::{AuditFilter, AuditRow, Store};

fn record(at_ms: i64, verb: &str, target: &str) -> AuditRow {
    AuditRow {
        id: 0,
        at_ms,
        verb: verb.into(),
        target: target.into(),
        args: r#"{"k":"v"}"#.into(),
        outcome: "ok".into(),
        caller: "admin".into(),
        caller_fingerprint: "sha256:00".into(),
        server: "https://replica-1:7443".into(),
    }
}

pub async fn the_audit_trail_keeps_records_in_order_filters_and_prunes(s: &dyn Store) {
    assert!(s.list_audit(AuditFilter::default()).await.unwrap().is_empty());
    for (at, verb, target) in [
        (1_000, "CreateCluster", "a"),
        (2_000, "StartRollout", "r1 kubelet@1"),
        (2_000, "PauseRollout", "r1"),
        (3_000, "StartRollout", "r2 kubelet@2"),
        (4_000, "HoldNode", "n1"),
    ] {
        s.append_audit(record(at, verb, target)).await.unwrap();
    }
    let all = s.list_audit(AuditFilter::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["a", "r1 kubelet@1", "r1", "r2 kubelet@2", "n1"],
        "oldest first, every field kept"
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ids increase: {all:?}");
    let first = &all[0];
    assert_eq!(
        (first.args.as_str(), first.outcome.as_str(), first.caller.as_str()),
        (r#"{"k":"v"}"#, "ok", "admin")
    );
    assert_eq!(first.caller_fingerprint, "sha256:00");
    assert_eq!(first.server, "https://replica-1:7443");

    let starts = s
        .list_audit(AuditFilter {
            verb: Some("StartRollout".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        starts.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["r1 kubelet@1", "r2 kubelet@2"]
    );
    let since = s
        .list_audit(AuditFilter {
            since_ms: 2_500,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        since.iter().map(|r| r.verb.as_str()).collect::<Vec<_>>(),
        ["StartRollout", "HoldNode"]
    );
    let newest_two = s
        .list_audit(AuditFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        newest_two.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["r2 kubelet@2", "n1"]
    );

    // Retention: everything before 3 s goes; what is left keeps its ids,
    // and a new record gets a higher one than any before it.
    assert_eq!(s.prune_audit(3_000).await.unwrap(), 3);
    let left = s.list_audit(AuditFilter::default()).await.unwrap();
    assert_eq!(
        left.iter().map(|r| r.id).collect::<Vec<_>>(),
        [all[3].id, all[4].id]
    );
    assert_eq!(s.prune_audit(3_000).await.unwrap(), 0);
    s.append_audit(record(5_000, "DeleteNode", "n1")).await.unwrap();
    let after = s.list_audit(AuditFilter::default()).await.unwrap();
    assert!(after.last().unwrap().id > all[4].id, "an id is never given twice");
}

pub async fn the_audit_trail_pages_past_many_records(s: &dyn Store) {
    // More records than one etcd page, with the wanted verb only among the
    // oldest: listing must read on until it has them.
    for i in 0..300 {
        let verb = if i < 3 { "DeleteBundle" } else { "HoldNode" };
        s.append_audit(record(10_000 + i, verb, &format!("t{i}")))
            .await
            .unwrap();
    }
    let deletes = s
        .list_audit(AuditFilter {
            verb: Some("DeleteBundle".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        deletes.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
        ["t0", "t1", "t2"]
    );
    let many = s
        .list_audit(AuditFilter {
            limit: 1_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(many.len(), 300);
    assert_eq!(
        s.list_audit(AuditFilter::default()).await.unwrap().len(),
        100,
        "the default limit"
    );
}
