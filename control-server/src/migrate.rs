//! `lks-control-server migrate --from-sqlite DIR --store etcd …`: moves a
//! single server's installation onto etcd, so that it grows into replicas
//! without re-enrolling a node (DESIGN §8).
//!
//! What moves: the CA and admin credential (`DIR/pki`), every row of
//! `DIR/state.db` (clusters, tokens, nodes with desired and reported state
//! and generation, bundles, cluster targets, rollouts with their node rows
//! and revisions, events), and every blob in `DIR/blobs` a bundle serves,
//! into etcd (`--blob-store etcd`, the default) or an S3 bucket
//! (`--blob-store s3://…`, checked before anything is written); and the
//! binary deltas of those versions (issue [delta]: the records, and the
//! patch blobs with them), so the new store offers the same patches. A
//! patch missing from `DIR/blobs` or too large for the blob store is
//! left behind with its record (transport only: the new store's maker
//! makes it again); the records of skipped patches move as they are.
//! Agents keep their pinned CA hash and node certificates: the replicas
//! serve with the same CA and know the same certificate serials.
//!
//! Order, so that a refusal writes nothing and a failure leaves nothing:
//! everything that can be checked locally is checked first (data dir, the
//! server stopped — SQLite's exclusive lock, held until the end so none
//! starts meanwhile —, identity readable, every blob present and, when
//! blobs go into etcd, no larger than `--etcd-max-blob-size`; a bucket has
//! no such limit), then that the etcd prefix is empty. The identity is
//! written first, with a create-only compare, so a second migrate racing
//! this one is refused; a failure after it removes what was written. The
//! SQLite data dir is only read.

use std::fmt;
use std::path::{Path, PathBuf};

use lks_proto::{Digest, Manifest};

use std::sync::Arc;

pub mod blobs;

use lks_pki::clusterca;
use lks_pki::seal::{SealError, SealKey};
use lks_pki::{Pki, PkiError, SharedIdentity};

use crate::replicas::{self, IdentityError};
use crate::store::{
    ClusterStore, DeltaRow, DeltaStore, Dump, EtcdConfig, EtcdStore, SealedField, SqliteStore, StoreError,
};
use lks_blobs::{BlobChoice, BlobError, BlobStore, EtcdChunks, LocalBlobs, S3Store};

/// What `migrate` is told.
#[derive(Clone, Debug)]
pub struct MigrateConfig {
    /// The single server's `--data-dir`.
    pub from: PathBuf,
    pub etcd: EtcdConfig,
    /// Seals the private keys stored in etcd.
    pub encryption_key_file: Option<PathBuf>,
    /// `--etcd-max-blob-size`.
    pub max_blob: u64,
    /// Where the blobs go (`--blob-store`): etcd unless a bucket is named.
    pub blob_store: BlobChoice,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "{dir} is not a control server's data dir (it has no {missing}); give the --data-dir of the SQLite server"
    )]
    NotADataDir { dir: PathBuf, missing: &'static str },
    #[error("read the CA and admin credential: {0}")]
    Identity(#[from] PkiError),
    #[error("{0}")]
    Seal(#[from] SealError),
    #[error("{0}")]
    ServerRunning(String),
    #[error("{0}")]
    ClusterCaKey(#[from] lks_pki::clusterca::keys::KeyError),
    #[error("cluster {cluster}: stored CA: {source}")]
    ClusterCa {
        cluster: String,
        #[source]
        source: lks_pki::clusterca::CaError,
    },
    #[error("{0}")]
    Kubeconfig(#[from] lks_kube::secret::SecretError),
    #[error("read {path}: {source}")]
    ReadState { path: PathBuf, source: StoreError },
    #[error(
        "bundle {bundle}: {file} ({digest}) is not in {dir}; the data dir is incomplete, restore its blobs first"
    )]
    MissingBlob {
        bundle: String,
        file: String,
        digest: Digest,
        dir: PathBuf,
    },
    #[error(
        "bundle {bundle}: {file} is {size} bytes, more than the {max} bytes a control server on etcd keeps per file; \
         give --etcd-max-blob-size {size} (and the same to every replica), or keep blobs in an object store \
         (--blob-store s3://BUCKET/PREFIX)"
    )]
    BlobTooLarge {
        bundle: String,
        file: String,
        size: u64,
        max: u64,
    },
    #[error("cannot reach etcd: {0}; check --etcd-endpoints and that etcd is up")]
    Etcd(StoreError),
    #[error(
        "etcd already holds {key}: the prefix {prefix} is in use (by this installation, moved already, \
         or another); migrate only into an empty prefix, e.g. another --etcd-prefix"
    )]
    NotEmpty { key: String, prefix: String },
    #[error("{0}")]
    BlobStore(BlobError),
    #[error(
        "--blob-store local keeps blobs on one server's disk; migrate onto replicas with --blob-store etcd or s3://BUCKET/PREFIX"
    )]
    LocalBlobStore,
    #[error("write to etcd: {cause}; {cleanup}")]
    Write { cause: Box<WriteError>, cleanup: String },
}

