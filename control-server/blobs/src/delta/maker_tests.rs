//! The maker end to end on a SQLite store and a local blob dir: what a pass
//! makes, skips and abandons, what it records and reports, and that a pair
//! skipped by a limit since raised is tried again.

use lks_proto::{BundlePath, Manifest, SignedBundle};

use super::*;
use crate::{LocalBlobs, LocalDirStore};
use lks_store::{NewBundle, StoredBundle};
use lks_store_sqlite::SqliteStore;

const PATH: &str = "/usr/bin/app";
const SIZE: usize = 256 << 10;

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    blobs: Arc<Blobs>,
    store: SqliteStore,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let durable = Arc::new(LocalDirStore::new(LocalBlobs::open(dir.path()).unwrap()));
        let blobs = Arc::new(Blobs::new(LocalBlobs::open(dir.path()).unwrap(), durable));
        Fixture {
            _dir: dir,
            blobs,
            store: SqliteStore::open_in_memory().unwrap(),
        }
    }

    /// Publishes app@`version` holding `data` at [`PATH`], its blob local.
    async fn publish(&self, version: &str, at: i64, data: &[u8]) {
        let d = Digest::of(data);
        let mut w = self.blobs.local.writer(d, data.len() as u64).await.unwrap();
        w.write(data).await.unwrap();
        w.finish().await.unwrap();
        let manifest = Manifest {
            name: "app".into(),
            version: version.into(),
            files: vec![FileSpec {
                path: BundlePath::new(PATH).unwrap(),
                digest: d,
                size: data.len() as u64,
                mode: 0o755,
                url: None,
                chunks: None,
                arch: None,
            }],
            ..Default::default()
        };
        let bundle = StoredBundle::new(SignedBundle {
            manifest,
            signature: None,
            chunks_signature: None,
        });
        self.store
            .put_bundle(NewBundle {
                name: "app".into(),
                version: version.into(),
                bundle,
                manifest_digest: Digest::of(version.as_bytes()),
                signed: false,
                files: 1,
                total_size: data.len() as u64,
                blob_digests: vec![d],
                now_ms: at,
            })
            .await
            .unwrap();
    }

    /// One pass with `limits`: what it did, and the results it reported.
    async fn pass(&self, limits: Limits, settled: &mut Settled) -> (Pass, Vec<PatchResult>) {
        let reported = std::sync::Mutex::new(Vec::new());
        let pass = make_missing(
            &self.blobs,
            &self.store,
            limits,
            settled,
            || 1,
            |o| {
                if let Some(r) = o.result {
                    reported.lock().unwrap().push(r);
                }
            },
        )
        .await
        .unwrap();
        (pass, reported.into_inner().unwrap())
    }

    /// Why app@`version` has no patch from `from` (`None`: it has one, or
    /// no row).
    async fn why(&self, version: &str, from: &str) -> Option<NoPatch> {
        let rows = self.store.deltas_of("app", version).await.unwrap();
        rows.into_iter()
            .find(|r| r.from_version == from)
            .and_then(|r| r.why)
    }
}

