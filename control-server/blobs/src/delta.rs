//! The delta maker (issue [delta]): for each file of a bundle version
//! whose path (and architecture) versions of the same name published
//! before it also had, with other bytes, a patch from each of the last
//! `bases` such contents (`lks_proto::delta`; bsdiff 4's search, its
//! sections in zstd frames unless `--delta-algorithm bsdiff4`), kept as a
//! blob and recorded in the store ([`lks_store::DeltaStore`]).
//!
//! Off the publish path: a task on the leading replica makes the missing
//! ones every `--delta-interval`, at most `--delta-jobs` at once, each on a
//! thread of its own at the lowest CPU priority, so a publish never waits
//! and a delta not made yet is simply not offered.
//! Bounds: a file over `--delta-max-file-size` gets none, and is not
//! recorded, so a higher limit makes it later. A pair costs what it is
//! worth ([`make`], issue [upgrade-cost]): one whose diff would need more
//! than `--delta-max-memory`, or whose base the estimate says supplies
//! less than `--delta-min-saving` of the file, is skipped before any diff;
//! a patch over half the file is abandoned. Either is recorded with its
//! reason ([`NoPatch`]), and not tried again while the reason holds (a
//! restart with other limits tries it again).
//! The patch blob follows the publish protocol of `gc.rs`: verified in a
//! temp file, claimed, then named, made durable, and recorded.
//!
//! Scaling: a pass lists the bundle versions (one store read), then works
//! only on the versions not [`Settled`] by an earlier pass of this replica:
//! it works out their candidates (against the earlier versions of their
//! name) and reads their delta rows (one read per version). A version is
//! settled once every patch the rule asks for has a row or is over the
//! size limit; so in the steady state a pass is one listing and no row
//! read, and after a publish one read per new version. In memory, per
//! replica: a new leader, or a restart, settles each version once again.

mod background;
pub mod estimate;
pub mod make;
#[cfg(test)]
mod maker_tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lks_proto::{Digest, FileSpec};

use crate::{BlobError, Blobs};
use lks_store::{BlobRecords, BundleRow, BundleStore, DeltaRow, DeltaStore, NoPatch};
use make::Made;

/// Default for `--delta-max-file-size`: about 1.5 GiB of memory while one
/// patch is made for a file this size (6× the file, BENCHMARKS.md).
pub const DEFAULT_MAX_FILE_SIZE: u64 = 256 << 20;
/// Default for `--delta-bases`: patches from the last two earlier versions.
pub const DEFAULT_BASES: usize = 2;
/// Default for `--delta-interval`.
pub const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
/// A patch larger than this share of its file (percent) is not kept.
pub const MAX_PATCH_PERCENT: u64 = 50;
/// Default for `--delta-min-saving` (percent of the file). The estimate
/// counts what the base supplies, not what the patch's compression adds:
/// unrelated content reads 0–1 %, a kubectl several minors back 21–31 %
/// (patches of 15–20 % of the file, BENCHMARKS.md), so 20 skips the first
/// and keeps every measured release pair.
pub const DEFAULT_MIN_SAVING: u8 = 20;
/// Default for `--delta-max-memory`: two versions of a file at the default
/// `--delta-max-file-size` fit ([`make::memory_needed`]).
pub const DEFAULT_MAX_MEMORY: u64 = 2 << 30;
/// Default for `--delta-jobs`.
pub const DEFAULT_JOBS: usize = 1;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_file_size: u64,
    pub bases: usize,
    /// `--delta-algorithm`: one of `lks_proto::delta::ALGORITHMS`.
    pub algorithm: &'static str,
    /// `--delta-min-saving`: the share of a file (percent, 0–100) the
    /// estimate must say the base supplies; 0 makes no estimate.
    pub min_saving: u8,
    /// `--delta-max-memory`: bytes the diffs running at once may need
    /// together (a pair needing more alone is skipped).
    pub max_memory: u64,
    /// `--delta-jobs`: makes at once (at least 1).
    pub jobs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            bases: DEFAULT_BASES,
            algorithm: lks_proto::delta::ZSTD_ALGORITHM,
            min_saving: DEFAULT_MIN_SAVING,
            max_memory: DEFAULT_MAX_MEMORY,
            jobs: DEFAULT_JOBS,
        }
    }
}

