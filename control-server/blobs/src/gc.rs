//! Garbage collection of blobs, and the claim a publish makes so that the
//! two never race (the records are in `store::blobrecs`).
//!
//! A publish, for each blob of the new bundle version, once the bytes are
//! verified in a temp file: reads the blob's record; if the collector is
//! deleting it, waits for that to end; else writes the record with
//! `claimed_at` = now at the revision it read ([`claim`]). From then on no
//! collector can start deleting it; only now does the publish give the
//! blob its local name and make sure the blob store holds it (uploading it
//! if not), and then, within the grace period, record the bundle version.
//!
//! The collector (the leading replica, every `--blob-gc-interval`):
//! reads the digests every bundle version references (at a revision), then
//! for each blob neither referenced nor claimed within the grace period
//! (`--blob-gc-grace`) writes a `deleting` mark at the record's revision,
//! refused if the record or the bundles changed since it read them; only
//! with the mark does it delete the bytes (blob store, then this replica's
//! copy), then the record. A publish that claimed first makes the mark
//! fail; a mark that came first makes the publish wait and upload again.
//! Blobs the store holds without a record (a publish that died between its
//! upload and its record, an installation older than the records) are
//! marked the same way, create-only.
//!
//! Every replica also drops the local copies (`DATA_DIR/blobs`) that no
//! bundle version references and that are older than the grace period;
//! a copy dropped too eagerly is fetched again from the store.

use std::collections::HashSet;
use std::time::Duration;

use lks_proto::Digest;

use crate::{BlobError, Blobs};
use lks_store::{BlobRecord, BlobRecords, StoreError};

/// Default for `--blob-gc-grace`: how long a claimed or fresh blob is kept
/// even if no bundle references it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);
/// Default for `--blob-gc-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);
/// How long a publish waits for the collector to finish deleting a blob it
/// needs, before it asks its client to retry.
const DELETION_WAIT: Duration = Duration::from_secs(60);

