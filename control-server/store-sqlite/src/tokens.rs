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
                    TokenRow::id_collision()
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
            c.query_row(
                &format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?1"),
                [id],
                token_row,
            )
            .optional()?
            .map(StoredToken::typed)
            .transpose()
        })
        .await
    }
}

/// The columns [`token_row`] reads, in its order.
pub(crate) const TOKEN_COLUMNS: &str =
    "id, secret_hash, cluster, expires_at_ms, remaining_uses, labels, created_at_ms";

/// A token row as stored: the secret's hash as bytes, the labels as JSON.
pub(crate) struct StoredToken {
    id: String,
    hash: Vec<u8>,
    cluster: String,
    expires_at_ms: i64,
    remaining_uses: Option<u32>,
    labels: String,
    created_at_ms: i64,
}

/// One row of `SELECT TOKEN_COLUMNS FROM tokens`: the one mapper of a
/// token row ([`StoredToken::typed`] makes it a [`TokenRow`]).
pub(crate) fn token_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredToken> {
    Ok(StoredToken {
        id: r.get(0)?,
        hash: r.get(1)?,
        cluster: r.get(2)?,
        expires_at_ms: r.get(3)?,
        remaining_uses: r.get(4)?,
        labels: r.get(5)?,
        created_at_ms: r.get(6)?,
    })
}

impl StoredToken {
    pub(crate) fn typed(self) -> Result<TokenRow> {
        let id = self.id;
        let secret_hash = TokenRow::stored_hash(&id, Some(self.hash))?;
        Ok(TokenRow {
            id,
            secret_hash,
            cluster: self.cluster,
            expires_at_ms: self.expires_at_ms,
            remaining_uses: self.remaining_uses,
            labels: labels_from_json(&self.labels)?,
            created_at_ms: self.created_at_ms,
        })
    }
}
