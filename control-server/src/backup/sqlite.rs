//! `backup --data-dir D --out FILE [--with-blobs]`: a single server's data
//! dir, taken while the server runs.
//!
//! Order: SQLite's online copy of `state.db` into a private temp dir beside
//! the output (0700), read back for the counts and the blobs its bundles
//! serve; `pki/` and `admin.conf` read; then the archive is written to a
//! temp file (0600) beside `--out`, fsynced and given its name only when
//! complete — an interrupted backup leaves no archive that looks whole.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lks_proto::Digest;

use super::archive::{ArchiveWriter, EntryName, FORMAT, FileEntry, Manifest, StoreKind};
use super::{BackupError, BackupSummary, Counts, blob_manifest};
use crate::blobs::{BlobChoice, BlobStore, LocalBlobs, S3Store};
use crate::pki::{Pki, SharedIdentity};
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

/// An entry and where its bytes come from.
enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
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
        let store = remote_store(&cfg.blob_store)?;
        for b in &blobs {
            let path = blob_path(b, &local, &fetched, store.as_deref(), &dir.join("blobs")).await?;
            let name = EntryName::Blob(b.digest).path();
            entries.push((
                FileEntry {
                    name,
                    size: b.size,
                    sha256: b.digest,
                    mode: 0o644,
                },
                Source::File(path),
            ));
        }
    }

    let manifest = Manifest {
        format: FORMAT,
        server_version: env!("CARGO_PKG_VERSION").into(),
        created_at: crate::clock::rfc3339(created_at_ms),
        created_at_ms,
        store: StoreKind::Sqlite,
        source: dir.display().to_string(),
        files: entries.iter().map(|(e, _)| e.clone()).collect(),
        blobs,
        blobs_included: cfg.with_blobs,
        counts: Counts::of(&dump),
    };
    let out = cfg.out.clone();
    let written =
        tokio::task::spawn_blocking(move || write_archive(&out, &manifest, entries).map(|d| (d, manifest)))
            .await
            .map_err(|e| BackupError::Io {
                what: "write",
                path: cfg.out.clone(),
                source: std::io::Error::other(e),
            })??;
    let (sha256, manifest) = written;
    let size = std::fs::metadata(&cfg.out).map(|m| m.len()).unwrap_or(0);
    Ok(BackupSummary {
        out: cfg.out.clone(),
        manifest,
        sha256,
        size,
    })
}

/// The directory a file goes into (`.` for a bare name).
fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn file_entry(name: &str, path: &Path) -> Result<FileEntry, BackupError> {
    let (sha256, size) = Digest::of_file(path).map_err(|source| BackupError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(FileEntry {
        name: name.into(),
        size,
        sha256,
        mode: 0o600,
    })
}

fn bytes_entry(name: &str, bytes: &[u8], mode: u32) -> FileEntry {
    FileEntry {
        name: name.into(),
        size: bytes.len() as u64,
        sha256: Digest::of(bytes),
        mode,
    }
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

/// The blob store to fetch blobs the data dir lacks from, if any.
fn remote_store(choice: &BlobChoice) -> Result<Option<Arc<dyn BlobStore>>, BackupError> {
    match choice {
        BlobChoice::S3(c) => Ok(Some(Arc::new(
            S3Store::new(c).map_err(|e| BackupError::BlobStore(Box::new(e)))?,
        ))),
        BlobChoice::Default | BlobChoice::Local | BlobChoice::Etcd => Ok(None),
    }
}

/// Where the bytes of blob `b` are: the data dir, or fetched (verified)
/// from the bucket into the temp dir.
async fn blob_path(
    b: &super::archive::BlobEntry,
    local: &LocalBlobs,
    fetched: &LocalBlobs,
    store: Option<&dyn BlobStore>,
    dir: &Path,
) -> Result<PathBuf, BackupError> {
    if local.contains(&b.digest) {
        return Ok(local.path(&b.digest));
    }
    let missing = |hint| BackupError::MissingBlob {
        bundle: b.bundles.join(", "),
        digest: b.digest,
        dir: dir.to_path_buf(),
        hint,
    };
    let Some(store) = store else {
        return Err(missing(
            "; if the server keeps its blobs in a bucket, give its --blob-store s3://… and --s3-* flags",
        ));
    };
    let found = store
        .fetch(&b.digest, fetched)
        .await
        .map_err(|source| BackupError::FetchBlob {
            digest: b.digest,
            store: store.describe(),
            source: Box::new(source),
        })?;
    if !found {
        return Err(missing(
            " nor in the blob store (deleted meanwhile?); run the backup again",
        ));
    }
    Ok(fetched.path(&b.digest))
}

/// Writes the archive to a temp file (0600) beside `out`, fsyncs it and
/// gives it its name (never over an existing file); returns its SHA-256.
fn write_archive(
    out: &Path,
    manifest: &Manifest,
    entries: Vec<(FileEntry, Source)>,
) -> Result<Digest, BackupError> {
    let dir = parent_of(out);
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Io { what, path, source }
    };
    // NamedTempFile is created 0600: the archive holds the CA key.
    let tmp = tempfile::Builder::new()
        .prefix(".lks-backup-")
        .suffix(".partial")
        .tempfile_in(&dir)
        .map_err(io("create a temp file in", &dir))?;
    let mut w = ArchiveWriter::new(std::io::BufWriter::new(tmp.as_file()), manifest)?;
    for (e, src) in entries {
        match src {
            Source::Bytes(b) => w.entry(&e.name, &b[..])?,
            Source::File(p) => {
                let f = std::fs::File::open(&p).map_err(io("open", &p))?;
                w.entry(&e.name, f)?;
            }
        }
    }
    let (mut buf, digest) = w.finish()?;
    buf.flush().map_err(io("write", out))?;
    drop(buf);
    tmp.as_file().sync_all().map_err(io("fsync", out))?;
    tmp.persist_noclobber(out).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            BackupError::OutExists(out.to_path_buf())
        } else {
            BackupError::Io {
                what: "name",
                path: out.to_path_buf(),
                source: e.error,
            }
        }
    })?;
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(digest)
}
