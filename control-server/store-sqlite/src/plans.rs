//! Release plans in the SQLite store: one JSON record per plan (`plans`),
//! with a revision each write compares and increments.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use lks_store::{EventRow, Kind, PlanRow, PlanStore, Result, StoreError, plan_changed, plan_exists};

use crate::{SqliteStore, insert_event};

fn decode(name: &str, doc: &str, revision: i64) -> Result<PlanRow> {
    let mut p: PlanRow = serde_json::from_str(doc).map_err(|e| StoreError::Corrupt {
        kind: Kind::Plan,
        name: name.to_string(),
        why: lks_store::Unreadable::Record(e.to_string()),
    })?;
    p.revision = revision;
    Ok(p)
}

fn read_plan(c: &Connection, name: &str) -> Result<Option<PlanRow>> {
    let row: Option<(String, i64)> = c
        .query_row("SELECT doc, revision FROM plans WHERE name = ?1", [name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    row.map(|(doc, rev)| decode(name, &doc, rev)).transpose()
}

/// Every plan, by name.
pub(crate) fn read_all(c: &Connection) -> Result<Vec<PlanRow>> {
    let mut stmt = c.prepare("SELECT name, doc, revision FROM plans ORDER BY name")?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.iter().map(|(n, d, rev)| decode(n, d, *rev)).collect()
}

#[async_trait]
impl PlanStore for SqliteStore {
    async fn create_plan(&self, plan: PlanRow, event: EventRow) -> Result<PlanRow> {
        let doc = serde_json::to_string(&plan)?;
        self.tx(move |tx| {
            let n = tx.execute(
                "INSERT INTO plans (name, doc, revision) VALUES (?1, ?2, 1) ON CONFLICT DO NOTHING",
                params![plan.name, doc],
            )?;
            if n == 0 {
                return Err(plan_exists(&plan.name));
            }
            insert_event(tx, &event)?;
            Ok(PlanRow { revision: 1, ..plan })
        })
        .await
    }

    async fn get_plan(&self, name: &str) -> Result<Option<PlanRow>> {
        let name = name.to_string();
        self.call(move |c| read_plan(c, &name)).await
    }

    async fn list_plans(&self) -> Result<Vec<PlanRow>> {
        self.call(|c| read_all(c)).await
    }

    async fn plan_revisions(&self) -> Result<Vec<(String, i64)>> {
        self.call(|c| {
            let mut stmt = c.prepare("SELECT name, revision FROM plans ORDER BY name")?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn update_plan(&self, plan: PlanRow, events: Vec<EventRow>) -> Result<PlanRow> {
        let doc = serde_json::to_string(&plan)?;
        self.tx(move |tx| {
            let n = tx.execute(
                "UPDATE plans SET doc = ?2, revision = revision + 1 WHERE name = ?1 AND revision = ?3",
                params![plan.name, doc, plan.revision],
            )?;
            if n == 0 {
                let exists = tx
                    .query_row("SELECT 1 FROM plans WHERE name = ?1", [&plan.name], |_| Ok(()))
                    .optional()?
                    .is_some();
                return Err(if exists {
                    plan_changed(&plan.name)
                } else {
                    StoreError::not_found(Kind::Plan, plan.name.clone())
                });
            }
            for e in &events {
                insert_event(tx, e)?;
            }
            let revision = plan.revision + 1;
            Ok(PlanRow { revision, ..plan })
        })
        .await
    }
}
