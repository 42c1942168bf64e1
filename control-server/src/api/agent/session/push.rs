//! Sending a stream its desired state: the node's bundles, its cluster's
//! peer-sharing settings, and the release and trust roots that admit them.

use super::*;

impl Session {
    /// Sends the node's current desired state unless it was already sent:
    /// again when its generation, its cluster's peer-sharing settings or
    /// its cluster's releases and roots changed.
    pub(super) async fn push_desired(&mut self, reg: &crate::hub::Registration) -> Result<(), PushError> {
        let read = self
            .s
            .store
            .desired_state_after(&self.caller.id.node, self.last_generation)
            .await;
        self.push_desired_read(reg, read).await
    }

    /// [`Self::push_desired`] with the desired state read already.
    pub(super) async fn push_desired_read(
        &mut self,
        reg: &crate::hub::Registration,
        read: crate::store::Result<crate::store::DesiredState>,
    ) -> Result<(), PushError> {
        let d = read.map_err(PushError::ReadDesired)?;
        let cluster = &self.caller.id.cluster;
        let peer = self
            .s
            .peer_settings(cluster)
            .await
            .map_err(PushError::ReadPeerSettings)?;
        let peer = crate::peers::peer_pb(peer);
        let channel = self
            .s
            .releases
            .get(&*self.s.store, &self.s.hub, cluster)
            .await
            .map_err(PushError::ReadReleases)?;
        let same_channel = self
            .last_channel
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &channel));
        if self.last_generation == Some(d.generation) && self.last_peer == peer && same_channel {
            return Ok(());
        }
        // Wire messages only, not validated domain bundles: the store
        // validated each when it was published, and this runs per agent.
        let mut bundles = Vec::with_capacity(d.bundles.len());
        for b in &d.bundles {
            bundles.push(pb::SignedBundle::decode(b.as_slice()).map_err(PushError::Decode)?);
        }
        let release = if channel.releases.is_empty() {
            None
        } else {
            // The manifest digests come from a per-replica memo: one store
            // read per bundle version, not per agent.
            let mut held = Vec::with_capacity(bundles.len());
            for (b, bytes) in bundles.iter().zip(&d.bundles) {
                let Some(m) = &b.manifest else { continue };
                let digest = self
                    .s
                    .releases
                    .manifest_digest(&*self.s.store, &m.name, &m.version, bytes.len())
                    .await
                    .map_err(PushError::ReadReleases)?;
                if let Some(digest) = digest {
                    held.push((m.name.clone(), m.version.clone(), digest));
                }
            }
            channel.release_for(&held).map(|r| r.wire().clone())
        };
        let release_version = release
            .as_ref()
            .and_then(|r| r.release.as_ref())
            .map(|r| r.version);
        let msg = ServerMessage {
            msg: Some(ServerMsg::Desired(pb::DesiredState {
                peer_sharing: peer,
                generation: d.generation,
                bundles,
                retry: d.retry.into_iter().collect(),
                release,
                roots: channel.roots.clone(),
            })),
        };
        tokio::select! {
            _ = reg.cancel.cancelled() => return Err(PushError::Cancelled),
            _ = self.s.cancel.cancelled() => return Err(PushError::Shutdown),
            r = self.tx.send(Box::new(Ok(msg))) => r.map_err(|_| PushError::AgentGone)?,
        }
        self.last_generation = Some(d.generation);
        self.last_peer = peer;
        self.last_channel = Some(channel);
        self.s.metrics.desired_state_pushed();
        tracing::debug!(generation = d.generation, release = ?release_version, "desired state sent");
        Ok(())
    }
}

/// Why the desired state could not be sent; the text ends the session.
#[derive(Debug, thiserror::Error)]
pub(super) enum PushError {
    #[error("read desired state: {0}")]
    ReadDesired(StoreError),
    #[error("read peer-sharing settings: {0}")]
    ReadPeerSettings(StoreError),
    #[error("read releases: {0}")]
    ReadReleases(StoreError),
    #[error("decode stored bundle: {0}")]
    Decode(prost::DecodeError),
    #[error("cancelled while sending desired state")]
    Cancelled,
    #[error("shutdown")]
    Shutdown,
    #[error("agent went away")]
    AgentGone,
}