/// Claims `d` for a publish: once this returns, no collector deletes it
/// (its bytes in the blob store or this replica's copy) within the grace
/// period, so the publish can rely on it and then record the bundle
/// version that references it. `store` names the blob store in errors.
pub async fn claim(
    records: &(impl BlobRecords + ?Sized),
    store: &str,
    d: &Digest,
    size: u64,
    now_ms: impl Fn() -> i64,
) -> Result<(), BlobError> {
    let deadline = tokio::time::Instant::now() + DELETION_WAIT;
    loop {
        let current = records.blob_record(d).await?;
        if let Some(r) = current.as_ref().filter(|r| r.record.deleting) {
            if tokio::time::Instant::now() >= deadline {
                return Err(BlobError::Unavailable {
                    store: store.to_string(),
                    message: format!(
                        "{d} is being deleted by the garbage collector of replica {:?}",
                        r.record.owner
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let record = BlobRecord {
            size,
            claimed_at_ms: now_ms(),
            deleting: false,
            owner: String::new(),
        };
        let rev = current.map_or(0, |r| r.rev);
        if records.put_blob_record(d, &record, rev).await?.is_some() {
            return Ok(());
        }
        // Changed meanwhile (another publish, or the collector): read again.
    }
}

/// What one collector pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Blobs whose bytes were deleted, and how many bytes.
    pub reclaimed: u64,
    pub reclaimed_bytes: u64,
    /// What the blob store holds after the pass.
    pub held: u64,
    pub held_bytes: u64,
}

/// One collector pass over the blob store. `owner` names this replica in
/// its marks. `keep` (agent packages) is never collected: no bundle
/// references a package, and with `--blob-store local` the store is the
/// directory the package endpoint serves it from.
pub async fn collect(
    blobs: &Blobs,
    records: &dyn BlobRecords,
    owner: &str,
    grace: Duration,
    now_ms: i64,
    keep: &HashSet<Digest>,
) -> Result<Pass, BlobError> {
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let mut pass = Pass::default();
    let all = records.blob_records().await?;
    // Marks this replica left halfway (SQLite after a crash; on etcd a
    // replica's marks die with its lease, and a restarted replica has
    // another name): finish them.
    for r in all
        .iter()
        .filter(|r| r.record.deleting && r.record.owner == owner)
    {
        if reclaim(blobs, records, &r.digest, r.rev).await? {
            pass.reclaimed += 1;
            pass.reclaimed_bytes += r.record.size;
        }
    }
    let (referenced, bundles_rev) = records.referenced_blobs().await?;
    let mut known: HashSet<Digest> = HashSet::new();
    for r in &all {
        known.insert(r.digest);
        if r.record.deleting || referenced.contains(&r.digest) || keep.contains(&r.digest) {
            continue;
        }
        if now_ms.saturating_sub(r.record.claimed_at_ms) < grace_ms {
            continue;
        }
        let mark = BlobRecord {
            deleting: true,
            owner: owner.to_string(),
            ..r.record.clone()
        };
        if let Some(rev) = records
            .mark_blob_deleting(&r.digest, &mark, r.rev, bundles_rev)
            .await?
            && reclaim(blobs, records, &r.digest, rev).await?
        {
            pass.reclaimed += 1;
            pass.reclaimed_bytes += r.record.size;
        }
    }
    // Held without a record: unreferenced ones go the same way.
    for b in blobs.store().list().await? {
        if known.contains(&b.digest) {
            pass.held += 1;
            pass.held_bytes += b.size;
            continue;
        }
        if referenced.contains(&b.digest) || keep.contains(&b.digest) {
            pass.held += 1;
            pass.held_bytes += b.size;
            continue;
        }
        let mark = BlobRecord {
            size: b.size,
            claimed_at_ms: now_ms,
            deleting: true,
            owner: owner.to_string(),
        };
        if let Some(rev) = records
            .mark_blob_deleting(&b.digest, &mark, 0, bundles_rev)
            .await?
            && reclaim(blobs, records, &b.digest, rev).await?
        {
            pass.reclaimed += 1;
            pass.reclaimed_bytes += b.size;
        } else {
            pass.held += 1;
            pass.held_bytes += b.size;
        }
    }
    Ok(pass)
}

/// Deletes a marked blob's bytes (the store, then this replica's copy),
/// then its record at the mark's revision.
async fn reclaim(blobs: &Blobs, records: &dyn BlobRecords, d: &Digest, rev: i64) -> Result<bool, BlobError> {
    blobs.store().delete(d).await?;
    blobs.local.remove(d).await?;
    let removed = records.delete_blob_record(d, rev).await?;
    tracing::info!(digest = %d, store = %blobs.store().describe(), "blob reclaimed: no bundle version references it");
    Ok(removed)
}

/// Drops this replica's local copies that no bundle version references
/// and that are older than `grace`, except `keep` (agent packages). Not
/// for a server whose blob store is its local directory: the collector
/// owns those. The bytes removed.
pub async fn sweep_local(
    blobs: &Blobs,
    records: &dyn BlobRecords,
    keep: &HashSet<Digest>,
    grace: Duration,
) -> Result<u64, BlobError> {
    let (referenced, _) = records.referenced_blobs().await.map_err(BlobError::Meta)?;
    let local = blobs.local.clone();
    let old = tokio::task::spawn_blocking(move || local.list_older_than(grace))
        .await
        .map_err(|e| BlobError::Meta(StoreError::backend_source(e)))??;
    let mut bytes = 0;
    for b in old {
        if referenced.contains(&b.digest) || keep.contains(&b.digest) {
            continue;
        }
        blobs.local.remove(&b.digest).await?;
        bytes += b.size;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::conformance::{TestS3, pattern};
    use crate::{BlobStore, LocalBlobs, LocalDirStore};
    use lks_store::{NewBundle, Store};
    use lks_store_sqlite::SqliteStore;

    fn bundle(name: &str, version: &str, d: &Digest) -> NewBundle {
        NewBundle {
            blob_digests: vec![*d],
            ..lks_store::conformance::bundle(name, version, "gc")
        }
    }

    async fn local_blob(blobs: &Blobs, data: &[u8]) -> Digest {
        let d = Digest::of(data);
        let mut w = blobs.local.writer(d, data.len() as u64).await.unwrap();
        w.write(data).await.unwrap();
        w.finish().await.unwrap();
        d
    }

    fn now() -> i64 {
        lks_store::clock::now_ms()
    }

    /// Deleted versions' blobs are reclaimed; referenced and freshly
    /// claimed ones are kept; a blob held without a record goes too.
    async fn reclaims_only_what_nothing_uses(
        store: Arc<dyn Store>,
        durable: Arc<dyn BlobStore>,
        dir: &std::path::Path,
    ) {
        let blobs = Blobs::new(LocalBlobs::open(dir).unwrap(), durable.clone());
        let (a, b) = (pattern(3 << 20, 1), pattern(1 << 20, 2));
        let (da, db) = (local_blob(&blobs, &a).await, local_blob(&blobs, &b).await);
        for (d, len) in [(da, a.len()), (db, b.len())] {
            claim(&*store, "test", &d, len as u64, now).await.unwrap();
            blobs.persist(&d, len as u64).await.unwrap();
        }
        store.put_bundle(bundle("k", "1", &da)).await.unwrap();
        store.put_bundle(bundle("k", "2", &db)).await.unwrap();
        // An orphan: in the store, no record, no bundle.
        let orphan = pattern(1000, 3);
        let other = tempfile::tempdir().unwrap();
        let other = LocalBlobs::open(other.path()).unwrap();
        let mut w = other.writer(Digest::of(&orphan), 1000).await.unwrap();
        w.write(&orphan).await.unwrap();
        w.finish().await.unwrap();
        let dor = Digest::of(&orphan);
        durable.put(&dor, 1000, &other.path(&dor)).await.unwrap();

        let pass = collect(&blobs, &*store, "me", Duration::ZERO, now(), &HashSet::new())
            .await
            .unwrap();
        assert_eq!((pass.reclaimed, pass.held), (1, 2), "the orphan goes: {pass:?}");
        store.delete_bundle("k", "1").await.unwrap();
        // Within the grace period: kept.
        let pass = collect(
            &blobs,
            &*store,
            "me",
            Duration::from_secs(3600),
            now(),
            &HashSet::new(),
        )
        .await
        .unwrap();
        assert_eq!(pass.reclaimed, 0);
        let pass = collect(&blobs, &*store, "me", Duration::ZERO, now(), &HashSet::new())
            .await
            .unwrap();
        assert_eq!(
            (pass.reclaimed, pass.reclaimed_bytes, pass.held),
            (1, a.len() as u64, 1)
        );
        assert!(!durable.contains(&da).await.unwrap() && !blobs.local.contains(&da));
        assert!(store.blob_record(&da).await.unwrap().is_none());
        assert!(durable.contains(&db).await.unwrap());
    }

    /// The grace period of the race: longer than any publish in it takes.
    const GRACE_MS: i64 = 60_000;

    /// A publish of the same digest racing the collector: whenever the new
    /// version is recorded, its blob is in the store, byte-exact.
    async fn a_racing_publish_never_loses_its_blob(
        store: Arc<dyn Store>,
        durable: Arc<dyn BlobStore>,
        dir: &std::path::Path,
    ) {
        let blobs = Arc::new(Blobs::new(LocalBlobs::open(dir).unwrap(), durable.clone()));
        let data = pattern(2 << 20, 9);
        let d = local_blob(&blobs, &data).await;
        claim(&*store, "test", &d, data.len() as u64, now).await.unwrap();
        blobs.persist(&d, data.len() as u64).await.unwrap();
        let mut kept = 0;
        for round in 0..25u64 {
            // Unreferenced, claimed long ago: the collector wants it.
            let rec = store.blob_record(&d).await.unwrap();
            if let Some(r) = rec {
                assert!(!r.record.deleting);
                let old = BlobRecord {
                    claimed_at_ms: now() - 2 * GRACE_MS,
                    ..r.record.clone()
                };
                let _ = store.put_blob_record(&d, &old, r.rev).await.unwrap();
            }
            // Either side starts first, by up to a few milliseconds: the
            // rounds cover the publish claiming before the collector reads,
            // between its read and its mark, and after the mark.
            let offset = Duration::from_micros((round * 7919) % 4000);
            let (collector_delay, jitter) = if round % 2 == 0 {
                (offset, Duration::ZERO)
            } else {
                (Duration::ZERO, offset)
            };
            let collector = {
                let (blobs, store) = (blobs.clone(), store.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(collector_delay).await;
                    collect(
                        &blobs,
                        &*store,
                        "me",
                        Duration::from_millis(GRACE_MS as u64),
                        now(),
                        &HashSet::new(),
                    )
                    .await
                })
            };
            let publish = {
                let (blobs, store) = (blobs.clone(), store.clone());
                let data = data.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(jitter).await;
                    // As a publish does: the bytes verified in a temp file,
                    // the claim, then the local name and the blob store.
                    let mut w = blobs.local.writer(d, data.len() as u64).await.unwrap();
                    w.write(&data).await.unwrap();
                    let staged = w.stage().await.unwrap();
                    claim(&*store, "test", &d, data.len() as u64, now).await.unwrap();
                    staged.commit().await.unwrap();
                    blobs.persist(&d, data.len() as u64).await.unwrap();
                    store
                        .put_bundle(bundle("r", &round.to_string(), &d))
                        .await
                        .unwrap();
                })
            };
            let pass = collector.await.unwrap().unwrap();
            publish.await.unwrap();
            kept += u64::from(pass.reclaimed == 0);
            assert!(
                durable.contains(&d).await.unwrap(),
                "round {round}: blob lost ({pass:?})"
            );
            let check = tempfile::tempdir().unwrap();
            let check = LocalBlobs::open(check.path()).unwrap();
            assert!(durable.fetch(&d, &check).await.unwrap(), "round {round}");
            assert_eq!(std::fs::read(check.path(&d)).unwrap(), data);
            store.delete_bundle("r", &round.to_string()).await.unwrap();
        }
        // Both orders happened at least once over the rounds? Not required,
        // but report it for whoever reads a failure.
        eprintln!(
            "collector reclaimed before the publish in {} of 25 rounds",
            25 - kept
        );
    }

    #[tokio::test]
    async fn sqlite_and_local_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let durable = Arc::new(LocalDirStore::new(LocalBlobs::open(dir.path()).unwrap()));
        reclaims_only_what_nothing_uses(store, durable, dir.path()).await;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let durable = Arc::new(LocalDirStore::new(LocalBlobs::open(dir.path()).unwrap()));
        a_racing_publish_never_loses_its_blob(store, durable, dir.path()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_and_s3() {
        let s3 = TestS3::start("lks-blobs");
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        reclaims_only_what_nothing_uses(store, Arc::new(s3.store("lks-blobs", "a")), dir.path()).await;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        a_racing_publish_never_loses_its_blob(store, Arc::new(s3.store("lks-blobs", "b")), dir.path()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_and_s3() {
        let etcd = crate::conformance::test_etcd();
        let s3 = TestS3::start("lks-blobs");
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(etcd.store("r1").await);
        reclaims_only_what_nothing_uses(store.clone(), Arc::new(s3.store("lks-blobs", "a")), dir.path())
            .await;
        let dir = tempfile::tempdir().unwrap();
        a_racing_publish_never_loses_its_blob(store, Arc::new(s3.store("lks-blobs", "b")), dir.path()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_and_etcd_chunks() {
        let etcd = crate::conformance::test_etcd();
        let store = etcd.store("r1").await;
        let chunks = Arc::new(crate::EtcdChunks::new(store.clone(), 32 << 20));
        let store: Arc<dyn Store> = Arc::new(store);
        let dir = tempfile::tempdir().unwrap();
        reclaims_only_what_nothing_uses(store.clone(), chunks.clone(), dir.path()).await;
        let dir = tempfile::tempdir().unwrap();
        a_racing_publish_never_loses_its_blob(store, chunks, dir.path()).await;
    }

    /// With `--blob-store local` the store is the data dir, where the
    /// agent packages are too: no bundle references them, yet the
    /// collector keeps them (it once reclaimed them on its first pass, and
    /// the package endpoint answered 500).
    #[tokio::test]
    async fn agent_packages_in_the_local_store_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let durable = Arc::new(LocalDirStore::new(LocalBlobs::open(dir.path()).unwrap()));
        let blobs = Blobs::new(LocalBlobs::open(dir.path()).unwrap(), durable);
        let package = local_blob(&blobs, b"agent package").await;
        let orphan = local_blob(&blobs, b"orphan").await;
        let keep: HashSet<Digest> = [package].into();
        let pass = collect(&blobs, &*store, "me", Duration::ZERO, now(), &keep)
            .await
            .unwrap();
        assert_eq!((pass.reclaimed, pass.held), (1, 1), "{pass:?}");
        assert!(blobs.local.contains(&package) && !blobs.local.contains(&orphan));
    }

    #[tokio::test]
    async fn local_copies_nothing_references_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let other = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(
            LocalBlobs::open(dir.path()).unwrap(),
            Arc::new(LocalDirStore::new(LocalBlobs::open(other.path()).unwrap())),
        );
        let used = local_blob(&blobs, b"used").await;
        let package = local_blob(&blobs, b"agent package").await;
        let stale = local_blob(&blobs, b"stale").await;
        store.put_bundle(bundle("k", "1", &used)).await.unwrap();
        let keep: HashSet<Digest> = [package].into();
        assert_eq!(
            sweep_local(&blobs, &*store, &keep, Duration::from_secs(3600))
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            sweep_local(&blobs, &*store, &keep, Duration::ZERO).await.unwrap(),
            5
        );
        assert!(
            blobs.local.contains(&used) && blobs.local.contains(&package) && !blobs.local.contains(&stale)
        );
    }
}