/// The write to etcd that failed (the identity, a blob, the store).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("store the identity: {0}")]
    Identity(IdentityError),
    #[error("copy blob {digest} to {to}: {source}")]
    CopyBlob {
        digest: Digest,
        /// The blob store, as it describes itself.
        to: String,
        source: BlobError,
    },
    #[error("import the store: {0}")]
    Import(StoreError),
    #[error("record the delta of {bundle} {path} from version {from_version}: {source}")]
    PutDelta {
        bundle: String,
        path: String,
        from_version: String,
        source: StoreError,
    },
}

/// What was moved.
#[derive(Clone, Debug)]
pub struct Summary {
    pub from: PathBuf,
    pub endpoints: String,
    pub prefix: String,
    pub ca_cert_hash: Digest,
    /// Key id that sealed the private keys, if any.
    pub sealed_with: Option<String>,
    pub counts: crate::store::DumpCounts,
    pub blobs: usize,
    pub blob_bytes: u64,
    /// Delta records moved: made patches (their blobs among `blobs`), and
    /// skipped ones.
    pub patches: usize,
    pub skipped_deltas: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "migrated {} to etcd {} under {}",
            self.from.display(),
            self.endpoints,
            self.prefix
        )?;
        let keys = match &self.sealed_with {
            Some(k) => format!("private keys sealed with {k}"),
            None => "private keys not encrypted; --encryption-key-file encrypts them".into(),
        };
        writeln!(
            f,
            "  identity    CA {} and admin credential ({keys})",
            self.ca_cert_hash
        )?;
        self.counts
            .write_lines(f, &format!("{} blobs, {} bytes", self.blobs, self.blob_bytes))?;
        writeln!(
            f,
            "  deltas      {} patches ({} skipped recorded)",
            self.patches, self.skipped_deltas
        )?;
        writeln!(
            f,
            "{} was left untouched (only read); do not start the SQLite server on it again.",
            self.from.display()
        )?;
        write!(
            f,
            "Next: start replicas with --store etcd on the address the agents dial; nodes keep their certificates and state."
        )
    }
}

/// A blob a bundle serves, checked locally before anything is written.
struct Blob {
    digest: Digest,
    size: u64,
}