impl Limits {
    /// Whether a pair recorded without a patch stays so under these
    /// limits; one skipped by a limit since raised is tried again.
    fn still_holds(&self, why: Option<NoPatch>) -> bool {
        match why {
            Some(NoPatch::Estimate { saving, .. }) => saving < self.min_saving,
            Some(NoPatch::Memory { need, .. }) => need > self.max_memory,
            Some(NoPatch::TooLarge { .. }) | None => true,
        }
    }
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub made: u64,
    /// Skipped before a diff (estimate, memory).
    pub skipped: u64,
    /// Diffed and thrown away (a patch over half its file).
    pub abandoned: u64,
}

/// One pair's end, as the metrics count it: the CPU time its estimate and
/// diff took, and what became of it (`None`: it failed and is tried again
/// next pass, or its blob is not held yet).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub cpu: Duration,
    pub result: Option<PatchResult>,
}

/// What a pair came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchResult {
    /// A patch kept, sparing this many bytes of its file per fetch.
    Made {
        saved: u64,
    },
    Skipped,
    Abandoned,
}

impl PatchResult {
    /// `made`, `skipped` or `abandoned`: the metrics' label and the log's.
    pub fn label(&self) -> &'static str {
        match self {
            PatchResult::Made { .. } => "made",
            PatchResult::Skipped => "skipped",
            PatchResult::Abandoned => "abandoned",
        }
    }
}

/// One patch to consider: `target`'s file `file`, from `base`'s file.
pub struct Want {
    name: String,
    version: String,
    from_version: String,
    file: FileSpec,
    base: Digest,
    base_size: u64,
}

/// Served files (no mirror URL) large enough to be worth a patch, by path
/// and architecture.
fn served(row: &BundleRow) -> BTreeMap<(String, String), &FileSpec> {
    row.bundle
        .signed()
        .manifest
        .files
        .iter()
        .filter(|f| f.url.is_none() && f.size >= lks_proto::delta::MIN_FILE_SIZE)
        .map(|f| {
            let arch = f.arch.map(|a| a.to_string()).unwrap_or_default();
            ((f.path.to_string(), arch), f)
        })
        .collect()
}

/// The bundle versions (name, version) whose patches are settled: each
/// one the rule asks for has a row (made or skipped), or is over
/// `--delta-max-file-size` (which only a restart changes, and this is in
/// memory). Kept by the maker's task from pass to pass.
#[derive(Debug, Default)]
pub struct Settled(HashSet<(String, String)>);

/// Every patch the rule asks for, by bundle version (pure, no I/O): for
/// each version not in `skip`, each served file, the last `bases` earlier
/// versions of the same name (in publish order) with a file at that path
/// and architecture holding other bytes, each such content once.
fn candidates(mut rows: Vec<BundleRow>, bases: usize, skip: &HashSet<(String, String)>) -> Vec<Want> {
    rows.sort_by(|a, b| (&a.name, a.published_at_ms).cmp(&(&b.name, b.published_at_ms)));
    let files: Vec<_> = rows.iter().map(served).collect();
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if skip.contains(&(row.name.clone(), row.version.clone())) {
            continue;
        }
        let same_name = rows[..i]
            .iter()
            .zip(&files[..i])
            .filter(|(r, _)| r.name == row.name);
        let earlier: Vec<_> = same_name.collect();
        for (key, f) in &files[i] {
            let mut seen = vec![f.digest];
            let bases_of = earlier.iter().rev().filter_map(|(r, fs)| {
                let b = fs.get(key)?;
                if seen.contains(&b.digest) {
                    return None;
                }
                seen.push(b.digest);
                Some((r.version.clone(), b.digest, b.size))
            });
            for (from_version, base, base_size) in bases_of.take(bases) {
                out.push(Want {
                    name: row.name.clone(),
                    version: row.version.clone(),
                    from_version,
                    file: (*f).clone(),
                    base,
                    base_size,
                });
            }
        }
    }
    out
}

