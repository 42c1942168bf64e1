//! Building the desired state a node's stream sends: the node's bundles
//! (as stored, in their wire form), its cluster's peer-sharing settings,
//! and the signed release and trust roots that admit them — or nothing,
//! when the stream sent that state already. Sending it is the stream's.

use std::sync::Arc;

use lks_proto::pb;
use prost::Message as _;

use crate::hub::Hub;
use crate::peers::{PeerCache, peer_pb};
use crate::releases::{Channel, ReleaseCache};
use crate::store::{DesiredState, Store, StoreError};

/// What building a desired state reads.
pub struct Deps<'a> {
    pub store: &'a dyn Store,
    pub hub: &'a Hub,
    pub peers: &'a PeerCache,
    pub releases: &'a ReleaseCache,
}

/// What a stream sent last, so the same state is not sent twice: again
/// only when the node's generation, its cluster's peer-sharing settings or
/// its cluster's releases and roots changed.
#[derive(Default)]
pub struct Sent {
    generation: Option<u64>,
    /// The peer-sharing settings last sent (`None`: off, or nothing sent).
    peer: Option<pb::PeerSharing>,
    /// The cluster's releases and roots the last desired state was made
    /// from: a read that found them changed is a new entry.
    channel: Option<Arc<Channel>>,
}

impl Sent {
    /// The generation last sent, if any.
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }
}

/// A desired state to send, and what to remember once it is sent.
pub struct Next {
    pub state: pb::DesiredState,
    pub sent: Sent,
}

impl Next {
    /// The version of the release it carries, for the log.
    pub fn release_version(&self) -> Option<u64> {
        self.state
            .release
            .as_ref()
            .and_then(|r| r.release.as_ref())
            .map(|r| r.version)
    }
}

/// Why a desired state could not be built; the stream ends with its text.
#[derive(Debug, thiserror::Error)]
pub enum DesiredError {
    #[error("read desired state: {0}")]
    ReadDesired(StoreError),
    #[error("read peer-sharing settings: {0}")]
    ReadPeerSettings(StoreError),
    #[error("read releases: {0}")]
    ReadReleases(StoreError),
    #[error("decode stored bundle: {0}")]
    Decode(prost::DecodeError),
}

/// The desired state of a node of `cluster` from `read` (its desired
/// state as the store answered it), unless `last` sent it already.
pub async fn next(
    s: &Deps<'_>,
    cluster: &str,
    read: crate::store::Result<DesiredState>,
    last: &Sent,
) -> Result<Option<Next>, DesiredError> {
    let d = read.map_err(DesiredError::ReadDesired)?;
    let peer = s
        .peers
        .get(s.store, s.hub, cluster)
        .await
        .map_err(DesiredError::ReadPeerSettings)?;
    let peer = peer_pb(peer);
    let channel = s
        .releases
        .get(s.store, s.hub, cluster)
        .await
        .map_err(DesiredError::ReadReleases)?;
    let same_channel = last.channel.as_ref().is_some_and(|c| Arc::ptr_eq(c, &channel));
    if last.generation == Some(d.generation) && last.peer == peer && same_channel {
        return Ok(None);
    }
    // Wire messages only, not validated domain bundles: the store
    // validated each when it was published, and this runs per agent.
    let mut bundles = Vec::with_capacity(d.bundles.len());
    for b in &d.bundles {
        bundles.push(pb::SignedBundle::decode(b.as_slice()).map_err(DesiredError::Decode)?);
    }
    let release = if channel.releases.is_empty() {
        None
    } else {
        // The manifest digests come from a per-replica memo: one store
        // read per bundle version, not per agent.
        let mut held = Vec::with_capacity(bundles.len());
        for (b, bytes) in bundles.iter().zip(&d.bundles) {
            let Some(m) = &b.manifest else { continue };
            let digest = s
                .releases
                .manifest_digest(s.store, &m.name, &m.version, bytes.len())
                .await
                .map_err(DesiredError::ReadReleases)?;
            if let Some(digest) = digest {
                held.push((m.name.clone(), m.version.clone(), digest));
            }
        }
        channel.release_for(&held).map(|r| r.wire().clone())
    };
    Ok(Some(Next {
        state: pb::DesiredState {
            peer_sharing: peer,
            generation: d.generation,
            bundles,
            retry: d.retry.into_iter().collect(),
            release,
            roots: channel.roots.clone(),
            reboot: (d.reboot > 0).then_some(pb::RebootRequest { id: d.reboot }),
        },
        sent: Sent {
            generation: Some(d.generation),
            peer,
            channel: Some(channel),
        },
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::time::Duration;

    use super::*;
    use crate::store::sqlite::SqliteStore;

    fn read(generation: u64) -> crate::store::Result<DesiredState> {
        Ok(DesiredState {
            generation,
            bundles: Vec::new(),
            retry: BTreeMap::from([("kubelet".to_string(), 2)]),
            reboot: 0,
        })
    }

    #[tokio::test]
    async fn a_state_is_sent_once_until_its_generation_changes() {
        let store = SqliteStore::open_in_memory().unwrap();
        let hub = Hub::default();
        let peers = PeerCache::new(Duration::from_secs(60));
        let releases = ReleaseCache::new(Duration::from_secs(60));
        let s = Deps {
            store: &store,
            hub: &hub,
            peers: &peers,
            releases: &releases,
        };
        let first = next(&s, "tenant-a", read(3), &Sent::default())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.state.generation, 3);
        assert_eq!(first.state.retry, HashMap::from([("kubelet".to_string(), 2)]));
        assert_eq!(first.state.peer_sharing, None, "no cluster: sharing is off");
        assert_eq!(first.release_version(), None);
        assert_eq!(first.sent.generation(), Some(3));
        // The same generation, settings and releases: nothing to send.
        assert!(
            next(&s, "tenant-a", read(3), &first.sent)
                .await
                .unwrap()
                .is_none()
        );
        let again = next(&s, "tenant-a", read(4), &first.sent).await.unwrap().unwrap();
        assert_eq!(again.state.generation, 4);
        // A failed read ends the stream with what failed.
        let failed = Err(StoreError::Unavailable("etcd down".into()));
        let e = next(&s, "tenant-a", failed, &again.sent).await.err().unwrap();
        assert!(e.to_string().starts_with("read desired state: "), "{e}");
    }
}
