//! Release plans on etcd: one JSON document per plan, `plans/NAME`, each
//! write a transaction comparing the `mod_revision` it was read at (a new
//! plan: that the key is absent), so two replicas never both write a plan
//! from one read.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};

use lks_store::{EventRow, Kind, PlanRow, PlanStore, Result, StoreError, plan_changed, plan_exists};

use crate::{EtcdStore, json};

fn plan_key(name: &str) -> String {
    format!("plans/{name}")
}

impl EtcdStore {
    /// Writes `plan` if its key is at `rev` (0: absent), with `events`;
    /// the new revision, or `None` if the compare failed.
    async fn put_plan(&self, plan: &PlanRow, rev: i64, events: &[EventRow]) -> Result<Option<i64>> {
        let key = self.key(&plan_key(&plan.name));
        let compare = if rev == 0 {
            Compare::create_revision(key.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
        };
        let mut ops = vec![TxnOp::put(key, json(plan)?, None)];
        if let Some(op) = self.event_op(events)? {
            ops.push(op);
        }
        self.txn_at(vec![compare], ops).await
    }
}

#[async_trait]
impl PlanStore for EtcdStore {
    async fn create_plan(&self, plan: PlanRow, event: EventRow) -> Result<PlanRow> {
        match self.put_plan(&plan, 0, std::slice::from_ref(&event)).await? {
            Some(revision) => Ok(PlanRow { revision, ..plan }),
            None => Err(plan_exists(&plan.name)),
        }
    }

    async fn get_plan(&self, name: &str) -> Result<Option<PlanRow>> {
        let doc = self.get::<PlanRow>(&self.key(&plan_key(name))).await?;
        Ok(doc.value.map(|p| PlanRow {
            revision: doc.rev,
            ..p
        }))
    }

    async fn list_plans(&self) -> Result<Vec<PlanRow>> {
        let mut rows: Vec<PlanRow> = self
            .range::<PlanRow>(&self.key("plans/"))
            .await?
            .into_iter()
            .map(|(_, p, revision)| PlanRow { revision, ..p })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rows)
    }

    async fn plan_revisions(&self) -> Result<Vec<(String, i64)>> {
        let mut out = self.key_revisions(&self.key("plans/")).await?;
        out.sort();
        Ok(out)
    }

    async fn update_plan(&self, plan: PlanRow, events: Vec<EventRow>) -> Result<PlanRow> {
        if plan.revision == 0 {
            return Err(StoreError::not_found(Kind::Plan, plan.name.clone()));
        }
        match self.put_plan(&plan, plan.revision, &events).await? {
            Some(revision) => Ok(PlanRow { revision, ..plan }),
            None => Err(match self.get_plan(&plan.name).await? {
                Some(_) => plan_changed(&plan.name),
                None => StoreError::not_found(Kind::Plan, plan.name.clone()),
            }),
        }
    }
}
