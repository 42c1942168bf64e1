//! Nodes: enrolment, identity, holds, retries and deletion on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use lks_store::clock::now_ms;
use lks_store::{
    EventRow, NewNode, NodeRow, NodeStore, Result, RolloutState, StoreError, TokenRefusal, TokenUse,
    cert_replaced, never_connected, retry_targets,
};

use crate::{SqliteStore, insert_event, labels_from_json, labels_to_json, next_generation, read_node};

#[async_trait]
impl NodeStore for SqliteStore {
    async fn enroll_node(&self, n: NewNode) -> Result<u64> {
        self.tx(move |tx| {
            let tok = tx
                .query_row(
                    "SELECT cluster, expires_at_ms, remaining_uses FROM tokens WHERE id = ?1",
                    [&n.token_id],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<u32>>(2)?)),
                )
                .optional()?;
            let Some((cluster, expires_at_ms, remaining)) = tok else {
                return Err(StoreError::Token(TokenRefusal::Unknown));
            };
            let rules = TokenUse {
                cluster: &cluster,
                expires_at_ms,
                remaining_uses: remaining,
            };
            rules.admits(&n.cluster, n.now_ms)?;
            if let Some((existing, key_hash, facts, last_seen, connected, generation)) = tx
                .query_row(
                    "SELECT cluster, key_hash, facts, last_seen_ms, connected, generation FROM nodes WHERE name = ?1",
                    [&n.name],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, bool>(4)?,
                            r.get::<_, i64>(5)?,
                        ))
                    },
                )
                .optional()?
            {
                n.over_existing(&existing, &key_hash, never_connected(&facts, last_seen, connected))?;
                tx.execute(
                    "UPDATE nodes SET cert_serial = ?2 WHERE name = ?1",
                    params![n.name, n.cert_serial],
                )?;
                insert_event(tx, &EventRow::reenrolled(&n))?;
                return Ok(generation as u64);
            }
            if let Some(left) = rules.take()? {
                tx.execute(
                    "UPDATE tokens SET remaining_uses = ?2 WHERE id = ?1",
                    params![n.token_id, left],
                )?;
            }
            let generation = next_generation(tx)?;
            tx.execute(
                "INSERT INTO nodes (name, cluster, labels, cert_serial, enrolled_at_ms, generation, key_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    n.name,
                    n.cluster,
                    labels_to_json(&n.labels)?,
                    n.cert_serial,
                    n.now_ms,
                    generation as i64,
                    n.key_hash
                ],
            )?;
            let targets = {
                let mut stmt = tx.prepare("SELECT bundle, version, selector FROM cluster_targets WHERE cluster = ?1")?;
                stmt.query_map([&n.cluster], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            let targets = targets
                .into_iter()
                .map(|(bundle, version, selector)| Ok((bundle, version, labels_from_json(&selector)?)))
                .collect::<Result<Vec<_>>>()?;
            let given = n.seed_desired(targets.iter().map(|(b, v, s)| (b.clone(), v.clone(), s)));
            for (bundle, version) in &given {
                tx.execute(
                    "INSERT INTO desired (node, bundle, version) VALUES (?1, ?2, ?3)",
                    params![n.name, bundle, version],
                )?;
            }
            // A running or paused rollout of the cluster takes the joiner in
            // too: it starts on the current target and waits for its turn.
            let rollouts = {
                // Only the rollouts that may take it in are read (a cluster
                // keeps every rollout it ever had).
                let taking = RolloutState::TAKING_JOINERS.map(|s| format!("'{}'", s.as_str())).join(", ");
                let mut stmt = tx.prepare(&format!(
                    "SELECT id, bundle, selector, state FROM rollouts WHERE cluster = ?1 AND state IN ({taking})"
                ))?;
                stmt.query_map([&n.cluster], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            for (id, bundle, selector, state) in rollouts {
                let Some(state) = RolloutState::parse(&state) else {
                    continue;
                };
                if let Some(row) = n.adopted_by(state, &bundle, &labels_from_json(&selector)?, &given) {
                    tx.execute(
                        "INSERT INTO rollout_nodes (rollout_id, node, previous_version, state, message)
                         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                        params![id, row.name, row.previous_version, row.state.as_str(), row.message],
                    )?;
                }
            }
            insert_event(
                tx,
                &EventRow::enrolled(&n),
            )?;
            Ok(generation)
        })
        .await
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeRow>> {
        let name = name.to_string();
        self.call(move |c| read_node(c, &name)).await
    }

    async fn node_identity(&self, name: &str) -> Result<Option<(String, String)>> {
        let name = name.to_string();
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT cluster, cert_serial FROM nodes WHERE name = ?1",
                [name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn list_nodes(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>> {
        let cluster = cluster.map(str::to_string);
        self.call(move |c| {
            let names = {
                let mut stmt =
                    c.prepare("SELECT name FROM nodes WHERE ?1 IS NULL OR cluster = ?1 ORDER BY name")?;
                stmt.query_map([&cluster], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                if let Some(row) = read_node(c, &n)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn count_nodes(&self) -> Result<u64> {
        self.call(|c| Ok(c.query_row("SELECT COUNT(*) FROM nodes", [], |r| r.get::<_, i64>(0))?))
            .await
            .map(|n| u64::try_from(n).unwrap_or(0))
    }

    async fn retry_node(
        &self,
        name: &str,
        bundle: Option<&str>,
        admin: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>> {
        let (name, bundle, admin) = (name.to_string(), bundle.map(str::to_string), admin.to_string());
        self.tx(move |tx| {
            let Some(cluster) = cluster_of(tx, &name)? else {
                return Ok(None);
            };
            let desired = {
                let mut stmt = tx.prepare("SELECT bundle FROM desired WHERE node = ?1 ORDER BY bundle")?;
                stmt.query_map([&name], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            let bundles = retry_targets(&name, desired, bundle.as_deref())?;
            if bundles.is_empty() {
                return Ok(Some(bundles));
            }
            let g = next_generation(tx)?;
            for b in &bundles {
                tx.execute(
                    "UPDATE desired SET retry = ?3 WHERE node = ?1 AND bundle = ?2",
                    params![name, b, g as i64],
                )?;
            }
            tx.execute(
                "UPDATE nodes SET generation = ?1 WHERE name = ?2",
                params![g as i64, name],
            )?;
            insert_event(tx, &EventRow::retry(&cluster, &name, &bundles, &admin, now_ms))?;
            Ok(Some(bundles))
        })
        .await
    }

    async fn request_reboot(&self, name: &str, admin: &str, now_ms: i64) -> Result<Option<u64>> {
        let (name, admin) = (name.to_string(), admin.to_string());
        self.tx(move |tx| {
            let Some(cluster) = cluster_of(tx, &name)? else {
                return Ok(None);
            };
            let g = next_generation(tx)?;
            tx.execute(
                "UPDATE nodes SET generation = ?1, reboot_request = ?1 WHERE name = ?2",
                params![g as i64, name],
            )?;
            insert_event(tx, &EventRow::reboot_requested(&cluster, &name, &admin, now_ms))?;
            Ok(Some(g))
        })
        .await
    }

    async fn clear_reboot_request(&self, name: &str, id: u64) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| {
            let stored: Option<i64> = tx
                .query_row("SELECT reboot_request FROM nodes WHERE name = ?1", [&name], |r| {
                    r.get(0)
                })
                .optional()?;
            if id == 0 || stored != Some(id as i64) {
                return Ok(false);
            }
            let g = next_generation(tx)?;
            tx.execute(
                "UPDATE nodes SET generation = ?1, reboot_request = 0 WHERE name = ?2",
                params![g as i64, name],
            )?;
            Ok(true)
        })
        .await
    }

    async fn set_node_hold(&self, name: &str, hold: Option<String>, mut event: EventRow) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| {
            let Some(cluster) = cluster_of(tx, &name)? else {
                return Ok(false);
            };
            tx.execute(
                "UPDATE nodes SET hold_reason = ?2 WHERE name = ?1",
                params![name, hold],
            )?;
            event.cluster = cluster;
            insert_event(tx, &event)?;
            Ok(true)
        })
        .await
    }

    async fn delete_node(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.tx(move |tx| {
            let Some(cluster) = cluster_of(tx, &name)? else {
                return Ok(false);
            };
            tx.execute("DELETE FROM nodes WHERE name = ?1", [&name])?;
            insert_event(tx, &EventRow::deleted(&cluster, &name, now_ms()))?;
            Ok(true)
        })
        .await
    }

    async fn replace_cert_serial(&self, name: &str, old: &str, new: &str) -> Result<()> {
        let (name, old, new) = (name.to_string(), old.to_string(), new.to_string());
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE nodes SET cert_serial = ?3 WHERE name = ?1 AND cert_serial = ?2",
                params![name, old, new],
            )?;
            if n == 0 {
                return Err(cert_replaced(&name));
            }
            Ok(())
        })
        .await
    }
}

/// The cluster of node `name`, `None` if there is no such node.
fn cluster_of(tx: &rusqlite::Transaction<'_>, name: &str) -> rusqlite::Result<Option<String>> {
    tx.query_row("SELECT cluster FROM nodes WHERE name = ?1", [name], |r| r.get(0))
        .optional()
}
