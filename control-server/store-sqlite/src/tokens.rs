//! Bootstrap tokens on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use lks_store::{Hint, Kind, Result, StoreError, TokenRow, TokenStore};

use crate::{SqliteStore, labels_from_json, labels_to_json};

#[async_trait]
impl TokenStore for SqliteStore {
    async fn create_token(&self, t: TokenRow) -> Result<()> {
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&t.cluster], |_| Ok(()))
                .optional()?
                .is_some();
            if !exists {
                return Err(StoreError::not_found_hint(Kind::Cluster, t.cluster.clone(), Hint::CreateCluster));
            }
            tx.execute(
                "INSERT INTO tokens (id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    t.id,
                    t.secret_hash.as_slice(),
                    t.cluster,
                    t.expires_at_ms,
                    t.remaining_uses,
                    labels_to_json(&t.labels)?,
                    t.created_at_ms
                ],
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                    StoreError::AlreadyExists("token id collision; try again".into())
                }
                e => e.into(),
            })?;
            Ok(())
        })
        .await
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRow>> {
        let id = id.to_string();
        self.call(move |c| {
            let row = c
                .query_row(
                    "SELECT id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms
                     FROM tokens WHERE id = ?1",
                    [id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, Vec<u8>>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, Option<u32>>(4)?,
                            r.get::<_, String>(5)?,
                            r.get::<_, i64>(6)?,
                        ))
                    },
                )
                .optional()?;
            let Some((id, hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms)) = row else {
                return Ok(None);
            };
            let secret_hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| StoreError::backend(format!("token {id}: stored hash is not 32 bytes")))?;
            Ok(Some(TokenRow {
                id,
                secret_hash,
                cluster,
                expires_at_ms,
                remaining_uses,
                labels: labels_from_json(&labels)?,
                created_at_ms,
            }))
        })
        .await
    }
}
