//! The admin API's bundles: listing, reading and deleting published
//! versions (with the bytes a delete lets the garbage collector reclaim);
//! publishing is in `publish.rs`.

mod publish;

pub(super) use publish::publish;

use std::collections::BTreeMap;

use lks_proto::names::{validate_bundle_name, validate_version};
use lks_proto::pb;
use lks_proto::{Digest, Manifest};
use tonic::{Response, Status};

use super::invalid;
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::store::Store;
use crate::store::{BundleRow, EventRow, StoreError};

/// What the bundle handlers use: the store, and what a publish uses
/// besides (the blobs it uploads into, the metrics it counts them in).
pub(super) struct Deps {
    pub store: std::sync::Arc<dyn Store>,
    pub publish: crate::ops::publish::Deps,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            publish: crate::ops::publish::Deps {
                store: s.store.clone(),
                blobs: s.blobs.clone(),
                metrics: s.metrics.clone(),
            },
        }
    }
}

/// `ListBundles`.
pub(super) async fn list(
    s: &Deps,
    req: pb::ListBundlesRequest,
) -> Result<Response<pb::ListBundlesResponse>, Status> {
    let name = req.name;
    let rows = s
        .store
        .list_bundles((!name.is_empty()).then_some(name.as_str()))
        .await
        .map_err(store_status)?;
    Ok(Response::new(pb::ListBundlesResponse {
        bundles: rows.into_iter().map(bundle_info).collect(),
    }))
}

/// `GetBundle`: the signed bundle as published.
pub(super) async fn get(s: &Deps, req: pb::GetBundleRequest) -> Result<Response<pb::Bundle>, Status> {
    let row = published(s, &req).await?;
    let bundle = pb::SignedBundle::from(row.bundle.signed());
    let deltas = s
        .store
        .deltas_of(&row.name, &row.version)
        .await
        .map_err(store_status)?
        .into_iter()
        .filter_map(|d| {
            Some(pb::HeldDelta {
                patch_digest: d.patch?.to_string(),
                path: d.path,
                arch: d.arch,
                from_version: d.from_version,
                base_digest: d.base.to_string(),
                patch_size: d.patch_size,
                size: d.size,
                algorithm: d.algorithm,
            })
        })
        .collect();
    Ok(Response::new(pb::Bundle {
        info: Some(bundle_info(row)),
        bundle: Some(bundle),
        deltas,
    }))
}

/// `DeleteBundle`: answers the bytes its blobs no other version holds.
pub(super) async fn delete(
    s: &Deps,
    r: pb::GetBundleRequest,
    who: String,
) -> Result<Response<pb::DeleteBundleResponse>, Status> {
    // A version stored unreadable can still be deleted; what it held is
    // not known then, and none of it is counted.
    let held = match stored(s, &r).await? {
        Ok(Some(row)) => held_blobs(row.bundle.manifest()),
        Ok(None) => return Err(not_published(&r)),
        Err(e @ StoreError::Corrupt { .. }) => {
            tracing::warn!(error = %e, "deleting a bundle version stored unreadable");
            BTreeMap::new()
        }
        Err(e) => return Err(store_status(e)),
    };
    let id = format!("{}@{}", r.name, r.version);
    s.store
        .delete_bundle(&r.name, &r.version)
        .await
        .map_err(|e| match e {
            StoreError::NotFound { .. } => Status::not_found(format!("bundle {id} is not published")),
            e => store_status(e),
        })?;
    let (still, _) = s.store.referenced_blobs().await.map_err(store_status)?;
    let reclaimable_bytes = held
        .iter()
        .filter(|(d, _)| !still.contains(d))
        .map(|(_, size)| size)
        .sum();
    s.store
        .add_event(EventRow::bundle(
            "bundle_deleted",
            &r.name,
            &r.version,
            format!("by {who}; {reclaimable_bytes} bytes to reclaim"),
            now_ms(),
        ))
        .await
        .map_err(store_status)?;
    tracing::info!(bundle = %id, by = %who, reclaimable_bytes, "bundle deleted");
    Ok(Response::new(pb::DeleteBundleResponse {
        name: r.name,
        version: r.version,
        reclaimable_bytes,
    }))
}

/// The published version a request names; `not_found` if there is none.
async fn published(s: &Deps, r: &pb::GetBundleRequest) -> Result<BundleRow, Status> {
    stored(s, r)
        .await?
        .map_err(store_status)?
        .ok_or_else(|| not_published(r))
}

/// What the store answers for the version a request names, once the name
/// and version are valid.
async fn stored(s: &Deps, r: &pb::GetBundleRequest) -> Result<Result<Option<BundleRow>, StoreError>, Status> {
    validate_bundle_name(&r.name).map_err(invalid)?;
    validate_version(&r.version).map_err(invalid)?;
    Ok(s.store.get_bundle(&r.name, &r.version).await)
}

fn not_published(r: &pb::GetBundleRequest) -> Status {
    Status::not_found(format!("bundle {}@{} is not published", r.name, r.version))
}

/// The distinct blobs a bundle version has the server hold, with their
/// sizes (files without a mirror URL).
fn held_blobs(m: &Manifest) -> BTreeMap<Digest, u64> {
    m.files
        .iter()
        .filter(|f| f.url.is_none())
        .map(|f| (f.digest, f.size))
        .collect()
}

fn bundle_info(b: BundleRow) -> pb::BundleInfo {
    let m = b.bundle.manifest();
    pb::BundleInfo {
        held_bytes: held_blobs(m).values().sum(),
        architectures: m.arches().iter().map(ToString::to_string).collect(),
        name: b.name,
        version: b.version,
        files: b.files,
        total_size: b.total_size,
        signed: b.signed,
        published_at_ms: b.published_at_ms,
        manifest_digest: b.manifest_digest.to_string(),
    }
}
