//! `backup --store etcd` and `restore --store etcd`: an installation of
//! replicas archived from its etcd prefix, and restored into an empty one.
//!
//! **Backup.** Every key under the prefix is read at one etcd revision —
//! the first read's — in pages (`GetOptions::with_revision`), so the
//! archive is one consistent snapshot while the replicas go on writing
//! (as `etcdctl snapshot save` is for the whole etcd). The keys go as they
//! are stored into the entry `etcd/keys`, except:
//! - keys under a lease (`replicas/ID`, `load/ID`, `leader`, a collector's
//!   `deleting` mark): they belong to live replicas and end with them;
//! - `blobs/` (blob bytes in etcd's chunks): the manifest lists every blob
//!   a bundle serves by digest, and `--with-blobs` adds their bytes as
//!   blob entries, as a data dir's backup does;
//! - `deltas/` (patch records): derived data; the restored replicas'
//!   maker makes them again from the bundles' bytes.
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
//! bucket), then every key with a create-only compare, at most 100 per
//! transaction. Audit records and event documents take their ids from the
//! revision that created them, so each is written in its own transaction,
//! in key (time) order: ids are new, their order is kept. A failure after
//! the identity removes what was written under the prefix.
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

use etcd_client::GetOptions;
use lks_pki::seal::SealKey;
use lks_proto::Digest;
use tempfile::TempDir;

use super::archive::{ArchiveReader, BlobEntry, EntryName, EtcdOrigin, FileEntry, Manifest, StoreKind};
use super::output::{Source, Taken, blob_entry, file_entry, finish, parent_of, remote_store};
use super::restore::{RestoreError, extract, unrestored_blobs};
use super::{BackupError, BackupSummary, Counts, blob_manifest, write_counts};
use crate::blobs::{BlobChoice, BlobStore, EtcdChunks, LocalBlobs, S3Store};
use crate::store::etcd::{dumped_bundle, kv_of};
use crate::store::{Dump, EtcdConfig, EtcdStore};

/// Keys per range read of the snapshot.
const PAGE: i64 = 256;
/// Keys written per restore transaction (etcd allows 128 by default).
const MAX_OPS: usize = 100;
/// Bytes of values per restore transaction, below etcd's 1.5 MiB limit.
const MAX_BYTES: usize = 1 << 20;
/// Families whose ids come from the revision that created each key: one
/// key per transaction.
const ONE_PER_TXN: &[&str] = &["audit/", "timeline/", "events/"];
/// Families not archived (see the module doc).
const NOT_ARCHIVED: &[&str] = &["blobs/", "deltas/"];

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

