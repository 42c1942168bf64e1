//! Reboot policies (a field of the cluster document) and reboot locks on
//! etcd: one document per cluster, `rebootlocks/<cluster>`, written only
//! if its `mod_revision` is still the one read (absent: never written), in
//! a transaction that also checks the cluster exists.

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, TxnOp};

use lks_store::{EventRow, Kind, LockAt, RebootLock, RebootStore, Result, StoreError};

use crate::docs::ClusterDoc;
use crate::{Doc, EtcdStore, json};

const LOCKS: &str = "rebootlocks/";

#[async_trait]
impl RebootStore for EtcdStore {
    async fn reboot_lock(&self, cluster: &str) -> Result<LockAt> {
        let doc: Doc<RebootLock> = self.get(&self.key(&format!("{LOCKS}{cluster}"))).await?;
        Ok(LockAt {
            lock: doc.value.unwrap_or_default(),
            revision: doc.rev,
        })
    }

    async fn put_reboot_lock(
        &self,
        cluster: &str,
        lock: &RebootLock,
        revision: i64,
        events: Vec<EventRow>,
    ) -> Result<Option<i64>> {
        let key = self.key(&format!("{LOCKS}{cluster}"));
        let ckey = self.key(&format!("clusters/{cluster}"));
        let read = Doc::<RebootLock> {
            value: None,
            rev: revision,
        };
        let mut ops = vec![TxnOp::put(key.clone(), json(lock)?, None)];
        if let Some(op) = self.event_op(&events)? {
            ops.push(op);
        }
        let compares = vec![
            read.compare(&key),
            Compare::create_revision(ckey.clone(), CompareOp::Greater, 0),
        ];
        if let Some(rev) = self.txn_at(compares, ops).await? {
            return Ok(Some(rev));
        }
        let cluster_doc: Doc<ClusterDoc> = self.get(&ckey).await?;
        if cluster_doc.value.is_none() {
            return Err(StoreError::not_found(Kind::Cluster, cluster.to_string()));
        }
        Ok(None)
    }

    async fn reboot_locks(&self) -> Result<Vec<(String, LockAt)>> {
        let docs: Vec<(String, RebootLock, i64)> = self.range(&self.key(LOCKS)).await?;
        Ok(docs
            .into_iter()
            .map(|(cluster, lock, revision)| (cluster, LockAt { lock, revision }))
            .collect())
    }
}
