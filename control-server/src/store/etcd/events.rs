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
