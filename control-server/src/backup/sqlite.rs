//! `backup --data-dir D --out FILE [--with-blobs]`: a single server's data
//! dir, taken while the server runs.
//!
//! Order: SQLite's online copy of `state.db` into a private temp dir beside
//! the output (0700), read back for the counts and the blobs its bundles
//! serve; `pki/` and `admin.conf` read; then the archive is written to a
//! temp file (0600) beside `--out`, fsynced and given its name only when
//! complete — an interrupted backup leaves no archive that looks whole.
//!
//! `restore --from FILE --data-dir D`: a data dir made from an archive.
//!
//! `D` must be absent or an empty directory. Everything is written into a
//! temp dir beside `D` (same file system), each entry checked against the
//! manifest as it streams, then the archive's closing SHA-256; then the
//! result is checked as a server would read it (the CA loads, `state.db`
//! opens with this server's schema, every blob it serves is there when the
//! archive carries blobs); only then is the temp dir fsynced and renamed to
//! `D`. Any problem leaves `D` as it was and removes the temp dir.

use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lks_pki::{Pki, SharedIdentity};

use super::archive::{ArchiveReader, EntryName, FileEntry, Manifest, StoreKind};
use super::common::{RestoreError, extract, io, unrestored_blobs};
use super::output::{
    Source, Taken, blob_entry, blob_path, bytes_entry, file_entry, finish, parent_of, remote_store,
};
use super::{BackupError, BackupSummary, Counts, blob_manifest, write_counts};
use crate::store::SqliteStore;
use lks_blobs::{BlobChoice, LocalBlobs};

/// What `backup` is told.
#[derive(Clone, Debug)]
pub struct BackupConfig {
    pub data_dir: PathBuf,
    pub out: PathBuf,
    /// Include the blobs' bytes.
    pub with_blobs: bool,
    /// Where blobs missing from the data dir are fetched (`--blob-store
    /// s3://…`), with `--with-blobs`.
    pub blob_store: BlobChoice,
}

/// Backs up the data dir of a (running or stopped) SQLite server.
pub async fn backup_sqlite(cfg: &BackupConfig) -> Result<BackupSummary, BackupError> {
    let dir = &cfg.data_dir;
    for (path, missing) in [(dir.join("state.db"), "state.db"), (dir.join("pki"), "pki/")] {
        if !path.exists() {
            return Err(BackupError::NotADataDir {
                dir: dir.clone(),
                missing,
            });
        }
    }
    if cfg.out.exists() {
        return Err(BackupError::OutExists(cfg.out.clone()));
    }
    // The CA must load: an archive without a usable identity restores nothing.
    let identity = SharedIdentity::from_dir(&dir.join("pki"))?;
    Pki::from_shared(&identity, &["localhost".to_string()])?;
    let out_dir = parent_of(&cfg.out);
    let tmp = tempfile::Builder::new()
        .prefix(".lks-backup-")
        .tempdir_in(&out_dir)
        .map_err(|source| BackupError::Io {
            what: "create a temp dir in",
            path: out_dir.clone(),
            source,
        })?;

    let created_at_ms = crate::clock::now_ms();
    let db = dir.join("state.db");
    let copy = tmp.path().join("state.db");
    let (src, dst) = (db.clone(), copy.clone());
    tokio::task::spawn_blocking(move || SqliteStore::snapshot(&src, &dst))
        .await
        .map_err(|e| BackupError::Snapshot {
            path: db.clone(),
            source: crate::store::StoreError::backend_at("backup task", e),
        })?
        .map_err(|source| BackupError::Snapshot {
            path: db.clone(),
            source,
        })?;
    let dump = {
        let read = |source| BackupError::ReadCopy {
            path: db.clone(),
            source,
        };
        let copy_store = SqliteStore::open_exclusive(&copy).map_err(read)?;
        copy_store.dump().await.map_err(read)?
    };

    let mut entries: Vec<(FileEntry, Source)> = Vec::new();
    entries.push((file_entry("state.db", &copy)?, Source::File(copy.clone())));
    for (name, bytes, mode) in pki_files(&dir.join("pki"))? {
        entries.push((
            bytes_entry(&format!("pki/{name}"), &bytes, mode),
            Source::Bytes(bytes),
        ));
    }
    let conf = dir.join("admin.conf");
    if conf.exists() {
        let bytes = std::fs::read(&conf).map_err(|source| BackupError::Io {
            what: "read",
            path: conf.clone(),
            source,
        })?;
        entries.push((bytes_entry("admin.conf", &bytes, 0o600), Source::Bytes(bytes)));
    }
    let blobs = blob_manifest(&dump);
    if cfg.with_blobs {
        let fetched =
            LocalBlobs::open(&tmp.path().join("blobs")).map_err(|e| BackupError::BlobStore(Box::new(e)))?;
        let local = LocalBlobs::read_only(&dir.join("blobs"));
        let store = remote_store(&cfg.blob_store, None)?;
        for b in &blobs {
            let path = blob_path(b, &local, &fetched, store.as_deref(), &dir.join("blobs")).await?;
            entries.push(blob_entry(b, path));
        }
    }
    let taken = Taken {
        store: StoreKind::Sqlite,
        source: dir.display().to_string(),
        created_at_ms,
        entries,
        blobs,
        blobs_included: cfg.with_blobs,
        counts: Counts::of(&dump),
        etcd: None,
    };
    finish(&cfg.out, taken).await
}

/// Every regular file of `pki/`, sorted by name, with its bytes and mode.
fn pki_files(pki: &Path) -> Result<Vec<(String, Vec<u8>, u32)>, BackupError> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Io { what, path, source }
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(pki).map_err(io("read", pki))? {
        let e = e.map_err(io("read", pki))?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let meta = e.metadata().map_err(io("read", &e.path()))?;
        // Temp files of a write in progress are no part of the identity.
        if !meta.is_file() || EntryName::parse(&format!("pki/{name}")).is_none() {
            continue;
        }
        let bytes = std::fs::read(e.path()).map_err(io("read", &e.path()))?;
        out.push((name, bytes, meta.permissions().mode() & 0o777));
    }
    out.sort();
    Ok(out)
}

/// What `restore --data-dir` is told.
#[derive(Clone, Debug)]
pub struct RestoreConfig {
    pub from: PathBuf,
    pub data_dir: PathBuf,
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
