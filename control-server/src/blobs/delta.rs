//! The delta maker (issue [delta]): for each file of a bundle version
//! whose path (and architecture) versions of the same name published
//! before it also had, with other bytes, a bsdiff 4 patch from each of the
//! last `bases` such contents (`lks_proto::delta`), kept as a blob and
//! recorded in the store ([`crate::store::DeltaStore`]).
//!
//! Off the publish path: a task on the leading replica makes the missing
//! ones every `--delta-interval`, one patch at a time on one core, so a
//! publish never waits and a delta not made yet is simply not offered.
//! Bounds: a file over `--delta-max-file-size` gets none (making a patch
//! holds both files and the base's suffix array: about 6× the file,
//! measured in BENCHMARKS.md, "Binary deltas"), and is not recorded, so a
//! higher limit makes it later; a patch over half the file is not kept and
//! is recorded as skipped, so it is not tried again.
//! The patch blob follows the publish protocol of `gc.rs`: verified in a
//! temp file, claimed, then named, made durable, and recorded.

use std::collections::BTreeMap;
use std::sync::Arc;

use lks_proto::{Digest, FileSpec};

use super::{BlobError, Blobs};
use crate::store::{BundleRow, BundleStore, DeltaRow, DeltaStore, Store};

/// Default for `--delta-max-file-size`: about 1.5 GiB of memory while one
/// patch is made for a file this size (6× the file, BENCHMARKS.md).
pub const DEFAULT_MAX_FILE_SIZE: u64 = 256 << 20;
/// Default for `--delta-bases`: patches from the last two earlier versions.
pub const DEFAULT_BASES: usize = 2;
/// Default for `--delta-interval`.
pub const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
/// A patch larger than this share of its file (percent) is not kept.
pub const MAX_PATCH_PERCENT: u64 = 50;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_file_size: u64,
    pub bases: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            bases: DEFAULT_BASES,
        }
    }
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub made: u64,
    pub skipped: u64,
}

/// One patch to consider: `target`'s file `file`, from `base`'s file.
struct Want {
    name: String,
    version: String,
    from_version: String,
    file: FileSpec,
    base: Digest,
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

/// Every patch the rule asks for, by bundle version (pure, no I/O): for
/// each version, each served file, the last `bases` earlier versions of
/// the same name (in publish order) with a file at that path and
/// architecture holding other bytes, each such content once.
fn candidates(mut rows: Vec<BundleRow>, bases: usize) -> Vec<Want> {
    rows.sort_by(|a, b| (&a.name, a.published_at_ms).cmp(&(&b.name, b.published_at_ms)));
    let files: Vec<_> = rows.iter().map(served).collect();
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let same_name = rows[..i]
            .iter()
            .zip(&files[..i])
            .filter(|(r, _)| r.name == row.name);
        let earlier: Vec<_> = same_name.collect();
        for (key, f) in &files[i] {
            let mut seen = vec![f.digest];
            let bases_of = earlier.iter().rev().filter_map(|(r, fs)| {
                let b = fs.get(key).map(|b| b.digest)?;
                if seen.contains(&b) {
                    return None;
                }
                seen.push(b);
                Some((r.version.clone(), b))
            });
            for (from_version, base) in bases_of.take(bases) {
                out.push(Want {
                    name: row.name.clone(),
                    version: row.version.clone(),
                    from_version,
                    file: (*f).clone(),
                    base,
                });
            }
        }
    }
    out
}

/// The [`candidates`] the store lacks a row for.
async fn wanted(
    store: &(impl BundleStore + DeltaStore + ?Sized),
    bases: usize,
) -> Result<Vec<Want>, BlobError> {
    let all = candidates(store.list_bundles(None).await?, bases);
    let mut out = Vec::new();
    let mut have: Option<((String, String), Vec<DeltaRow>)> = None;
    for w in all {
        let id = (w.name.clone(), w.version.clone());
        if have.as_ref().is_none_or(|(h, _)| *h != id) {
            have = Some((id.clone(), store.deltas_of(&w.name, &w.version).await?));
        }
        let rows = have.as_ref().map(|(_, r)| r.as_slice()).unwrap_or_default();
        let arch = w.file.arch.map(|a| a.to_string()).unwrap_or_default();
        if !rows
            .iter()
            .any(|h| h.path == w.file.path.to_string() && h.arch == arch && h.base == w.base)
        {
            out.push(w);
        }
    }
    Ok(out)
}