/// The [`candidates`] of the versions not settled yet that the store
/// lacks a row for, within the size limit; settles the versions that have
/// none left.
async fn wanted(
    store: &(impl BundleStore + DeltaStore + ?Sized),
    limits: Limits,
    settled: &mut Settled,
) -> Result<Vec<Want>, BlobError> {
    let rows = store.list_bundles(None).await?;
    let ids: HashSet<(String, String)> = rows.iter().map(|r| (r.name.clone(), r.version.clone())).collect();
    // Deleted versions are forgotten.
    settled.0.retain(|id| ids.contains(id));
    let mut by_version: BTreeMap<(String, String), Vec<Want>> = ids
        .into_iter()
        .filter(|id| !settled.0.contains(id))
        .map(|id| (id, Vec::new()))
        .collect();
    for w in candidates(rows, limits.bases, &settled.0) {
        // Not recorded: a higher limit (a restart) makes it.
        if w.file.size > limits.max_file_size {
            tracing::debug!(path = %w.file.path, size = w.file.size, "no delta: the file is over --delta-max-file-size");
            continue;
        }
        if let Some(v) = by_version.get_mut(&(w.name.clone(), w.version.clone())) {
            v.push(w);
        }
    }
    let mut out = Vec::new();
    for (id, wants) in by_version {
        let have = if wants.is_empty() {
            Vec::new()
        } else {
            store.deltas_of(&id.0, &id.1).await?
        };
        let missing: Vec<Want> = wants
            .into_iter()
            .filter(|w| {
                let arch = w.file.arch.map(|a| a.to_string()).unwrap_or_default();
                !have.iter().any(|h| {
                    h.path == w.file.path.to_string()
                        && h.arch == arch
                        && h.base == w.base
                        && (h.patch.is_some() || limits.still_holds(h.why))
                })
            })
            .collect();
        if missing.is_empty() {
            settled.0.insert(id);
        }
        out.extend(missing);
    }
    Ok(out)
}

/// One pass: makes every missing patch, at most `limits.jobs` at once,
/// and tells `report` how each ended. A failure of one (a blob this
/// replica cannot read now) is logged and tried next pass.
pub async fn make_missing(
    blobs: &Arc<Blobs>,
    store: &(impl BundleStore + DeltaStore + BlobRecords + ?Sized),
    limits: Limits,
    settled: &mut Settled,
    now_ms: impl Fn() -> i64,
    report: impl Fn(Outcome),
) -> Result<Pass, BlobError> {
    let mut pass = Pass::default();
    let (now_ms, budget) = (&now_ms, &make::Budget::new(limits.max_memory));
    let mut attempts = futures::stream::iter(wanted(store, limits, settled).await?)
        .map(|w| async move {
            let started = std::time::Instant::now();
            let attempt = make::make_one(blobs, store, &w, (limits, budget), now_ms).await;
            (w, attempt, started.elapsed())
        })
        .buffer_unordered(limits.jobs.max(1));
    while let Some((w, attempt, took)) = attempts.next().await {
        let result = record(store, limits, &w, attempt.made, took, now_ms).await?;
        match result {
            Some(PatchResult::Made { .. }) => pass.made += 1,
            Some(PatchResult::Skipped) => pass.skipped += 1,
            Some(PatchResult::Abandoned) => pass.abandoned += 1,
            None => {}
        }
        report(Outcome {
            cpu: attempt.cpu,
            result,
        });
    }
    Ok(pass)
}

