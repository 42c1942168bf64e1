//! Reports on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use lks_store::{BundleStatusRow, NodeReboot, NodeStatusStore, NodeTrust, Result};

use crate::{SqliteStore, upsert_actual};

#[async_trait]
impl NodeStatusStore for SqliteStore {
    async fn node_hello(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        trust: Option<NodeTrust>,
        reboot: Option<NodeReboot>,
        now_ms: i64,
    ) -> Result<()> {
        let (name, facts) = (name.to_string(), facts_json.to_string());
        let trust = trust.map(|t| serde_json::to_string(&t)).transpose()?;
        let reboot = reboot.map(|r| serde_json::to_string(&r)).transpose()?;
        self.tx(move |tx| {
            tx.execute(
                "UPDATE nodes SET facts = ?2, connected = 1, last_seen_ms = ?3, trust = ?4, reboot = ?5 \
                 WHERE name = ?1",
                params![name, facts, now_ms, trust, reboot],
            )?;
            // The Hello lists everything the node holds; anything else it
            // reported earlier is gone.
            tx.execute("DELETE FROM actual WHERE node = ?1", [&name])?;
            for s in &held {
                upsert_actual(tx, &name, s)?;
            }
            Ok(())
        })
        .await
    }

    async fn node_disconnected(&self, name: &str, now_ms: i64) -> Result<()> {
        let name = name.to_string();
        self.tx(move |tx| {
            tx.execute(
                "UPDATE nodes SET connected = 0, last_seen_ms = MAX(last_seen_ms, ?2) WHERE name = ?1",
                params![name, now_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn record_trust(&self, name: &str, trust: NodeTrust) -> Result<()> {
        let name = name.to_string();
        let json = serde_json::to_string(&trust)?;
        self.tx(move |tx| {
            tx.execute("UPDATE nodes SET trust = ?2 WHERE name = ?1", params![name, json])?;
            Ok(())
        })
        .await
    }

    async fn record_reboot(&self, name: &str, reboot: NodeReboot) -> Result<()> {
        let name = name.to_string();
        let json = serde_json::to_string(&reboot)?;
        self.tx(move |tx| {
            tx.execute(
                "UPDATE nodes SET reboot = ?2 WHERE name = ?1",
                params![name, json],
            )?;
            Ok(())
        })
        .await
    }

    async fn record_status(&self, name: &str, statuses: Vec<BundleStatusRow>) -> Result<()> {
        let name = name.to_string();
        self.tx(move |tx| {
            let exists = tx
                .query_row("SELECT 1 FROM nodes WHERE name = ?1", [&name], |_| Ok(()))
                .optional()?
                .is_some();
            if exists {
                for s in &statuses {
                    upsert_actual(tx, &name, s)?;
                }
                // Left out of the report and no longer desired: removed.
                let mut stmt = tx.prepare_cached(
                    "SELECT a.bundle FROM actual a WHERE a.node = ?1
                       AND NOT EXISTS (SELECT 1 FROM desired d WHERE d.node = a.node AND d.bundle = a.bundle)",
                )?;
                let undesired = stmt
                    .query_map([&name], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                for b in undesired.iter().filter(|b| !statuses.iter().any(|s| s.name == **b)) {
                    tx.execute("DELETE FROM actual WHERE node = ?1 AND bundle = ?2", params![name, b])?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn touch_nodes(&self, seen: Vec<(String, i64)>) -> Result<()> {
        if seen.is_empty() {
            return Ok(());
        }
        self.tx(move |tx| {
            let mut stmt =
                tx.prepare_cached("UPDATE nodes SET last_seen_ms = MAX(last_seen_ms, ?2) WHERE name = ?1")?;
            for (n, t) in &seen {
                stmt.execute(params![n, t])?;
            }
            Ok(())
        })
        .await
    }

    async fn mark_all_disconnected(&self) -> Result<()> {
        self.tx(|tx| {
            tx.execute("UPDATE nodes SET connected = 0 WHERE connected != 0", [])?;
            Ok(())
        })
        .await
    }
}
