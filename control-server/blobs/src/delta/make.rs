//! One pair's make (issue [upgrade-cost]): the checks that keep its cost
//! bounded, cheapest first, then the diff and the patch blob.
//!
//! 1. Memory, from the two sizes alone: over `--delta-max-memory`, the
//!    pair is skipped before a byte is read. The makes running at once
//!    share that cap ([`Budget`]): a diff waits until its share is free.
//! 2. The estimate ([`super::estimate`]): both files read once; a base
//!    that supplies less than `--delta-min-saving` of the file is skipped.
//! 3. The diff; a patch over half its file is abandoned.
//!
//! Steps 2 and 3 run on a thread of their own at the lowest priority
//! ([`super::background`]), whose CPU time is reported with the outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lks_proto::Digest;

use super::{Limits, MAX_PATCH_PERCENT, Want, background, estimate};
use crate::{BlobError, Blobs};
use lks_store::{BlobRecords, NoPatch};

/// What making a patch from a `base`-byte file to a `target`-byte one
/// holds in memory, about: both files, the base's suffix array (4 bytes a
/// byte) and the patch and its re-encoding (up to the file each, for
/// unrelated bytes). Measured at about 6× the file for two versions of one
/// binary (BENCHMARKS.md, "Binary deltas"); counted a little above.
pub fn memory_needed(base: u64, target: u64) -> u64 {
    base.saturating_mul(5).saturating_add(target.saturating_mul(2))
}

/// The memory the diffs running at once may need together
/// (`--delta-max-memory`), counted in MiB: a diff holds its share from
/// before it reads the files until its patch is written.
pub struct Budget(tokio::sync::Semaphore);

impl Budget {
    pub fn new(cap: u64) -> Self {
        Budget(tokio::sync::Semaphore::new(mib(cap) as usize))
    }

    /// Waits for `need` bytes of the cap (at most the cap: a pair needing
    /// more is skipped before it asks).
    async fn take(&self, need: u64) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.0.acquire_many(mib(need)).await.ok()
    }
}

fn mib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX)
}

/// What became of a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    /// A patch of `size` bytes, kept as the blob `digest`.
    Patch { digest: Digest, size: u64 },
    /// No patch (recorded, not tried again while the reason holds).
    NoPatch(NoPatch),
    /// A blob neither this replica nor the blob store holds (now).
    NotHeld(Digest),
}

/// A pair's outcome and the CPU time its estimate and diff took.
#[derive(Debug)]
pub struct Attempt {
    pub made: Result<Made, BlobError>,
    pub cpu: Duration,
}

/// Makes the patch `w` asks for within `limits`, or says why not.
pub async fn make_one(
    blobs: &Arc<Blobs>,
    store: &(impl BlobRecords + ?Sized),
    w: &Want,
    (limits, budget): (Limits, &Budget),
    now_ms: &impl Fn() -> i64,
) -> Attempt {
    let mut cpu = Duration::ZERO;
    let made = try_make(blobs, store, w, (limits, budget), now_ms, &mut cpu).await;
    Attempt { made, cpu }
}

async fn try_make(
    blobs: &Arc<Blobs>,
    store: &(impl BlobRecords + ?Sized),
    w: &Want,
    (limits, budget): (Limits, &Budget),
    now_ms: &impl Fn() -> i64,
    cpu: &mut Duration,
) -> Result<Made, BlobError> {
    let need = memory_needed(w.base_size, w.file.size);
    if need > limits.max_memory {
        return Ok(Made::NoPatch(NoPatch::Memory {
            need,
            cap: limits.max_memory,
        }));
    }
    for d in [&w.base, &w.file.digest] {
        if !blobs.ensure_local(d).await? {
            return Ok(Made::NotHeld(*d));
        }
    }
    let (base_path, target_path) = (blobs.local.path(&w.base), blobs.local.path(&w.file.digest));
    if limits.min_saving > 0 {
        let (b, t) = (base_path.clone(), target_path.clone());
        let saving = in_background(&target_path, cpu, move || estimate::estimate_files(&b, &t))
            .await?
            .map_err(|e| io_error(&target_path, e))?;
        if saving < limits.min_saving {
            return Ok(Made::NoPatch(NoPatch::Estimate {
                saving,
                min: limits.min_saving,
            }));
        }
    }
    let _share = budget.take(need).await;
    let (algorithm, path) = (limits.algorithm, target_path.clone());
    let patch = in_background(&path, cpu, move || -> Result<Vec<u8>, BlobError> {
        let base = std::fs::read(&base_path).map_err(|e| io_error(&base_path, e))?;
        let target = std::fs::read(&target_path).map_err(|e| io_error(&target_path, e))?;
        lks_proto::delta::make_as(algorithm, &base, &target)
            .map_err(|e| io_error(&target_path, std::io::Error::other(e)))
    })
    .await??;
    let size = patch.len() as u64;
    if size.saturating_mul(100) > w.file.size.saturating_mul(MAX_PATCH_PERCENT) {
        return Ok(Made::NoPatch(NoPatch::TooLarge { patch_size: size }));
    }
    let digest = keep(blobs, store, &patch, now_ms).await?;
    Ok(Made::Patch { digest, size })
}

/// Runs `work` at the lowest priority, adding its CPU time to `cpu`.
async fn in_background<T: Send + 'static>(
    path: &Path,
    cpu: &mut Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlobError> {
    let (answer, used) = background::run(work)
        .await
        .map_err(|e| io_error(path, e))?
        .map_err(|e| io_error(path, std::io::Error::other(e)))?;
    *cpu += used;
    Ok(answer)
}

fn io_error(path: &Path, source: std::io::Error) -> BlobError {
    BlobError::Io {
        path: PathBuf::from(path),
        source,
    }
}

/// The patch as a blob (the publish protocol of `gc.rs`: verified in a
/// temp file, claimed, then named, made durable); its digest.
async fn keep(
    blobs: &Arc<Blobs>,
    store: &(impl BlobRecords + ?Sized),
    patch: &[u8],
    now_ms: &impl Fn() -> i64,
) -> Result<Digest, BlobError> {
    let (d, size) = (Digest::of(patch), patch.len() as u64);
    if !blobs.local.contains(&d) {
        let mut writer = blobs.local.writer(d, size).await?;
        writer.write(patch).await?;
        let staged = writer.stage().await?;
        crate::gc::claim(store, &blobs.store().describe(), &d, size, now_ms).await?;
        staged.commit().await?;
    } else {
        crate::gc::claim(store, &blobs.store().describe(), &d, size, now_ms).await?;
    }
    blobs.persist(&d, size).await?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_a_make_needs_grows_with_both_files() {
        // Two 256 MiB versions: 1.75 GiB, under the default cap.
        let mib = 1u64 << 20;
        assert_eq!(memory_needed(256 * mib, 256 * mib), 1792 * mib);
        assert!(memory_needed(256 * mib, 256 * mib) <= super::super::DEFAULT_MAX_MEMORY);
        assert_eq!(memory_needed(u64::MAX, 1), u64::MAX, "saturates");
    }

    #[tokio::test]
    async fn diffs_share_the_memory_cap() {
        let budget = Budget::new(3 << 20);
        let a = budget.take(2 << 20).await.unwrap();
        // 2 MiB more must wait for the first share.
        let b = tokio::time::timeout(Duration::from_millis(50), budget.take(2 << 20)).await;
        assert!(b.is_err(), "waits");
        drop(a);
        assert!(budget.take(2 << 20).await.is_some());
        assert_eq!(mib(1), 1, "a part of a MiB counts whole");
    }
}
