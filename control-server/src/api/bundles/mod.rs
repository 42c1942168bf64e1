//! The admin API's bundles: listing, reading and deleting published
//! versions (with the bytes a delete lets the garbage collector reclaim);
//! publishing is in `publish.rs`.

mod publish;

pub(super) use publish::publish;

use std::collections::BTreeMap;

use lks_proto::names::{validate_bundle_name, validate_version};
use lks_proto::pb;
use lks_proto::{Digest, Manifest, SignedBundle};
use prost::Message as _;
use tonic::{Response, Status};

use super::invalid;
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::store::{BundleRow, EventRow, StoreError};

/// `ListBundles`.
pub(super) async fn list(
    s: &Shared,
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
pub(super) async fn get(s: &Shared, req: pb::GetBundleRequest) -> Result<Response<pb::Bundle>, Status> {
    let row = published(s, &req).await?;
    let bundle = pb::SignedBundle::decode(row.signed_bundle.as_slice())
        .map_err(|e| Status::internal(format!("stored bundle: {e}")))?;
    Ok(Response::new(pb::Bundle {
        info: Some(bundle_info(row)),
        bundle: Some(bundle),
    }))
}

/// `DeleteBundle`: answers the bytes its blobs no other version holds.
pub(super) async fn delete(
    s: &Shared,
    r: pb::GetBundleRequest,
    who: String,
) -> Result<Response<pb::DeleteBundleResponse>, Status> {
    let row = published(s, &r).await?;
    let id = format!("{}@{}", r.name, r.version);
    s.store
        .delete_bundle(&r.name, &r.version)
        .await
        .map_err(|e| match e {
            StoreError::NotFound { .. } => Status::not_found(format!("bundle {id} is not published")),
            e => store_status(e),
        })?;
    let (still, _) = s.store.referenced_blobs().await.map_err(store_status)?;
    let reclaimable_bytes = held_blobs(&row.signed_bundle)
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
async fn published(s: &Shared, r: &pb::GetBundleRequest) -> Result<BundleRow, Status> {
    validate_bundle_name(&r.name).map_err(invalid)?;
    validate_version(&r.version).map_err(invalid)?;
    s.store
        .get_bundle(&r.name, &r.version)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("bundle {}@{} is not published", r.name, r.version)))
}

pub(super) fn decode_manifest(bytes: &[u8]) -> Result<Manifest, Status> {
    let pb = pb::SignedBundle::decode(bytes).map_err(|e| Status::internal(format!("stored bundle: {e}")))?;
    SignedBundle::try_from(pb)
        .map(|b| b.manifest)
        .map_err(|e| Status::internal(format!("stored bundle: {e}")))
}

/// The distinct blobs a stored bundle version has the server hold, with
/// their sizes (files without a mirror URL).
fn held_blobs(signed_bundle: &[u8]) -> BTreeMap<Digest, u64> {
    pb::SignedBundle::decode(signed_bundle)
        .ok()
        .and_then(|p| SignedBundle::try_from(p).ok())
        .map(|b| {
            b.manifest
                .files
                .iter()
                .filter(|f| f.url.is_none())
                .map(|f| (f.digest, f.size))
                .collect()
        })
        .unwrap_or_default()
}

/// The architectures a stored bundle version is for (empty: any node).
fn bundle_arches(signed_bundle: &[u8]) -> Vec<String> {
    pb::SignedBundle::decode(signed_bundle)
        .ok()
        .and_then(|p| SignedBundle::try_from(p).ok())
        .map(|b| b.manifest.arches().iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

fn bundle_info(b: BundleRow) -> pb::BundleInfo {
    pb::BundleInfo {
        held_bytes: held_blobs(&b.signed_bundle).values().sum(),
        architectures: bundle_arches(&b.signed_bundle),
        name: b.name,
        version: b.version,
        files: b.files,
        total_size: b.total_size,
        signed: b.signed,
        published_at_ms: b.published_at_ms,
        manifest_digest: b.manifest_digest,
    }
}