/// Moves the installation in `cfg.from` into the empty etcd prefix.
pub async fn migrate(cfg: &MigrateConfig) -> Result<Summary, MigrateError> {
    let dir = &cfg.from;
    for (path, missing) in [(dir.join("state.db"), "state.db"), (dir.join("pki"), "pki/")] {
        if !path.exists() {
            return Err(MigrateError::NotADataDir {
                dir: dir.clone(),
                missing,
            });
        }
    }
    let identity = SharedIdentity::from_dir(&dir.join("pki"))?;
    // Proves the CA key and certificate are usable before they are copied.
    let ca_cert_hash = Pki::from_shared(&identity, &["localhost".to_string()])?.ca_hash();
    let seal = cfg
        .encryption_key_file
        .as_deref()
        .map(SealKey::load)
        .transpose()?;

    let db = dir.join("state.db");
    // Held until the end: no server starts on the data dir meanwhile.
    let sqlite = SqliteStore::open_exclusive(&db).map_err(|e| match e {
        StoreError::Conflict(m) => MigrateError::ServerRunning(m),
        source => MigrateError::ReadState {
            path: db.clone(),
            source,
        },
    })?;
    let mut dump = sqlite.dump().await.map_err(|source| MigrateError::ReadState {
        path: db.clone(),
        source,
    })?;
    let blob_dir = dir.join("blobs");
    let blobs = LocalBlobs::read_only(&blob_dir);
    let s3 = match &cfg.blob_store {
        BlobChoice::S3(c) => {
            let s = S3Store::new(c).map_err(MigrateError::BlobStore)?;
            s.check().await.map_err(MigrateError::BlobStore)?;
            Some(s)
        }
        BlobChoice::Local => return Err(MigrateError::LocalBlobStore),
        BlobChoice::Default | BlobChoice::Etcd => None,
    };
    let limit = size_limit(&cfg.blob_store, cfg.max_blob);
    let mut served = served_blobs(&dump, &blobs, &blob_dir, limit)?;
    let deltas = deltas_to_move(&sqlite, &dump, &blobs, limit, &mut served)
        .await
        .map_err(|source| MigrateError::ReadState {
            path: db.clone(),
            source,
        })?;

    let store = EtcdStore::connect(&cfg.etcd, "migrate")
        .await
        .map_err(MigrateError::Etcd)?;
    let durable: Arc<dyn BlobStore> = match s3 {
        Some(s) => Arc::new(s),
        None => Arc::new(EtcdChunks::new(store.clone(), cfg.max_blob)),
    };
    let not_empty = |key: String| MigrateError::NotEmpty {
        key,
        prefix: store.prefix().to_string(),
    };
    if store
        .identity()
        .get()
        .await
        .map_err(MigrateError::Etcd)?
        .is_some()
    {
        return Err(not_empty(store.identity().key()));
    }
    if let Some(key) = store.first_key().await.map_err(MigrateError::Etcd)? {
        return Err(not_empty(key));
    }
    reseal_cluster_cas(&mut dump, seal.as_ref(), &store)?;
    reseal_kubeconfigs(&mut dump, seal.as_ref(), &store)?;
    match replicas::store_identity(&store, &identity, seal.as_ref()).await {
        Ok(()) => {}
        Err(IdentityError::Exists(key)) => return Err(not_empty(key)),
        Err(e) => {
            return Err(MigrateError::Write {
                cause: Box::new(WriteError::Identity(e)),
                cleanup: "nothing was written".into(),
            });
        }
    }
    if let Err(cause) = write_data(&store, &dump, &blobs, &*durable, &served, &deltas).await {
        let cleanup = match store.remove_import().await {
            Ok(()) => format!("removed what was written under {}", store.prefix()),
            Err(e) => format!(
                "could not remove what was written ({e}); remove it with `etcdctl del --prefix {}` before trying again",
                store.prefix()
            ),
        };
        return Err(MigrateError::Write {
            cause: Box::new(cause),
            cleanup,
        });
    }
    drop(sqlite);
    Ok(Summary {
        from: dir.clone(),
        endpoints: cfg.etcd.endpoints.join(","),
        prefix: store.prefix().to_string(),
        ca_cert_hash,
        sealed_with: seal.as_ref().map(SealKey::key_id),
        counts: crate::store::DumpCounts::of(&dump),
        blobs: served.len(),
        blob_bytes: served.iter().map(|b| b.size).sum(),
        patches: deltas.iter().filter(|d| d.patch.is_some()).count(),
        skipped_deltas: deltas.iter().filter(|d| d.patch.is_none()).count(),
    })
}

/// The delta records of the dumped bundle versions to move: skipped ones
/// as they are, made ones whose patch is here and fits the blob store (the
/// patch joins `served`). The rest stay behind: the new store's maker
/// makes them again.
async fn deltas_to_move(
    sqlite: &SqliteStore,
    dump: &Dump,
    blobs: &LocalBlobs,
    max: Option<u64>,
    served: &mut Vec<Blob>,
) -> Result<Vec<DeltaRow>, StoreError> {
    let mut out = Vec::new();
    for b in &dump.bundles {
        for row in sqlite.deltas_of(&b.row.name, &b.row.version).await? {
            let Some(patch) = row.patch else {
                out.push(row);
                continue;
            };
            let size = match std::fs::metadata(blobs.path(&patch)) {
                Ok(m) if m.is_file() => m.len(),
                _ => continue,
            };
            if size != row.patch_size || max.is_some_and(|max| size > max) {
                continue;
            }
            if !served.iter().any(|x| x.digest == patch) {
                served.push(Blob { digest: patch, size });
            }
            out.push(row);
        }
    }
    Ok(out)
}

