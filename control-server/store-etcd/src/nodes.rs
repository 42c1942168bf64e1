//! Nodes: enrolment, identity, holds, retries and deletion on etcd.

use std::collections::BTreeMap;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};

use lks_store::clock::now_ms;
use lks_store::{
    EventRow, NewNode, NodeRow, NodeStore, Result, StoreError, TokenRefusal, TokenUse, cert_replaced,
    never_connected, retry_targets,
};

use crate::docs::{DesiredDoc, NodeDoc, TargetDoc};
use crate::rolloutdocs;
use crate::rolloutdocs::{RolloutDoc, RolloutNodeDoc};
use crate::smallmap::SmallMap;
use crate::tokens::TokenDoc;
use crate::{Doc, ENROL_ATTEMPTS, EtcdStore, MAX_ATTEMPTS, backoff, busy, json, unavailable};

#[async_trait]
impl NodeStore for EtcdStore {
    async fn enroll_node(&self, n: NewNode) -> Result<u64> {
        // A boot storm enrols many nodes with one token at once, and each
        // takes a use of it: lost races back off with jitter and try again.
        for attempt in 0..ENROL_ATTEMPTS {
            if attempt > 0 {
                backoff(attempt).await;
            }
            if let Some(generation) = self.try_enrol(&n).await? {
                return Ok(generation);
            }
        }
        Err(busy("enrol node"))
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeRow>> {
        let Some(doc) = self
            .get::<NodeDoc>(&self.key(&format!("nodes/{name}")))
            .await?
            .value
        else {
            return Ok(None);
        };
        let desired = self
            .get::<DesiredDoc>(&self.key(&format!("desired/{name}")))
            .await?
            .value;
        let live = self.liveness().await?;
        Ok(Some(Self::node_row(name, doc, desired, &live)))
    }

    /// One document read: no desired state, no replica liveness.
    async fn node_identity(&self, name: &str) -> Result<Option<(String, String)>> {
        Ok(self
            .get::<NodeDoc>(&self.key(&format!("nodes/{name}")))
            .await?
            .value
            .map(|d| (d.cluster.to_string(), d.cert_serial.into())))
    }

    async fn list_nodes(&self, cluster: Option<&str>) -> Result<Vec<NodeRow>> {
        // From the watch-fed copy when it is fresh: a listing of one
        // cluster read every node document of the region from etcd (~17 MiB
        // at 30,000 nodes), and every `rollout start` lists its cluster
        // (the selector's count, the path-conflict check): at 30,000 agents
        // in 30 clusters that was most of what etcd sent during a rollout
        // to all (BENCHMARKS.md, "A region on replicas").
        let from_copy = self
            .with_cache(|c, live| {
                let mut rows: Vec<NodeRow> = c
                    .nodes()
                    .filter(|(_, d)| cluster.is_none_or(|want| d.cluster == want))
                    .map(|(name, d)| Self::node_row(name, d.clone(), c.desired(name).cloned(), live))
                    .collect();
                rows.sort_by(|a, b| a.name.cmp(&b.name));
                rows
            })
            .await;
        match from_copy {
            Some(rows) => Ok(rows),
            None => self.nodes_from_etcd(cluster).await,
        }
    }

    async fn count_nodes(&self) -> Result<u64> {
        self.count(&self.key("nodes/")).await
    }

    async fn retry_node(
        &self,
        name: &str,
        bundle: Option<&str>,
        admin: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<String>>> {
        let nkey = self.key(&format!("nodes/{name}"));
        let dkey = self.key(&format!("desired/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let node: Doc<NodeDoc> = self.get(&nkey).await?;
            let desired: Doc<DesiredDoc> = self.get(&dkey).await?;
            let (Some(n), Some(mut d)) = (node.value.as_ref(), desired.value.clone()) else {
                return Ok(None);
            };
            let bundles = retry_targets(name, d.bundles.keys().map(String::from).collect(), bundle)?;
            if bundles.is_empty() {
                return Ok(Some(bundles));
            }
            let g = self.next_generation().await?.max(d.generation + 1);
            d.generation = g;
            for b in &bundles {
                d.retry.insert(b.clone(), g);
            }
            let event = EventRow::retry(&n.cluster, name, &bundles, admin, now_ms);
            if self
                .put_desired_if_unchanged((&node, &nkey), (&desired, &dkey), &d, event)
                .await?
            {
                return Ok(Some(bundles));
            }
        }
        Err(busy("retry node"))
    }

    async fn request_reboot(&self, name: &str, admin: &str, now_ms: i64) -> Result<Option<u64>> {
        let nkey = self.key(&format!("nodes/{name}"));
        let dkey = self.key(&format!("desired/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let node: Doc<NodeDoc> = self.get(&nkey).await?;
            let desired: Doc<DesiredDoc> = self.get(&dkey).await?;
            let (Some(n), Some(mut d)) = (node.value.as_ref(), desired.value.clone()) else {
                return Ok(None);
            };
            let g = self.next_generation().await?.max(d.generation + 1);
            d.generation = g;
            d.reboot = g;
            let event = EventRow::reboot_requested(&n.cluster, name, admin, now_ms);
            if self
                .put_desired_if_unchanged((&node, &nkey), (&desired, &dkey), &d, event)
                .await?
            {
                return Ok(Some(g));
            }
        }
        Err(busy("request a reboot"))
    }

    async fn clear_reboot_request(&self, name: &str, id: u64) -> Result<bool> {
        let dkey = self.key(&format!("desired/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let desired: Doc<DesiredDoc> = self.get(&dkey).await?;
            let Some(mut d) = desired.value.clone() else {
                return Ok(false);
            };
            if id == 0 || d.reboot != id {
                return Ok(false);
            }
            d.generation = self.next_generation().await?.max(d.generation + 1);
            d.reboot = 0;
            let ops = vec![TxnOp::put(dkey.clone(), json(&d)?, None)];
            if self.txn(vec![desired.compare(&dkey)], ops).await? {
                return Ok(true);
            }
        }
        Err(busy("clear a reboot request"))
    }

    async fn set_node_hold(&self, name: &str, hold: Option<String>, mut event: EventRow) -> Result<bool> {
        let nkey = self.key(&format!("nodes/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let doc: Doc<NodeDoc> = self.get(&nkey).await?;
            let Some(mut d) = doc.value.clone() else {
                return Ok(false);
            };
            d.hold = hold.as_deref().map(Box::from);
            event.cluster = d.cluster.to_string();
            let mut ops = vec![TxnOp::put(nkey.clone(), json(&d)?, None)];
            if let Some(op) = self.event_op(std::slice::from_ref(&event))? {
                ops.push(op);
            }
            if self.txn(vec![doc.compare(&nkey)], ops).await? {
                return Ok(true);
            }
        }
        Err(busy("hold node"))
    }

    async fn delete_node(&self, name: &str) -> Result<bool> {
        for _ in 0..MAX_ATTEMPTS {
            let nkey = self.key(&format!("nodes/{name}"));
            let doc: Doc<NodeDoc> = self.get(&nkey).await?;
            let Some(d) = doc.value.as_ref() else {
                return Ok(false);
            };
            let mut ops = vec![
                TxnOp::delete(nkey.clone(), None),
                TxnOp::delete(self.key(&format!("desired/{name}")), None),
            ];
            if let Some(op) = self.event_op(&[EventRow::deleted(&d.cluster, name, now_ms())])? {
                ops.push(op);
            }
            if self.txn(vec![doc.compare(&nkey)], ops).await? {
                return Ok(true);
            }
        }
        Err(busy("delete node"))
    }

    async fn replace_cert_serial(&self, name: &str, old: &str, new: &str) -> Result<()> {
        for _ in 0..MAX_ATTEMPTS {
            let nkey = self.key(&format!("nodes/{name}"));
            let doc: Doc<NodeDoc> = self.get(&nkey).await?;
            let Some(mut d) = doc.value.clone().filter(|d| *d.cert_serial == *old) else {
                return Err(cert_replaced(name));
            };
            d.cert_serial = new.into();
            if self
                .txn(vec![doc.compare(&nkey)], vec![TxnOp::put(nkey, json(&d)?, None)])
                .await?
            {
                return Ok(());
            }
        }
        Err(busy("replace certificate serial"))
    }
}

impl EtcdStore {
    /// Read-modify-write of one node document; `f` returns false to leave
    /// it unchanged. A missing node is not an error (it was deleted).
    pub(super) async fn update_node(&self, name: &str, f: impl Fn(&mut NodeDoc) -> bool) -> Result<()> {
        let nkey = self.key(&format!("nodes/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            let doc: Doc<NodeDoc> = self.get(&nkey).await?;
            let Some(mut d) = doc.value.clone() else {
                return Ok(());
            };
            if !f(&mut d) {
                return Ok(());
            }
            if self
                .txn(
                    vec![doc.compare(&nkey)],
                    vec![TxnOp::put(nkey.clone(), json(&d)?, None)],
                )
                .await?
            {
                return Ok(());
            }
        }
        Err(busy("update node"))
    }

    /// Writes node `name`'s desired document `d` and `event` in one
    /// transaction, if neither the node's nor the desired document changed
    /// since they were read; false if one did (read again and retry).
    async fn put_desired_if_unchanged(
        &self,
        (node, nkey): (&Doc<NodeDoc>, &str),
        (desired, dkey): (&Doc<DesiredDoc>, &str),
        d: &DesiredDoc,
        event: EventRow,
    ) -> Result<bool> {
        let mut ops = vec![TxnOp::put(dkey, json(d)?, None)];
        if let Some(op) = self.event_op(&[event])? {
            ops.push(op);
        }
        self.txn(vec![node.compare(nkey), desired.compare(dkey)], ops)
            .await
    }
}

impl EtcdStore {
    /// One attempt at enrolling `n` in one transaction: its generation, or
    /// `None` when a concurrent write won the race.
    async fn try_enrol(&self, n: &NewNode) -> Result<Option<u64>> {
        let tkey = self.key(&format!("tokens/{}", n.token_id));
        let token: Doc<TokenDoc> = self.get(&tkey).await?;
        let Some(mut tok) = token.value.clone() else {
            return Err(StoreError::Token(TokenRefusal::Unknown));
        };
        let rules = TokenUse {
            cluster: &tok.cluster,
            expires_at_ms: tok.expires_at_ms,
            remaining_uses: tok.remaining_uses,
        };
        rules.admits(&n.cluster, n.now_ms)?;
        let left = rules.take();
        let nkey = self.key(&format!("nodes/{}", n.name));
        let node: Doc<NodeDoc> = self.get(&nkey).await?;
        if let Some(existing) = node.value.clone() {
            return self.re_enrol(n, existing, &node, &nkey).await;
        }
        let left = left?;
        let mut compares = vec![
            token.compare(&tkey),
            Compare::create_revision(nkey.clone(), CompareOp::Equal, 0),
        ];
        let mut ops = Vec::new();
        if left.is_some() {
            tok.remaining_uses = left;
            ops.push(TxnOp::put(tkey.clone(), json(&tok)?, None));
        }
        // The cluster's targets, compared as a range: a target set or
        // changed meanwhile makes the enrolment read again.
        let tprefix = self.key(&format!("targets/{}/", n.cluster));
        let targets = self.range::<TargetDoc>(&tprefix).await?;
        let max_rev = targets.iter().map(|t| t.2).max().unwrap_or(0);
        compares.push(Compare::mod_revision(tprefix.clone(), CompareOp::Less, max_rev + 1).with_prefix());
        let given = n.seed_desired(
            targets
                .iter()
                .map(|(b, t, _)| (b.clone(), t.version.clone(), &t.selector)),
        );
        ops.push(TxnOp::put(nkey, json(&new_node_doc(n))?, None));
        self.join_active_rollouts(n, &given, &mut compares, &mut ops)
            .await?;
        let g = self.next_generation().await?;
        ops.push(self.put(
            &format!("desired/{}", n.name),
            json(&DesiredDoc {
                generation: g,
                bundles: given.into(),
                retry: SmallMap::new(),
                reboot: 0,
            })?,
        ));
        if let Some(op) = self.event_op(&[EventRow::enrolled(n)])? {
            ops.push(op);
        }
        Ok(self.txn(compares, ops).await?.then_some(g))
    }

    /// Enrols `n` again over its existing record, where `over_existing`
    /// allows it: the new certificate serial, the desired state as it is.
    /// `None` if either changed meanwhile.
    async fn re_enrol(
        &self,
        n: &NewNode,
        mut existing: NodeDoc,
        node: &Doc<NodeDoc>,
        nkey: &str,
    ) -> Result<Option<u64>> {
        let never = never_connected(
            &existing.facts_json,
            existing.last_seen_ms,
            !existing.replica.is_empty(),
        );
        n.over_existing(&existing.cluster, &existing.key_hash, never)?;
        let dkey = self.key(&format!("desired/{}", n.name));
        let desired: Doc<DesiredDoc> = self.get(&dkey).await?;
        existing.cert_serial = n.cert_serial.as_str().into();
        let mut ops = vec![TxnOp::put(nkey.to_string(), json(&existing)?, None)];
        if let Some(op) = self.event_op(&[EventRow::reenrolled(n)])? {
            ops.push(op);
        }
        if self
            .txn(vec![node.compare(nkey), desired.compare(&dkey)], ops)
            .await?
        {
            return Ok(Some(desired.value.map_or(0, |d| d.generation)));
        }
        Ok(None)
    }

    /// A running or paused rollout of the cluster takes the joiner in too:
    /// it starts on the current target and waits for its turn. Adds the
    /// rollouts' rows and headers to the enrolment's transaction, compared
    /// so that a rollout changed meanwhile makes it read again.
    async fn join_active_rollouts(
        &self,
        n: &NewNode,
        given: &BTreeMap<String, String>,
        compares: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) -> Result<()> {
        let aprefix = self.key(&format!("active/{}/", n.cluster));
        let mut kv = crate::kv_of(&self.client);
        let active = kv
            .get(aprefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        for a in active.kvs() {
            let id = String::from_utf8_lossy(a.value()).into_owned();
            let rkey = self.key(&rolloutdocs::header_key(&id));
            let Some((r, hrev)) = self.rollout_to_write(&id).await? else {
                compares.push(Compare::create_revision(rkey, CompareOp::Equal, 0));
                continue;
            };
            compares.push(Compare::mod_revision(rkey.clone(), CompareOp::Equal, hrev));
            let Some(row) = n.adopted_by(r.state, &r.bundle, &r.selector, given) else {
                continue;
            };
            if !r.nodes.iter().any(|x| x.name == n.name) {
                ops.push(self.put(
                    &rolloutdocs::row_key(&id, &n.name),
                    json(&RolloutNodeDoc::from_row(&row))?,
                ));
                // The header is written with every row (module
                // `rollouts`): its revision covers the rows.
                ops.push(TxnOp::put(rkey, json(&RolloutDoc::header(&r))?, None));
            }
        }
        Ok(())
    }
}

/// The record of a node enrolled now, before it first connects.
fn new_node_doc(n: &NewNode) -> NodeDoc {
    NodeDoc {
        cluster: n.cluster.as_str().into(),
        labels: n.labels.clone(),
        cert_serial: n.cert_serial.as_str().into(),
        facts_json: Box::default(),
        last_seen_ms: 0,
        enrolled_at_ms: n.now_ms,
        replica: String::new(),
        actual: SmallMap::new(),
        hold: None,
        key_hash: n.key_hash.as_str().into(),
        trust: None,
        reboot: None,
    }
}
