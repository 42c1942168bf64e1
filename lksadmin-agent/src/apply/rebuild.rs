//! Rebuilding a file from a binary delta (issue [delta]): the base's bytes
//! (a blob this node holds verified) and a patch, written once into the
//! download's partial file, hashed while written, fsynced; the caller
//! renames it into place only if it matched the manifest, as a download.
//!
//! Memory: the base is read whole (bsdiff reads it at random) and hashed
//! on the way in, so a base that changed on disk is refused before the
//! patch is applied; the patch is in memory (at most half the file); the
//! output streams through a 1 MiB buffer. Peak: about the file's size plus
//! the patch, given back when this returns.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use lks_proto::digest::{Verifier, VerifyError};
use lks_proto::{Digest, FileSpec};

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("read the base {digest}: {source}")]
    ReadBase {
        digest: Digest,
        #[source]
        source: io::Error,
    },
    #[error("the base {0} no longer holds the bytes it was stored as")]
    BaseChanged(Digest),
    #[error("write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Delta(#[from] lks_proto::delta::DeltaError),
    #[error("the rebuilt file does not match the manifest: {0}")]
    Mismatch(#[source] VerifyError),
}

/// Rebuilds `file` into `part` from the bytes `base_file` holds (a cached
/// blob, or an installed target: either must hash to `base`) and `patch`.
/// On any error `part` is removed.
pub fn rebuild(
    file: &FileSpec,
    base_file: File,
    base: Digest,
    algorithm: &str,
    patch: &[u8],
    part: &Path,
) -> Result<(), RebuildError> {
    let r = write(file, base_file, base, algorithm, patch, part);
    if r.is_err() {
        let _ = fs::remove_file(part);
    }
    r
}

fn write(
    file: &FileSpec,
    mut f: File,
    base: Digest,
    algorithm: &str,
    patch: &[u8],
    part: &Path,
) -> Result<(), RebuildError> {
    let read_base = |source| RebuildError::ReadBase { digest: base, source };
    let len = f.metadata().map_err(read_base)?.len();
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.read_to_end(&mut bytes).map_err(read_base)?;
    if Digest::of(&bytes) != base {
        return Err(RebuildError::BaseChanged(base));
    }
    let write_err = |source| RebuildError::Write {
        path: part.display().to_string(),
        source,
    };
    let out = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        // Moved beside a target later: not readable by others there
        // before its mode is set.
        .mode(0o600)
        .open(part)
        .map_err(write_err)?;
    let mut w = Verifying {
        out: BufWriter::with_capacity(1 << 20, out),
        verifier: Verifier::new(file.digest, file.size),
        bad: None,
        written: 0,
    };
    let applied = lks_proto::delta::apply(algorithm, &bytes, patch, file.size, &mut w);
    drop(bytes);
    if let Some(e) = w.bad.take() {
        return Err(RebuildError::Mismatch(e));
    }
    applied?;
    let Verifying { out, verifier, .. } = w;
    verifier.finish().map_err(RebuildError::Mismatch)?;
    let out = out.into_inner().map_err(|e| write_err(e.into_error()))?;
    out.sync_all().map_err(write_err)?;
    Ok(())
}

/// Hashes what passes and refuses a byte past the manifest's size, so a
/// wrong patch fails as soon as it goes astray in length.
struct Verifying<W> {
    out: W,
    verifier: Verifier,
    bad: Option<VerifyError>,
    written: u64,
}

impl<W: Write> Write for Verifying<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Err(e) = self.verifier.update(buf) {
            self.bad = Some(e);
            return Err(io::Error::new(io::ErrorKind::InvalidData, "past the file's size"));
        }
        self.out.write_all(buf)?;
        let before = self.written;
        self.written += buf.len() as u64;
        if before < 1 << 20 && self.written >= 1 << 20 {
            self.out.flush()?;
            crate::fault::point("delta-rebuilding");
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_proto::BundlePath;

    fn spec(bytes: &[u8]) -> FileSpec {
        FileSpec {
            chunks: None,
            arch: None,
            path: BundlePath::new("/usr/bin/tool").unwrap(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            mode: 0o755,
            url: None,
        }
    }

    fn pair() -> (Vec<u8>, Vec<u8>) {
        let old: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut new = old.clone();
        new[70_000] ^= 1;
        new.splice(100_000..100_000, *b"inserted");
        (old, new)
    }

    #[test]
    fn a_patch_rebuilds_the_file_and_a_wrong_one_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (old, new) = pair();
        let base_path = d.path().join("base");
        fs::write(&base_path, &old).unwrap();
        let patch = lks_proto::delta::make(&old, &new).unwrap();
        let part = d.path().join("part");
        let f = spec(&new);
        let alg = lks_proto::delta::ALGORITHM;
        rebuild(
            &f,
            File::open(&base_path).unwrap(),
            Digest::of(&old),
            alg,
            &patch,
            &part,
        )
        .unwrap();
        assert_eq!(fs::read(&part).unwrap(), new);

        // A corrupted patch: refused, nothing left.
        let mut bad = patch.clone();
        let at = bad.len() - 5;
        bad[at] ^= 0xff;
        assert!(
            rebuild(
                &f,
                File::open(&base_path).unwrap(),
                Digest::of(&old),
                alg,
                &bad,
                &part
            )
            .is_err()
        );
        assert!(!part.exists());

        // A base that changed on disk since it was stored: refused before
        // the patch is applied.
        let mut other = old.clone();
        other[10] ^= 1;
        fs::write(&base_path, &other).unwrap();
        let e = rebuild(
            &f,
            File::open(&base_path).unwrap(),
            Digest::of(&old),
            alg,
            &patch,
            &part,
        )
        .unwrap_err();
        assert!(matches!(e, RebuildError::BaseChanged(_)), "{e}");
        assert!(!part.exists());

        // The right base under the wrong digest claim: the output does not
        // match the manifest.
        let e = rebuild(
            &f,
            File::open(&base_path).unwrap(),
            Digest::of(&other),
            alg,
            &patch,
            &part,
        )
        .unwrap_err();
        assert!(
            matches!(e, RebuildError::Mismatch(_) | RebuildError::Delta(_)),
            "{e}"
        );
        assert!(!part.exists());
    }
}