/// Logs a pair's make and records it in the store; what it came to
/// (`None`: nothing recorded, tried again next pass).
async fn record(
    store: &(impl DeltaStore + ?Sized),
    limits: Limits,
    w: &Want,
    made: Result<Made, BlobError>,
    took: Duration,
    now_ms: &impl Fn() -> i64,
) -> Result<Option<PatchResult>, BlobError> {
    let bundle = format!("{}@{}", w.name, w.version);
    let mut row = DeltaRow {
        name: w.name.clone(),
        version: w.version.clone(),
        path: w.file.path.to_string(),
        arch: w.file.arch.map(|a| a.to_string()).unwrap_or_default(),
        from_version: w.from_version.clone(),
        base: w.base,
        target: w.file.digest,
        size: w.file.size,
        patch: None,
        patch_size: 0,
        algorithm: limits.algorithm.into(),
        note: String::new(),
        made_at_ms: now_ms(),
        why: None,
    };
    let result = match made {
        Ok(Made::Patch { digest, size }) => {
            (row.patch, row.patch_size) = (Some(digest), size);
            PatchResult::Made {
                saved: w.file.size.saturating_sub(size),
            }
        }
        Ok(Made::NoPatch(why)) => {
            row.why = Some(why);
            row.note = no_patch_text(&why);
            if why.abandoned() {
                PatchResult::Abandoned
            } else {
                PatchResult::Skipped
            }
        }
        Ok(Made::NotHeld(d)) => {
            tracing::debug!(path = %w.file.path, digest = %d, "no delta yet: the blob is in no store");
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!(%bundle, path = %w.file.path, from = %w.from_version, error = %e,
                "delta not made; trying again next pass");
            return Ok(None);
        }
    };
    tracing::info!(%bundle, path = %w.file.path, from = %w.from_version, size = w.file.size,
        patch_size = row.patch_size, note = %row.note, ms = took.as_millis() as u64,
        "delta {}", result.label());
    match store.put_delta(&row).await {
        Ok(()) | Err(lks_store::StoreError::NotFound { .. }) => Ok(Some(result)),
        Err(e) => Err(e.into()),
    }
}

/// Why a pair has no patch, in words: the note a row keeps and the log
/// says (`lksctl bundle get` says the same from the typed reason).
pub fn no_patch_text(why: &NoPatch) -> String {
    match why {
        NoPatch::Estimate { saving, min } => format!("estimated saving {saving}% < {min}%"),
        NoPatch::Memory { need, cap } => {
            format!("making it needs about {need} bytes of memory, over --delta-max-memory {cap}")
        }
        NoPatch::TooLarge { patch_size } => {
            format!("the patch ({patch_size} bytes) is over {MAX_PATCH_PERCENT} % of the file")
        }
    }
}

#[cfg(test)]
mod tests {
    use lks_proto::{BundlePath, Manifest, SignedBundle};

    use super::*;
    use lks_store::StoredBundle;

    fn file(path: &str, tag: &str, size: u64, arch: Option<&str>, url: bool) -> FileSpec {
        FileSpec {
            path: BundlePath::new(path).unwrap(),
            digest: Digest::of(tag.as_bytes()),
            size,
            mode: 0o755,
            url: url.then(|| "https://mirror.example/f".to_string()),
            chunks: None,
            arch: arch.map(|a| lks_proto::arch::Arch::parse(a).unwrap()),
        }
    }

    fn row(name: &str, version: &str, at: i64, files: Vec<FileSpec>) -> BundleRow {
        let manifest = Manifest {
            name: name.into(),
            version: version.into(),
            files,
            ..Default::default()
        };
        BundleRow {
            name: name.into(),
            version: version.into(),
            bundle: StoredBundle::new(SignedBundle {
                manifest,
                signature: None,
                chunks_signature: None,
            }),
            manifest_digest: Digest::of(version.as_bytes()),
            signed: false,
            files: 1,
            total_size: 0,
            published_at_ms: at,
        }
    }

    const BIG: u64 = 1 << 20;

    #[test]
    fn patches_come_from_the_last_earlier_versions_with_other_bytes_at_the_same_path_and_arch() {
        let bin = |tag: &str| file("/usr/bin/kubelet", tag, BIG, None, false);
        let rows = vec![
            // Published out of name order: publish time decides.
            row(
                "k",
                "4",
                40,
                vec![bin("d"), file("/etc/small", "s4", 100, None, false)],
            ),
            row(
                "k",
                "1",
                10,
                vec![bin("a"), file("/etc/small", "s1", 100, None, false)],
            ),
            row(
                "k",
                "2",
                20,
                vec![bin("b"), file("/opt/m", "m2", BIG, None, true)],
            ),
            // The same bytes as 2: no patch from 2.
            row(
                "k",
                "3",
                30,
                vec![bin("b"), file("/opt/m", "m3", BIG, None, true)],
            ),
            row("other", "1", 5, vec![bin("z")]),
        ];
        let got: Vec<(String, String, Digest)> = candidates(rows, 2, &HashSet::new())
            .into_iter()
            .map(|w| (w.version, w.from_version, w.base))
            .collect();
        let d = |t: &str| Digest::of(t.as_bytes());
        assert_eq!(
            got,
            vec![
                ("2".into(), "1".into(), d("a")),
                ("3".into(), "1".into(), d("a")),
                // The last two earlier contents: b (3, the latest holding
                // it) and a (1); 2 holds b too, made once.
                ("4".into(), "3".into(), d("b")),
                ("4".into(), "1".into(), d("a")),
            ],
            "small files, mirror files and other names never"
        );
    }

