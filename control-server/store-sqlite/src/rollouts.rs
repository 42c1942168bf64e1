//! Rollouts on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Transaction, params};

use lks_store::{
    BundleStatusRow, EventRow, Kind, NewRollout, NodeBundleView, NodeState, Result, RolloutCommit,
    RolloutNodeRow, RolloutRow, RolloutStore, StartChecks, StoreError, Target, TargetChange, check_revision,
    still_active,
};

use std::collections::BTreeMap;

use crate::{
    SqliteStore, active_rollout, insert_event, labels_from_json, labels_to_json, next_generation,
    read_rollout, read_rollouts, state_from_str,
};

#[async_trait]
impl RolloutStore for SqliteStore {
    async fn start_rollout(&self, r: NewRollout) -> Result<RolloutRow> {
        self.tx(move |tx| {
            let cluster_exists = tx
                .query_row("SELECT 1 FROM clusters WHERE name = ?1", [&r.cluster], |_| Ok(()))
                .optional()?
                .is_some();
            let bundle_published = tx
                .query_row(
                    "SELECT 1 FROM bundles WHERE name = ?1 AND version = ?2",
                    params![r.bundle, r.version],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            r.may_start(&StartChecks {
                cluster_exists,
                bundle_published,
                active: active_rollout(tx, &r.cluster, &r.bundle, &r.id)?,
            })?;
            let candidates = {
                let mut stmt = tx.prepare(
                    "SELECT n.name, n.cluster, n.labels, d.version FROM nodes n
                     LEFT JOIN desired d ON d.node = n.name AND d.bundle = ?2
                     WHERE n.cluster = ?1",
                )?;
                stmt.query_map(params![r.cluster, r.bundle], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, Option<String>>(3)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?
            };
            let mut members = Vec::new();
            for (node, cluster, labels, previous) in candidates {
                if r.takes(&cluster, &labels_from_json(&labels)?) {
                    members.push(RolloutNodeRow::waiting(&node, &previous.unwrap_or_default()));
                }
            }
            let previous_target = tx
                .query_row(
                    "SELECT version, selector, rollout_id FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2",
                    params![r.cluster, r.bundle],
                    |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()?
                .map(|(version, selector, rollout_id)| {
                    Ok::<_, StoreError>(Target {
                        version,
                        selector: labels_from_json(&selector)?,
                        rollout_id,
                    })
                })
                .transpose()?;
            let row = r.start(members, previous_target);
            let prev = row.previous_target.as_ref();
            tx.execute(
                "INSERT INTO rollouts (id, cluster, bundle, version, selector, batch_size, failure_threshold, state,
                     created_at_ms, updated_at_ms, message, offline_deadline_ms, revision,
                     prev_target_version, prev_target_selector, prev_target_rollout, policy, pacing)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                params![
                    row.id,
                    row.cluster,
                    row.bundle,
                    row.version,
                    labels_to_json(&row.selector)?,
                    row.batch_size,
                    row.failure_threshold,
                    row.state.as_str(),
                    row.created_at_ms,
                    row.updated_at_ms,
                    row.message,
                    row.offline_deadline_ms as i64,
                    row.revision as i64,
                    prev.map(|t| t.version.as_str()),
                    prev.map(|t| labels_to_json(&t.selector)).transpose()?,
                    prev.map(|t| t.rollout_id.as_str()),
                    serde_json::to_string(&row.policy)?,
                    serde_json::to_string(&row.pacing)?
                ],
            )?;
            for n in &row.nodes {
                tx.execute(
                    "INSERT INTO rollout_nodes (rollout_id, node, previous_version, state, message)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![row.id, n.name, n.previous_version, n.state.as_str(), n.message],
                )?;
            }
            insert_event(tx, &EventRow::rollout_started(&r, row.batch_size, row.nodes.len()))?;
            read_rollout(tx, &r.id)?
                .ok_or_else(|| StoreError::backend(format!("rollout {} vanished in its own transaction", r.id)))
        })
        .await
    }

    async fn get_rollout(&self, id: &str) -> Result<Option<RolloutRow>> {
        let id = id.to_string();
        self.call(move |c| read_rollout(c, &id)).await
    }

    async fn list_rollouts(&self, cluster: Option<&str>, only_active: bool) -> Result<Vec<RolloutRow>> {
        let cluster = cluster.map(str::to_string);
        self.call(move |c| {
            let ids = {
                let mut stmt = c.prepare(
                    "SELECT id FROM rollouts WHERE (?1 IS NULL OR cluster = ?1)
                       AND (?2 = 0 OR state IN ('running', 'paused', 'rolling_back'))
                     ORDER BY created_at_ms, id",
                )?;
                stmt.query_map(params![cluster, only_active], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            read_rollouts(c, ids)
        })
        .await
    }

    async fn rollouts_to_drive(&self) -> Result<Vec<RolloutRow>> {
        self.call(move |c| {
            let ids = {
                let mut stmt = c.prepare(
                    "SELECT id FROM rollouts r WHERE state IN ('running', 'paused', 'rolling_back')
                        OR EXISTS (SELECT 1 FROM rollout_nodes rn WHERE rn.rollout_id = r.id AND rn.state = 'applying')
                        OR (state = 'completed' AND EXISTS (SELECT 1 FROM rollout_nodes rn
                              WHERE rn.rollout_id = r.id AND rn.state IN ('deferred', 'held')))
                     ORDER BY created_at_ms, id",
                )?;
                stmt.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?
            };
            read_rollouts(c, ids)
        })
        .await
    }

    async fn commit_rollout(&self, c: RolloutCommit) -> Result<(RolloutRow, Vec<String>)> {
        self.tx(move |tx| {
            let mut r = c.rollout;
            let Some(stored) = read_rollout(tx, &r.id)? else {
                return Err(StoreError::not_found(Kind::Rollout, r.id.to_string()));
            };
            check_revision(&r.id, stored.revision, r.revision)?;
            if r.state.is_active()
                && !stored.state.is_active()
                && let Some((id, state)) = active_rollout(tx, &r.cluster, &r.bundle, &r.id)?
            {
                return Err(still_active(&r.cluster, &r.bundle, &id, &state));
            }
            let changed = assign_versions(tx, &mut r, &stored, &c.assign)?;
            r.revision = stored.revision + 1;
            write_rollout(tx, &r)?;
            set_target(tx, &r, c.target)?;
            for e in &c.events {
                insert_event(tx, e)?;
            }
            let row = read_rollout(tx, &r.id)?.ok_or_else(|| {
                StoreError::backend(format!("rollout {} vanished in its own transaction", r.id))
            })?;
            Ok((row, changed))
        })
        .await
    }

    async fn rollout_views(&self, rollout_id: &str) -> Result<BTreeMap<String, NodeBundleView>> {
        let id = rollout_id.to_string();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT rn.node, n.last_seen_ms, d.version, a.version, a.state, a.message, a.updated_at_ms,
                        a.generation, r.bundle, n.connected, n.hold_reason IS NOT NULL, n.facts
                 FROM rollout_nodes rn
                 JOIN rollouts r ON r.id = rn.rollout_id
                 JOIN nodes n ON n.name = rn.node
                 LEFT JOIN desired d ON d.node = rn.node AND d.bundle = r.bundle
                 LEFT JOIN actual a ON a.node = rn.node AND a.bundle = r.bundle
                 WHERE rn.rollout_id = ?1",
            )?;
            let rows = stmt
                .query_map([&id], |r| {
                    Ok((
                        (
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<String>>(2)?,
                            r.get::<_, bool>(9)?,
                            r.get::<_, bool>(10)?,
                            r.get::<_, String>(11)?,
                        ),
                        (
                            r.get::<_, Option<String>>(3)?,
                            r.get::<_, Option<String>>(4)?,
                            r.get::<_, Option<String>>(5)?,
                            r.get::<_, Option<i64>>(6)?,
                            r.get::<_, Option<i64>>(7)?,
                            r.get::<_, String>(8)?,
                        ),
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = BTreeMap::new();
            for (
                (node, last_seen_ms, desired, connected, held, facts_json),
                (version, state, message, updated_at_ms, generation, bundle),
            ) in rows
            {
                let actual = match (version, state) {
                    (Some(version), Some(state)) => Some(BundleStatusRow {
                        fetched_from_server: 0,
                        fetched_from_peers: 0,
                        fetched_as_delta: 0,
                        name: bundle,
                        version,
                        state: state_from_str(&state)?,
                        message: message.unwrap_or_default(),
                        updated_at_ms: updated_at_ms.unwrap_or_default(),
                        generation: generation.unwrap_or_default() as u64,
                    }),
                    _ => None,
                };
                out.insert(
                    node,
                    NodeBundleView {
                        desired,
                        actual,
                        last_seen_ms,
                        connected,
                        held,
                        facts_json,
                    },
                );
            }
            Ok(out)
        })
        .await
    }
}

/// Gives each node of `assign` its version (or removes the bundle) and a
/// new generation, recorded in its row of `r`; a node deleted meanwhile is
/// skipped. Returns the nodes whose desired state changed.
fn assign_versions(
    tx: &Transaction<'_>,
    r: &mut RolloutRow,
    stored: &RolloutRow,
    assign: &[(String, Option<String>)],
) -> Result<Vec<String>> {
    let mut changed = Vec::new();
    for (node, version) in assign {
        let Some(n) = r.nodes.iter_mut().find(|n| n.name == *node) else {
            return Err(StoreError::backend(format!(
                "rollout {}: node {node} to assign is not part of it",
                r.id
            )));
        };
        let current: Option<Option<String>> = tx
            .query_row(
                "SELECT (SELECT version FROM desired WHERE node = ?1 AND bundle = ?2) FROM nodes WHERE name = ?1",
                params![node, r.bundle],
                |row| row.get(0),
            )
            .optional()?;
        let Some(current) = current else {
            n.state = NodeState::Skipped;
            n.message = "node was deleted".into();
            continue;
        };
        let was_touched = stored.nodes.iter().any(|s| s.name == *node && s.touched);
        if !n.reverting && !was_touched {
            n.previous_version = current.unwrap_or_default();
        }
        match version {
            Some(v) => tx.execute(
                "INSERT INTO desired (node, bundle, version) VALUES (?1, ?2, ?3)
                 ON CONFLICT (node, bundle) DO UPDATE SET version = excluded.version",
                params![node, r.bundle, v],
            )?,
            None => tx.execute(
                "DELETE FROM desired WHERE node = ?1 AND bundle = ?2",
                params![node, r.bundle],
            )?,
        };
        let g = next_generation(tx)?;
        tx.execute(
            "UPDATE nodes SET generation = ?1 WHERE name = ?2",
            params![g as i64, node],
        )?;
        n.generation = g;
        changed.push(node.clone());
    }
    Ok(changed)
}

/// The rollout's header and node rows as `r` has them.
fn write_rollout(tx: &Transaction<'_>, r: &RolloutRow) -> Result<()> {
    tx.execute(
        "UPDATE rollouts SET state = ?2, message = ?3, updated_at_ms = ?4, revision = ?5, pacing = ?6
         WHERE id = ?1",
        params![
            r.id,
            r.state.as_str(),
            r.message,
            r.updated_at_ms,
            r.revision as i64,
            serde_json::to_string(&r.pacing)?
        ],
    )?;
    let mut stmt = tx.prepare_cached(
        "UPDATE rollout_nodes SET previous_version = ?3, state = ?4, message = ?5, generation = ?6,
             turn_at_ms = ?7, touched = ?8, reverting = ?9, unreached = ?10, canary = ?11,
             kube_step = ?12, kube_since_ms = ?13, drain_started_ms = ?14
         WHERE rollout_id = ?1 AND node = ?2",
    )?;
    for n in &r.nodes {
        stmt.execute(params![
            r.id,
            n.name,
            n.previous_version,
            n.state.as_str(),
            n.message,
            n.generation as i64,
            n.turn_at_ms,
            n.touched,
            n.reverting,
            n.unreached,
            n.canary,
            n.kube.as_str(),
            n.kube_since_ms,
            n.drain_started_ms
        ])?;
    }
    Ok(())
}

/// The cluster's target as the commit says: kept, set to the rollout, or
/// given back to the previous one while this rollout is still what set it.
fn set_target(tx: &Transaction<'_>, r: &RolloutRow, target: TargetChange) -> Result<()> {
    match target {
        TargetChange::Keep => {}
        TargetChange::SetToRollout => {
            tx.execute(
                "INSERT INTO cluster_targets (cluster, bundle, version, selector, rollout_id)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (cluster, bundle) DO UPDATE SET version = excluded.version,
                     selector = excluded.selector, rollout_id = excluded.rollout_id",
                params![r.cluster, r.bundle, r.version, labels_to_json(&r.selector)?, r.id],
            )?;
        }
        TargetChange::RestorePrevious => {
            // Only if this rollout is still what set the target.
            let ours = tx
                .query_row(
                    "SELECT 1 FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2 AND rollout_id = ?3",
                    params![r.cluster, r.bundle, r.id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if ours {
                match &r.previous_target {
                    Some(t) => tx.execute(
                        "UPDATE cluster_targets SET version = ?3, selector = ?4, rollout_id = ?5
                         WHERE cluster = ?1 AND bundle = ?2",
                        params![
                            r.cluster,
                            r.bundle,
                            t.version,
                            labels_to_json(&t.selector)?,
                            t.rollout_id
                        ],
                    )?,
                    None => tx.execute(
                        "DELETE FROM cluster_targets WHERE cluster = ?1 AND bundle = ?2",
                        params![r.cluster, r.bundle],
                    )?,
                };
            }
        }
    }
    Ok(())
}
