//! Conformance cases for [`DeltaStore`]: rows kept once per file and base
//! when they name a patch, a skip replaced by a later record, the reason
//! for no patch read back as written, found by target and by patch, gone
//! with their bundle version, and their patches referenced (kept by the
//! collector) while they are.

use lks_proto::Digest;

use crate::conformance::bundle_with_blob;
use crate::{BlobRecord, DeltaRow, Kind, NoPatch, Store, StoreError};

fn row(version: &str, from: &str, target: Digest, patch: Option<Digest>) -> DeltaRow {
    DeltaRow {
        name: "k".into(),
        version: version.into(),
        path: "/usr/bin/kubelet".into(),
        arch: String::new(),
        from_version: from.into(),
        base: Digest::of(format!("base {from}").as_bytes()),
        target,
        size: 1000,
        patch,
        patch_size: patch.map_or(0, |_| 30),
        algorithm: lks_proto::delta::ALGORITHM.into(),
        note: if patch.is_none() {
            "patch over half the file".into()
        } else {
            String::new()
        },
        made_at_ms: 7,
        why: patch.is_none().then_some(NoPatch::TooLarge { patch_size: 600 }),
    }
}

pub async fn deltas_live_and_die_with_their_bundle_version(s: &dyn Store) {
    let (d1, d2, d3) = (Digest::of(b"v1"), Digest::of(b"v2"), Digest::of(b"v3"));
    s.put_bundle(bundle_with_blob("k", "1", &d1)).await.unwrap();
    s.put_bundle(bundle_with_blob("k", "2", &d2)).await.unwrap();
    s.put_bundle(bundle_with_blob("k", "3", &d3)).await.unwrap();
    let (p21, p31) = (Digest::of(b"patch 1->2"), Digest::of(b"patch 1->3"));
    let made = row("2", "1", d2, Some(p21));
    s.put_delta(&made).await.unwrap();
    // Once per file and base: a second row is ignored.
    let mut again = made.clone();
    again.patch = Some(Digest::of(b"other"));
    s.put_delta(&again).await.unwrap();
    let skipped = row("3", "2", d3, None);
    s.put_delta(&row("3", "1", d3, Some(p31))).await.unwrap();
    s.put_delta(&skipped).await.unwrap();
    // A version that is gone takes no row.
    assert!(matches!(
        s.put_delta(&row("9", "1", d3, Some(p31))).await,
        Err(StoreError::NotFound {
            kind: Kind::Bundle,
            ..
        })
    ));

    assert_eq!(s.deltas_of("k", "2").await.unwrap(), vec![made.clone()]);
    let of3 = s.deltas_of("k", "3").await.unwrap();
    assert_eq!(of3.len(), 2);
    assert!(of3.contains(&skipped));
    assert_eq!(s.deltas_to(&d2).await.unwrap(), vec![made.clone()]);
    let to3 = s.deltas_to(&d3).await.unwrap();
    assert_eq!(to3.len(), 1, "skipped rows are not offered");
    assert_eq!(to3[0].patch, Some(p31));
    assert_eq!(s.deltas_by_patch(&p21).await.unwrap(), vec![made]);
    assert!(s.deltas_by_patch(&d1).await.unwrap().is_empty());

    // The collector keeps a patch while its row is.
    let (refs, _) = s.referenced_blobs().await.unwrap();
    assert!(refs.contains(&p21) && refs.contains(&p31));
    let mark = BlobRecord {
        size: 30,
        claimed_at_ms: 0,
        deleting: true,
        owner: "me".into(),
    };
    // A row recorded after the collector read the references: its mark is
    // refused (the patch was claimed before its row, gc.rs).
    let (_, brev) = s.referenced_blobs().await.unwrap();
    let p41 = Digest::of(b"patch 1->3 again");
    let mut late = row("3", "0", d3, Some(p41));
    late.base = Digest::of(b"base 0");
    s.put_delta(&late).await.unwrap();
    assert!(
        s.mark_blob_deleting(&p41, &mark, 0, brev)
            .await
            .unwrap()
            .is_none(),
        "a patch recorded after the collector read is not marked"
    );

    // Deleting the version drops its rows; its patches are unreferenced.
    s.delete_bundle("k", "2").await.unwrap();
    assert!(s.deltas_of("k", "2").await.unwrap().is_empty());
    assert!(s.deltas_to(&d2).await.unwrap().is_empty());
    let (refs, brev) = s.referenced_blobs().await.unwrap();
    assert!(!refs.contains(&p21) && refs.contains(&p31));
    assert!(
        s.mark_blob_deleting(&p21, &mark, 0, brev)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(s.deltas_of("k", "3").await.unwrap().len(), 3);
}

pub async fn a_skip_is_recorded_with_its_reason_and_replaced_by_a_later_record(s: &dyn Store) {
    let (d1, d2) = (Digest::of(b"v1"), Digest::of(b"v2"));
    s.put_bundle(bundle_with_blob("k", "1", &d1)).await.unwrap();
    s.put_bundle(bundle_with_blob("k", "2", &d2)).await.unwrap();
    let mut skipped = row("2", "1", d2, None);
    skipped.why = Some(NoPatch::Estimate { saving: 3, min: 50 });
    skipped.note = String::new();
    s.put_delta(&skipped).await.unwrap();
    assert_eq!(s.deltas_of("k", "2").await.unwrap(), vec![skipped.clone()]);
    assert!(
        s.deltas_to(&d2).await.unwrap().is_empty(),
        "a skip is not offered"
    );

    // The limits changed: the pair was tried again and skipped for another
    // reason; the newer record replaces the older.
    let mut memory = skipped.clone();
    memory.why = Some(NoPatch::Memory {
        need: 7 << 30,
        cap: 2 << 30,
    });
    memory.made_at_ms = 8;
    s.put_delta(&memory).await.unwrap();
    assert_eq!(s.deltas_of("k", "2").await.unwrap(), vec![memory]);

    // Then made: the patch replaces the skip, and stays.
    let p = Digest::of(b"patch 1->2");
    let made = row("2", "1", d2, Some(p));
    s.put_delta(&made).await.unwrap();
    assert_eq!(s.deltas_of("k", "2").await.unwrap(), vec![made.clone()]);
    s.put_delta(&skipped).await.unwrap();
    assert_eq!(
        s.deltas_of("k", "2").await.unwrap(),
        vec![made.clone()],
        "a patch is never replaced by a skip"
    );
    assert_eq!(s.deltas_to(&d2).await.unwrap(), vec![made]);
}
