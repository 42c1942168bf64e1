//! What a node may have of the server's blobs, and from where: a blob of a
//! bundle version assigned to it, for its architecture
//! ([`Tracker::blob_allowed`]), or a patch that rebuilds one
//! ([`patch_for`]). On that rule: the server's copy a `FetchBlob` reads
//! and the range it asks for ([`open`]), the peers `FindPeers` names
//! ([`peers`]) and the patches `FindDeltas` offers ([`deltas`]). The
//! bytes themselves are streamed by the handler.

use std::collections::BTreeMap;
use std::sync::Arc;

use lks_proto::Digest;
use lks_proto::chunks::Chunks;
use lks_proto::identity::NodeIdentity;
use lks_tracker::{Answer, Tracker};
use tokio::io::AsyncSeekExt;

use super::{Kind, OpError};
use crate::hub::Hub;
use crate::peers::PeerCache;
use crate::store::{DeltaRow, Store, StoreError};
use lks_blobs::Blobs;

/// What the blob operations use.
pub struct Deps<'a> {
    /// Who may have what.
    pub store: &'a dyn Store,
    pub tracker: &'a Tracker,
    pub blobs: &'a Blobs,
    /// The clusters' peer-sharing settings, read through the cache.
    pub peers: &'a PeerCache,
    pub hub: &'a Hub,
}

/// Why a `FetchBlob` is refused or failed (besides the store's and the
/// blob store's failures).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("blob {digest} is not part of any bundle assigned to node {node} (for its architecture)")]
    NotAssigned { digest: Digest, node: String },
    #[error("blob {0} is not in the control server's blob store (its bundle lists a mirror URL)")]
    NotHere(Digest),
    #[error("open blob {digest}: {source}")]
    Open {
        digest: Digest,
        #[source]
        source: std::io::Error,
    },
    #[error("stat blob {digest}: {source}")]
    Stat {
        digest: Digest,
        #[source]
        source: std::io::Error,
    },
    #[error("offset {offset} is past the end of blob {digest} ({size} bytes)")]
    PastEnd { offset: u64, digest: Digest, size: u64 },
    #[error("seek blob {digest}: {source}")]
    Seek {
        digest: Digest,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    pub fn kind(&self) -> Kind {
        match self {
            FetchError::NotAssigned { .. } => Kind::PermissionDenied,
            FetchError::NotHere(_) => Kind::NotFound,
            FetchError::PastEnd { .. } => Kind::OutOfRange,
            FetchError::Open { .. } | FetchError::Stat { .. } | FetchError::Seek { .. } => Kind::Internal,
        }
    }
}

/// The part of a blob a `FetchBlob` asks for.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub offset: u64,
    /// 0: to the end (and what a client from before the field asks for).
    pub length: u64,
}

/// The server's copy of a blob, positioned at the range's start.
#[derive(Debug)]
pub struct Opened {
    pub file: tokio::fs::File,
    /// The whole blob's.
    pub size: u64,
    /// Bytes to send from the file's position: the range, cut at the end.
    pub length: u64,
    /// For a patch: the size of the file it rebuilds less its own (what
    /// serving it spares, for the metrics); `None` for a blob.
    pub spared: Option<u64>,
}

/// The patch record that lets `node` have the patch `digest`: one that
/// rebuilds a blob the node may fetch. `None`: not a patch, or none of the
/// node's.
pub async fn patch_for(
    d: &Deps<'_>,
    node: &NodeIdentity,
    digest: &Digest,
) -> Result<Option<DeltaRow>, StoreError> {
    for row in d.store.deltas_by_patch(digest).await? {
        if d.tracker
            .blob_allowed(d.store, &node.cluster, &node.node, &row.target)
            .await?
        {
            return Ok(Some(row));
        }
    }
    Ok(None)
}

/// `FetchBlob`: the server's copy of `digest` for `node`, positioned for
/// `range`; refused unless the node may have it.
pub async fn open(
    d: &Deps<'_>,
    node: &NodeIdentity,
    digest: Digest,
    range: Range,
) -> Result<Opened, OpError> {
    let allowed = d
        .tracker
        .blob_allowed(d.store, &node.cluster, &node.node, &digest)
        .await?;
    // A patch (binary delta) is served wherever the file it rebuilds is.
    let mut spared = None;
    if !allowed {
        spared = patch_for(d, node, &digest)
            .await?
            .map(|row| row.size.saturating_sub(row.patch_size));
    }
    if !allowed && spared.is_none() {
        return Err(FetchError::NotAssigned {
            digest,
            node: node.node.clone(),
        }
        .into());
    }
    // Published through another replica: fetched once from the blob
    // store, verified, then served from this replica's own copy.
    d.blobs
        .ensure_local(&digest)
        .await
        .map_err(|e| OpError::blob("", e))?;
    let path = d.blobs.local.path(&digest);
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FetchError::NotHere(digest).into()),
        Err(source) => return Err(FetchError::Open { digest, source }.into()),
    };
    let size = file
        .metadata()
        .await
        .map_err(|source| FetchError::Stat { digest, source })?
        .len();
    if range.offset > size {
        return Err(FetchError::PastEnd {
            offset: range.offset,
            digest,
            size,
        }
        .into());
    }
    file.seek(std::io::SeekFrom::Start(range.offset))
        .await
        .map_err(|source| FetchError::Seek { digest, source })?;
    let length = match range.length {
        0 => size - range.offset,
        n => n.min(size - range.offset),
    };
    Ok(Opened {
        file,
        size,
        length,
        spared,
    })
}

