//! What a restore into either store shares: its error, and the archive
//! streamed into a staging dir, each entry checked as it comes.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::BufWriter;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lks_proto::Digest;

use super::archive::{ArchiveError, ArchiveReader, EntryName, Manifest};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0} is not empty; restore only into a new or empty directory")]
    NotEmpty(PathBuf),
    #[error("{0} is not a directory")]
    NotADir(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Archive(#[from] ArchiveError),
    #[error(
        "this archive holds an etcd installation ({origin}): restore it into an empty etcd prefix with \
         --store etcd --etcd-endpoints URL[,URL…] [--etcd-prefix P], not into a data dir"
    )]
    EtcdArchive { origin: String },
    #[error(
        "this archive holds a SQLite data dir ({origin}): restore it with --data-dir DIR, then move it onto \
         etcd with `lks-control-server migrate --from-sqlite DIR --store etcd …`"
    )]
    SqliteArchive { origin: String },
    #[error(
        "the archive's private keys are sealed (key {key}) for the prefix {origin}, and open only there: \
         restore into --etcd-prefix {origin} (of another etcd, or after emptying it)"
    )]
    SealedForPrefix { key: String, origin: String },
    #[error(
        "etcd already holds {key}: the prefix {prefix} is in use; restore only into an empty prefix \
         (another --etcd-prefix, or empty it with `etcdctl del --prefix {prefix}` after a final backup)"
    )]
    PrefixInUse { key: String, prefix: String },
    #[error(
        "blob {digest} is {size} bytes, more than the {max} bytes etcd keeps per blob; give \
         --etcd-max-blob-size {size} (and the same to every replica), or --blob-store s3://BUCKET/PREFIX"
    )]
    BlobTooLarge { digest: Digest, size: u64, max: u64 },
    #[error("--blob-store local is no blob store of replicas: give etcd (the default) or s3://BUCKET/PREFIX")]
    LocalBlobStore,
    #[error("cannot reach etcd: {0}; check --etcd-endpoints and that etcd is up")]
    EtcdUnreachable(#[source] lks_store::StoreError),
    #[error("{what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: lks_store::StoreError,
    },
    #[error("{0}")]
    BlobStore(#[source] Box<lks_blobs::BlobError>),
    #[error("the extraction task: {0}")]
    Extract(#[from] tokio::task::JoinError),
    #[error("{cause}; {cleanup}")]
    Write {
        #[source]
        cause: Box<super::etcd::WriteError>,
        cleanup: String,
    },
    /// Each line one problem; nothing was restored.
    #[error("{}", .0.join("\n"))]
    Problems(Vec<String>),
}

impl RestoreError {
    /// One line per problem, for stderr.
    pub fn lines(&self) -> Vec<String> {
        match self {
            RestoreError::Problems(p) => p.clone(),
            // The cause's text already holds its causes, and the cleanup
            // (what to do next) ends the line: no deeper cause after it.
            RestoreError::Write { .. } => vec![self.to_string()],
            e => vec![lks_proto::report::one_line(e)],
        }
    }
}

/// Writes every entry of the archive into `staging` (each file created
/// new, with its manifest mode, fsynced), checking each against the
/// manifest as it streams and then the closing SHA-256; returns the blobs
/// restored. Any mismatch: one line per problem, `staging` to be dropped.
pub(super) fn extract<R: std::io::Read>(
    mut reader: ArchiveReader<R>,
    staging: &Path,
) -> Result<HashSet<Digest>, RestoreError> {
    let mut problems = Vec::new();
    let mut restored_blobs = HashSet::new();
    loop {
        let next = next_path(&reader, staging)?;
        let Some((name, path, mode)) = next else { break };
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(io("create", &path))?;
        let mut w = BufWriter::new(f);
        let Some(read) = reader.next_entry(&mut w)? else {
            break;
        };
        let f = w.into_inner().map_err(|e| RestoreError::Io {
            what: "write",
            path: path.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(io("fsync", &path))?;
        match read.problem {
            Some(p) => problems.push(p.to_string()),
            None => {
                if let EntryName::Blob(d) = name {
                    restored_blobs.insert(d);
                }
            }
        }
    }
    match reader.finish() {
        Ok(()) => {}
        // An entry that did not match its digest already said so: the
        // closing SHA-256 over it cannot match either.
        Err(ArchiveError::Checksum) if !problems.is_empty() => {}
        Err(e) => problems.push(e.to_string()),
    }
    if !problems.is_empty() {
        return Err(RestoreError::Problems(problems));
    }
    Ok(restored_blobs)
}

/// How many of the manifest's blobs the archive does not carry (taken
/// without `--with-blobs`); one that it should carry but does not is a
/// problem.
pub(super) fn unrestored_blobs(
    manifest: &Manifest,
    restored: &HashSet<Digest>,
    problems: &mut Vec<String>,
) -> usize {
    let mut missing = 0;
    for b in &manifest.blobs {
        if !restored.contains(&b.digest) {
            if manifest.blobs_included {
                problems.push(format!(
                    "blob {} ({}) is listed but not in the archive: the archive was altered",
                    b.digest,
                    b.bundles.join(", ")
                ));
            } else {
                missing += 1;
            }
        }
    }
    missing
}

/// The next entry's name, its path in `staging` (parents created) and mode.
fn next_path<R: std::io::Read>(
    reader: &ArchiveReader<R>,
    staging: &Path,
) -> Result<Option<(EntryName, PathBuf, u32)>, RestoreError> {
    let Some(e) = reader.next_file() else {
        return Ok(None);
    };
    let name = EntryName::parse(&e.name).ok_or_else(|| ArchiveError::BadName(e.name.clone()))?;
    let path = staging.join(name.path());
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(io("create", p))?;
    }
    Ok(Some((name, path, e.mode & 0o777)))
}

pub(super) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_path_buf();
    move |source| RestoreError::Io { what, path, source }
}
