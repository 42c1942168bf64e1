//! The `[[file]]` entries of `bundle.toml`: each one's path, architecture,
//! mode and content — a local source hashed once however often it is
//! named (digest, size, chunk list), or a URL with its declared digest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{BundleTomlError as E, FileSource, RawFile, UrlSizer, parse_mode, source_path};
use crate::arch::Arch;
use crate::chunks::{Chunks, DEFAULT_CHUNK_SIZE};
use crate::digest::Digest;
use crate::limits::MAX_FILES;
use crate::manifest::FileSpec;
use crate::path::BundlePath;

/// Each local source read so far: its digest, size and chunk list.
type Hashed = BTreeMap<PathBuf, (Digest, u64, Option<Chunks>)>;

/// The files of a bundle and, parallel to them, where each one's bytes
/// come from.
pub(super) fn parse_files(
    raw: Vec<RawFile>,
    dir: &Path,
    sizer: &mut dyn UrlSizer,
) -> Result<(Vec<FileSpec>, Vec<FileSource>), E> {
    let mut files = Vec::with_capacity(raw.len());
    let mut sources = Vec::with_capacity(raw.len());
    if raw.len() > MAX_FILES {
        return Err(E::TooMany {
            what: "file",
            count: raw.len(),
            limit: MAX_FILES,
        });
    }
    let mut hashed = Hashed::new();
    for (i, f) in raw.into_iter().enumerate() {
        let (file, source) = parse_file(i, f, dir, sizer, &mut hashed)?;
        files.push(file);
        sources.push(source);
    }
    Ok((files, sources))
}

/// `file[i]`.
fn parse_file(
    i: usize,
    f: RawFile,
    dir: &Path,
    sizer: &mut dyn UrlSizer,
    hashed: &mut Hashed,
) -> Result<(FileSpec, FileSource), E> {
    let field = |n: &str| format!("file[{i}].{n}");
    let missing = |n: &str, reason: &'static str| E::Field {
        field: field(n),
        reason,
    };
    let path = BundlePath::new(&f.path).map_err(|source| E::Path {
        field: field("path"),
        source,
    })?;
    let arch = f
        .arch
        .as_deref()
        .map(Arch::parse)
        .transpose()
        .map_err(|source| E::Arch {
            field: field("arch"),
            source,
        })?;
    let mode = match f.mode {
        None => 0o644,
        Some(m) => parse_mode(m).map_err(|source| E::Mode {
            field: field("mode"),
            source,
        })?,
    };
    let declared = f
        .sha256
        .as_deref()
        .map(Digest::from_hex)
        .transpose()
        .map_err(|_| missing("sha256", "must be 64 lowercase hex digits"))?;
    let (digest, size, source, url, chunks) = match (f.source, f.url) {
        (Some(_), Some(_)) => return Err(missing("source", "give either source or url, not both")),
        (None, None) => {
            return Err(missing(
                "source",
                "missing: give source (a file in the bundle directory) or url",
            ));
        }
        (Some(src), None) => {
            let (local, digest, size, chunks) = local_source(i, src, declared, f.size, dir, hashed)?;
            (digest, size, FileSource::Local(local), None, chunks)
        }
        (None, Some(url)) => {
            let digest = declared.ok_or_else(|| missing("sha256", "missing (required with url)"))?;
            let size = match f.size {
                Some(s) => s,
                None => sizer.size_of(&url, &digest).map_err(|source| E::Size {
                    field: field("size"),
                    source,
                })?,
            };
            (digest, size, FileSource::Url, Some(url), None)
        }
    };
    let file = FileSpec {
        arch,
        path,
        digest,
        size,
        mode,
        url,
        chunks,
    };
    Ok((file, source))
}

/// `file[i].source`: the file in the bundle directory, hashed (once), and
/// checked against the digest and size declared beside it.
fn local_source(
    i: usize,
    src: String,
    declared: Option<Digest>,
    declared_size: Option<u64>,
    dir: &Path,
    hashed: &mut Hashed,
) -> Result<(PathBuf, Digest, u64, Option<Chunks>), E> {
    let field = |n: &str| format!("file[{i}].{n}");
    let local = source_path(dir, &src).map_err(|source| E::SourcePath {
        field: field("source"),
        source,
    })?;
    let read = |source| E::Read {
        field: field("source"),
        path: local.clone(),
        source,
    };
    let (digest, size, chunks) = match hashed.get(&local) {
        Some(v) => v.clone(),
        None => {
            let meta = std::fs::metadata(&local).map_err(read)?;
            if !meta.is_file() {
                return Err(E::NotAFile {
                    field: field("source"),
                    path: local,
                });
            }
            // One read gives the digest and the chunk list; a file of one
            // chunk needs no list (its piece is the file).
            let v = std::fs::File::open(&local)
                .and_then(|f| Chunks::of_reader(f, DEFAULT_CHUNK_SIZE))
                .map(|(d, n, c)| (d, n, (n > u64::from(DEFAULT_CHUNK_SIZE)).then_some(c)))
                .map_err(read)?;
            hashed.insert(local.clone(), v.clone());
            v
        }
    };
    if let Some(d) = declared
        && d != digest
    {
        return Err(E::DigestMismatch {
            field: field("sha256"),
            src,
            digest,
        });
    }
    if let Some(s) = declared_size
        && s != size
    {
        return Err(E::SizeMismatch {
            field: field("size"),
            declared: s,
            src,
            size,
        });
    }
    Ok((local, digest, size, chunks))
}
