//! Publishing a cluster's signed releases and trust roots (issue
//! [trust]). The server cannot check a record's signatures (the nodes hold
//! the roots), so it checks what it can, in this order: the record's own
//! rules (`lks_proto::release`), that its cluster exists, that every bundle
//! version a release names is published with that manifest digest; the
//! store then settles the version order atomically. The caller tells the
//! cluster's nodes of a record stored anew.

use lks_proto::names::{NameError, validate_cluster_name};
use lks_proto::pb;
use lks_proto::release::{SignedRelease, SignedRoot, TrustError};

use super::{Kind, OpError};
use crate::store::{
    BundleStore, ClusterStore, Hint, ReleaseRow, ReleaseStore, RootRow, StoreError, Stored, StoredRelease,
    StoredRoot,
};

/// Why a release or a root was refused (besides the store's refusals).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("no release given")]
    NoRelease,
    #[error("no trust root given")]
    NoRoot,
    /// The record breaks its own rules.
    #[error(transparent)]
    Record(#[from] TrustError),
    #[error("{release}: bundle {bundle} is not published; publish it before releasing it")]
    NotPublished { release: String, bundle: String },
    #[error(
        "{release}: bundle {bundle} is published with manifest digest {stored}, the release names {named}"
    )]
    OtherManifest {
        release: String,
        bundle: String,
        stored: String,
        named: String,
    },
    /// The record was stored but is not there when read back.
    #[error("{what} {version} of {cluster} vanished once stored")]
    Vanished {
        what: &'static str,
        version: u64,
        cluster: String,
    },
}

impl ReleaseError {
    pub fn kind(&self) -> Kind {
        match self {
            ReleaseError::Name(_)
            | ReleaseError::NoRelease
            | ReleaseError::NoRoot
            | ReleaseError::Record(_) => Kind::Invalid,
            ReleaseError::NotPublished { .. } | ReleaseError::OtherManifest { .. } => {
                Kind::FailedPrecondition
            }
            ReleaseError::Vanished { .. } => Kind::Internal,
        }
    }
}

/// Refuses a malformed or unknown cluster, with the way to make it.
pub async fn require_cluster(store: &(impl ClusterStore + ?Sized), cluster: &str) -> Result<(), OpError> {
    validate_cluster_name(cluster).map_err(ReleaseError::from)?;
    if !store.cluster_exists(cluster).await? {
        return Err(
            StoreError::not_found_hint(crate::store::Kind::Cluster, cluster, Hint::CreateCluster).into(),
        );
    }
    Ok(())
}

/// Checks and stores a release; answers it as stored and whether it is new.
pub async fn publish(
    store: &(impl ClusterStore + BundleStore + ReleaseStore + ?Sized),
    release: Option<pb::SignedRelease>,
    now_ms: i64,
) -> Result<(ReleaseRow, Stored), OpError> {
    let signed =
        SignedRelease::try_from(release.ok_or(ReleaseError::NoRelease)?).map_err(ReleaseError::from)?;
    let rel = &signed.release;
    let cluster = rel.channel.clone();
    require_cluster(store, &cluster).await?;
    // In name order (the record's), so the first mismatch named is stable.
    for (name, b) in &rel.bundles {
        let bundle = format!("{name}@{}", b.version);
        let Some(stored) = store.get_bundle(name, &b.version).await? else {
            return Err(ReleaseError::NotPublished {
                release: rel.id(),
                bundle,
            }
            .into());
        };
        if stored.manifest_digest != b.manifest_digest {
            return Err(ReleaseError::OtherManifest {
                release: rel.id(),
                bundle,
                stored: stored.manifest_digest.to_string(),
                named: b.manifest_digest.to_string(),
            }
            .into());
        }
    }
    let version = rel.version;
    let outcome = store.put_release(StoredRelease::new(signed), now_ms).await?;
    let row = store
        .list_releases(&cluster, 0)
        .await?
        .into_iter()
        .find(|r| r.release.version() == version)
        .ok_or(ReleaseError::Vanished {
            what: "release",
            version,
            cluster,
        })?;
    Ok((row, outcome))
}

/// Checks and stores a root rotation of `cluster`; answers it as stored
/// and whether it is new.
pub async fn publish_root(
    store: &(impl ClusterStore + ReleaseStore + ?Sized),
    cluster: &str,
    root: Option<pb::SignedRoot>,
    now_ms: i64,
) -> Result<(RootRow, Stored), OpError> {
    require_cluster(store, cluster).await?;
    let signed = SignedRoot::try_from(root.ok_or(ReleaseError::NoRoot)?).map_err(ReleaseError::from)?;
    let version = signed.root.version;
    let outcome = store.put_root(cluster, StoredRoot::new(signed), now_ms).await?;
    let row = store
        .list_roots(cluster)
        .await?
        .into_iter()
        .find(|x| x.root.version() == version)
        .ok_or(ReleaseError::Vanished {
            what: "trust root",
            version,
            cluster: cluster.into(),
        })?;
    Ok((row, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn refusals_come_in_order_and_store_nothing() {
        let store = SqliteStore::open_in_memory().unwrap();
        let e = publish(&store, None, 1).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (Some(Kind::Invalid), "no release given".into())
        );
        // The cluster is checked before the record.
        let e = publish_root(&store, "Bad_Name", None, 1).await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::Invalid), "{e}");
        let e = publish_root(&store, "nowhere", None, 1).await.unwrap_err();
        assert!(matches!(e, OpError::Store(StoreError::NotFound { .. })), "{e}");
        assert!(store.list_roots("nowhere").await.unwrap().is_empty());
    }
}
