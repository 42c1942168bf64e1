//! What both backups share: the archive's entries and where their bytes
//! come from, fetching blobs from the installation's blob store, and
//! writing the archive so that only a complete one gets its name.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lks_proto::Digest;

use super::archive::{
    ArchiveWriter, BlobEntry, EntryName, EtcdOrigin, FORMAT, FileEntry, Manifest, StoreKind,
};
use super::{BackupError, BackupSummary, Counts};
use crate::store::EtcdStore;
use lks_blobs::{BlobChoice, BlobStore, EtcdChunks, LocalBlobs, S3Store};

/// An entry and where its bytes come from.
pub(super) enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// The directory a file goes into (`.` for a bare name).
pub(super) fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub(super) fn file_entry(name: &str, path: &Path) -> Result<FileEntry, BackupError> {
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

pub(super) fn bytes_entry(name: &str, bytes: &[u8], mode: u32) -> FileEntry {
    FileEntry {
        name: name.into(),
        size: bytes.len() as u64,
        sha256: Digest::of(bytes),
        mode,
    }
}

/// The blob store to fetch blobs from that are not on this disk, if any:
/// the bucket named, or etcd's chunks under the store being backed up
/// (`etcd`: with `--store etcd`, `max` its `--etcd-max-blob-size`).
pub(super) fn remote_store(
    choice: &BlobChoice,
    etcd: Option<(&EtcdStore, u64)>,
) -> Result<Option<Arc<dyn BlobStore>>, BackupError> {
    match (choice, etcd) {
        (BlobChoice::S3(c), _) => Ok(Some(Arc::new(
            S3Store::new(c).map_err(|e| BackupError::BlobStore(Box::new(e)))?,
        ))),
        (BlobChoice::Default | BlobChoice::Etcd, Some((store, max))) => {
            Ok(Some(Arc::new(EtcdChunks::new(store.clone(), max))))
        }
        (BlobChoice::Default | BlobChoice::Local | BlobChoice::Etcd, _) => Ok(None),
    }
}

/// Where the bytes of blob `b` are: the data dir, or fetched (verified)
/// from the bucket into the temp dir.
pub(super) async fn blob_path(
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
pub(super) fn write_archive(
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

/// The archive entry of blob `b`, its bytes at `path`.
pub(super) fn blob_entry(b: &BlobEntry, path: PathBuf) -> (FileEntry, Source) {
    (
        FileEntry {
            name: EntryName::Blob(b.digest).path(),
            size: b.size,
            sha256: b.digest,
            mode: 0o644,
        },
        Source::File(path),
    )
}

/// What a backup read, ready to be written.
pub(super) struct Taken {
    pub(super) store: StoreKind,
    pub(super) source: String,
    pub(super) created_at_ms: i64,
    pub(super) entries: Vec<(FileEntry, Source)>,
    pub(super) blobs: Vec<BlobEntry>,
    pub(super) blobs_included: bool,
    pub(super) counts: Counts,
    pub(super) etcd: Option<EtcdOrigin>,
}

/// Writes the archive of `t` to `out` ([`write_archive`], off the async
/// threads) and says what it holds.
pub(super) async fn finish(out: &Path, t: Taken) -> Result<BackupSummary, BackupError> {
    let manifest = Manifest {
        format: FORMAT,
        server_version: env!("CARGO_PKG_VERSION").into(),
        created_at: crate::clock::rfc3339(t.created_at_ms),
        created_at_ms: t.created_at_ms,
        store: t.store,
        source: t.source,
        files: t.entries.iter().map(|(e, _)| e.clone()).collect(),
        blobs: t.blobs,
        blobs_included: t.blobs_included,
        counts: t.counts,
        etcd: t.etcd,
    };
    let (to, entries) = (out.to_path_buf(), t.entries);
    let (sha256, manifest) =
        tokio::task::spawn_blocking(move || write_archive(&to, &manifest, entries).map(|d| (d, manifest)))
            .await
            .map_err(|e| BackupError::Io {
                what: "write",
                path: out.to_path_buf(),
                source: std::io::Error::other(e),
            })??;
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(BackupSummary {
        out: out.to_path_buf(),
        manifest,
        sha256,
        size,
    })
}