#[tokio::test]
async fn unrelated_pairs_are_skipped_before_a_diff_and_related_ones_patched() {
    let f = Fixture::new();
    let (v1, v2) = (noise(SIZE, 1), noise(SIZE, 2));
    let mut v3 = v2.clone();
    v3.splice(SIZE / 2..SIZE / 2, *b"a small edit");
    f.publish("1", 10, &v1).await;
    f.publish("2", 20, &v2).await;
    f.publish("3", 30, &v3).await;
    let mut settled = Settled::default();
    let (pass, reported) = f.pass(Limits::default(), &mut settled).await;
    assert_eq!((pass.made, pass.skipped, pass.abandoned), (1, 2, 0), "{pass:?}");
    assert_eq!(reported.len(), 3);
    let saved = reported.iter().find_map(|r| match r {
        PatchResult::Made { saved } => Some(*saved),
        _ => None,
    });
    assert!(saved.unwrap() > SIZE as u64 * 9 / 10, "{saved:?}");
    assert!(matches!(
        f.why("2", "1").await,
        Some(NoPatch::Estimate {
            saving: 0..=2,
            min: crate::delta::DEFAULT_MIN_SAVING
        })
    ));
    assert!(matches!(
        f.why("3", "1").await,
        Some(NoPatch::Estimate {
            min: crate::delta::DEFAULT_MIN_SAVING,
            ..
        })
    ));
    let made = f.store.deltas_of("app", "3").await.unwrap();
    assert!(made.iter().any(|r| r.from_version == "2" && r.patch.is_some()));

    // Recorded: the next pass looks at nothing.
    let (pass, reported) = f.pass(Limits::default(), &mut Settled::default()).await;
    assert_eq!((pass, reported.len()), (Pass::default(), 0));

    // A restart without the estimate tries the skipped pairs: their
    // patches are over half the file, abandoned.
    let no_estimate = Limits {
        min_saving: 0,
        ..Limits::default()
    };
    let (pass, _) = f.pass(no_estimate, &mut Settled::default()).await;
    assert_eq!((pass.made, pass.skipped, pass.abandoned), (0, 0, 2), "{pass:?}");
    assert!(matches!(f.why("2", "1").await, Some(NoPatch::TooLarge { .. })));
    let (pass, _) = f.pass(no_estimate, &mut Settled::default()).await;
    assert_eq!(pass, Pass::default(), "abandoned is for good");
}

#[tokio::test]
async fn a_pair_over_the_memory_cap_is_skipped_until_the_cap_is_raised() {
    let f = Fixture::new();
    let v1 = noise(SIZE, 3);
    let mut v2 = v1.clone();
    v2[SIZE / 3] ^= 0xff;
    f.publish("1", 10, &v1).await;
    f.publish("2", 20, &v2).await;
    let small = Limits {
        max_memory: SIZE as u64,
        ..Limits::default()
    };
    let (pass, _) = f.pass(small, &mut Settled::default()).await;
    assert_eq!((pass.made, pass.skipped), (0, 1));
    let need = make::memory_needed(SIZE as u64, SIZE as u64);
    assert_eq!(
        f.why("2", "1").await,
        Some(NoPatch::Memory {
            need,
            cap: SIZE as u64
        })
    );
    // The same cap: not tried again. A higher one: made.
    assert_eq!(f.pass(small, &mut Settled::default()).await.0, Pass::default());
    let (pass, _) = f.pass(Limits::default(), &mut Settled::default()).await;
    assert_eq!(pass.made, 1);
    assert_eq!(f.why("2", "1").await, None);
}

#[tokio::test]
async fn several_jobs_make_every_pair_once() {
    let f = Fixture::new();
    let mut v = noise(SIZE, 4);
    for (i, at) in [(1, 10), (2, 20), (3, 30), (4, 40)] {
        v[i * 1000] ^= 0x5a;
        f.publish(&i.to_string(), at, &v).await;
    }
    let jobs = Limits {
        jobs: 3,
        ..Limits::default()
    };
    let (pass, reported) = f.pass(jobs, &mut Settled::default()).await;
    // 2 from 1; 3 from 2 and 1; 4 from 3 and 2.
    assert_eq!((pass.made, reported.len()), (5, 5), "{pass:?}");
}

#[tokio::test]
async fn jobs_sharing_a_cap_that_fits_one_diff_take_turns() {
    let f = Fixture::new();
    let mut v = noise(SIZE, 5);
    for (i, at) in [(1, 10), (2, 20), (3, 30)] {
        v[i * 1000] ^= 0x5a;
        f.publish(&i.to_string(), at, &v).await;
    }
    let one_at_a_time = Limits {
        jobs: 3,
        max_memory: make::memory_needed(SIZE as u64, SIZE as u64),
        ..Limits::default()
    };
    let (pass, _) = f.pass(one_at_a_time, &mut Settled::default()).await;
    assert_eq!((pass.made, pass.skipped), (3, 0), "{pass:?}");
}
