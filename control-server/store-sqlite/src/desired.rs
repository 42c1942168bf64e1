//! Desired states: what each node should hold, and the blobs it may fetch on SQLite.

use async_trait::async_trait;
use lks_proto::Digest;
use rusqlite::{OptionalExtension, params};

use lks_store::{DesiredState, DesiredStore, Kind, Result, StoreError};

use crate::SqliteStore;

#[async_trait]
impl DesiredStore for SqliteStore {
    async fn desired_state(&self, node: &str) -> Result<DesiredState> {
        let node = node.to_string();
        self.call(move |c| {
            let row: Option<(i64, i64)> = c
                .query_row(
                    "SELECT generation, reboot_request FROM nodes WHERE name = ?1",
                    [&node],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((generation, reboot)) = row else {
                return Err(StoreError::not_found(Kind::Node, node.to_string()));
            };
            let mut stmt = c.prepare_cached(
                "SELECT b.signed_bundle, d.bundle, d.retry FROM desired d
                 JOIN bundles b ON b.name = d.bundle AND b.version = d.version
                 WHERE d.node = ?1 ORDER BY d.bundle",
            )?;
            let rows = stmt
                .query_map([&node], |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = DesiredState {
                generation: generation as u64,
                reboot: reboot.max(0) as u64,
                ..Default::default()
            };
            for (bytes, bundle, retry) in rows {
                out.bundles.push(bytes);
                if retry > 0 {
                    out.retry.insert(bundle, retry as u64);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn blob_grants(&self, node: &str, digest: &Digest) -> Result<Vec<(String, String)>> {
        let (node, digest) = (node.to_string(), digest.to_string());
        self.call(move |c| {
            let mut st = c.prepare_cached(
                // A reported bundle counts only if a rollout of the node's
                // cluster assigned that version to it (as its target or as
                // the version it replaced): a node cannot read another
                // tenant's blobs by claiming to hold their bundle.
                "SELECT bb.name, bb.version FROM bundle_blobs bb WHERE bb.digest = ?2 AND (
                    EXISTS (SELECT 1 FROM desired d WHERE d.node = ?1 AND d.bundle = bb.name AND d.version = bb.version)
                    OR EXISTS (
                        SELECT 1 FROM actual a
                        JOIN nodes n ON n.name = a.node
                        JOIN rollout_nodes rn ON rn.node = a.node
                        JOIN rollouts r ON r.id = rn.rollout_id AND r.cluster = n.cluster AND r.bundle = a.bundle
                        WHERE a.node = ?1 AND a.bundle = bb.name AND a.version = bb.version
                          AND ((rn.touched = 1 AND r.version = a.version) OR rn.previous_version = a.version)))
                 LIMIT 16",
            )?;
            let rows = st
                .query_map(params![node, digest], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<std::result::Result<Vec<(String, String)>, _>>()?;
            Ok(rows)
        })
        .await
    }
}