/// The prefix as the store normalizes it (a trailing `/`).
fn normalized(prefix: &str) -> String {
    if prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

/// The first key after every key starting with `prefix`.
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The generation floor stored in `meta/generation` (0 if unreadable).
fn floor_of(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `meta/generation` for the restored prefix. Replicas hand out
/// generations as that floor plus etcd's revision (`EtcdStore::
/// next_generation`), so every generation in the archive is at most its
/// floor plus the revision it was read at. A new etcd starts at a lower
/// revision: with this floor every generation handed out after the restore
/// is above every one in the archive, as `migrate` sets it from a data dir
/// (a node's own desired state also never goes below its last one plus 1).
fn restored_floor(pairs: &[(String, Vec<u8>)], revision: i64) -> u64 {
    let old = pairs
        .iter()
        .find(|(k, _)| k == "meta/generation")
        .map_or(0, |(_, v)| floor_of(v));
    old + revision.max(0) as u64 + 1
}

fn write_pair(w: &mut impl Write, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    for part in [key, value] {
        let len = u32::try_from(part.len()).map_err(std::io::Error::other)?;
        w.write_all(&len.to_be_bytes())?;
        w.write_all(part)?;
    }
    Ok(())
}

/// The pairs of an `etcd/keys` file (already verified by its SHA-256).
fn read_pairs(path: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut r = BufReader::new(File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?);
    let mut out = Vec::new();
    let mut len = [0u8; 4];
    loop {
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        }
        let mut key = vec![0u8; u32::from_be_bytes(len) as usize];
        let mut vlen = [0u8; 4];
        r.read_exact(&mut key)
            .and_then(|()| r.read_exact(&mut vlen))
            .map_err(|e| format!("etcd/keys ends inside a key: {e}"))?;
        let mut value = vec![0u8; u32::from_be_bytes(vlen) as usize];
        r.read_exact(&mut value)
            .map_err(|e| format!("etcd/keys ends inside a value: {e}"))?;
        let key =
            String::from_utf8(key).map_err(|e| format!("etcd/keys holds a key that is not UTF-8: {e}"))?;
        out.push((key, value));
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
    /// Counts `rest` for the summary (the same kinds a dump counts).
    fn tally(&mut self, rest: &str, value: &[u8]) -> Result<(), BackupError> {
        let family = rest.split('/').next().unwrap_or("");
        let c = &mut self.counts;
        match family {
            "clusters" => {
                c.clusters += 1;
                let doc: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
                if doc.get("ca_cert_pem").is_some_and(|v| !v.is_null()) {
                    c.cluster_cas += 1;
                }
            }
            "certs" => c.certificates += 1,
            "tokens" => c.tokens += 1,
            "nodes" => c.nodes += 1,
            "targets" => c.targets += 1,
            "rollouts" => c.rollouts += 1,
            "audit" => c.audit += 1,
            "releases" => c.releases += 1,
            "roots" => c.roots += 1,
            "timeline" | "events" => {
                let docs: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
                c.events += docs.as_array().map_or(0, Vec::len);
            }
            "meta" if rest == "meta/generation" => c.generation = c.generation.max(floor_of(value)),
            "desired" => {
                let doc: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
                let g = doc
                    .get("generation")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                c.generation = c.generation.max(g);
            }
            "identity" if rest == "identity" => self.identity = Some(value.to_vec()),
            "bundles" => {
                c.bundles += 1;
                let b = dumped_bundle(rest, value).map_err(|e| BackupError::Etcd(e.to_string()))?;
                self.dump.bundles.push(b);
            }
            _ => {}
        }
        Ok(())
    }
}

/// Reads every archived key under the store's prefix at one revision into
/// `out` (the `etcd/keys` format).
async fn read_snapshot(store: &EtcdStore, out: &Path) -> Result<Snapshot, BackupError> {
    let prefix = store.prefix().as_bytes().to_vec();
    let etcd = |what: &str, e: etcd_client::Error| {
        BackupError::Etcd(format!(
            "{what} {}: {e}{}",
            store.prefix(),
            if e.to_string().contains("compacted") {
                " (etcd compacted the revision the backup reads at while it read: run the backup again)"
            } else {
                ""
            }
        ))
    };
    let mut kv = kv_of(&store.client());
    let first = kv
        .get(prefix.clone(), Some(GetOptions::new().with_limit(1)))
        .await
        .map_err(|e| etcd("read", e))?;
    let mut snap = Snapshot {
        revision: first.header().map_or(0, |h| h.revision()),
        ..Snapshot::default()
    };
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
    // Two ranges around `blobs/`, whose chunks are never read here.
    let blobs = [&prefix[..], b"blobs/"].concat();
    let ranges = [
        (prefix.clone(), blobs.clone()),
        (range_end(&blobs), range_end(&prefix)),
    ];
    for (from, end) in ranges {
        let mut start = from;
        loop {
            let resp = kv
                .get(
                    start.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(end.clone())
                            .with_revision(snap.revision)
                            .with_limit(PAGE),
                    ),
                )
                .await
                .map_err(|e| etcd("read", e))?;
            for item in resp.kvs() {
                let rest = String::from_utf8_lossy(&item.key()[prefix.len()..]).into_owned();
                if item.lease() != 0 || NOT_ARCHIVED.iter().any(|p| rest.starts_with(p)) {
                    continue;
                }
                snap.tally(&rest, item.value())?;
                write_pair(&mut w, rest.as_bytes(), item.value()).map_err(write_err)?;
                snap.keys += 1;
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => start = [last.key(), &[0][..]].concat(),
                _ => break,
            }
        }
    }
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
        return Err(BackupError::Etcd(
            "--blob-store local is no blob store of replicas: give etcd (the default) or s3://BUCKET/PREFIX"
                .into(),
        ));
    }
    let seal = cfg
        .encryption_key_file
        .as_deref()
        .map(SealKey::load)
        .transpose()
        .map_err(|e| BackupError::Etcd(e.to_string()))?;
    let store = EtcdStore::connect(&cfg.etcd, "backup").await.map_err(|e| {
        BackupError::Etcd(format!(
            "cannot reach etcd: {e}; check --etcd-endpoints and that etcd is up"
        ))
    })?;
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
        return Err(BackupError::Etcd(format!(
            "etcd holds no control plane under {} (no identity key): check --etcd-prefix",
            store.prefix()
        )));
    };
    let (sealed_with, _) = crate::replicas::read_stored_identity(&store, identity, seal.as_ref())
        .map_err(|e| BackupError::Etcd(format!("the stored CA and admin credential: {e}")))?;

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
        return Err(BackupError::Etcd("no blob store to read the blobs from".into()));
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
        return Err(BackupError::Etcd(format!(
            "bundle {}: blob {} is not in {}{}",
            b.bundles.join(", "),
            b.digest,
            store.describe(),
            if store.describe() == "etcd" {
                "; if the replicas keep blobs in a bucket, give their --blob-store s3://… and --s3-* flags"
            } else {
                " (deleted meanwhile?); run the backup again"
            }
        )));
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
    let prefix = normalized(&cfg.etcd.prefix);
    if let Some(key) = &origin.sealed_with
        && prefix != origin.prefix
    {
        return Err(RestoreError::SealedForPrefix {
            key: key.clone(),
            origin: origin.prefix.clone(),
        });
    }
    if matches!(cfg.blob_store, BlobChoice::Local) {
        return Err(RestoreError::Etcd(
            "--blob-store local is no blob store of replicas: give etcd (the default) or s3://BUCKET/PREFIX"
                .into(),
        ));
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
    let restored = tokio::task::spawn_blocking(move || extract(reader, &dir))
        .await
        .map_err(|e| RestoreError::Etcd(e.to_string()))??;
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
    let Some(identity) = pairs
        .iter()
        .find(|(k, _)| k == "identity")
        .map(|(_, v)| v.clone())
    else {
        problems.push("the archive holds no identity (CA and admin credential)".into());
        return Err(RestoreError::Problems(problems));
    };
    if !problems.is_empty() {
        return Err(RestoreError::Problems(problems));
    }
    let floor = restored_floor(&pairs, origin.revision);
    pairs.retain(|(k, _)| k != "meta/generation");
    pairs.push(("meta/generation".into(), floor.to_string().into_bytes()));
    Ok(Verified {
        pairs,
        identity,
        not_included,
    })
}

