//! Start-up before serving: what is checked first, the store and the
//! identity it holds, `admin.conf`, and the blobs (the local copies, where
//! they are kept for good, the agent packages).

use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;

use lks_pki::Pki;
use lks_pki::seal::SealKey;

use super::{Config, ServerError, StoreChoice};
use crate::adminconf::{AdminConf, AdminConfError, AdminConfFile};
use crate::packages::AgentPackages;
use crate::replicas;
use crate::store::{EtcdStore, NodeStatusStore, SqliteStore, Store};
use lks_blobs::{BlobChoice, BlobStore, Blobs, EtcdChunks, LocalBlobs, LocalDirStore, S3Store};

/// What is checked before anything is created: the `--agent-package`
/// files (their candidates returned), the blob bucket, and the data dir
/// (created owner-only: it holds the CA key and admin credentials).
pub(super) async fn preflight(cfg: &Config) -> Result<Vec<crate::packages::Candidate>, ServerError> {
    // Bad --agent-package files are refused before anything is created.
    let package_candidates = crate::packages::inspect_all(&cfg.agent_packages)?;
    // So is a blob store that cannot be used: wrong endpoint, credentials
    // or bucket. One line names it.
    if let BlobChoice::S3(c) = &cfg.blob_store {
        let s = S3Store::new(c).map_err(ServerError::BlobStore)?;
        s.check().await.map_err(ServerError::BlobStore)?;
    }
    let data_dir = &cfg.data_dir;
    // The data dir holds the CA key and admin credentials: owner only.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(|source| ServerError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
    Ok(package_candidates)
}

/// Writes `admin.conf` naming every replica known now (written once at start:
/// a replica started later is not in it until this one restarts); returns their URLs, this server's first.
pub(super) async fn write_first_admin_conf(
    data_dir: &std::path::Path,
    server_url: &str,
    pki: &Pki,
    etcd: Option<&EtcdStore>,
) -> Result<Vec<String>, ServerError> {
    let conf = AdminConf {
        server: server_url.to_string(),
        ca_cert: pki.ca_pem().to_string(),
        client_cert: pki.admin_cert_pem.clone(),
        client_key: pki.admin_key_pem.clone(),
    };
    let conf_path = data_dir.join("admin.conf");
    // Every replica known now; rewritten as replicas come and go.
    let known = match etcd {
        Some(e) => replicas::replica_urls(e, server_url).await?,
        None => vec![server_url.to_string()],
    };
    write_admin_conf(&conf_path, &conf, &known)?;
    Ok(known)
}

/// The names the serving certificate carries: the advertised host,
/// localhost, 127.0.0.1 and every `--tls-san`, each once.
pub(super) fn certificate_names(cfg: &Config, host: &str) -> Vec<String> {
    let mut names = vec![host.to_string()];
    for n in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    for n in &cfg.tls_sans {
        if !names.iter().any(|x| x == n) {
            names.push(n.clone());
        }
    }
    names
}

/// The store and the identity it goes with.
pub(super) struct Opened {
    pub(super) store: Arc<dyn Store>,
    /// Set with `--store etcd`: this replica's handle on the region.
    pub(super) etcd: Option<EtcdStore>,
    pub(super) pki: Pki,
    pub(super) seal: Option<SealKey>,
}

/// Opens the store (SQLite in the data dir, or etcd) and loads or creates
/// the control plane's identity (the data dir's `pki/`, or etcd's).
pub(super) async fn open_store(
    cfg: &Config,
    data_dir: &std::path::Path,
    names: &[String],
) -> Result<Opened, ServerError> {
    Ok(match &cfg.store {
        StoreChoice::Sqlite => {
            if cfg.encryption_key_file.is_some() {
                return Err(ServerError::Usage(
                    "--encryption-key-file applies to keys kept in etcd (--store etcd); \
                     with SQLite the keys stay in the data dir, readable by its owner only"
                        .into(),
                ));
            }
            let pki = Pki::load_or_create(&data_dir.join("pki"), names)?;
            let store = SqliteStore::open(&data_dir.join("state.db"))?;
            store.mark_all_disconnected().await?;
            Opened {
                store: Arc::new(store),
                etcd: None,
                pki,
                seal: None,
            }
        }
        StoreChoice::Etcd(ecfg) => {
            let seal = cfg
                .encryption_key_file
                .as_deref()
                .map(SealKey::load)
                .transpose()?;
            let mut id = [0u8; 8];
            let _ = getrandom::getrandom(&mut id);
            let replica = hex::encode(id);
            let store = EtcdStore::connect(ecfg, &replica).await?;
            let identity = replicas::load_or_create_identity(&store, seal.as_ref()).await?;
            let pki = Pki::from_shared(&identity, names)?;
            tracing::info!(replica = %replica, prefix = store.prefix(), endpoints = %ecfg.endpoints.join(","), "store: etcd");
            Opened {
                store: Arc::new(store.clone()),
                etcd: Some(store),
                pki,
                seal,
            }
        }
    })
}

/// The blobs: the data dir's copies, the store where they are kept for
/// good, and the agent packages served from them.
pub(super) async fn open_blobs(
    cfg: &Config,
    etcd: Option<&EtcdStore>,
    package_candidates: Vec<crate::packages::Candidate>,
) -> Result<(Blobs, AgentPackages), ServerError> {
    let local_blobs = LocalBlobs::open(&cfg.data_dir.join("blobs"))?;
    let durable = durable_blobs(cfg, etcd, &local_blobs)?;
    tracing::info!(blob_store = %durable.describe(), "blob store");
    let agent_packages = AgentPackages::import(package_candidates, &local_blobs).await?;
    Ok((Blobs::new(local_blobs, durable), agent_packages))
}

/// Where blobs are kept for good (`--blob-store`; the default follows the
/// store).
fn durable_blobs(
    cfg: &Config,
    etcd: Option<&EtcdStore>,
    local_blobs: &LocalBlobs,
) -> Result<Arc<dyn BlobStore>, ServerError> {
    Ok(match (&cfg.blob_store, etcd) {
        (BlobChoice::S3(c), _) => Arc::new(S3Store::new(c).map_err(ServerError::BlobStore)?),
        (BlobChoice::Default | BlobChoice::Local, None) => {
            Arc::new(LocalDirStore::new(local_blobs.clone())) as Arc<dyn BlobStore>
        }
        (BlobChoice::Default | BlobChoice::Etcd, Some(e)) => {
            Arc::new(EtcdChunks::new(e.clone(), cfg.etcd_max_blob))
        }
        (BlobChoice::Local, Some(_)) => {
            return Err(ServerError::Usage(
                "--blob-store local keeps blobs on one replica's disk; with --store etcd use \
                 --blob-store etcd or s3://BUCKET/PREFIX"
                    .into(),
            ));
        }
        (BlobChoice::Etcd, None) => {
            return Err(ServerError::Usage("--blob-store etcd needs --store etcd".into()));
        }
    })
}

/// Writes `admin.conf` (server, every replica, credentials) if it differs.
fn write_admin_conf(path: &std::path::Path, conf: &AdminConf, urls: &[String]) -> Result<(), AdminConfError> {
    let file = AdminConfFile {
        conf: conf.clone(),
        servers: if urls.len() > 1 { urls.to_vec() } else { Vec::new() },
    };
    if AdminConfFile::load(path).ok().as_ref() != Some(&file) {
        file.save(path)?;
        tracing::info!(path = %path.display(), replicas = urls.len(), "wrote admin.conf");
    }
    Ok(())
}