/// Checks each cluster CA of the dump loads, and seals its key for its
/// etcd name when an encryption key is given (as the server would).
fn reseal_cluster_cas(
    dump: &mut Dump,
    seal: Option<&SealKey>,
    store: &EtcdStore,
) -> Result<(), MigrateError> {
    for (name, ca) in &mut dump.cluster_cas {
        // A SQLite data dir keeps CA keys as PEM: nothing to open.
        let pem = clusterca::keys::open_key(None, &[], name, &ca.key)?;
        clusterca::ClusterCa::load(&ca.cert_pem, &pem).map_err(|source| MigrateError::ClusterCa {
            cluster: name.clone(),
            source,
        })?;
        let aad = store.sealed_aad(name, SealedField::CaKey);
        ca.key = clusterca::keys::seal_key(seal, &aad, name, &pem)?;
    }
    Ok(())
}

/// Seals each cluster's tenant kubeconfig for its etcd name when an
/// encryption key is given, as the server would.
fn reseal_kubeconfigs(
    dump: &mut Dump,
    seal: Option<&SealKey>,
    store: &EtcdStore,
) -> Result<(), MigrateError> {
    for (name, k) in &mut dump.cluster_kube {
        if let Some(stored) = &k.kubeconfig {
            // A SQLite data dir keeps kubeconfigs as text: nothing to open.
            let text = lks_kube::secret::open_kubeconfig(None, &[], name, stored)?;
            let aad = store.sealed_aad(name, SealedField::Kubeconfig);
            k.kubeconfig = Some(lks_kube::secret::seal_kubeconfig(seal, &aad, name, &text)?);
        }
    }
    Ok(())
}

