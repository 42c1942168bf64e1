//! `backup --store etcd` and `restore --store etcd`: an installation of
//! replicas archived from its etcd prefix, and restored into an empty one.
//!
//! **Backup.** Every key under the prefix is read at one etcd revision —
//! the first read's — in pages (`GetOptions::with_revision`), so the
//! archive is one consistent snapshot while the replicas go on writing
//! (as `etcdctl snapshot save` is for the whole etcd). The keys go as they
//! are stored into the entry `etcd/keys`, except those of live replicas
//! (under a lease), blob chunks and patch records: which keys are taken,
//! and what each is, is `lks-store-etcd`'s ([`EtcdStore::archive`]). The
//! manifest lists every blob a bundle serves by digest, and `--with-blobs`
//! adds their bytes as blob entries, as a data dir's backup does.
//!
//! The identity document (CA and admin credential) is among the keys, as
//! stored: sealed if the replicas run with `--encryption-key-file`. Given
//! the key file, backup opens it to prove the CA loads; without it a
//! sealed identity is archived as it is and the summary names the key.
//!
//! **Restore.** The archive is read and verified whole into a private temp
//! dir first (every entry's SHA-256, the closing one); then, with the
//! prefix proven empty, the identity is created first (create-only, so a
//! second restore or a replica starting meanwhile is refused), then the
//! blobs go into the blob store (`--blob-store etcd`, the default, or a
//! bucket), then every key with a create-only compare, batched as the store
//! says ([`crate::store::etcd::Archive::restore`]): ids of audit records
//! and events are new, their order is kept. A failure after the identity
//! removes what was written under the prefix.
//!
//! `etcd/keys` format: for each key, in key order, `u32` big-endian length
//! of the key (relative to the prefix, UTF-8), the key, `u32` big-endian
//! length of the value, the value.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lks_pki::seal::SealKey;
use lks_proto::Digest;
use tempfile::TempDir;

use super::archive::{ArchiveReader, BlobEntry, EntryName, EtcdOrigin, FileEntry, Manifest, StoreKind};
use super::common::{RestoreError, extract, unrestored_blobs};
use super::output::{Source, Taken, blob_entry, file_entry, finish, parent_of, remote_store};
use super::{BackupError, BackupSummary, Counts, blob_manifest, write_counts};
use crate::store::etcd::archive::{self, ArchivedKey, ReadError};
use crate::store::{Dump, EtcdConfig, EtcdStore, StoreError};
use lks_blobs::{BlobChoice, BlobError, BlobStore, EtcdChunks, LocalBlobs, S3Store};

/// What `backup --store etcd` is told.
#[derive(Clone, Debug)]
pub struct EtcdBackupConfig {
    pub etcd: EtcdConfig,
    pub out: PathBuf,
    pub with_blobs: bool,
    /// Where the replicas keep blobs (`--blob-store`): etcd's chunks unless
    /// a bucket is named.
    pub blob_store: BlobChoice,
    /// Opens a sealed identity to prove the CA loads.
    pub encryption_key_file: Option<PathBuf>,
    /// `--etcd-max-blob-size` (reading chunks checks sizes against it).
    pub max_blob: u64,
}

/// What `restore --store etcd` is told.
#[derive(Clone, Debug)]
pub struct EtcdRestoreConfig {
    pub from: PathBuf,
    pub etcd: EtcdConfig,
    /// Where the archive's blobs go: etcd's chunks unless a bucket is named.
    pub blob_store: BlobChoice,
    pub max_blob: u64,
}

/// What a restore into etcd wrote.
#[derive(Clone, Debug)]
pub struct EtcdRestoreSummary {
    pub endpoints: String,
    pub prefix: String,
    pub manifest: Manifest,
    pub keys: usize,
    /// Blobs put into the blob store (absent there before).
    pub blobs_put: usize,
    pub blob_store: String,
    /// Blobs the bundles serve that neither the archive nor the blob store
    /// holds.
    pub blobs_missing: usize,
}

