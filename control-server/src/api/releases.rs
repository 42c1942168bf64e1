//! The admin API's signed releases and trust roots (issue [trust]):
//! `PublishRelease`, `ListReleases`, `PublishRoot`, `ListRoots`.
//!
//! What the server checks before it stores a record is `ops::release`'s.
//! A stored record is sent to the cluster's connected nodes at once
//! (`crate::releases`).

use std::sync::Arc;

use lks_proto::pb;
use tonic::{Response, Status};

use crate::authz::store_status;
use crate::clock::now_ms;
use crate::hub::Hub;
use crate::ops::release;
use crate::releases::{ReleaseCache, notify_cluster};
use crate::store::{ReleaseRow, RootRow, Store, Stored};

/// The most one `ListReleases` answer holds, in encoded releases (gRPC
/// messages are limited to 4 MiB; a release may be 128 KiB).
const MAX_LIST_BYTES: usize = 3 << 20;

crate::context::shared_view! {
    /// What the release handlers use: the store, and whom to tell of a new
    /// record (the release cache, the cluster's streams).
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        releases: Arc<ReleaseCache>,
    }
}

impl Deps {
    /// A record of `cluster` was stored: its nodes here get it now (other
    /// replicas within `crate::releases::TTL`).
    async fn announce(&self, cluster: &str) {
        self.releases.invalidate(cluster);
        if let Err(e) = notify_cluster(&*self.store, &self.hub, cluster).await {
            // The refresh tells them within the TTL.
            tracing::warn!(cluster = %cluster, error = %e, "tell the cluster's streams of a new release");
        }
    }
}

pub(super) fn release_info(r: &ReleaseRow) -> pb::ReleaseInfo {
    pb::ReleaseInfo {
        release: Some(r.release.wire().clone()),
        published_at_ms: r.published_at_ms,
        digest: r.release.digest().to_string(),
    }
}

fn root_info(r: &RootRow) -> pb::RootInfo {
    pb::RootInfo {
        cluster: r.cluster.clone(),
        root: Some(r.root.wire().clone()),
        published_at_ms: r.published_at_ms,
    }
}

/// `PublishRelease`.
pub(super) async fn publish(
    s: &Deps,
    r: pb::PublishReleaseRequest,
) -> Result<Response<pb::ReleaseInfo>, Status> {
    let (row, outcome) = release::publish(s.store.as_ref(), r.release, now_ms()).await?;
    let cluster = row.release.cluster().to_string();
    tracing::info!(cluster = %cluster, version = row.release.version(), digest = %row.release.digest(), ?outcome, "release published");
    if outcome == Stored::Created {
        s.announce(&cluster).await;
    }
    Ok(Response::new(release_info(&row)))
}

/// `ListReleases`.
pub(super) async fn list(
    s: &Deps,
    r: pb::ListReleasesRequest,
) -> Result<Response<pb::ListReleasesResponse>, Status> {
    release::require_cluster(s.store.as_ref(), &r.cluster).await?;
    let rows = s
        .store
        .list_releases(&r.cluster, r.limit)
        .await
        .map_err(store_status)?;
    // Newest first, as many as fit in one answer.
    let mut size = 0;
    let mut releases = Vec::with_capacity(rows.len());
    for row in &rows {
        size += row.release.encoded().len() + 128;
        if !releases.is_empty() && size > MAX_LIST_BYTES {
            break;
        }
        releases.push(release_info(row));
    }
    Ok(Response::new(pb::ListReleasesResponse { releases }))
}

/// `PublishRoot`.
pub(super) async fn publish_root(
    s: &Deps,
    r: pb::PublishRootRequest,
) -> Result<Response<pb::RootInfo>, Status> {
    let (row, outcome) = release::publish_root(s.store.as_ref(), &r.cluster, r.root, now_ms()).await?;
    tracing::info!(cluster = %r.cluster, version = row.root.version(), ?outcome, "trust root published");
    if outcome == Stored::Created {
        s.announce(&r.cluster).await;
    }
    Ok(Response::new(root_info(&row)))
}

/// `ListRoots`.
pub(super) async fn list_roots(
    s: &Deps,
    r: pb::ListRootsRequest,
) -> Result<Response<pb::ListRootsResponse>, Status> {
    release::require_cluster(s.store.as_ref(), &r.cluster).await?;
    let rows = s.store.list_roots(&r.cluster).await.map_err(store_status)?;
    Ok(Response::new(pb::ListRootsResponse {
        roots: rows.iter().map(root_info).collect(),
    }))
}
