//! Conformance cases: Bundles, blob records and what keeps a bundle version.

use lks_proto::sign::SigningKey;
use lks_proto::{canonical, pb};
use prost::Message as _;

use crate::conformance::{
    WriteStored, blob, bundle, commit, encoded, node, rollout, row_of, signed_bundle, token,
};
use crate::{
    BlobRecord, Hint, Kind, NewBundle, NewCluster, NodeState, PutOutcome, RolloutState, Store, StoreError,
    TargetChange, Unreadable,
};

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

/// A bundle whose one served blob is `d`.
pub fn bundle_with_blob(name: &str, version: &str, d: &lks_proto::Digest) -> NewBundle {
    NewBundle {
        blob_digests: vec![*d],
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
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            ..
        })
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
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            ..
        })
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
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            hint: Some(Hint::PublishBundle),
            ..
        })
    ));
}

/// A published bundle reads back typed: the digests it was put with, the
/// bundle and manifest it was made from, and the bytes agents are sent.
pub async fn bundles_read_back_typed(s: &dyn Store) {
    let key = SigningKey::generate();
    let signed = key.sign_bundle(signed_bundle("k", "1", "d1").manifest);
    let new = NewBundle::new(signed.clone(), vec![blob("k", "1")], 5);
    assert_eq!(s.put_bundle(new.clone()).await.unwrap(), PutOutcome::Created);
    let row = s.get_bundle("k", "1").await.unwrap().unwrap();
    assert_eq!(row, row_of(&new));
    assert_eq!(row.manifest_digest, canonical::manifest_digest(&signed.manifest));
    assert_eq!(row.bundle.signed(), &signed);
    assert_eq!(row.bundle.manifest(), &signed.manifest);
    assert_eq!(
        row.bundle.encoded(),
        pb::SignedBundle::from(&signed).encode_to_vec()
    );
    assert!(row.signed);
    assert_eq!(
        s.list_bundles(Some("k")).await.unwrap(),
        std::slice::from_ref(&row)
    );
    assert_eq!(s.list_bundles(None).await.unwrap(), [row]);
    let (refs, _) = s.referenced_blobs().await.unwrap();
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), [blob("k", "1")]);
    assert_eq!(s.put_bundle(new).await.unwrap(), PutOutcome::Unchanged);
}

/// A bundle version whose stored fields no longer read back is a
/// [`StoreError::Corrupt`] naming it, whichever field broke; it can still
/// be deleted.
pub async fn a_bundle_stored_unreadable_is_a_typed_error<S: Store + WriteStored>(s: &S) {
    let good = bundle("k", "1", "d1");
    s.put_bundle(good.clone()).await.unwrap();
    let digest = good.manifest_digest.to_string();
    let no_manifest = pb::SignedBundle::default().encode_to_vec();
    let other_version = encoded("k", "2", "d1");
    // The bytes and digest text stored, and the reason they must give.
    type Case<'a> = (&'a [u8], &'a str, fn(&Unreadable) -> bool);
    let cases: [Case<'_>; 4] = [
        (b"\x0a\xff", &digest, |w| matches!(w, Unreadable::Decode(_))),
        (
            &no_manifest,
            &digest,
            |w| matches!(w, Unreadable::Invalid(e) if e.field == "manifest"),
        ),
        (
            &other_version,
            &digest,
            |w| matches!(w, Unreadable::OtherVersion(v) if v == "k@2"),
        ),
        (good.bundle.encoded(), "d1", |w| {
            matches!(w, Unreadable::Digest(_))
        }),
    ];
    for (bytes, digest, why) in cases {
        s.write_stored_bundle("k", "1", bytes, digest).await;
        for e in [
            s.get_bundle("k", "1").await.unwrap_err(),
            s.list_bundles(None).await.unwrap_err(),
        ] {
            match &e {
                StoreError::Corrupt {
                    kind: Kind::Bundle,
                    name,
                    why: w,
                } if name == "k@1" && why(w) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    s.write_stored_bundle("k", "1", b"\x0a\xff", &digest).await;
    let e = s.get_bundle("k", "1").await.unwrap_err().to_string();
    assert!(
        e.starts_with("stored bundle k@1 is unreadable: not an encoded signed bundle: "),
        "{e}"
    );
    s.delete_bundle("k", "1").await.unwrap();
    assert!(s.list_bundles(None).await.unwrap().is_empty());
}
