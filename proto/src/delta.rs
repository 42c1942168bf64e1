//! Binary deltas (issue [delta]): a patch that rebuilds a file of a new
//! bundle version from the bytes of an earlier one, so a node that holds the
//! earlier bytes fetches a few percent of the new file instead of all of it.
//!
//! A patch is transport, never trust: nothing here is signed, and the caller
//! checks the rebuilt bytes against the manifest's SHA-256 before anything
//! else sees them (a wrong base, a corrupted or lying patch give other bytes
//! and are refused there). The search is bsdiff 4's (`qbsdiff`), chosen by
//! measurement (BENCHMARKS.md, "Binary deltas"): its patches are the
//! smallest (0.22 % of a one-fix kubectl against zstd's patch-from 2.67 %),
//! and applying one needs the base in memory and writes the new file as a
//! stream, 1.04–1.24× the file in memory where zstd's patch-from needs the
//! base and a window as large as the file (2.0×).
//!
//! Two containers for that search's output:
//! - `bsdiff4` ([`ALGORITHM`]): qbsdiff's, its sections in bzip2. The
//!   smallest, but bzip2's decoding is most of the time a node spends
//!   applying one.
//! - `bsdiff4-zstd` ([`ZSTD_ALGORITHM`], [`sections`]): the same sections
//!   in zstd frames, about 1.5× the bytes and applied 4–7× faster. What the
//!   server makes unless told otherwise.
//!
//! The server makes a patch with [`make_as`] (one core; memory about 6× the
//! file: both files and the base's suffix array); the agent applies it
//! with [`apply`] (memory about the file's size plus the patch).

use std::io::{self, Write};

pub mod sections;

/// bsdiff 4 as qbsdiff writes it (sections in bzip2): what agents from
/// before `bsdiff4-zstd` apply.
pub const ALGORITHM: &str = "bsdiff4";
/// bsdiff 4's sections in zstd frames ([`sections`]): the same patch,
/// applied several times faster. What the server makes by default.
pub const ZSTD_ALGORITHM: &str = "bsdiff4-zstd";
/// Every algorithm this build makes and applies, the preferred first.
pub const ALGORITHMS: [&str; 2] = [ZSTD_ALGORITHM, ALGORITHM];