impl fmt::Display for EtcdRestoreSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.manifest;
        writeln!(
            f,
            "restored the backup of {} taken at {} into etcd {} under {}",
            m.source, m.created_at, self.endpoints, self.prefix
        )?;
        write_counts(f, m)?;
        writeln!(
            f,
            "  keys        {} written; {} blobs put into {}",
            self.keys, self.blobs_put, self.blob_store
        )?;
        if self.blobs_missing > 0 {
            writeln!(
                f,
                "{} blobs are in neither the archive (taken without --with-blobs) nor {}: start the replicas \
                 with the --blob-store that holds them",
                self.blobs_missing, self.blob_store
            )?;
        }
        let key = match m.etcd.as_ref().and_then(|e| e.sealed_with.as_deref()) {
            Some(k) => format!(" --encryption-key-file (the key {k})"),
            None => String::new(),
        };
        write!(
            f,
            "Next: start the replicas with --store etcd --etcd-prefix {}{key} on the address the agents dial. \
             Nodes enrolled and bundles published after {} are unknown to them.",
            self.prefix, m.created_at
        )
    }
}

fn write_pair(w: &mut impl Write, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    for part in [key, value] {
        let len = u32::try_from(part.len()).map_err(std::io::Error::other)?;
        w.write_all(&len.to_be_bytes())?;
        w.write_all(part)?;
    }
    Ok(())
}

