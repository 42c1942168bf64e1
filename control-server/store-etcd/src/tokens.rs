//! Bootstrap tokens on etcd.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};
use lks_proto::labels::Labels;
use serde::{Deserialize, Serialize};

use lks_store::{ClusterStore, Hint, Kind, Result, StoreError, TokenRow, TokenStore};

use crate::{EtcdStore, json};

#[async_trait]
impl TokenStore for EtcdStore {
    async fn create_token(&self, t: TokenRow) -> Result<()> {
        let ckey = self.key(&format!("clusters/{}", t.cluster));
        let tkey = self.key(&format!("tokens/{}", t.id));
        let doc = TokenDoc::from_row(&t);
        let ok = self
            .txn(
                vec![
                    Compare::create_revision(ckey, CompareOp::Greater, 0),
                    Compare::create_revision(tkey.clone(), CompareOp::Equal, 0),
                ],
                vec![TxnOp::put(tkey.clone(), json(&doc)?, None)],
            )
            .await?;
        if ok {
            return Ok(());
        }
        if !self.cluster_exists(&t.cluster).await? {
            return Err(StoreError::not_found_hint(
                Kind::Cluster,
                t.cluster.clone(),
                Hint::CreateCluster,
            ));
        }
        Err(TokenRow::id_collision())
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>> {
        let key = self.key(&format!("tokens/{id}"));
        let Some(t) = self.get::<TokenDoc>(&key).await?.value else {
            return Ok(None);
        };
        let secret_hash = TokenRow::stored_hash(id, hex::decode(&t.secret_hash).ok())?;
        Ok(Some(TokenRow {
            id: id.to_string(),
            secret_hash,
            cluster: t.cluster,
            expires_at_ms: t.expires_at_ms,
            remaining_uses: t.remaining_uses,
            labels: t.labels,
            created_at_ms: t.created_at_ms,
        }))
    }
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct TokenDoc {
    pub(super) secret_hash: String,
    pub(super) cluster: String,
    pub(super) expires_at_ms: i64,
    pub(super) remaining_uses: Option<u32>,
    pub(super) labels: Labels,
    pub(super) created_at_ms: i64,
}

impl TokenDoc {
    pub(super) fn from_row(t: &TokenRow) -> Self {
        TokenDoc {
            secret_hash: hex::encode(t.secret_hash),
            cluster: t.cluster.clone(),
            expires_at_ms: t.expires_at_ms,
            remaining_uses: t.remaining_uses,
            labels: t.labels.clone(),
            created_at_ms: t.created_at_ms,
        }
    }
}
