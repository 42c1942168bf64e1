//! `restore --from FILE --data-dir D`: a data dir made from an archive.
//!
//! `D` must be absent or an empty directory. Everything is written into a
//! temp dir beside `D` (same file system), each entry checked against the
//! manifest as it streams, then the archive's closing SHA-256; then the
//! result is checked as a server would read it (the CA loads, `state.db`
//! opens with this server's schema, every blob it serves is there when the
//! archive carries blobs); only then is the temp dir fsynced and renamed to
//! `D`. Any problem leaves `D` as it was and removes the temp dir.

use std::collections::HashSet;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lks_pki::{Pki, SharedIdentity};
use lks_proto::Digest;

use super::archive::{ArchiveError, ArchiveReader, EntryName, Manifest, StoreKind};
use super::write_counts;
use crate::store::SqliteStore;

#[derive(Clone, Debug)]
pub struct RestoreConfig {
    pub from: PathBuf,
    pub data_dir: PathBuf,
}

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
    #[error("{0}")]
    Etcd(String),
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
            e => vec![lks_proto::report::one_line(e)],
        }
    }
}

/// What a restore wrote.
#[derive(Clone, Debug)]
pub struct RestoreSummary {
    pub data_dir: PathBuf,
    pub manifest: Manifest,
    /// Blobs the bundles serve that the archive does not carry.
    pub blobs_not_included: usize,
}

impl fmt::Display for RestoreSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.manifest;
        writeln!(
            f,
            "restored the backup of {} taken at {} into {}",
            m.source,
            m.created_at,
            self.data_dir.display()
        )?;
        write_counts(f, m)?;
        if self.blobs_not_included > 0 {
            writeln!(
                f,
                "{} blobs are not in the archive (taken without --with-blobs): start the server with the \
                 --blob-store that holds them (s3://…), or copy them into {}/blobs",
                self.blobs_not_included,
                self.data_dir.display()
            )?;
        }
        write!(
            f,
            "Next: start lks-control-server with --data-dir {} on the address the agents dial. \
             Nodes enrolled and bundles published after {} are unknown to it.",
            self.data_dir.display(),
            m.created_at
        )
    }
}

/// Restores the archive `cfg.from` into `cfg.data_dir`.
pub fn restore(cfg: &RestoreConfig) -> Result<RestoreSummary, RestoreError> {
    let target = &cfg.data_dir;
    check_target(target)?;
    let file = File::open(&cfg.from).map_err(|source| RestoreError::Io {
        what: "open",
        path: cfg.from.clone(),
        source,
    })?;
    let reader = ArchiveReader::open(BufReader::new(file))?;
    let manifest = reader.manifest().clone();
    if manifest.store == StoreKind::Etcd {
        return Err(RestoreError::EtcdArchive {
            origin: manifest.source.clone(),
        });
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io("create", &parent))?;
    let base = target
        .file_name()
        .map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{base}.restore-"))
        .tempdir_in(&parent)
        .map_err(io("create a temp dir in", &parent))?;

    let restored_blobs = extract(reader, staging.path())?;
    let mut problems = Vec::new();
    let missing = unrestored_blobs(&manifest, &restored_blobs, &mut problems);
    check_restored(staging.path(), &mut problems);
    if !problems.is_empty() {
        return Err(RestoreError::Problems(problems));
    }

    // As the server makes its data dir: the keys inside are its own.
    std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod", staging.path()))?;
    sync_tree(staging.path())?;
    let staged = staging.keep();
    if let Err(source) = std::fs::rename(&staged, target) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(RestoreError::Io {
            what: "rename the restored data dir to",
            path: target.clone(),
            source,
        });
    }
    File::open(&parent)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", &parent))?;
    Ok(RestoreSummary {
        data_dir: target.clone(),
        manifest,
        blobs_not_included: missing,
    })
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

/// Absent, or an empty directory.
fn check_target(target: &Path) -> Result<(), RestoreError> {
    match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(RestoreError::Io {
            what: "read",
            path: target.to_path_buf(),
            source,
        }),
        Ok(m) if !m.is_dir() => Err(RestoreError::NotADir(target.to_path_buf())),
        Ok(_) => {
            let mut entries = std::fs::read_dir(target).map_err(io("read", target))?;
            match entries.next() {
                None => Ok(()),
                Some(_) => Err(RestoreError::NotEmpty(target.to_path_buf())),
            }
        }
    }
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

/// Reads the staged dir as a server would; one line per problem.
fn check_restored(dir: &Path, problems: &mut Vec<String>) {
    match SharedIdentity::from_dir(&dir.join("pki"))
        .and_then(|id| Pki::from_shared(&id, &["localhost".to_string()]))
    {
        Ok(_) => {}
        Err(e) => problems.push(format!(
            "the archive's CA and admin credential: {}",
            lks_proto::report::one_line(&e)
        )),
    }
    let db = dir.join("state.db");
    if !db.exists() {
        problems.push("the archive holds no state.db".into());
        return;
    }
    if let Err(e) = SqliteStore::open_exclusive(&db) {
        problems.push(format!(
            "the archive's state.db: {}",
            lks_proto::report::one_line(&e)
        ));
    }
}

/// fsyncs every directory under `dir` (files were fsynced when written).
fn sync_tree(dir: &Path) -> Result<(), RestoreError> {
    for e in std::fs::read_dir(dir).map_err(io("read", dir))? {
        let e = e.map_err(io("read", dir))?;
        if e.file_type().map_err(io("read", &e.path()))?.is_dir() {
            sync_tree(&e.path())?;
        }
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", dir))
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_path_buf();
    move |source| RestoreError::Io { what, path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_empty_or_non_dir_target_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_target(&dir.path().join("absent")).is_ok());
        assert!(check_target(dir.path()).is_ok(), "an empty dir");
        std::fs::write(dir.path().join("x"), b"").unwrap();
        assert!(matches!(check_target(dir.path()), Err(RestoreError::NotEmpty(_))));
        assert!(matches!(
            check_target(&dir.path().join("x")),
            Err(RestoreError::NotADir(_))
        ));
    }
}
