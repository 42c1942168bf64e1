//! Connection state and last-seen times on etcd (see the module
//! documentation of `etcd.rs`): which replicas live, when each last heard
//! its agents (`heard/ID`), the `seen/ID` documents of the version before,
//! and the leader's settling of what a replica that is gone left behind.

use etcd_client::{Compare, CompareOp, TxnOp};

use lks_store::{Result, StoreError};

use crate::docs::{HeardDoc, NodeDoc};
use crate::{EtcdStore, json, unavailable};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Live replicas and when each replica last heard its agents, read in one
/// go.
#[derive(Default)]
pub(super) struct Liveness {
    pub(super) replicas: BTreeSet<String>,
    /// Replica → `heard/ID`'s time (live replicas and dead ones alike).
    pub(super) heard: HashMap<String, i64>,
    /// Node → time, from `seen/ID` documents written by replicas of the
    /// version before `heard/` (empty once none is left).
    pub(super) legacy: HashMap<String, i64>,
}

impl Liveness {
    pub(super) fn connected(&self, doc: &NodeDoc) -> bool {
        !doc.replica.is_empty() && self.replicas.contains(&doc.replica)
    }

    pub(super) fn last_seen(&self, name: &str, doc: &NodeDoc) -> i64 {
        let heard = if doc.replica.is_empty() {
            0
        } else {
            self.heard.get(&doc.replica).copied().unwrap_or(0)
        };
        let legacy = if self.legacy.is_empty() {
            0
        } else {
            self.legacy.get(name).copied().unwrap_or(0)
        };
        doc.last_seen_ms.max(heard).max(legacy)
    }

    /// Merges the node → time maps of `seen/ID` documents.
    pub(super) fn fold_legacy<'a>(
        maps: impl IntoIterator<Item = &'a HashMap<String, i64>>,
    ) -> HashMap<String, i64> {
        let mut seen: HashMap<String, i64> = HashMap::new();
        for map in maps {
            for (n, t) in map {
                let e = seen.entry(n.clone()).or_default();
                *e = (*e).max(*t);
            }
        }
        seen
    }
}

/// How long the leader waits after a replica's last `heard/ID` time before
/// it settles what that replica left, when its lease is gone: the nodes
/// still naming it get that time as their own last-seen time and name no
/// replica. Much longer than a lease TTL, so that a replica that only lost
/// etcd for a while comes back to its own nodes' documents.
pub const SETTLE_AFTER: Duration = Duration::from_secs(600);
/// Node documents the leader settles per pass (one read and one write each).
const SETTLE_PER_PASS: usize = 1000;

impl EtcdStore {
    pub(super) async fn liveness(&self) -> Result<Liveness> {
        let replicas = self.keys(&self.key("replicas/")).await?.into_iter().collect();
        let heard = self
            .range::<HeardDoc>(&self.key("heard/"))
            .await?
            .into_iter()
            .map(|(id, h, _)| (id, h.at_ms))
            .collect();
        let legacy = self.range::<HashMap<String, i64>>(&self.key("seen/")).await?;
        Ok(Liveness {
            replicas,
            heard,
            legacy: Liveness::fold_legacy(legacy.iter().map(|(_, m, _)| m)),
        })
    }

    /// Settles what replicas that are gone (no `replicas/ID`) left behind,
    /// on the leader every minute: see the module documentation. Returns
    /// how many `heard/ID` and `seen/ID` documents it deleted.
    pub async fn prune_seen(&self) -> Result<usize> {
        self.settle_gone_replicas(lks_store::clock::now_ms(), SETTLE_AFTER)
            .await
    }