/// Files smaller than this are not worth a patch (one round trip more for
/// a few KiB).
pub const MIN_FILE_SIZE: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// The algorithm is not one this build applies.
    #[error("unknown delta algorithm {0:?} (this build applies {ZSTD_ALGORITHM} and {ALGORITHM})")]
    Algorithm(String),
    /// The patch is not a patch of its algorithm, or is truncated or
    /// corrupted.
    #[error("the patch is not a valid patch of its algorithm: {0}")]
    Corrupt(#[source] io::Error),
    /// The patch rebuilds a file of another size than the one wanted.
    #[error("the patch rebuilds {got} bytes, the file has {want}")]
    Size { got: u64, want: u64 },
    /// Making a patch failed (qbsdiff's search, or re-encoding its
    /// sections).
    #[error("make the patch: {0}")]
    Make(#[source] io::Error),
    /// Writing the rebuilt bytes failed (the writer's own error, e.g. a
    /// digest mismatch from a verifying writer, or the disk).
    #[error("write the rebuilt file: {0}")]
    Write(#[source] io::Error),
}

/// Makes a bsdiff 4 patch that rebuilds `target` from `base`, on the
/// calling thread only (no parallel search: the server makes one patch at
/// a time on one core).
pub fn make(base: &[u8], target: &[u8]) -> io::Result<Vec<u8>> {
    let mut patch = Vec::new();
    qbsdiff::Bsdiff::new(base, target)
        .parallel_scheme(qbsdiff::ParallelScheme::Never)
        .compare(io::Cursor::new(&mut patch))?;
    Ok(patch)
}

/// Makes a patch of `algorithm` (one of [`ALGORITHMS`]): the same search,
/// its sections re-encoded for `bsdiff4-zstd`.
pub fn make_as(algorithm: &str, base: &[u8], target: &[u8]) -> Result<Vec<u8>, DeltaError> {
    match algorithm {
        ALGORITHM => make(base, target),
        ZSTD_ALGORITHM => make(base, target).and_then(|p| sections::transcode(&p)),
        other => return Err(DeltaError::Algorithm(other.to_string())),
    }
    .map_err(DeltaError::Make)
}

/// Rebuilds the file of `size` bytes from `base` and `patch` into `out`,
/// streaming: the rebuilt bytes are never all in memory. The caller's
/// writer verifies them (size and digest) as they pass. Returns the bytes
/// written.
pub fn apply(
    algorithm: &str,
    base: &[u8],
    patch: &[u8],
    size: u64,
    out: impl Write,
) -> Result<u64, DeltaError> {
    // The header's file size, from our own read of it: for bsdiff 4 also
    // the check that keeps a forged header from qbsdiff's unchecked sums.
    let (hint, patcher) = match algorithm {
        ALGORITHM => (
            sections::check_bsdiff4(patch).map_err(DeltaError::Corrupt)?,
            Some(qbsdiff::Bspatch::new(patch).map_err(DeltaError::Corrupt)?),
        ),
        ZSTD_ALGORITHM => (sections::target_size(patch).map_err(DeltaError::Corrupt)?, None),
        other => return Err(DeltaError::Algorithm(other.to_string())),
    };
    if hint != size {
        return Err(DeltaError::Size {
            got: hint,
            want: size,
        });
    }
    let mut counted = Counted {
        inner: out,
        n: 0,
        failed: None,
    };
    let applied = match patcher {
        Some(p) => p.apply(base, &mut counted),
        None => sections::apply(base, patch, &mut counted),
    };
    match applied {
        Ok(_) => {}
        Err(e) => {
            return Err(match counted.failed.take() {
                Some(w) => DeltaError::Write(w),
                None => DeltaError::Corrupt(e),
            });
        }
    }
    counted.flush().map_err(DeltaError::Write)?;
    if counted.n != size {
        return Err(DeltaError::Size {
            got: counted.n,
            want: size,
        });
    }
    Ok(counted.n)
}

/// Counts what passes, and keeps the writer's own error apart from the
/// patcher's (which reports both as `io::Error`).
struct Counted<W> {
    inner: W,
    n: u64,
    failed: Option<io::Error>,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => {
                self.n += n as u64;
                Ok(n)
            }
            Err(e) => {
                let kind = e.kind();
                self.failed = Some(e);
                Err(io::Error::new(kind, "the rebuilt file's writer failed"))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pseudo-binary of `n` bytes, and a "patch release" of it: a few
    /// edits and an insertion that shifts everything after it.
    fn pair(n: usize) -> (Vec<u8>, Vec<u8>) {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let old: Vec<u8> = (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Runs of structure, like code and tables.
                if i % 64 < 16 { (i / 64) as u8 } else { x as u8 }
            })
            .collect();
        let mut new = old.clone();
        for i in (1000..n).step_by(n / 7) {
            new[i] ^= 0x5a;
        }
        new.splice(n / 2..n / 2, b"a new function".iter().copied());
        (old, new)
    }

    #[test]
    fn a_patch_rebuilds_the_new_bytes_and_is_small() {
        let (old, new) = pair(300_000);
        let patch = make(&old, &new).unwrap();
        assert!(patch.len() < new.len() / 20, "patch of {} bytes", patch.len());
        let mut out = Vec::new();
        let n = apply(ALGORITHM, &old, &patch, new.len() as u64, &mut out).unwrap();
        assert_eq!(n, new.len() as u64);
        assert_eq!(out, new);
    }

    #[test]
    fn a_corrupted_patch_is_refused_or_gives_other_bytes() {
        let (old, new) = pair(200_000);
        for alg in ALGORITHMS {
            let patch = make_as(alg, &old, &new).unwrap();
            let mut out = Vec::new();
            apply(alg, &old, &patch, new.len() as u64, &mut out).unwrap();
            assert_eq!(out, new, "{alg}");
            for at in [0, 10, 40, patch.len() / 2, patch.len() - 1] {
                let mut bad = patch.clone();
                bad[at] ^= 0xff;
                let mut out = Vec::new();
                match apply(alg, &old, &bad, new.len() as u64, &mut out) {
                    Err(_) => {}
                    Ok(_) => assert_ne!(out, new, "{alg}: a flipped byte at {at} went unnoticed"),
                }
            }
            let mut out = Vec::new();
            let e = apply(alg, &old, &patch[..patch.len() / 2], new.len() as u64, &mut out);
            assert!(e.is_err(), "{alg}: a truncated patch is refused");
            // One algorithm's patch is not the other's.
            let other = ALGORITHMS.into_iter().find(|a| *a != alg).unwrap();
            assert!(apply(other, &old, &patch, new.len() as u64, Vec::new()).is_err());
        }
    }

    #[test]
    fn a_wrong_base_gives_other_bytes_and_a_wrong_size_is_refused() {
        let (old, new) = pair(200_000);
        let patch = make(&old, &new).unwrap();
        let mut other = old.clone();
        other[5000] ^= 1;
        let mut out = Vec::new();
        // bsdiff adds the base's bytes in: another base, other bytes, which
        // the caller's digest check refuses.
        if apply(ALGORITHM, &other, &patch, new.len() as u64, &mut out).is_ok() {
            assert_ne!(out, new);
        }
        let e = apply(ALGORITHM, &old, &patch, new.len() as u64 + 1, Vec::new()).unwrap_err();
        assert!(matches!(e, DeltaError::Size { .. }), "{e}");
        let e = apply("zstd", &old, &patch, new.len() as u64, Vec::new()).unwrap_err();
        assert!(matches!(e, DeltaError::Algorithm(_)), "{e}");
        let e = make_as("xdelta3", &old, &new).unwrap_err();
        assert!(matches!(e, DeltaError::Algorithm(_)), "{e}");
    }

    #[test]
    fn a_failing_writer_is_reported_as_the_writer() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (old, new) = pair(100_000);
        for alg in ALGORITHMS {
            let patch = make_as(alg, &old, &new).unwrap();
            let e = apply(alg, &old, &patch, new.len() as u64, Full).unwrap_err();
            assert!(matches!(e, DeltaError::Write(_)), "{alg}: {e}");
        }
    }
}
