//! `backup --data-dir D --out FILE [--with-blobs]`: a single server's data
//! dir, taken while the server runs.
//!
//! Order: SQLite's online copy of `state.db` into a private temp dir beside
//! the output (0700), read back for the counts and the blobs its bundles
//! serve; `pki/` and `admin.conf` read; then the archive is written to a
//! temp file (0600) beside `--out`, fsynced and given its name only when
//! complete — an interrupted backup leaves no archive that looks whole.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lks_pki::{Pki, SharedIdentity};

use super::archive::{EntryName, FileEntry, StoreKind};
use super::output::{
    Source, Taken, blob_entry, blob_path, bytes_entry, file_entry, finish, parent_of, remote_store,
};
use super::{BackupError, BackupSummary, Counts, blob_manifest};
use crate::blobs::{BlobChoice, LocalBlobs};
use crate::store::SqliteStore;

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