    /// [`Self::prune_seen`] at `now_ms`, settling replicas last heard more
    /// than `after` ago.
    pub(super) async fn settle_gone_replicas(&self, now_ms: i64, after: Duration) -> Result<usize> {
        let live: BTreeSet<String> = self.keys(&self.key("replicas/")).await?.into_iter().collect();
        let oldest = now_ms.saturating_sub(after.as_millis() as i64);
        // Replica → (its last time, the document's revision).
        let settle: HashMap<String, (i64, i64)> = self
            .range::<HeardDoc>(&self.key("heard/"))
            .await?
            .into_iter()
            .filter(|(id, h, _)| !live.contains(id) && h.at_ms <= oldest)
            .map(|(id, h, rev)| (id, (h.at_ms, rev)))
            .collect();
        let legacy: Vec<(String, HashMap<String, i64>, i64)> = self
            .range::<HashMap<String, i64>>(&self.key("seen/"))
            .await?
            .into_iter()
            .filter(|(id, _, _)| !live.contains(id))
            .collect();
        if settle.is_empty() && legacy.is_empty() {
            return Ok(0);
        }
        let legacy_times = Liveness::fold_legacy(legacy.iter().map(|(_, m, _)| m));
        // The nodes to write, and how many name each settled replica.
        let pick = |nodes: &mut dyn Iterator<Item = (&str, &NodeDoc)>| {
            let mut todo = Vec::new();
            let mut named: HashMap<String, usize> = HashMap::new();
            for (name, d) in nodes {
                let gone = settle.contains_key(&d.replica);
                if gone {
                    *named.entry(d.replica.clone()).or_default() += 1;
                }
                if gone || legacy_times.get(name).is_some_and(|t| *t > d.last_seen_ms) {
                    todo.push((name.to_string(), d.replica.clone()));
                }
            }
            (todo, named)
        };
        let picked = self.with_cache(|c, _| pick(&mut c.nodes())).await;
        let (todo, mut named) = match picked {
            Some(p) => p,
            None => {
                let docs = self.range::<NodeDoc>(&self.key("nodes/")).await?;
                pick(&mut docs.iter().map(|(n, d, _)| (n.as_str(), d)))
            }
        };
        let mut left = todo.len();
        for (name, replica) in todo.iter().take(SETTLE_PER_PASS) {
            let written = self
                .update_node(name, |d| {
                    let mut changed = false;
                    if let Some((at, _)) = settle.get(&d.replica) {
                        d.last_seen_ms = d.last_seen_ms.max(*at);
                        d.replica.clear();
                        changed = true;
                    }
                    if let Some(t) = legacy_times.get(name)
                        && *t > d.last_seen_ms
                    {
                        d.last_seen_ms = *t;
                        changed = true;
                    }
                    changed
                })
                .await;
            match written {
                Ok(()) => {
                    left -= 1;
                    if let Some(n) = named.get_mut(replica) {
                        *n -= 1;
                    }
                }
                Err(e) => {
                    tracing::debug!(node = %name, error = %e, "settling a gone replica's node; next pass")
                }
            }
        }
        let mut deleted = 0;
        // A document rewritten since it was read (its replica is back) stays.
        let mut delete = async |key: String, rev: i64| -> Result<()> {
            let at = Compare::mod_revision(key.clone(), CompareOp::Equal, rev);
            if self.txn(vec![at], vec![TxnOp::delete(key, None)]).await? {
                deleted += 1;
            }
            Ok(())
        };
        for (id, (_, rev)) in &settle {
            if named.get(id).is_none_or(|n| *n == 0) {
                delete(self.key(&format!("heard/{id}")), *rev).await?;
            }
        }
        if left == 0 {
            for (id, _, rev) in &legacy {
                delete(self.key(&format!("seen/{id}")), *rev).await?;
            }
        }
        Ok(deleted)
    }

    /// Writes when this replica last heard one of its agents, if that
    /// moved since the last write; not under the lease: it outlives a
    /// replica killed hard.
    pub(super) async fn flush_heard(&self) -> Result<()> {
        let lease = *self
            .lease
            .lock()
            .map_err(|_| StoreError::backend("lease poisoned"))?;
        let at = self.heard_at.load(std::sync::atomic::Ordering::Relaxed);
        if lease == 0 || at == 0 || self.heard_written.load(std::sync::atomic::Ordering::Relaxed) == at {
            return Ok(());
        }
        let mut kv = crate::kv_of(&self.client);
        kv.put(
            self.key(&format!("heard/{}", self.replica)),
            json(&HeardDoc { at_ms: at })?,
            None,
        )
        .await
        .map_err(unavailable)?;
        self.heard_written.store(at, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
