//! Conformance cases: signed releases and trust roots per cluster.

use std::collections::BTreeMap;

use lks_proto::release::{Release, ReleasedBundle, SignedRelease, SignedRoot, TrustRoot};
use lks_proto::sign::SigningKey;

use lks_proto::Digest;

use crate::conformance::{held, node, token};
use crate::{
    NewCluster, NodeTrust, ReleaseRow, Store, StoreError, Stored, StoredRelease, StoredRoot, TrustHealth,
};

fn release(cluster: &str, version: u64, expires_at_ms: i64) -> StoredRelease {
    let mut bundles = BTreeMap::new();
    bundles.insert(
        "kubelet".to_string(),
        ReleasedBundle {
            version: "1".into(),
            manifest_digest: Digest::of(b"manifest"),
        },
    );
    StoredRelease::new(SignedRelease::sign(
        Release {
            channel: cluster.into(),
            version,
            expires_at_ms,
            bundles,
        },
        &[],
    ))
}

fn root(version: u64, threshold: u32) -> StoredRoot {
    let k = SigningKey::generate();
    StoredRoot::new(SignedRoot::sign(
        TrustRoot {
            version,
            keys: vec![k.public()],
            threshold,
            expires_at_ms: 0,
        },
        &[&k],
    ))
}

fn versions(rows: &[ReleaseRow]) -> Vec<u64> {
    rows.iter().map(|r| r.release.version()).collect()
}

pub async fn releases_only_move_forward(s: &dyn Store) {
    assert!(s.list_releases("a", 0).await.unwrap().is_empty());
    let r1 = release("a", 1, 10);
    assert_eq!(s.put_release(r1.clone(), 100).await.unwrap(), Stored::Created);
    assert_eq!(
        s.put_release(release("a", 5, 10), 200).await.unwrap(),
        Stored::Created
    );
    assert_eq!(
        s.put_release(release("a", 5, 10), 300).await.unwrap(),
        Stored::Unchanged,
        "the identical record again"
    );
    let e = s.put_release(release("a", 5, 11), 300).await.unwrap_err();
    assert!(matches!(e, StoreError::AlreadyExists(_)), "{e}");
    let e = s.put_release(release("a", 4, 10), 300).await.unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    assert_eq!(
        s.put_release(r1, 300).await.unwrap(),
        Stored::Unchanged,
        "an older stored record again"
    );
    let e = s.put_release(release("a", 1, 11), 300).await.unwrap_err();
    assert!(matches!(e, StoreError::AlreadyExists(_)), "{e}");
    assert_eq!(
        s.put_release(release("b", 2, 10), 400).await.unwrap(),
        Stored::Created
    );

    let all = s.list_releases("a", 0).await.unwrap();
    assert_eq!(versions(&all), [5, 1], "newest first, one cluster's");
    assert_eq!(all[0].release, release("a", 5, 10), "read back typed, as stored");
    assert_eq!(all[0].release.digest(), release("a", 5, 10).digest());
    assert_eq!((all[0].published_at_ms, all[0].cluster.as_str()), (200, "a"));
    assert_eq!(versions(&s.list_releases("a", 1).await.unwrap()), [5]);
    assert_eq!(versions(&s.list_releases("b", 0).await.unwrap()), [2]);
}

pub async fn one_release_version_is_stored_once_under_a_race(s: &dyn Store) {
    let (x, y) = futures::join!(
        s.put_release(release("a", 3, 10), 1),
        s.put_release(release("a", 3, 20), 1)
    );
    let created = [&x, &y]
        .iter()
        .filter(|r| matches!(r, Ok(Stored::Created)))
        .count();
    assert_eq!(created, 1, "{x:?} {y:?}");
    assert!(
        [&x, &y]
            .iter()
            .any(|r| matches!(r, Err(StoreError::AlreadyExists(_)))),
        "{x:?} {y:?}"
    );
    assert_eq!(versions(&s.list_releases("a", 0).await.unwrap()), [3]);
}

pub async fn roots_follow_one_another(s: &dyn Store) {
    assert!(s.list_roots("a").await.unwrap().is_empty());
    let e = s.put_root("a", root(3, 1), 1).await.unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    let r2 = root(2, 1);
    assert_eq!(s.put_root("a", r2.clone(), 10).await.unwrap(), Stored::Created);
    assert_eq!(s.put_root("a", r2.clone(), 11).await.unwrap(), Stored::Unchanged);
    let e = s.put_root("a", root(2, 1), 12).await.unwrap_err();
    assert!(matches!(e, StoreError::AlreadyExists(_)), "{e}");
    let e = s.put_root("a", root(4, 1), 12).await.unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    let r3 = root(3, 1);
    assert_eq!(s.put_root("a", r3.clone(), 20).await.unwrap(), Stored::Created);
    assert_eq!(s.put_root("b", root(2, 1), 30).await.unwrap(), Stored::Created);

    let all = s.list_roots("a").await.unwrap();
    assert_eq!(
        all.iter()
            .map(|r| (r.root.clone(), r.published_at_ms))
            .collect::<Vec<_>>(),
        [(r2, 10), (r3, 20)],
        "in version order, as stored"
    );
    assert_eq!(s.list_roots("b").await.unwrap().len(), 1);
}

pub async fn a_nodes_reported_trust_is_kept_with_it(s: &dyn Store) {
    s.create_cluster(NewCluster::new("a", 1)).await.unwrap();
    s.create_token(token("many00", "a", None, 10_000)).await.unwrap();
    s.enroll_node(node("w1", "a", "many00", &[])).await.unwrap();
    assert_eq!(
        s.get_node("w1").await.unwrap().unwrap().trust,
        None,
        "never reported"
    );
    let stale = NodeTrust {
        enabled: true,
        state: Some(TrustHealth::StaleRelease),
        message: "release 7 of a expired".into(),
        release_version: 7,
        release_expires_at_ms: 1_000,
        root_version: 2,
    };
    s.node_hello("w1", "{}", Vec::new(), Some(stale.clone()), None, 2_000)
        .await
        .unwrap();
    s.record_status("w1", vec![held("1", 1)]).await.unwrap();
    assert_eq!(
        s.get_node("w1").await.unwrap().unwrap().trust.as_ref(),
        Some(&stale),
        "from the Hello, kept across reports"
    );
    let listed = s.list_nodes(Some("a")).await.unwrap();
    assert_eq!(listed[0].trust.as_ref(), Some(&stale));
    let ok = NodeTrust {
        state: Some(TrustHealth::Ok),
        message: String::new(),
        release_version: 8,
        ..stale
    };
    s.record_trust("w1", ok.clone()).await.unwrap();
    assert_eq!(s.get_node("w1").await.unwrap().unwrap().trust, Some(ok));
    s.node_connected("w1", "{}", Vec::new(), 3_000).await.unwrap();
    assert_eq!(
        s.get_node("w1").await.unwrap().unwrap().trust,
        None,
        "an agent that no longer reports it shows none"
    );
    // A node that is gone is no error.
    s.record_trust("gone", NodeTrust::off()).await.unwrap();
}