/// Connects to etcd and to the blob store the replicas keep blobs in.
async fn open_target(cfg: &EtcdRestoreConfig) -> Result<(EtcdStore, Arc<dyn BlobStore>), RestoreError> {
    let store = EtcdStore::connect(&cfg.etcd, "restore").await.map_err(|e| {
        RestoreError::Etcd(format!(
            "cannot reach etcd: {e}; check --etcd-endpoints and that etcd is up"
        ))
    })?;
    let durable: Arc<dyn BlobStore> = match &cfg.blob_store {
        BlobChoice::S3(c) => {
            let s = S3Store::new(c).map_err(|e| RestoreError::Etcd(e.to_string()))?;
            s.check().await.map_err(|e| RestoreError::Etcd(e.to_string()))?;
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
    if let Some(key) = store
        .first_key()
        .await
        .map_err(|e| RestoreError::Etcd(e.to_string()))?
    {
        return Err(in_use(key));
    }
    let stored = store
        .create_once("identity", identity.clone())
        .await
        .map_err(|e| RestoreError::Etcd(format!("store the identity: {e}")))?;
    if stored != identity {
        return Err(in_use(store.key("identity")));
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
                Err(RestoreError::Write { cause, cleanup })
            }
        }
    }

    /// The blobs into the blob store, then every key but the identity
    /// (written first); returns how many blobs were put.
    async fn write(&self) -> Result<usize, String> {
        let put = self.put_blobs().await?;
        self.create_keys().await?;
        Ok(put)
    }

    /// The restored blobs the blob store does not hold yet; returns how
    /// many were put.
    async fn put_blobs(&self) -> Result<usize, String> {
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
                .map_err(|e| format!("blob {} in {}: {e}", b.digest, durable.describe()))?;
            if !held {
                durable
                    .put(&b.digest, b.size, &blobs.path(&b.digest))
                    .await
                    .map_err(|e| format!("copy blob {} to {}: {e}", b.digest, durable.describe()))?;
                put += 1;
            }
        }
        Ok(put)
    }

    /// Every key but the identity, in transactions of at most `MAX_OPS`
    /// keys and `MAX_BYTES`, a key of `ONE_PER_TXN` alone in its own.
    async fn create_keys(&self) -> Result<(), String> {
        let create = |batch: Vec<(String, Vec<u8>)>| async move {
            self.store.create_all(batch).await.map_err(|e| e.to_string())
        };
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        let mut bytes = 0;
        for pair in self.pairs.iter().filter(|(k, _)| k != "identity") {
            let alone = ONE_PER_TXN.iter().any(|p| pair.0.starts_with(p));
            if !batch.is_empty() && (alone || batch.len() == MAX_OPS || bytes + pair.1.len() > MAX_BYTES) {
                create(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += pair.1.len();
            batch.push(pair.clone());
            if alone {
                create(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            create(batch).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
