//! The admin API's signed releases and trust roots (issue [trust]):
//! `PublishRelease`, `ListReleases`, `PublishRoot`, `ListRoots`.
//!
//! The server cannot check a record's signatures (it does not know the
//! nodes' roots; they do). It checks what it can: the record's own rules
//! (`lks_proto::release`), that its cluster exists, that every bundle
//! version a release names is published with that manifest digest, and
//! the version order the store settles atomically. A stored record is sent
//! to the cluster's connected nodes at once (`crate::releases`).

use std::sync::Arc;

use lks_proto::names::validate_cluster_name;
use lks_proto::pb;
use lks_proto::release::{SignedRelease, SignedRoot};
use tonic::{Response, Status};

use super::invalid;
use crate::authz::store_status;
use crate::clock::now_ms;
use crate::context::Shared;
use crate::hub::Hub;
use crate::releases::{ReleaseCache, notify_cluster};
use crate::store::{Hint, Kind, ReleaseRow, RootRow, Store, StoreError, Stored, StoredRelease, StoredRoot};

/// The most one `ListReleases` answer holds, in encoded releases (gRPC
/// messages are limited to 4 MiB; a release may be 128 KiB).
const MAX_LIST_BYTES: usize = 3 << 20;

/// What the release handlers use: the store, and whom to tell of a new
/// record (the release cache, the cluster's streams).
pub(super) struct Deps {
    pub store: Arc<dyn Store>,
    pub hub: Arc<Hub>,
    pub releases: Arc<ReleaseCache>,
}

impl Deps {
    pub fn of(s: &Shared) -> Self {
        Deps {
            store: s.store.clone(),
            hub: s.hub.clone(),
            releases: s.releases.clone(),
        }
    }

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

/// Refuses an unknown cluster with the way to make it.
async fn require_cluster(s: &Deps, cluster: &str) -> Result<(), Status> {
    validate_cluster_name(cluster).map_err(invalid)?;
    if !s.store.cluster_exists(cluster).await.map_err(store_status)? {
        return Err(store_status(StoreError::not_found_hint(
            Kind::Cluster,
            cluster,
            Hint::CreateCluster,
        )));
    }
    Ok(())
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
    let signed = r
        .release
        .ok_or_else(|| invalid("no release given"))
        .and_then(|m| SignedRelease::try_from(m).map_err(invalid))?;
    let rel = &signed.release;
    let cluster = rel.channel.clone();
    require_cluster(s, &cluster).await?;
    // In name order (the record's), so the first mismatch named is stable.
    for (name, b) in &rel.bundles {
        let id = format!("{name}@{}", b.version);
        let Some(stored) = s.store.get_bundle(name, &b.version).await.map_err(store_status)? else {
            return Err(Status::failed_precondition(format!(
                "{}: bundle {id} is not published; publish it before releasing it",
                rel.id()
            )));
        };
        if stored.manifest_digest != b.manifest_digest {
            return Err(Status::failed_precondition(format!(
                "{}: bundle {id} is published with manifest digest {}, the release names {}",
                rel.id(),
                stored.manifest_digest,
                b.manifest_digest
            )));
        }
    }
    let version = rel.version;
    let stored = StoredRelease::new(signed);
    let outcome = s
        .store
        .put_release(stored.clone(), now_ms())
        .await
        .map_err(store_status)?;
    tracing::info!(cluster = %cluster, version, digest = %stored.digest(), ?outcome, "release published");
    if outcome == Stored::Created {
        s.announce(&cluster).await;
    }
    let rows = s.store.list_releases(&cluster, 0).await.map_err(store_status)?;
    let row = rows
        .iter()
        .find(|r| r.release.version() == version)
        .ok_or_else(|| Status::internal(format!("release {version} of {cluster} vanished once stored")))?;
    Ok(Response::new(release_info(row)))
}

/// `ListReleases`.
pub(super) async fn list(
    s: &Deps,
    r: pb::ListReleasesRequest,
) -> Result<Response<pb::ListReleasesResponse>, Status> {
    require_cluster(s, &r.cluster).await?;
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
    require_cluster(s, &r.cluster).await?;
    let signed = r
        .root
        .ok_or_else(|| invalid("no trust root given"))
        .and_then(|m| SignedRoot::try_from(m).map_err(invalid))?;
    let version = signed.root.version;
    let outcome = s
        .store
        .put_root(&r.cluster, StoredRoot::new(signed), now_ms())
        .await
        .map_err(store_status)?;
    tracing::info!(cluster = %r.cluster, version, ?outcome, "trust root published");
    if outcome == Stored::Created {
        s.announce(&r.cluster).await;
    }
    let rows = s.store.list_roots(&r.cluster).await.map_err(store_status)?;
    let row = rows.iter().find(|x| x.root.version() == version).ok_or_else(|| {
        Status::internal(format!(
            "trust root {version} of {} vanished once stored",
            r.cluster
        ))
    })?;
    Ok(Response::new(root_info(row)))
}

/// `ListRoots`.
pub(super) async fn list_roots(
    s: &Deps,
    r: pb::ListRootsRequest,
) -> Result<Response<pb::ListRootsResponse>, Status> {
    require_cluster(s, &r.cluster).await?;
    let rows = s.store.list_roots(&r.cluster).await.map_err(store_status)?;
    Ok(Response::new(pb::ListRootsResponse {
        roots: rows.iter().map(root_info).collect(),
    }))
}