/// One pass: makes every missing patch, one at a time. A failure of one
/// (a blob this replica cannot read now) is logged and tried next pass.
pub async fn make_missing(
    blobs: &Arc<Blobs>,
    store: &Arc<dyn Store>,
    limits: Limits,
    now_ms: impl Fn() -> i64,
) -> Result<Pass, BlobError> {
    let mut pass = Pass::default();
    for w in wanted(&**store, limits.bases).await? {
        // Not recorded: raising the limit makes it on the next pass.
        if w.file.size > limits.max_file_size {
            tracing::debug!(path = %w.file.path, size = w.file.size, "no delta: the file is over --delta-max-file-size");
            continue;
        }
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
            algorithm: lks_proto::delta::ALGORITHM.into(),
            note: String::new(),
            made_at_ms: 0,
        };
        let started = std::time::Instant::now();
        match make_one(blobs, &**store, &w, &now_ms).await {
            Ok(Made::Patch(d, size)) => {
                row.patch = Some(d);
                row.patch_size = size;
                pass.made += 1;
            }
            Ok(Made::Skipped(why)) => {
                row.note = why;
                pass.skipped += 1;
            }
            Ok(Made::NotHeld(d)) => {
                tracing::debug!(path = %w.file.path, digest = %d, "no delta yet: the blob is in no store");
                continue;
            }
            Err(e) => {
                tracing::warn!(bundle = %format!("{}@{}", w.name, w.version), path = %w.file.path,
                    from = %w.from_version, error = %e, "delta not made; trying again next pass");
                continue;
            }
        }
        row.made_at_ms = now_ms();
        tracing::info!(
            bundle = %format!("{}@{}", w.name, w.version),
            path = %w.file.path,
            from = %w.from_version,
            size = w.file.size,
            patch_size = row.patch_size,
            note = %row.note,
            ms = started.elapsed().as_millis() as u64,
            "delta {}",
            if row.patch.is_some() { "made" } else { "skipped" }
        );
        match store.put_delta(&row).await {
            Ok(()) | Err(crate::store::StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(pass)
}

enum Made {
    Patch(Digest, u64),
    /// Not worth keeping (recorded, never tried again).
    Skipped(String),
    /// A blob neither this replica nor the blob store holds (now).
    NotHeld(Digest),
}

async fn make_one(
    blobs: &Arc<Blobs>,
    store: &dyn Store,
    w: &Want,
    now_ms: &impl Fn() -> i64,
) -> Result<Made, BlobError> {
    for d in [&w.base, &w.file.digest] {
        if !blobs.ensure_local(d).await? {
            return Ok(Made::NotHeld(*d));
        }
    }
    let (base_path, target_path) = (blobs.local.path(&w.base), blobs.local.path(&w.file.digest));
    let io = |path: &std::path::Path, e: std::io::Error| BlobError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let made = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, BlobError> {
        let base = std::fs::read(&base_path).map_err(|e| io(&base_path, e))?;
        let target = std::fs::read(&target_path).map_err(|e| io(&target_path, e))?;
        lks_proto::delta::make(&base, &target).map_err(|e| io(&target_path, e))
    })
    .await
    .map_err(|e| BlobError::Io {
        path: blobs.local.path(&w.file.digest),
        source: std::io::Error::other(e),
    })??;
    let size = made.len() as u64;
    if size.saturating_mul(100) > w.file.size.saturating_mul(MAX_PATCH_PERCENT) {
        return Ok(Made::Skipped(format!(
            "the patch ({size} bytes) is over {MAX_PATCH_PERCENT} % of the file"
        )));
    }
    let d = Digest::of(&made);
    if !blobs.local.contains(&d) {
        let mut writer = blobs.local.writer(d, size).await?;
        writer.write(&made).await?;
        let staged = writer.stage().await?;
        super::gc::claim(store, &blobs.store().describe(), &d, size, now_ms).await?;
        staged.commit().await?;
    } else {
        super::gc::claim(store, &blobs.store().describe(), &d, size, now_ms).await?;
    }
    blobs.persist(&d, size).await?;
    Ok(Made::Patch(d, size))
}

#[cfg(test)]
mod tests {
    use lks_proto::{BundlePath, Manifest, SignedBundle};

    use super::*;
    use crate::store::StoredBundle;

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
        let got: Vec<(String, String, Digest)> = candidates(rows, 2)
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
        let got: Vec<(String, Digest)> = candidates(rows, 2)
            .into_iter()
            .map(|w| (w.file.arch.map(|a| a.to_string()).unwrap_or_default(), w.base))
            .collect();
        let d = |t: &str| Digest::of(t.as_bytes());
        assert_eq!(got, vec![("amd64".into(), d("a1")), ("arm64".into(), d("r1"))]);
    }
}
