//! The delta maker (issue [delta]): for each file of a bundle version
//! whose path (and architecture) a version of the same name published
//! before it also had, with other bytes, a bsdiff 4 patch from each of the
//! last `bases` such versions' bytes (`lks_proto::delta`), kept as a blob
//! and recorded in the store ([`crate::store::DeltaStore`]).
//!
//! Off the publish path: a task on the leading replica makes the missing
//! ones every `--delta-interval`, one patch at a time on one core, so a
//! publish never waits and a delta not made yet is simply not offered.
//! Bounds: a file over `--delta-max-file-size` is skipped (making a patch
//! holds both files and the base's suffix array: about 6× the file,
//! measured in BENCHMARKS.md, "Binary deltas"); a patch over half the file
//! is not kept. Either is recorded as skipped, so it is not tried again.
//! The patch blob follows the publish protocol of `gc.rs`: verified in a
//! temp file, claimed, then named, made durable, and recorded.

use std::collections::BTreeMap;
use std::sync::Arc;

use lks_proto::{Digest, FileSpec};

use super::{BlobError, Blobs};
use crate::store::{BundleRow, DeltaRow, Store};

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

/// Every patch the store lacks a row for: for each version, each served
/// file, each of the last `bases` earlier versions (in publish order) with
/// a file at that path and architecture holding other bytes.
async fn wanted(store: &dyn Store, bases: usize) -> Result<Vec<Want>, BlobError> {
    let mut by_name: BTreeMap<String, Vec<BundleRow>> = BTreeMap::new();
    for row in store.list_bundles(None).await? {
        by_name.entry(row.name.clone()).or_default().push(row);
    }
    let mut out = Vec::new();
    for rows in by_name.values_mut() {
        rows.sort_by_key(|r| r.published_at_ms);
        for (i, row) in rows.iter().enumerate().skip(1) {
            let mut want = Vec::new();
            for (key, f) in served(row) {
                let earlier = rows[..i].iter().rev().filter_map(|r| {
                    let b = served(r).get(&key).map(|b| b.digest)?;
                    (b != f.digest).then(|| (r.version.clone(), b))
                });
                for (from_version, base) in earlier.take(bases) {
                    want.push(Want {
                        name: row.name.clone(),
                        version: row.version.clone(),
                        from_version,
                        file: f.clone(),
                        base,
                    });
                }
            }
            if want.is_empty() {
                continue;
            }
            let have = store.deltas_of(&row.name, &row.version).await?;
            out.extend(want.into_iter().filter(|w| {
                !have.iter().any(|h| {
                    h.path == w.file.path.to_string()
                        && h.arch == w.file.arch.map(|a| a.to_string()).unwrap_or_default()
                        && h.base == w.base
                })
            }));
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
        match make_one(blobs, &**store, &w, limits, &now_ms).await {
            Ok(Made::Patch(d, size)) => {
                row.patch = Some(d);
                row.patch_size = size;
                pass.made += 1;
            }
            Ok(Made::Skipped(why)) => {
                row.note = why;
                pass.skipped += 1;
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
    Skipped(String),
}

async fn make_one(
    blobs: &Arc<Blobs>,
    store: &dyn Store,
    w: &Want,
    limits: Limits,
    now_ms: &impl Fn() -> i64,
) -> Result<Made, BlobError> {
    if w.file.size > limits.max_file_size {
        return Ok(Made::Skipped(format!(
            "the file is over --delta-max-file-size ({} bytes)",
            limits.max_file_size
        )));
    }
    for d in [&w.base, &w.file.digest] {
        if !blobs.ensure_local(d).await? {
            return Ok(Made::Skipped(format!("blob {d} is not held")));
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