/// Blobs first: once a bundle is in etcd, its blobs are in the blob store.
async fn write_data(
    store: &EtcdStore,
    dump: &Dump,
    blobs: &LocalBlobs,
    durable: &dyn BlobStore,
    served: &[Blob],
    deltas: &[DeltaRow],
) -> Result<(), WriteError> {
    for b in served {
        let copied = match durable.contains(&b.digest).await {
            Ok(true) => Ok(()),
            Ok(false) => durable.put(&b.digest, b.size, &blobs.path(&b.digest)).await,
            Err(e) => Err(e),
        };
        copied.map_err(|source| WriteError::CopyBlob {
            digest: b.digest,
            to: durable.describe(),
            source,
        })?;
    }
    store.import(dump).await.map_err(WriteError::Import)?;
    // After their bundle versions, which a record needs.
    for d in deltas {
        store.put_delta(d).await.map_err(|source| WriteError::PutDelta {
            bundle: format!("{}@{}", d.name, d.version),
            path: d.path.clone(),
            from_version: d.from_version.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The largest file the chosen blob store keeps: `--etcd-max-blob-size`
/// for etcd's chunks; none for a bucket, where that flag has no say (a file
/// over it is no reason to refuse a migration into S3).
fn size_limit(choice: &BlobChoice, max_blob: u64) -> Option<u64> {
    match choice {
        BlobChoice::S3(_) => None,
        BlobChoice::Default | BlobChoice::Etcd | BlobChoice::Local => Some(max_blob),
    }
}

/// Every distinct blob the dumped bundles serve, each present in `blobs`
/// and no larger than `max` (if the blob store has a limit).
fn served_blobs(
    dump: &Dump,
    blobs: &LocalBlobs,
    dir: &Path,
    max: Option<u64>,
) -> Result<Vec<Blob>, MigrateError> {
    let mut out: Vec<Blob> = Vec::new();
    for b in &dump.bundles {
        let bundle = format!("{}@{}", b.row.name, b.row.version);
        for &digest in &b.blob_digests {
            let file = || file_of(b.row.bundle.manifest(), &digest);
            if out.iter().any(|x| x.digest == digest) {
                continue;
            }
            let size = match std::fs::metadata(blobs.path(&digest)) {
                Ok(m) if m.is_file() => m.len(),
                _ => {
                    return Err(MigrateError::MissingBlob {
                        bundle,
                        file: file(),
                        digest,
                        dir: dir.to_path_buf(),
                    });
                }
            };
            if let Some(max) = max
                && size > max
            {
                return Err(MigrateError::BlobTooLarge {
                    bundle,
                    file: file(),
                    size,
                    max,
                });
            }
            out.push(Blob { digest, size });
        }
    }
    Ok(out)
}

/// The bundle path of the file with `digest`, for messages; the digest if
/// the stored bundle cannot be read.
fn file_of(m: &Manifest, digest: &Digest) -> String {
    m.files
        .iter()
        .find(|f| f.digest == *digest)
        .map_or_else(|| digest.to_string(), |f| f.path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DumpedBundle, conformance};

    fn dump_with_blob(digest: &Digest) -> Dump {
        Dump {
            bundles: vec![DumpedBundle {
                row: conformance::row_of(&conformance::bundle("app", "1", "x")),
                blob_digests: vec![*digest, *digest],
            }],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn served_blobs_are_checked_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let d = Digest::of(b"hello");
        let dump = dump_with_blob(&d);
        let e = served_blobs(&dump, &blobs, dir.path(), Some(100)).err().unwrap();
        assert!(matches!(e, MigrateError::MissingBlob { .. }), "{e}");

        let mut w = blobs.writer(d, 5).await.unwrap();
        w.write(b"hello").await.unwrap();
        w.finish().await.unwrap();
        let ok = served_blobs(&dump, &blobs, dir.path(), Some(100)).unwrap();
        assert_eq!(ok.len(), 1, "a blob two files share is copied once");
        assert_eq!(
            served_blobs(&dump, &blobs, dir.path(), None).unwrap().len(),
            1,
            "no cap on S3"
        );
        let e = served_blobs(&dump, &blobs, dir.path(), Some(4)).err().unwrap();
        assert!(
            e.to_string().starts_with("bundle app@1: sha256:")
                && e.to_string().contains("give --etcd-max-blob-size 5"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_etcd_size_limit_refuses_only_blobs_bound_for_etcd() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let d = Digest::of(b"hello");
        let mut w = blobs.writer(d, 5).await.unwrap();
        w.write(b"hello").await.unwrap();
        w.finish().await.unwrap();
        let dump = dump_with_blob(&d);
        for etcd in [BlobChoice::Default, BlobChoice::Etcd] {
            let e = served_blobs(&dump, &blobs, dir.path(), size_limit(&etcd, 4))
                .err()
                .unwrap();
            assert!(
                matches!(e, MigrateError::BlobTooLarge { size: 5, max: 4, .. }),
                "{e}"
            );
        }
        let s3 = BlobChoice::S3(lks_blobs::S3Config {
            bucket: "lks-blobs".into(),
            prefix: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            virtual_hosted: false,
            access_key_id: "id".into(),
            secret_access_key: "secret".into(),
            session_token: None,
            ca_cert_pem: None,
        });
        let moved = served_blobs(&dump, &blobs, dir.path(), size_limit(&s3, 4)).unwrap();
        assert_eq!(
            moved.iter().map(|b| (b.digest, b.size)).collect::<Vec<_>>(),
            [(d, 5)],
            "a file over --etcd-max-blob-size goes into the bucket"
        );
    }

    #[tokio::test]
    async fn a_dir_without_state_or_pki_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = MigrateConfig {
            from: dir.path().to_path_buf(),
            etcd: EtcdConfig::default(),
            encryption_key_file: None,
            max_blob: 1,
            blob_store: BlobChoice::Default,
        };
        let e = migrate(&cfg).await.err().unwrap();
        assert!(e.to_string().contains("has no state.db"), "{e}");
        std::fs::write(dir.path().join("state.db"), b"").unwrap();
        let e = migrate(&cfg).await.err().unwrap();
        assert!(e.to_string().contains("has no pki/"), "{e}");
    }
}
