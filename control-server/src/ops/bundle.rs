//! Reading and deleting a published bundle version: the version a request
//! names (its name and version checked first), and its delete, which
//! answers the bytes of its blobs no other version holds (what the garbage
//! collector may reclaim) and records a `bundle_deleted` event.

use std::collections::BTreeMap;

use lks_proto::names::{NameError, validate_bundle_name, validate_version};
use lks_proto::{Digest, Manifest};

use super::{Kind, OpError};
use crate::store::{BlobRecords, BundleRow, BundleStore, EventRow, EventStore, StoreError};

/// Why a bundle version was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("bundle {name}@{version} is not published")]
    NotPublished { name: String, version: String },
}

impl BundleError {
    pub fn kind(&self) -> Kind {
        match self {
            BundleError::Name(_) => Kind::Invalid,
            BundleError::NotPublished { .. } => Kind::NotFound,
        }
    }
}

fn not_published(name: &str, version: &str) -> OpError {
    BundleError::NotPublished {
        name: name.into(),
        version: version.into(),
    }
    .into()
}

/// What the store answers for `name@version`, once both are valid.
async fn stored(
    store: &(impl BundleStore + ?Sized),
    name: &str,
    version: &str,
) -> Result<Result<Option<BundleRow>, StoreError>, OpError> {
    validate_bundle_name(name).map_err(BundleError::from)?;
    validate_version(version).map_err(BundleError::from)?;
    Ok(store.get_bundle(name, version).await)
}

/// The published version `name@version`.
pub async fn published(
    store: &(impl BundleStore + ?Sized),
    name: &str,
    version: &str,
) -> Result<BundleRow, OpError> {
    stored(store, name, version)
        .await??
        .ok_or_else(|| not_published(name, version))
}

/// Deletes `name@version`; answers the bytes its blobs no other version
/// holds. A version stored unreadable can still be deleted; what it held
/// is not known then, and none of it is counted.
pub async fn delete(
    store: &(impl BundleStore + BlobRecords + EventStore + ?Sized),
    name: &str,
    version: &str,
    who: &str,
    now_ms: i64,
) -> Result<u64, OpError> {
    let held = match stored(store, name, version).await? {
        Ok(Some(row)) => held_blobs(row.bundle.manifest()),
        Ok(None) => return Err(not_published(name, version)),
        Err(e @ StoreError::Corrupt { .. }) => {
            tracing::warn!(error = %e, "deleting a bundle version stored unreadable");
            BTreeMap::new()
        }
        Err(e) => return Err(e.into()),
    };
    store.delete_bundle(name, version).await.map_err(|e| match e {
        StoreError::NotFound { .. } => not_published(name, version),
        e => e.into(),
    })?;
    let (still, _) = store.referenced_blobs().await?;
    let reclaimable: u64 = held
        .iter()
        .filter(|(d, _)| !still.contains(d))
        .map(|(_, size)| size)
        .sum();
    store
        .add_event(EventRow::bundle(
            "bundle_deleted",
            name,
            version,
            format!("by {who}; {reclaimable} bytes to reclaim"),
            now_ms,
        ))
        .await?;
    Ok(reclaimable)
}

/// The distinct blobs a bundle version has the server hold, with their
/// sizes (files without a mirror URL).
pub fn held_blobs(m: &Manifest) -> BTreeMap<Digest, u64> {
    m.files
        .iter()
        .filter(|f| f.url.is_none())
        .map(|f| (f.digest, f.size))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn a_version_is_named_validly_and_published_or_refused() {
        let store = SqliteStore::open_in_memory().unwrap();
        let e = published(&store, "Bad_Name", "1").await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::Invalid), "{e}");
        let e = published(&store, "app", "").await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::Invalid), "{e}");
        let e = delete(&store, "app", "1", "admin", 1).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (Some(Kind::NotFound), "bundle app@1 is not published".into())
        );
    }
}
