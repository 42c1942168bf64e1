//! The admin API's bundles: listing, reading and deleting published
//! versions (with the bytes a delete lets the garbage collector reclaim);
//! publishing is in `publish.rs`.

mod publish;

pub(super) use publish::publish;

use lks_proto::pb;
use tonic::{Response, Status};

use crate::authz::store_status;
use crate::clock::now_ms;
use crate::ops::bundle::{self, held_blobs};
use crate::store::BundleRow;

/// What the bundle handlers use is what a publish uses: the store, the
/// blobs it uploads into, the metrics it counts them in.
pub(super) use crate::ops::publish::Deps;

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
    let row = bundle::published(s.store.as_ref(), &req.name, &req.version).await?;
    let bundle = pb::SignedBundle::from(row.bundle.signed());
    let rows = s
        .store
        .deltas_of(&row.name, &row.version)
        .await
        .map_err(store_status)?;
    let no_deltas = rows.iter().filter(|d| d.patch.is_none()).map(no_delta).collect();
    let deltas = rows
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
        no_deltas,
    }))
}

/// A pair recorded without a patch, and why (issue [upgrade-cost]).
fn no_delta(d: &crate::store::DeltaRow) -> pb::NoDelta {
    use crate::store::NoPatch;
    let mut v = pb::NoDelta {
        path: d.path.clone(),
        arch: d.arch.clone(),
        from_version: d.from_version.clone(),
        base_digest: d.base.to_string(),
        size: d.size,
        note: d.note.clone(),
        ..Default::default()
    };
    match d.why {
        Some(NoPatch::Estimate { saving, min }) => {
            v.set_reason(pb::NoDeltaReason::Estimate);
            (v.estimated_saving, v.min_saving) = (saving.into(), min.into());
        }
        Some(NoPatch::Memory { need, cap }) => {
            v.set_reason(pb::NoDeltaReason::Memory);
            (v.memory_needed, v.memory_cap) = (need, cap);
        }
        Some(NoPatch::TooLarge { patch_size }) => {
            v.set_reason(pb::NoDeltaReason::TooLarge);
            v.patch_size = patch_size;
        }
        None => {}
    }
    v
}

/// `DeleteBundle`: answers the bytes its blobs no other version holds.
pub(super) async fn delete(
    s: &Deps,
    r: pb::GetBundleRequest,
    who: String,
) -> Result<Response<pb::DeleteBundleResponse>, Status> {
    let reclaimable_bytes = bundle::delete(s.store.as_ref(), &r.name, &r.version, &who, now_ms()).await?;
    tracing::info!(bundle = %format!("{}@{}", r.name, r.version), by = %who, reclaimable_bytes, "bundle deleted");
    Ok(Response::new(pb::DeleteBundleResponse {
        name: r.name,
        version: r.version,
        reclaimable_bytes,
    }))
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
