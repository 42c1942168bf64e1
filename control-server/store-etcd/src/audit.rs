//! The audit trail on etcd: one key per record,
//! `audit/<at_ms, 16 digits>-<nonce>`, so time order is key order, the
//! retention sweep is one range delete and a record's id is the etcd
//! revision that created it.

use async_trait::async_trait;
use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget};
use serde::{Deserialize, Serialize};

use lks_store::Result;

use crate::limits::prefix_end;
use crate::{EtcdStore, corrupt, json, kv_of, nonce, unavailable};
use lks_store::{AuditFilter, AuditRow, AuditStore};

/// A record as stored (its id is the revision that stored it).
#[derive(Serialize, Deserialize)]
struct AuditDoc {
    at_ms: i64,
    verb: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    args: String,
    outcome: String,
    caller: String,
    #[serde(default)]
    caller_fingerprint: String,
    #[serde(default)]
    server: String,
    /// Its place among the records an import wrote in one transaction
    /// (which share a revision); 0 for a record appended on its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    seq: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl AuditDoc {
    fn from_row(r: AuditRow, seq: u32) -> Self {
        AuditDoc {
            at_ms: r.at_ms,
            verb: r.verb,
            target: r.target,
            args: r.args,
            outcome: r.outcome,
            caller: r.caller,
            caller_fingerprint: r.caller_fingerprint,
            server: r.server,
            seq,
        }
    }
}

/// Records per import transaction (ids are the revision times 1000 plus
/// the place in the transaction, so under 1000; etcd's default
/// --max-txn-ops is 128).
const IMPORT_BATCH: usize = 100;

impl EtcdStore {
    /// The audit trail of a dump, in its order (migration from SQLite).
    pub(super) async fn import_audit(&self, rows: &[AuditRow]) -> Result<()> {
        for chunk in rows.chunks(IMPORT_BATCH) {
            let mut docs = Vec::with_capacity(chunk.len());
            for (i, r) in chunk.iter().enumerate() {
                let key = format!("audit/{:016}-{}", r.at_ms.max(0), nonce());
                docs.push((key, json(&AuditDoc::from_row(r.clone(), i as u32))?));
            }
            self.create_all(docs).await?;
        }
        Ok(())
    }
}

/// Keys read per request while listing.
const PAGE: i64 = 256;

#[async_trait]
impl AuditStore for EtcdStore {
    async fn append_audit(&self, r: AuditRow) -> Result<()> {
        let key = format!("audit/{:016}-{}", r.at_ms.max(0), nonce());
        let doc = AuditDoc::from_row(r, 0);
        self.txn(Vec::new(), vec![self.put(&key, json(&doc)?)]).await?;
        Ok(())
    }

    async fn list_audit(&self, f: AuditFilter) -> Result<Vec<AuditRow>> {
        let limit = f.effective_limit();
        let prefix = self.key("audit/");
        let first = self.key(&format!("audit/{:016}", f.since_ms.max(0)));
        let mut kv = kv_of(&self.client);
        // Newest first, a page at a time, down to `since`, until enough match.
        let mut out: Vec<AuditRow> = Vec::new();
        let mut end = prefix_end(prefix.as_bytes());
        loop {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(PAGE);
            let resp = kv.get(first.clone(), Some(opts)).await.map_err(unavailable)?;
            for item in resp.kvs() {
                let key = String::from_utf8_lossy(item.key()).into_owned();
                let d: AuditDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
                let row = AuditRow {
                    id: item.create_revision() as u64 * 1000 + u64::from(d.seq),
                    at_ms: d.at_ms,
                    verb: d.verb,
                    target: d.target,
                    args: d.args,
                    outcome: d.outcome,
                    caller: d.caller,
                    caller_fingerprint: d.caller_fingerprint,
                    server: d.server,
                };
                if f.admits(&row) {
                    out.push(row);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            if out.len() >= limit || (resp.kvs().len() as i64) < PAGE {
                break;
            }
            match resp.kvs().last() {
                // The range end is exclusive: the next page ends at the
                // oldest key read.
                Some(last) => end = last.key().to_vec(),
                None => break,
            }
        }
        out.sort_by_key(|r| r.id);
        Ok(out)
    }

    async fn prune_audit(&self, before_ms: i64) -> Result<usize> {
        let from = self.key("audit/");
        let to = self.key(&format!("audit/{:016}", before_ms.max(0)));
        let resp = kv_of(&self.client)
            .delete(from, Some(DeleteOptions::new().with_range(to)))
            .await
            .map_err(unavailable)?;
        Ok(resp.deleted() as usize)
    }
}