/// `FindPeers`: the peers that may serve `digest` to `node`, and whether
/// the server does.
pub async fn peers(d: &Deps<'_>, node: &NodeIdentity, digest: Digest) -> Result<Answer, OpError> {
    let settings = d.peers.get(d.store, d.hub, &node.cluster).await?;
    // Sharing off, or a blob the caller may not have: nobody is named
    // (FetchBlob then answers for the blob as it always did). A patch is
    // shared like the blob it rebuilds.
    let mut allowed = settings.enabled
        && d.tracker
            .blob_allowed(d.store, &node.cluster, &node.node, &digest)
            .await?;
    let patch = settings.enabled && !allowed && patch_for(d, node, &digest).await?.is_some();
    allowed |= patch;
    if !allowed {
        return Ok(Answer {
            peers: Vec::new(),
            server: true,
        });
    }
    let a = d
        .tracker
        .find(d.store, &node.cluster, &node.node, digest, settings.port, patch)
        .await?;
    tracing::debug!(%digest, peers = a.peers.len(), server = a.server, "peers named");
    Ok(a)
}

/// A patch `FindDeltas` offers.
#[derive(Clone, Debug)]
pub struct Offer {
    /// The bytes the patch applies to.
    pub base: Digest,
    pub patch: Digest,
    pub patch_size: u64,
    pub algorithm: String,
    /// The patch's piece list, for a patch of more than one piece whose
    /// list this replica could read.
    pub pieces: Option<Arc<Chunks>>,
}

/// `FindDeltas`: the patches held that rebuild `digest`, if `node` may
/// fetch it: one per base (the smallest), smallest first.
pub async fn deltas(d: &Deps<'_>, node: &NodeIdentity, digest: Digest) -> Result<Vec<Offer>, OpError> {
    let allowed = d
        .tracker
        .blob_allowed(d.store, &node.cluster, &node.node, &digest)
        .await?;
    if !allowed {
        return Ok(Vec::new());
    }
    let mut best: BTreeMap<Digest, DeltaRow> = BTreeMap::new();
    for row in d.store.deltas_to(&digest).await? {
        if best.get(&row.base).is_none_or(|b| row.patch_size < b.patch_size) {
            best.insert(row.base, row);
        }
    }
    let mut offers = Vec::new();
    for r in best.into_values() {
        let Some(patch) = r.patch else { continue };
        // A patch of more than one piece gets its piece list, so peers can
        // pass it on in checked pieces; without one (a blob this replica
        // cannot read now) it is offered as one piece all the same.
        let mut pieces = None;
        if r.patch_size > u64::from(lks_proto::chunks::DEFAULT_CHUNK_SIZE) {
            match d.blobs.pieces_of(&patch).await {
                Ok(c) => pieces = c,
                Err(e) => tracing::warn!(%patch, error = %e, "no piece list for a patch"),
            }
        }
        offers.push(Offer {
            base: r.base,
            patch,
            patch_size: r.patch_size,
            algorithm: r.algorithm,
            pieces,
        });
    }
    offers.sort_by_key(|o| o.patch_size);
    Ok(offers)
}

#[cfg(test)]
mod tests {
    use lks_proto::manifest::Manifest;
    use lks_proto::{FileSpec, SignedBundle};

    use super::*;
    use crate::store::NewBundle;
    use crate::store::sqlite::SqliteStore;
    use lks_blobs::{LocalBlobs, LocalDirStore};

    const CONTENT: &[u8] = b"0123456789";

    /// What the operations use, on a store with cluster `a`, its nodes
    /// `n1` and `n2` enrolled, and `kubelet@1` (one file, [`CONTENT`])
    /// assigned to `n1` only; no blob held.
    struct World {
        store: Arc<dyn Store>,
        tracker: Tracker,
        blobs: Blobs,
        peers: PeerCache,
        hub: Hub,
        _dir: tempfile::TempDir,
    }