    #[test]
    fn each_architecture_patches_from_its_own_file() {
        let f = |tag: &str, arch| file("/usr/bin/kubelet", tag, BIG, Some(arch), false);
        let rows = vec![
            row("k", "1", 10, vec![f("a1", "amd64"), f("r1", "arm64")]),
            row("k", "2", 20, vec![f("a2", "amd64"), f("r2", "arm64")]),
        ];
        let got: Vec<(String, Digest)> = candidates(rows, 2, &HashSet::new())
            .into_iter()
            .map(|w| (w.file.arch.map(|a| a.to_string()).unwrap_or_default(), w.base))
            .collect();
        let d = |t: &str| Digest::of(t.as_bytes());
        assert_eq!(got, vec![("amd64".into(), d("a1")), ("arm64".into(), d("r1"))]);
    }

    #[tokio::test]
    async fn a_version_whose_patches_all_have_rows_is_settled_and_not_looked_at_again() {
        use lks_store::{BlobRecords, BundleStore, DeltaStore};
        let store = lks_store_sqlite::SqliteStore::open_in_memory().unwrap();
        let bin = |tag: &str| file("/usr/bin/kubelet", tag, BIG, None, false);
        let huge = file("/usr/bin/huge", "h2", 1 << 30, None, false);
        let versions = [
            row(
                "k",
                "1",
                10,
                vec![bin("a"), file("/usr/bin/huge", "h1", 1 << 30, None, false)],
            ),
            row("k", "2", 20, vec![bin("b"), huge]),
        ];
        for r in &versions {
            let put = lks_store::NewBundle {
                name: r.name.clone(),
                version: r.version.clone(),
                bundle: r.bundle.clone(),
                manifest_digest: r.manifest_digest,
                signed: false,
                files: 2,
                total_size: 0,
                blob_digests: Vec::new(),
                now_ms: r.published_at_ms,
            };
            store.put_bundle(put).await.unwrap();
        }
        let id = |v: &str| ("k".to_string(), v.to_string());
        let limits = Limits {
            max_file_size: 256 << 20,
            bases: 2,
            ..Limits::default()
        };
        let mut settled = Settled::default();
        // k@1 has no earlier version: settled at once. k@2 wants the
        // kubelet patch (the huge file is over the limit: not wanted).
        let w = wanted(&store, limits, &mut settled).await.unwrap();
        assert_eq!(
            w.iter()
                .map(|w| (w.version.as_str(), w.file.path.to_string()))
                .collect::<Vec<_>>(),
            [("2", "/usr/bin/kubelet".to_string())]
        );
        assert_eq!(settled.0, HashSet::from([id("1")]));
        store
            .put_delta(&DeltaRow {
                name: "k".into(),
                version: "2".into(),
                path: "/usr/bin/kubelet".into(),
                arch: String::new(),
                from_version: "1".into(),
                base: Digest::of(b"a"),
                target: Digest::of(b"b"),
                size: BIG,
                patch: Some(Digest::of(b"patch")),
                patch_size: 10,
                algorithm: lks_proto::delta::ALGORITHM.into(),
                note: String::new(),
                made_at_ms: 1,
                why: None,
            })
            .await
            .unwrap();
        assert!(wanted(&store, limits, &mut settled).await.unwrap().is_empty());
        assert_eq!(settled.0, HashSet::from([id("1"), id("2")]));
        // Settled versions are skipped: no candidate is worked out for them.
        let rows = store.list_bundles(None).await.unwrap();
        assert!(candidates(rows, 2, &settled.0).is_empty());
        // A deleted version is forgotten.
        store.delete_bundle("k", "2").await.unwrap();
        assert!(wanted(&store, limits, &mut settled).await.unwrap().is_empty());
        assert_eq!(settled.0, HashSet::from([id("1")]));
    }
}
