//! The event log on etcd.

use super::*;

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
        let prefix = self.key("events/");
        let mut kv = crate::store::etcd::kv_of(&self.client);
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
    pub(super) fn event_op(&self, events: &[EventRow]) -> Result<Option<TxnOp>> {
        if events.is_empty() {
            return Ok(None);
        }
        let at = events.iter().map(|e| e.at_ms).max().unwrap_or_default().max(0);
        let docs: Vec<EventDoc> = events.iter().map(EventDoc::from_row).collect();
        Ok(Some(
            self.put(&format!("events/{at:016}-{}", nonce()), json(&docs)?),
        ))
    }

    /// Drops the oldest event documents beyond [`MAX_EVENT_DOCS`].
    pub async fn prune_events(&self) -> Result<usize> {
        self.prune_events_to(MAX_EVENT_DOCS).await
    }

    /// Keeps the newest `keep` event documents.
    pub(super) async fn prune_events_to(&self, keep: usize) -> Result<usize> {
        let prefix = self.key("events/");
        let keys = self.keys(&prefix).await?;
        if keys.len() <= keep {
            return Ok(0);
        }
        let drop = keys.len() - keep;
        // Keys sort by time: delete [first, the first one kept).
        let end = format!("{prefix}{}", keys[drop]);
        let mut kv = crate::store::etcd::kv_of(&self.client);
        kv.delete(
            format!("{prefix}{}", keys[0]),
            Some(etcd_client::DeleteOptions::new().with_range(end)),
        )
        .await
        .map_err(unavailable)?;
        Ok(drop)
    }
}
