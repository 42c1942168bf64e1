//! Issuing a bootstrap token (`CreateToken`): the cluster's name, the
//! lifetime (24 hours unless asked, at most 365 days) and the labels
//! checked, in that order; the token generated and stored (its secret only
//! as a hash). The caller builds the join command from what comes back.

use std::collections::HashMap;
use std::time::Duration;

use lks_proto::names::{NameError, validate_cluster_name};
use lks_proto::token::BootstrapToken;

use super::labels::{self, LabelsError};
use super::{Kind, OpError};
use crate::store::{TokenRow, TokenStore};

const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A token as asked for.
pub struct NewToken {
    pub cluster: String,
    /// 0: [`DEFAULT_TTL`].
    pub ttl_seconds: u64,
    /// 0: unlimited.
    pub uses: u32,
    pub labels: HashMap<String, String>,
}

/// A stored token: the secret to hand out once, and when it expires.
pub struct Issued {
    pub token: BootstrapToken,
    pub expires_at_ms: i64,
}

/// Why a token was not issued (besides the store's refusal).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Cluster(#[from] NameError),
    #[error("token TTL is longer than the limit of 365 days")]
    TooLong,
    #[error(transparent)]
    Labels(#[from] LabelsError),
}

impl TokenError {
    pub fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// Checks `new` and stores a fresh token for it.
pub async fn issue(
    store: &(impl TokenStore + ?Sized),
    new: NewToken,
    now_ms: i64,
) -> Result<Issued, OpError> {
    validate_cluster_name(&new.cluster).map_err(TokenError::from)?;
    let ttl = match new.ttl_seconds {
        0 => DEFAULT_TTL,
        s => Duration::from_secs(s),
    };
    if ttl > MAX_TTL {
        return Err(TokenError::TooLong.into());
    }
    let labels = labels::check("labels", &new.labels).map_err(TokenError::from)?;
    let token = BootstrapToken::generate();
    let expires_at_ms = now_ms.saturating_add(ttl.as_millis() as i64);
    store
        .create_token(TokenRow {
            id: token.id().to_string(),
            secret_hash: *token.secret_hash().as_bytes(),
            cluster: new.cluster,
            expires_at_ms,
            remaining_uses: (new.uses > 0).then_some(new.uses),
            labels,
            created_at_ms: now_ms,
        })
        .await?;
    Ok(Issued { token, expires_at_ms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{ClusterStore, NewCluster};

    fn new(cluster: &str, ttl_seconds: u64) -> NewToken {
        NewToken {
            cluster: cluster.into(),
            ttl_seconds,
            uses: 2,
            labels: HashMap::from([("zone".to_string(), "a".to_string())]),
        }
    }

    #[tokio::test]
    async fn a_token_is_stored_for_its_lifetime_and_bad_requests_are_refused_in_order() {
        let store = SqliteStore::open_in_memory().unwrap();
        // A cluster that does not exist: the store's refusal, as it was.
        let e = issue(&store, new("c", 0), 1_000).await.err().unwrap();
        assert!(matches!(e, OpError::Store(_)), "{e}");
        store
            .create_cluster(NewCluster {
                name: "c".into(),
                now_ms: 1,
                ca: None,
                api_server: None,
            })
            .await
            .unwrap();
        let t = issue(&store, new("c", 0), 1_000).await.unwrap();
        assert_eq!(t.expires_at_ms, 1_000 + 24 * 3600 * 1000);
        let row = store.get_token(t.token.id()).await.unwrap().unwrap();
        assert_eq!((row.cluster.as_str(), row.remaining_uses), ("c", Some(2)));
        assert_eq!(row.labels.get("zone").map(String::as_str), Some("a"));

        for (bad, why) in [
            (new("Not_A_Name", 0), "cluster name"),
            (
                new("c", 366 * 24 * 3600),
                "token TTL is longer than the limit of 365 days",
            ),
        ] {
            let e = issue(&store, bad, 1_000).await.err().unwrap();
            assert_eq!(e.kind(), Some(Kind::Invalid));
            assert!(e.to_string().contains(why), "{e}");
        }
    }
}
