//! The event log on etcd.
//!
//! Event documents are stored under `timeline/`, outside the key range
//! every replica watches (`desired/` to `seen/`, `cache.rs`): nothing a
//! replica does follows them, and during a rollout to 30,000 nodes they
//! were 30 of the 169 MiB the three replicas' watches carried
//! (BENCHMARKS.md, "A region on replicas"). Documents written under
//! `events/` before 2026-11-26 (or by a replica not yet upgraded) are read
//! and pruned alongside.

use async_trait::async_trait;
use etcd_client::{GetOptions, SortOrder, SortTarget, TxnOp};
use serde::{Deserialize, Serialize};

use lks_store::{EventFilter, EventRow, EventStore, Result};

use crate::{DEFAULT_EVENT_LIMIT, EtcdStore, MAX_EVENT_DOCS, corrupt, json, nonce, unavailable};

/// Where event documents are written.
pub(super) const EVENTS: &str = "timeline/";
/// Where they were written before, still read and pruned.
const LEGACY_EVENTS: &str = "events/";

#[async_trait]
impl EventStore for EtcdStore {
    async fn add_event(&self, e: EventRow) -> Result<()> {
        if let Some(op) = self.event_op(&[e])? {
            self.txn(Vec::new(), vec![op]).await?;
        }
        Ok(())
    }

    async fn list_events(&self, f: EventFilter) -> Result<Vec<EventRow>> {
        let limit = if f.limit == 0 {
            DEFAULT_EVENT_LIMIT
        } else {
            f.limit
        } as usize;
        let mut out: Vec<EventRow> = Vec::new();
        for prefix in [EVENTS, LEGACY_EVENTS] {
            out.extend(self.newest_events(prefix, &f, limit).await?);
        }
        // Ids come from the storing revision, whichever the prefix.
        out.sort_by_key(|e| std::cmp::Reverse(e.id));
        out.truncate(limit);
        out.sort_by_key(|e| e.id);
        Ok(out)
    }
}

/// An event as stored (its id comes from the etcd revision that stored it).
#[derive(Serialize, Deserialize)]
pub(super) struct EventDoc {
    at_ms: i64,
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    rollout_id: String,
    kind: String,
    #[serde(default)]
    bundle: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    message: String,
}

impl EventDoc {
    pub(super) fn from_row(e: &EventRow) -> Self {
        EventDoc {
            at_ms: e.at_ms,
            cluster: e.cluster.clone(),
            node: e.node.clone(),
            rollout_id: e.rollout_id.clone(),
            kind: e.kind.clone(),
            bundle: e.bundle.clone(),
            version: e.version.clone(),
            message: e.message.clone(),
        }
    }

    fn into_row(self, id: u64) -> EventRow {
        EventRow {
            id,
            at_ms: self.at_ms,
            cluster: self.cluster,
            node: self.node,
            rollout_id: self.rollout_id,
            kind: self.kind,
            bundle: self.bundle,
            version: self.version,
            message: self.message,
        }
    }
}

impl EtcdStore {
    /// Up to `limit` events matching `f` under `prefix`, newest first.
    async fn newest_events(&self, prefix: &str, f: &EventFilter, limit: usize) -> Result<Vec<EventRow>> {
        let prefix = self.key(prefix);
        let mut kv = crate::kv_of(&self.client);
        // Newest documents first, a page at a time, until enough match.
        let mut out: Vec<EventRow> = Vec::new();
        let mut end: Option<Vec<u8>> = None;
        loop {
            let mut opts = GetOptions::new()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_limit(256);
            opts = match &end {
                Some(e) => opts.with_range(e.clone()),
                None => opts.with_prefix(),
            };
            let resp = kv.get(prefix.clone(), Some(opts)).await.map_err(unavailable)?;
            if resp.kvs().is_empty() {
                break;
            }
            for item in resp.kvs() {
                let key = String::from_utf8_lossy(item.key()).into_owned();
                let batch: Vec<EventRow> = serde_json::from_slice::<Vec<EventDoc>>(item.value())
                    .map_err(|e| corrupt(&key, e))?
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| e.into_row(item.create_revision() as u64 * 1000 + i as u64))
                    .collect();
                for e in batch.into_iter().rev() {
                    let keep = f.cluster.as_ref().is_none_or(|c| e.cluster == *c)
                        && f.node.as_ref().is_none_or(|n| e.node == *n)
                        && f.rollout_id.as_ref().is_none_or(|r| e.rollout_id == *r);
                    if keep {
                        out.push(e);
                    }
                }
                if out.len() >= limit {
                    break;
                }
            }
            if out.len() >= limit || resp.kvs().len() < 256 {
                break;
            }
            end = resp.kvs().last().map(|kv| kv.key().to_vec());
        }
        Ok(out)
    }

    pub(super) fn event_op(&self, events: &[EventRow]) -> Result<Option<TxnOp>> {
        if events.is_empty() {
            return Ok(None);
        }
        let at = events.iter().map(|e| e.at_ms).max().unwrap_or_default().max(0);
        let docs: Vec<EventDoc> = events.iter().map(EventDoc::from_row).collect();
        Ok(Some(
            self.put(&format!("{EVENTS}{at:016}-{}", nonce()), json(&docs)?),
        ))
    }

    /// Drops the oldest event documents beyond [`MAX_EVENT_DOCS`].
    pub async fn prune_events(&self) -> Result<usize> {
        self.prune_events_to(MAX_EVENT_DOCS).await
    }

    /// Keeps the newest `keep` event documents (those under the old
    /// prefix are the oldest: they go first).
    pub(super) async fn prune_events_to(&self, keep: usize) -> Result<usize> {
        let mut held = Vec::new();
        for prefix in [LEGACY_EVENTS, EVENTS] {
            let prefix = self.key(prefix);
            let keys = self.keys(&prefix).await?;
            held.push((prefix, keys));
        }
        let total: usize = held.iter().map(|(_, k)| k.len()).sum();
        if total <= keep {
            return Ok(0);
        }
        let mut drop = total - keep;
        let mut kv = crate::kv_of(&self.client);
        for (prefix, keys) in held {
            if drop == 0 || keys.is_empty() {
                continue;
            }
            let n = drop.min(keys.len());
            // Keys sort by time: delete [first, the first one kept), or
            // all of them.
            let (from, opts) = match keys.get(n) {
                Some(k) => (
                    format!("{prefix}{}", keys[0]),
                    etcd_client::DeleteOptions::new().with_range(format!("{prefix}{k}")),
                ),
                None => (prefix.clone(), etcd_client::DeleteOptions::new().with_prefix()),
            };
            kv.delete(from, Some(opts)).await.map_err(unavailable)?;
            drop -= n;
        }
        Ok(total - keep)
    }
}
