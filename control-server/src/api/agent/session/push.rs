//! Sending a stream its desired state (built by `ops::desired`: the
//! node's bundles, its cluster's peer-sharing settings, and the release
//! and trust roots that admit them) unless it was sent already.

use super::*;
use crate::ops::desired;

impl Session {
    /// Sends the node's current desired state unless it was already sent:
    /// again when its generation, its cluster's peer-sharing settings or
    /// its cluster's releases and roots changed.
    pub(super) async fn push_desired(&mut self, reg: &crate::hub::Registration) -> Result<(), PushError> {
        let read = self
            .s
            .store
            .desired_state_after(&self.caller.id.node, self.sent.generation())
            .await;
        self.push_desired_read(reg, read).await
    }

    /// [`Self::push_desired`] with the desired state read already.
    pub(super) async fn push_desired_read(
        &mut self,
        reg: &crate::hub::Registration,
        read: crate::store::Result<crate::store::DesiredState>,
    ) -> Result<(), PushError> {
        let s = &self.s;
        let deps = desired::Deps {
            store: &*s.store,
            hub: &s.hub,
            peers: &s.peers,
            releases: &s.releases,
        };
        let Some(next) = desired::next(&deps, &self.caller.id.cluster, read, &self.sent).await? else {
            return Ok(());
        };
        let release_version = next.release_version();
        let generation = next.state.generation;
        let mut state = next.state;
        if !self.reboot_feature {
            state.reboot = None;
        }
        let reboot = state.reboot.as_ref().map_or(0, |r| r.id);
        let msg = ServerMessage {
            msg: Some(ServerMsg::Desired(state)),
        };
        tokio::select! {
            _ = reg.cancel.cancelled() => return Err(PushError::Cancelled),
            _ = self.s.cancel.cancelled() => return Err(PushError::Shutdown),
            r = self.tx.send(Box::new(Ok(msg))) => r.map_err(|_| PushError::AgentGone)?,
        }
        self.sent = next.sent;
        self.pushed_reboot = reboot;
        self.s.metrics.desired_state_pushed();
        tracing::debug!(generation, release = ?release_version, "desired state sent");
        // The agent may have reported the request carried out already (its
        // Hello, back from the reboot).
        self.settle_reboot_request().await;
        Ok(())
    }
}

/// Why the desired state could not be sent; the text ends the session.
#[derive(Debug, thiserror::Error)]
pub(super) enum PushError {
    #[error(transparent)]
    Build(#[from] desired::DesiredError),
    #[error("cancelled while sending desired state")]
    Cancelled,
    #[error("shutdown")]
    Shutdown,
    #[error("agent went away")]
    AgentGone,
}
