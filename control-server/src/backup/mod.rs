//! `lks-control-server backup` and `restore`: an online, consistent copy
//! of an installation in one self-verifying archive ([`archive`]), and a
//! data dir made from one.
//!
//! A single server's backup (`--store sqlite`) holds SQLite's online copy
//! of `state.db` (every row: clusters with their CAs, tokens, nodes with
//! their certificate serials, bundles, targets, rollouts, events, the audit
//! trail, releases and trust roots), the files of `pki/` (the CA and its
//! key among them), `admin.conf`, and a manifest of every blob a bundle in
//! the copy serves, by digest — with `--with-blobs`, their bytes too.
//! The running server is not stopped or paused: SQLite's backup reads the
//! database in one read transaction while the server goes on writing.

pub mod archive;
mod common;
mod etcd;
mod output;
mod sqlite;

use std::fmt;
use std::path::PathBuf;

use lks_pki::PkiError;

pub use archive::{ArchiveError, Counts, Manifest, StoreKind};
pub use common::RestoreError;
pub use etcd::{EtcdBackupConfig, EtcdRestoreConfig, EtcdRestoreSummary, backup_etcd, restore_etcd};
pub use sqlite::{BackupConfig, RestoreConfig, RestoreSummary, backup_sqlite, restore};

use crate::store::etcd::archive::ReadError;
use crate::store::{Dump, StoreError};
use lks_blobs::BlobError;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "{dir} is not a control server's data dir (it has no {missing}); give the --data-dir of the running server"
    )]
    NotADataDir { dir: PathBuf, missing: &'static str },
    #[error("{0} exists already; give a new --out file (an archive is never overwritten)")]
    OutExists(PathBuf),
    #[error("copy {path} (SQLite online backup): {source}")]
    Snapshot {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("read the copy of {path}: {source}")]
    ReadCopy {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("read the CA and admin credential: {0}")]
    Identity(#[from] PkiError),
    #[error("bundle {bundle}: blob {digest} is not in {dir}{hint}")]
    MissingBlob {
        bundle: String,
        digest: lks_proto::Digest,
        dir: PathBuf,
        hint: &'static str,
    },
    #[error("fetch blob {digest} from {store}: {source}")]
    FetchBlob {
        digest: lks_proto::Digest,
        store: String,
        #[source]
        source: Box<BlobError>,
    },
    #[error("{0}")]
    BlobStore(#[source] Box<BlobError>),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Archive(#[from] ArchiveError),
    #[error("{what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("{0}")]
    EtcdRead(#[source] ReadError<std::convert::Infallible>),
    #[error("cannot reach etcd: {0}; check --etcd-endpoints and that etcd is up")]
    EtcdUnreachable(#[source] StoreError),
    #[error("--blob-store local is no blob store of replicas: give etcd (the default) or s3://BUCKET/PREFIX")]
    LocalBlobStore,
    #[error("{0}")]
    SealKey(#[from] lks_pki::seal::SealError),
    #[error("etcd holds no control plane under {prefix} (no identity key): check --etcd-prefix")]
    NoControlPlane { prefix: String },
    #[error("the stored CA and admin credential: {0}")]
    StoredIdentity(#[source] crate::replicas::IdentityError),
    #[error("no blob store to read the blobs from")]
    NoBlobStore,
    #[error("bundle {bundles}: blob {digest} is not in {store}{hint}")]
    BlobNotInStore {
        bundles: String,
        digest: lks_proto::Digest,
        store: String,
        hint: &'static str,
    },
}

/// What a backup wrote.
#[derive(Clone, Debug)]
pub struct BackupSummary {
    pub out: PathBuf,
    pub manifest: Manifest,
    /// SHA-256 of the whole archive file.
    pub sha256: lks_proto::Digest,
    pub size: u64,
}

impl fmt::Display for BackupSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.manifest;
        writeln!(
            f,
            "backed up {} ({}) at {} into {}",
            m.source,
            m.store,
            m.created_at,
            self.out.display()
        )?;
        write_counts(f, m)?;
        if let Some(e) = &m.etcd {
            let sealed = match &e.sealed_with {
                Some(k) => format!(
                    "; private keys sealed with the key {k}: the restored replicas need that \
                     --encryption-key-file, under the prefix {}",
                    e.prefix
                ),
                None => String::new(),
            };
            writeln!(
                f,
                "  etcd        {} keys at revision {}{sealed}",
                e.keys, e.revision
            )?;
        }
        writeln!(f, "  archive     {} bytes, {} entries", self.size, m.files.len())?;
        writeln!(f, "  sha256      {}  {}", self.sha256.hex(), self.out.display())?;
        write!(
            f,
            "{} holds the CA private key (written 0600): keep it like the CA key itself.",
            self.out.display()
        )
    }
}

/// The counts of a manifest, one line per kind (backup and restore print
/// them alike).
fn write_counts(f: &mut fmt::Formatter<'_>, m: &Manifest) -> fmt::Result {
    let bytes: u64 = m.blobs.iter().map(|b| b.size).sum();
    let included = if m.blobs_included {
        "bytes included"
    } else {
        "by digest only; --with-blobs includes the bytes"
    };
    m.counts
        .write_lines(f, &format!("{} blobs, {bytes} bytes, {included}", m.blobs.len()))
}

/// Every distinct blob the dumped bundles serve, with its size (from the
/// bundle's manifest) and the bundles serving it, by digest.
pub fn blob_manifest(d: &Dump) -> Vec<archive::BlobEntry> {
    let mut by: std::collections::BTreeMap<lks_proto::Digest, archive::BlobEntry> = Default::default();
    for b in &d.bundles {
        let id = format!("{}@{}", b.row.name, b.row.version);
        for digest in &b.blob_digests {
            let size = b
                .row
                .bundle
                .manifest()
                .files
                .iter()
                .find(|f| f.digest == *digest)
                .map_or(0, |f| f.size);
            let e = by.entry(*digest).or_insert_with(|| archive::BlobEntry {
                digest: *digest,
                size,
                bundles: Vec::new(),
            });
            if !e.bundles.contains(&id) {
                e.bundles.push(id.clone());
            }
        }
    }
    by.into_values().collect()
}