/// Why an `etcd/keys` file could not be read as pairs.
#[derive(Debug, thiserror::Error)]
enum PairsError {
    #[error("open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd/keys ends inside a key: {0}")]
    InKey(#[source] std::io::Error),
    #[error("etcd/keys ends inside a value: {0}")]
    InValue(#[source] std::io::Error),
    #[error("etcd/keys holds a key that is not UTF-8: {0}")]
    NotUtf8(#[source] std::string::FromUtf8Error),
}

/// The pairs of an `etcd/keys` file (already verified by its SHA-256).
fn read_pairs(path: &Path) -> Result<Vec<(String, Vec<u8>)>, PairsError> {
    let file = File::open(path).map_err(|source| PairsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let mut r = BufReader::new(file);
    let mut out = Vec::new();
    let mut len = [0u8; 4];
    loop {
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(source) => {
                return Err(PairsError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let mut key = vec![0u8; u32::from_be_bytes(len) as usize];
        let mut vlen = [0u8; 4];
        r.read_exact(&mut key)
            .and_then(|()| r.read_exact(&mut vlen))
            .map_err(PairsError::InKey)?;
        let mut value = vec![0u8; u32::from_be_bytes(vlen) as usize];
        r.read_exact(&mut value).map_err(PairsError::InValue)?;
        out.push((String::from_utf8(key).map_err(PairsError::NotUtf8)?, value));
    }
}

/// What reading the prefix found besides the keys it wrote.
#[derive(Default)]
struct Snapshot {
    revision: i64,
    keys: u64,
    identity: Option<Vec<u8>>,
    counts: Counts,
    /// Bundles, for the blob manifest.
    dump: Dump,
}

impl Snapshot {
    /// Counts the key `rest` for the summary (the same kinds a dump counts).
    fn tally(&mut self, rest: &str, value: &[u8]) -> Result<(), BackupError> {
        let c = &mut self.counts;
        match archive::archived_key(rest, value).map_err(|source| BackupError::Store {
            what: "read an archived key",
            source,
        })? {
            ArchivedKey::Cluster { with_ca } => {
                c.clusters += 1;
                c.cluster_cas += usize::from(with_ca);
            }
            ArchivedKey::Cert => c.certificates += 1,
            ArchivedKey::Token => c.tokens += 1,
            ArchivedKey::Node => c.nodes += 1,
            ArchivedKey::Target => c.targets += 1,
            ArchivedKey::Rollout => c.rollouts += 1,
            ArchivedKey::Audit => c.audit += 1,
            ArchivedKey::Release => c.releases += 1,
            ArchivedKey::Root => c.roots += 1,
            ArchivedKey::Events(n) => c.events += n,
            ArchivedKey::GenerationFloor(g) | ArchivedKey::Desired { generation: g } => {
                c.generation = c.generation.max(g)
            }
            ArchivedKey::Identity => self.identity = Some(value.to_vec()),
            ArchivedKey::Bundle(b) => {
                c.bundles += 1;
                self.dump.bundles.push(*b);
            }
            ArchivedKey::Other => {}
        }
        Ok(())
    }
}

/// Reads every archived key under the store's prefix at one revision into
/// `out` (the `etcd/keys` format).
async fn read_snapshot(store: &EtcdStore, out: &Path) -> Result<Snapshot, BackupError> {
    let file = File::create(out).map_err(|source| BackupError::Io {
        what: "create",
        path: out.to_path_buf(),
        source,
    })?;
    let mut w = BufWriter::new(file);
    let write_err = |source| BackupError::Io {
        what: "write",
        path: out.to_path_buf(),
        source,
    };
    let mut snap = Snapshot::default();
    let revision = store
        .archive()
        .read(|rest, value| {
            snap.tally(rest, value)?;
            write_pair(&mut w, rest.as_bytes(), value).map_err(write_err)?;
            snap.keys += 1;
            Ok(())
        })
        .await
        .map_err(|e| match e {
            ReadError::Each(e) => e,
            ReadError::Etcd {
                prefix,
                message,
                compacted,
            } => BackupError::EtcdRead(ReadError::Etcd {
                prefix,
                message,
                compacted,
            }),
        })?;
    snap.revision = revision;
    let f = w.into_inner().map_err(|e| write_err(e.into_error()))?;
    f.sync_all().map_err(write_err)?;
    Ok(snap)
}

/// Backs up every key under the etcd prefix, and the blobs with
/// `--with-blobs`.
pub async fn backup_etcd(cfg: &EtcdBackupConfig) -> Result<BackupSummary, BackupError> {
    if cfg.out.exists() {
        return Err(BackupError::OutExists(cfg.out.clone()));
    }
    if matches!(cfg.blob_store, BlobChoice::Local) {
        return Err(BackupError::LocalBlobStore);
    }
    let seal = cfg
        .encryption_key_file
        .as_deref()
        .map(SealKey::load)
        .transpose()?;
    let store = EtcdStore::connect(&cfg.etcd, "backup")
        .await
        .map_err(BackupError::EtcdUnreachable)?;
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
    let keys_path = tmp.path().join("keys");
    let snap = read_snapshot(&store, &keys_path).await?;
    let Some(identity) = &snap.identity else {
        return Err(BackupError::NoControlPlane {
            prefix: store.prefix().to_string(),
        });
    };
    let (sealed_with, _) = crate::replicas::read_stored_identity(&store, identity, seal.as_ref())
        .map_err(BackupError::StoredIdentity)?;

    // file_entry: mode 0600, the keys hold the CA key.
    let mut entries: Vec<(FileEntry, Source)> = vec![(
        file_entry(&EntryName::EtcdKeys.path(), &keys_path)?,
        Source::File(keys_path.clone()),
    )];
    let blobs = blob_manifest(&snap.dump);
    if cfg.with_blobs {
        let fetched =
            LocalBlobs::open(&tmp.path().join("blobs")).map_err(|e| BackupError::BlobStore(Box::new(e)))?;
        let from = remote_store(&cfg.blob_store, Some((&store, cfg.max_blob)))?;
        for b in &blobs {
            let path = fetch_blob(b, from.as_deref(), &fetched).await?;
            entries.push(blob_entry(b, path));
        }
    }
    let taken = Taken {
        store: StoreKind::Etcd,
        source: format!(
            "{} {}@{}",
            cfg.etcd.endpoints.join(","),
            store.prefix(),
            snap.revision
        ),
        created_at_ms,
        entries,
        blobs,
        blobs_included: cfg.with_blobs,
        counts: snap.counts.clone(),
        etcd: Some(EtcdOrigin {
            prefix: store.prefix().to_string(),
            revision: snap.revision,
            keys: snap.keys,
            sealed_with,
        }),
    };
    finish(&cfg.out, taken).await
}

/// Fetches blob `b` (verified) from the replicas' blob store into `into`.
async fn fetch_blob(
    b: &BlobEntry,
    store: Option<&dyn BlobStore>,
    into: &LocalBlobs,
) -> Result<PathBuf, BackupError> {
    let Some(store) = store else {
        return Err(BackupError::NoBlobStore);
    };
    let found = store
        .fetch(&b.digest, into)
        .await
        .map_err(|source| BackupError::FetchBlob {
            digest: b.digest,
            store: store.describe(),
            source: Box::new(source),
        })?;
    if !found {
        return Err(BackupError::BlobNotInStore {
            bundles: b.bundles.join(", "),
            digest: b.digest,
            store: store.describe(),
            hint: if store.describe() == "etcd" {
                "; if the replicas keep blobs in a bucket, give their --blob-store s3://… and --s3-* flags"
            } else {
                " (deleted meanwhile?); run the backup again"
            },
        });
    }
    Ok(into.path(&b.digest))
}

/// Restores an etcd archive into an empty prefix.
pub async fn restore_etcd(cfg: &EtcdRestoreConfig) -> Result<EtcdRestoreSummary, RestoreError> {
    let file = File::open(&cfg.from).map_err(|source| RestoreError::Io {
        what: "open",
        path: cfg.from.clone(),
        source,
    })?;
    let reader = ArchiveReader::open(BufReader::new(file))?;
    let manifest = reader.manifest().clone();
    let origin = etcd_origin(&manifest)?;
    check_target(cfg, &manifest, &origin)?;

    // Everything is read and verified before anything is written.
    let (staging, restored) = stage(reader).await?;
    let Verified {
        pairs,
        identity,
        not_included,
    } = verify(&manifest, &origin, &restored, staging.path())?;

    let (store, durable) = open_target(cfg).await?;
    claim_prefix(&store, identity).await?;
    let blobs_put = Restoring {
        store: &store,
        durable: &*durable,
        manifest: &manifest,
        restored: &restored,
        staging: staging.path(),
        pairs: &pairs,
    }
    .write_or_remove()
    .await?;
    let mut blobs_missing = 0;
    if not_included > 0 {
        for b in manifest.blobs.iter().filter(|b| !restored.contains(&b.digest)) {
            if !durable.contains(&b.digest).await.unwrap_or(false) {
                blobs_missing += 1;
            }
        }
    }
    Ok(EtcdRestoreSummary {
        endpoints: cfg.etcd.endpoints.join(","),
        prefix: store.prefix().to_string(),
        keys: pairs.len(),
        blobs_put,
        blob_store: durable.describe(),
        blobs_missing,
        manifest,
    })
}

/// Where the archive came from, refused unless it holds etcd and names its prefix.
fn etcd_origin(manifest: &Manifest) -> Result<EtcdOrigin, RestoreError> {
    match (&manifest.store, &manifest.etcd) {
        (StoreKind::Etcd, Some(o)) => Ok(o.clone()),
        (StoreKind::Etcd, None) => Err(RestoreError::Problems(vec![
            "the archive says it holds etcd but names no prefix: the archive was altered".into(),
        ])),
        (StoreKind::Sqlite, _) => Err(RestoreError::SqliteArchive {
            origin: manifest.source.clone(),
        }),
    }
}

/// Refuses what the target cannot take: a sealed archive into another
/// prefix, a local blob store, a blob over the etcd blob store's limit.
fn check_target(
    cfg: &EtcdRestoreConfig,
    manifest: &Manifest,
    origin: &EtcdOrigin,
) -> Result<(), RestoreError> {
    let prefix = cfg.etcd.normalized_prefix();
    if let Some(key) = &origin.sealed_with
        && prefix != origin.prefix
    {
        return Err(RestoreError::SealedForPrefix {
            key: key.clone(),
            origin: origin.prefix.clone(),
        });
    }
    if matches!(cfg.blob_store, BlobChoice::Local) {
        return Err(RestoreError::LocalBlobStore);
    }
    if matches!(cfg.blob_store, BlobChoice::Default | BlobChoice::Etcd)
        && let Some(b) = manifest.blobs.iter().find(|b| b.size > cfg.max_blob)
    {
        return Err(RestoreError::BlobTooLarge {
            digest: b.digest,
            size: b.size,
            max: cfg.max_blob,
        });
    }
    Ok(())
}

/// Extracts the archive into a temp dir; returns the dir and the blobs it
/// held.
async fn stage(reader: ArchiveReader<BufReader<File>>) -> Result<(TempDir, HashSet<Digest>), RestoreError> {
    let staging = tempfile::Builder::new()
        .prefix("lks-restore-")
        .tempdir()
        .map_err(|source| RestoreError::Io {
            what: "create a temp dir in",
            path: std::env::temp_dir(),
            source,
        })?;
    let dir = staging.path().to_path_buf();
    let restored = tokio::task::spawn_blocking(move || extract(reader, &dir)).await??;
    Ok((staging, restored))
}

/// The staged keys, checked against the manifest, as `verify` returns them.
struct Verified {
    /// Every key to write, `meta/generation` set to the restored floor.
    pairs: Vec<(String, Vec<u8>)>,
    identity: Vec<u8>,
    /// Blobs of the manifest the archive did not include.
    not_included: usize,
}

/// Reads the staged keys and checks them against the manifest (every
/// problem reported at once), then sets the generation floor.
fn verify(
    manifest: &Manifest,
    origin: &EtcdOrigin,
    restored: &HashSet<Digest>,
    staging: &Path,
) -> Result<Verified, RestoreError> {
    let mut problems = Vec::new();
    let not_included = unrestored_blobs(manifest, restored, &mut problems);
    let mut pairs = read_pairs(&staging.join(EntryName::EtcdKeys.path()))
        .map_err(|e| RestoreError::Problems(vec![format!("{e}: the archive was altered")]))?;
    if pairs.len() as u64 != origin.keys {
        problems.push(format!(
            "etcd/keys holds {} keys, the manifest says {}: the archive was altered",
            pairs.len(),
            origin.keys
        ));
    }
    let Some(identity) = archive::archived_identity(&pairs).map(<[u8]>::to_vec) else {
        problems.push("the archive holds no identity (CA and admin credential)".into());
        return Err(RestoreError::Problems(problems));
    };
    if !problems.is_empty() {
        return Err(RestoreError::Problems(problems));
    }
    archive::raise_generation_floor(&mut pairs, origin.revision);
    Ok(Verified {
        pairs,
        identity,
        not_included,
    })
}

/// Connects to etcd and to the blob store the replicas keep blobs in.
async fn open_target(cfg: &EtcdRestoreConfig) -> Result<(EtcdStore, Arc<dyn BlobStore>), RestoreError> {
    let store = EtcdStore::connect(&cfg.etcd, "restore")
        .await
        .map_err(RestoreError::EtcdUnreachable)?;
    let durable: Arc<dyn BlobStore> = match &cfg.blob_store {
        BlobChoice::S3(c) => {
            let blob_err = |e| RestoreError::BlobStore(Box::new(e));
            let s = S3Store::new(c).map_err(blob_err)?;
            s.check().await.map_err(blob_err)?;
            Arc::new(s)
        }
        _ => Arc::new(EtcdChunks::new(store.clone(), cfg.max_blob)),
    };
    Ok((store, durable))
}

/// Claims the prefix by creating the identity first: refused when a key is
/// already there or another restore's identity won.
async fn claim_prefix(store: &EtcdStore, identity: Vec<u8>) -> Result<(), RestoreError> {
    let in_use = |key: String| RestoreError::PrefixInUse {
        key,
        prefix: store.prefix().to_string(),
    };
    if let Some(key) = store.first_key().await.map_err(|source| RestoreError::Store {
        what: "read the prefix",
        source,
    })? {
        return Err(in_use(key));
    }
    let stored = store
        .identity()
        .create(identity.clone())
        .await
        .map_err(|source| RestoreError::Store {
            what: "store the identity",
            source,
        })?;
    if stored != identity {
        return Err(in_use(store.identity().key()));
    }
    Ok(())
}

/// What a restore writes once the archive was read and verified: its
/// blobs (`restored`, staged under `staging`) into the blob store
/// `durable`, and its keys into `store`.
struct Restoring<'a> {
    store: &'a EtcdStore,
    durable: &'a dyn BlobStore,
    manifest: &'a Manifest,
    restored: &'a HashSet<Digest>,
    staging: &'a Path,
    pairs: &'a [(String, Vec<u8>)],
}

impl Restoring<'_> {
    /// [`Self::write`], and when it fails, removes what it wrote (the
    /// error says whether that worked).
    async fn write_or_remove(&self) -> Result<usize, RestoreError> {
        match self.write().await {
            Ok(n) => Ok(n),
            Err(cause) => {
                let cleanup = match self.store.remove_import().await {
                    Ok(()) => format!("removed what was written under {}", self.store.prefix()),
                    Err(e) => format!(
                        "could not remove what was written ({e}); remove it with `etcdctl del --prefix {}` before trying again",
                        self.store.prefix()
                    ),
                };
                Err(RestoreError::Write {
                    cause: Box::new(cause),
                    cleanup,
                })
            }
        }
    }

    /// The blobs into the blob store, then every key but the identity
    /// (written first); returns how many blobs were put.
    async fn write(&self) -> Result<usize, WriteError> {
        let put = self.put_blobs().await?;
        self.create_keys().await?;
        Ok(put)
    }

    /// The restored blobs the blob store does not hold yet; returns how
    /// many were put.
    async fn put_blobs(&self) -> Result<usize, WriteError> {
        let durable = self.durable;
        let blobs = LocalBlobs::read_only(&self.staging.join("blobs"));
        let mut put = 0;
        for b in self
            .manifest
            .blobs
            .iter()
            .filter(|b| self.restored.contains(&b.digest))
        {
            let held = durable
                .contains(&b.digest)
                .await
                .map_err(|source| WriteError::Look {
                    digest: b.digest,
                    store: durable.describe(),
                    source,
                })?;
            if !held {
                durable
                    .put(&b.digest, b.size, &blobs.path(&b.digest))
                    .await
                    .map_err(|source| WriteError::Copy {
                        digest: b.digest,
                        store: durable.describe(),
                        source,
                    })?;
                put += 1;
            }
        }
        Ok(put)
    }

    /// Every key but the identity (written first), as the store batches
    /// a restore.
    async fn create_keys(&self) -> Result<(), WriteError> {
        self.store
            .archive()
            .restore(self.pairs)
            .await
            .map_err(WriteError::Keys)
    }
}

/// Why writing a verified archive into etcd and its blob store failed
/// (what was written is then removed: [`RestoreError::Write`]).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("blob {digest} in {store}: {source}")]
    Look {
        digest: Digest,
        store: String,
        #[source]
        source: BlobError,
    },
    #[error("copy blob {digest} to {store}: {source}")]
    Copy {
        digest: Digest,
        store: String,
        #[source]
        source: BlobError,
    },
    #[error("{0}")]
    Keys(#[source] StoreError),
}

#[cfg(test)]
mod tests;
