//! Published bundle versions on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use lks_store::{BundleRow, BundleStore, NewBundle, PutOutcome, RawBundleRow, Result, StoreError};

use crate::{SqliteStore, bundle_row};

#[async_trait]
impl BundleStore for SqliteStore {
    async fn put_bundle(&self, b: NewBundle) -> Result<PutOutcome> {
        self.tx(move |tx| {
            let existing: Option<String> = tx
                .query_row(
                    "SELECT manifest_digest FROM bundles WHERE name = ?1 AND version = ?2",
                    params![b.name, b.version],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(d) = existing {
                return if d == b.manifest_digest.to_string() {
                    Ok(PutOutcome::Unchanged)
                } else {
                    Err(StoreError::AlreadyExists(format!(
                        "bundle {}@{} already exists with other content ({d}); versions are immutable, publish a new version",
                        b.name, b.version
                    )))
                };
            }
            tx.execute(
                "INSERT INTO bundles (name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    b.name,
                    b.version,
                    b.bundle.encoded(),
                    b.manifest_digest.to_string(),
                    b.signed,
                    b.files,
                    b.total_size as i64,
                    b.now_ms
                ],
            )?;
            let mut stmt = tx.prepare_cached(
                "INSERT INTO bundle_blobs (name, version, digest) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            )?;
            for d in &b.blob_digests {
                stmt.execute(params![b.name, b.version, d.to_string()])?;
            }
            Ok(PutOutcome::Created)
        })
        .await
    }

    async fn get_bundle(&self, name: &str, version: &str) -> Result<Option<BundleRow>> {
        let (name, version) = (name.to_string(), version.to_string());
        self.call(move |c| {
            c.query_row(
                "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
                 FROM bundles WHERE name = ?1 AND version = ?2",
                params![name, version],
                bundle_row,
            )
            .optional()?
            .map(RawBundleRow::typed)
            .transpose()
        })
        .await
    }

    async fn list_bundles(&self, name: Option<&str>) -> Result<Vec<BundleRow>> {
        let name = name.map(str::to_string);
        self.call(move |c| {
            let mut stmt = c.prepare(
                "SELECT name, version, signed_bundle, manifest_digest, signed, files, total_size, published_at_ms
                 FROM bundles WHERE ?1 IS NULL OR name = ?1 ORDER BY name, published_at_ms, version",
            )?;
            stmt.query_map([&name], bundle_row)?
                .map(|r| r?.typed())
                .collect()
        })
        .await
    }
}
