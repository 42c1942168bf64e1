//! Bootstrap tokens: what enrolment takes a use of.

use async_trait::async_trait;
use lks_proto::labels::Labels;

use super::Result;

/// Why a bootstrap token could not be used, decided inside the enrolment
/// transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("bootstrap token is unknown or was deleted")]
    Unknown,
    #[error("bootstrap token has expired; create a new one with `lksctl token create`")]
    Expired,
    #[error("bootstrap token has no uses left; create a new one with `lksctl token create`")]
    UsedUp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    /// SHA-256 of the secret ([`lks_proto::token::BootstrapToken::secret_hash`]).
    pub secret_hash: [u8; 32],
    pub cluster: String,
    pub expires_at_ms: i64,
    /// `None`: unlimited.
    pub remaining_uses: Option<u32>,
    pub labels: Labels,
    pub created_at_ms: i64,
}

/// Bootstrap tokens (their use is taken by [`NodeStore::enroll_node`]).
///
/// [`NodeStore::enroll_node`]: super::NodeStore::enroll_node
#[async_trait]
pub trait TokenStore: Send + Sync {
    async fn create_token(&self, token: TokenRow) -> Result<()>;
    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>>;
}
