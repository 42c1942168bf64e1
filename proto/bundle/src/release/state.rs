//! What a node remembers between releases, and the two ways it moves on:
//! a newer release, or a rotated trust root.

use crate::digest::Digest;

use super::signed::{check_count, check_threshold};
use super::{Release, SignedRelease, SignedRoot, TrustError, TrustRoot};

/// A node's trust in one channel: the root whose keys sign, the highest
/// release accepted, and the latest time it accepted metadata at. The
/// `accept_*` methods change it only when they succeed; the agent then
/// writes it to its journal once, before it acts on what was accepted. A
/// state read back from the journal is trusted as it is (it is the node's
/// own record, not received data).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustState {
    pub root: TrustRoot,
    /// Highest release version accepted; 0 before the first.
    pub release_version: u64,
    /// [`Release::digest`] of the release accepted at `release_version`.
    #[serde(default)]
    pub release_digest: Option<Digest>,
    /// Milliseconds since the Unix epoch; only ever raised.
    pub latest_known_time_ms: i64,
}

impl TrustState {
    /// A node that has accepted no release yet.
    pub fn new(root: TrustRoot) -> Self {
        TrustState {
            root,
            release_version: 0,
            release_digest: None,
            latest_known_time_ms: 0,
        }
    }

    fn clock(&self, now_ms: i64) -> Result<(), TrustError> {
        if now_ms < self.latest_known_time_ms {
            return Err(TrustError::ClockWentBack {
                now: now_ms,
                latest_known: self.latest_known_time_ms,
            });
        }
        Ok(())
    }

    /// Rotates to `new` (module doc, "Rotating the root"). On error the
    /// state is unchanged. The current root may have expired: a rotation
    /// is how a node gets out of that.
    pub fn accept_root(&mut self, new: &SignedRoot, now_ms: i64) -> Result<(), TrustError> {
        self.clock(now_ms)?;
        let root = &new.root;
        check_count(|| root.id(), &new.signatures)?;
        root.validate()?;
        let want = self.root.version.saturating_add(1);
        if root.version != want {
            return Err(TrustError::RootVersion {
                got: root.version,
                have: self.root.version,
                want,
            });
        }
        let encoded = root.encode();
        check_threshold(
            &encoded,
            &new.signatures,
            &self.root,
            || root.id(),
            || format!("the keys of {}", self.root.id()),
        )?;
        check_threshold(
            &encoded,
            &new.signatures,
            root,
            || root.id(),
            || "its own keys".into(),
        )?;
        if root.is_expired(now_ms) {
            return Err(TrustError::RootExpired {
                version: root.version,
                at: root.expires_at_ms,
                now: now_ms,
            });
        }
        self.root = root.clone();
        self.latest_known_time_ms = self.latest_known_time_ms.max(now_ms);
        Ok(())
    }

    /// Accepts `signed` as the node's current release of `channel` (module
    /// doc, "Accepting a release") and returns it. On error the state is
    /// unchanged and the caller keeps the release it has.
    pub fn accept_release(
        &mut self,
        signed: &SignedRelease,
        channel: &str,
        now_ms: i64,
    ) -> Result<Release, TrustError> {
        self.clock(now_ms)?;
        let r = &signed.release;
        check_count(|| r.id(), &signed.signatures)?;
        r.validate()?;
        if r.channel != channel {
            return Err(TrustError::WrongChannel {
                version: r.version,
                got: r.channel.clone(),
                want: channel.into(),
            });
        }
        if self.root.is_expired(now_ms) {
            return Err(TrustError::RootExpired {
                version: self.root.version,
                at: self.root.expires_at_ms,
                now: now_ms,
            });
        }
        let encoded = r.encode();
        check_threshold(
            &encoded,
            &signed.signatures,
            &self.root,
            || r.id(),
            || format!("the keys of {}", self.root.id()),
        )?;
        if r.version < self.release_version {
            return Err(TrustError::Rollback {
                channel: r.channel.clone(),
                got: r.version,
                have: self.release_version,
            });
        }
        let digest = Digest::of(&encoded);
        if r.version == self.release_version && self.release_digest != Some(digest) {
            return Err(TrustError::Equivocation {
                channel: r.channel.clone(),
                version: r.version,
            });
        }
        if r.is_expired(now_ms) {
            return Err(TrustError::Expired {
                channel: r.channel.clone(),
                version: r.version,
                at: r.expires_at_ms,
                now: now_ms,
            });
        }
        self.release_version = r.version;
        self.release_digest = Some(digest);
        self.latest_known_time_ms = self.latest_known_time_ms.max(now_ms);
        Ok(r.clone())
    }
}
