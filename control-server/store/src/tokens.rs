//! Bootstrap tokens: what enrolment takes a use of.

use async_trait::async_trait;
use lks_proto::labels::Labels;

use super::{Result, StoreError};

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

impl TokenRow {
    /// The refusal of a new token whose random id is taken.
    pub fn id_collision() -> StoreError {
        StoreError::AlreadyExists("token id collision; try again".into())
    }

    /// The secret's hash as a backend stored it (`None`: not even bytes):
    /// 32 bytes, or the token is unreadable.
    pub fn stored_hash(id: &str, bytes: Option<Vec<u8>>) -> Result<[u8; 32]> {
        bytes
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| StoreError::backend(format!("token {id}: stored hash is not 32 bytes")))
    }
}

/// What enrolment reads of a token, and the rules it applies to it: the
/// same on every backend, which only read the token and write the result
/// in one transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenUse<'a> {
    pub cluster: &'a str,
    pub expires_at_ms: i64,
    /// `None`: unlimited.
    pub remaining_uses: Option<u32>,
}

impl TokenUse<'_> {
    /// Refuses a token that expired by `now_ms` or belongs to another
    /// cluster than the node's. A repeated enrolment passes this too.
    pub fn admits(&self, cluster: &str, now_ms: i64) -> Result<()> {
        if self.expires_at_ms <= now_ms {
            return Err(StoreError::Token(TokenRefusal::Expired));
        }
        if self.cluster != cluster {
            return Err(StoreError::Conflict(format!(
                "token belongs to cluster {}, not {cluster}",
                self.cluster
            )));
        }
        Ok(())
    }

    /// The uses left once a new node took one (`None`: unlimited); refused
    /// when none is left.
    pub fn take(&self) -> Result<Option<u32>> {
        match self.remaining_uses {
            Some(0) => Err(StoreError::Token(TokenRefusal::UsedUp)),
            Some(n) => Ok(Some(n - 1)),
            None => Ok(None),
        }
    }
}

/// Bootstrap tokens (their use is taken by [`NodeStore::enroll_node`]).
///
/// [`NodeStore::enroll_node`]: super::NodeStore::enroll_node
#[async_trait]
pub trait TokenStore: Send + Sync {
    async fn create_token(&self, token: TokenRow) -> Result<()>;
    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_admits_nodes_of_its_cluster_until_it_expires_and_counts_its_uses() {
        let t = TokenUse {
            cluster: "a",
            expires_at_ms: 100,
            remaining_uses: Some(2),
        };
        assert!(t.admits("a", 99).is_ok());
        assert!(matches!(
            t.admits("a", 100),
            Err(StoreError::Token(TokenRefusal::Expired))
        ));
        let Err(StoreError::Conflict(m)) = t.admits("b", 0) else {
            panic!("another cluster's node was admitted");
        };
        assert_eq!(m, "token belongs to cluster a, not b");
        assert_eq!(t.take().unwrap(), Some(1));
        let used = TokenUse {
            remaining_uses: Some(0),
            ..t
        };
        assert!(matches!(
            used.take(),
            Err(StoreError::Token(TokenRefusal::UsedUp))
        ));
        let unlimited = TokenUse {
            remaining_uses: None,
            ..t
        };
        assert_eq!(unlimited.take().unwrap(), None);
    }
}