    impl World {
        fn deps(&self) -> Deps<'_> {
            Deps {
                store: &*self.store,
                tracker: &self.tracker,
                blobs: &self.blobs,
                peers: &self.peers,
                hub: &self.hub,
            }
        }

        async fn hold(&self, content: &[u8]) {
            let mut w = self
                .blobs
                .local
                .writer(Digest::of(content), content.len() as u64)
                .await
                .unwrap();
            w.write(content).await.unwrap();
            w.finish().await.unwrap();
        }
    }

    async fn world() -> World {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        crate::ops::fixture::cluster_a(&*store).await;
        for (name, serial) in [("n1", "01"), ("n2", "02")] {
            crate::ops::fixture::enrol(&*store, name, serial, "sha256:00").await;
        }
        let file = FileSpec {
            path: lks_proto::BundlePath::new("/etc/a.conf").unwrap(),
            digest: Digest::of(CONTENT),
            size: CONTENT.len() as u64,
            mode: 0o644,
            url: None,
            chunks: None,
            arch: None,
        };
        let signed = SignedBundle {
            manifest: Manifest {
                name: "kubelet".into(),
                version: "1".into(),
                files: vec![file],
                ..Default::default()
            },
            signature: None,
            chunks_signature: None,
        };
        store
            .put_bundle(NewBundle::new(signed, vec![Digest::of(CONTENT)], 1))
            .await
            .unwrap();
        crate::ops::fixture::assign_n1(&*store, "kubelet").await;
        let dir = tempfile::tempdir().unwrap();
        let local = LocalBlobs::open(dir.path()).unwrap();
        let durable = Arc::new(LocalDirStore::new(local.clone()));
        World {
            store,
            tracker: Tracker::new(None),
            blobs: Blobs::new(local, durable),
            peers: PeerCache::default(),
            hub: Hub::default(),
            _dir: dir,
        }
    }

    fn id(node: &str) -> NodeIdentity {
        NodeIdentity::new("a", node).unwrap()
    }

    const WHOLE: Range = Range { offset: 0, length: 0 };

    #[tokio::test]
    async fn a_blob_of_no_bundle_assigned_to_the_node_is_refused_and_named() {
        let w = world().await;
        w.hold(CONTENT).await;
        let digest = Digest::of(CONTENT);
        let e = open(&w.deps(), &id("n2"), digest, WHOLE).await.unwrap_err();
        assert!(matches!(e, OpError::Fetch(FetchError::NotAssigned { .. })), "{e}");
        assert_eq!(e.kind(), Some(Kind::PermissionDenied));
        assert_eq!(
            e.to_string(),
            format!("blob {digest} is not part of any bundle assigned to node n2 (for its architecture)")
        );
        // Nor are peers named for it, or patches offered.
        let a = peers(&w.deps(), &id("n2"), digest).await.unwrap();
        assert_eq!((a.peers.len(), a.server), (0, true));
        assert!(deltas(&w.deps(), &id("n2"), digest).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_assigned_blob_the_server_does_not_hold_is_not_found() {
        let w = world().await;
        let digest = Digest::of(CONTENT);
        let e = open(&w.deps(), &id("n1"), digest, WHOLE).await.unwrap_err();
        assert!(matches!(e, OpError::Fetch(FetchError::NotHere(_))), "{e}");
        assert_eq!(e.kind(), Some(Kind::NotFound));
        assert_eq!(
            e.to_string(),
            format!(
                "blob {digest} is not in the control server's blob store (its bundle lists a mirror URL)"
            )
        );
    }

    #[tokio::test]
    async fn a_range_is_cut_at_the_end_and_may_not_start_past_it() {
        let w = world().await;
        w.hold(CONTENT).await;
        let digest = Digest::of(CONTENT);
        let n1 = id("n1");
        let at = |offset, length| Range { offset, length };
        let e = open(&w.deps(), &n1, digest, at(11, 0)).await.unwrap_err();
        assert_eq!(e.kind(), Some(Kind::OutOfRange));
        assert_eq!(
            e.to_string(),
            format!("offset 11 is past the end of blob {digest} (10 bytes)")
        );
        for (range, length) in [
            (at(0, 0), 10),
            (at(4, 0), 6),
            (at(4, 3), 3),
            (at(4, 99), 6),
            (at(10, 0), 0),
        ] {
            let o = open(&w.deps(), &n1, digest, range).await.unwrap();
            assert_eq!((o.size, o.length, o.spared), (10, length, None), "{range:?}");
            let mut file = o.file;
            let mut rest = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut file, &mut rest)
                .await
                .unwrap();
            assert_eq!(rest, &CONTENT[range.offset as usize..]);
        }
    }
}
