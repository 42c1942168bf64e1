//! Rollouts on etcd: a small header document per rollout
//! (`rollouts/ID`) and one key per node row (`rnodes/ID/NODE`).
//!
//! A rollout used to be one document listing its nodes, rewritten whole by
//! every decision: ~100 KiB at 1,000 nodes, and at 30,000 agents in 30
//! rollouts that rewriting was nearly all of the 74 MiB etcd stored during
//! a rollout to all and, sent to every replica's watch and reader, most of
//! the 1.5 GiB it sent (BENCHMARKS.md, "Where a rollout's time went"). It
//! also capped a rollout at about 4,900 nodes: a decision changing every
//! row passed etcd's 1.5 MiB request limit and was refused on every try.
//! Now a decision writes the rows it changes and the header.
//!
//! Rules that keep the pieces one consistent rollout:
//! - **Every write of a row also writes the header**, in the same
//!   transaction. So the header's `mod_revision` covers its rows: a copy
//!   whose header has etcd's current revision has every row as etcd has
//!   them ([`EtcdStore::rollout`]), and a transaction that compares the
//!   header's revision compares the whole rollout.
//! - **A decision larger than one transaction is stored in steps**
//!   ([`ROWS_PER_TXN`] rows each; etcd takes 128 operations per
//!   transaction), each step a consistent rollout: its first assignments
//!   (those nodes started, nothing else yet) or some of its nodes' new
//!   states, as if those reports had come first. The rollout's own state,
//!   its target and active marker, and the events not about one node go in
//!   the last step. Each step compares the header as the step before left
//!   it: a step that loses a race reads the rollout again and goes on with
//!   what is left, unless another decision came in between (then the
//!   caller decides again, as before).
//! - **A start writes the rows first, the header last**: rows without a
//!   header are no rollout (nothing reads a rollout's rows without its
//!   header), and the start that lost its race deletes them before it tries
//!   again. A replica killed between the two leaves rows that nothing
//!   reads; the next `rollout start` of that id is impossible (ids are
//!   random), and they are listed nowhere.
//! - **Documents stored before** (rows inline, `nodes`) are read as they
//!   are; the first write to one converts it ([`EtcdStore::convert_inline`]:
//!   rows first, each step comparing the unchanged document, then the
//!   header). A replica of an older build cannot read a new header (its
//!   `nodes` field is missing): during an upgrade it fails a rollout call
//!   with one error line rather than take a wrong decision.

use std::collections::HashSet;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use lks_store::{
    EventRow, Kind, NewRollout, NodeBundleView, NodeState, OlderReplica, Result, RolloutCommit,
    RolloutNodeRow, RolloutRow, RolloutStore, StoreError, TargetChange, check_revision, still_active,
};

use crate::docs::{DesiredDoc, NodeDoc, ReplicaFormat, TargetDoc};
use crate::name::Name;
use crate::seen::Liveness;
use crate::{
    Doc, EtcdStore, MAX_ATTEMPTS, backoff, busy, cache, corrupt, json, kv_of, node_view, reads, unavailable,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::rolloutdocs::{RolloutDoc, RolloutNodeDoc, header_key, row_key, rows_prefix};

/// Node rows written per transaction: each may come with its node's
/// desired-state document (a put and a compare), plus the header, the drive
/// key, an event document, the active marker and the target, within etcd's
/// default `--max-txn-ops` of 128.
pub(super) const ROWS_PER_TXN: usize = 60;

/// Rows written in one transaction where nothing else is (a start, a
/// conversion).
pub(super) const ROWS_ALONE_PER_TXN: usize = 120;

/// The row of `name` in `nodes`, sorted by name as a rollout's are.
fn row<'a>(nodes: &'a [RolloutNodeRow], name: &str) -> Option<&'a RolloutNodeRow> {
    let i = nodes.binary_search_by(|n| n.name.as_str().cmp(name)).ok()?;
    nodes.get(i)
}

/// [`row`], to change.
fn row_mut<'a>(nodes: &'a mut [RolloutNodeRow], name: &str) -> Option<&'a mut RolloutNodeRow> {
    let i = nodes.binary_search_by(|n| n.name.as_str().cmp(name)).ok()?;
    nodes.get_mut(i)
}

/// One piece of a decision: a node whose row changes, with the version to
/// assign it (`Some(None)`: remove the bundle) if its desired state changes.
type Item = (String, Option<Option<String>>);

/// What is left of a decision once `stored` holds some of it: the nodes to
/// assign (not yet `done`) first, in the decision's order, then the nodes
/// whose row in the decision differs from the stored one.
fn plan(c: &RolloutCommit, stored: &RolloutRow, done: &HashSet<String>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    let mut taken: HashSet<&str> = HashSet::new();
    for (node, version) in &c.assign {
        if !done.contains(node) && taken.insert(node.as_str()) {
            out.push((node.clone(), Some(version.clone())));
        }
    }
    let current: HashMap<&str, &RolloutNodeRow> = stored.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    for n in &c.rollout.nodes {
        if done.contains(&n.name) || taken.contains(n.name.as_str()) {
            continue;
        }
        // A row of a node that is not (or no longer) part of the stored
        // rollout is not created by a decision.
        if current.get(n.name.as_str()).is_some_and(|s| *s != n) {
            taken.insert(n.name.as_str());
            out.push((n.name.clone(), None));
        }
    }
    out
}

/// The outcome of one step.
enum Step {
    /// Stored: the rollout as it now stands, its header's revision, the
    /// nodes whose desired state changed.
    Stored(Box<RolloutRow>, i64, Vec<String>),
    /// The header or a desired state changed meanwhile.
    Raced,
}

impl EtcdStore {
    /// Runs one transaction; the revision it wrote at if its compares held.
    pub(super) async fn txn_at(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<Option<i64>> {
        let mut kv = kv_of(&self.client);
        let resp = kv
            .txn(Txn::new().when(compares).and_then(ops))
            .await
            .map_err(unavailable)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        self.wrote(rev);
        Ok(Some(rev))
    }

    /// A rollout's rows as etcd held them at `rev`.
    pub(super) async fn rows_at(&self, id: &str, rev: i64) -> Result<Vec<RolloutNodeDoc>> {
        let prefix = self.key(&rows_prefix(id));
        let mut opts = GetOptions::new().with_prefix();
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let resp = kv_of(&self.client)
            .get(prefix.clone(), Some(opts))
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, &prefix, resp.kvs());
        resp.kvs()
            .iter()
            .map(|item| serde_json::from_slice(item.value()).map_err(|e| corrupt(&prefix, e)))
            .collect()
    }

    /// A rollout as etcd holds it now (header, then its rows at the
    /// header's read revision), with the header's `mod_revision` and
    /// whether it is stored with its rows inline.
    pub(super) async fn rollout_from_etcd_as_stored(
        &self,
        id: &str,
    ) -> Result<Option<(RolloutRow, i64, bool)>> {
        let key = self.key(&header_key(id));
        let resp = kv_of(&self.client)
            .get(key.clone(), None)
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Get, &key, resp.kvs());
        let Some(item) = resp.kvs().first() else {
            return Ok(None);
        };
        let at = resp.header().map_or(0, |h| h.revision());
        let doc: RolloutDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
        let inline = !doc.rows;
        let rows = if inline {
            Vec::new()
        } else {
            self.rows_at(id, at).await?
        };
        Ok(Some((doc.into_row(id, rows)?, item.mod_revision(), inline)))
    }

    /// Every rollout, rows and all, as of one revision.
    pub(super) async fn all_rollouts(&self) -> Result<Vec<RolloutRow>> {
        let prefix = self.key("rollouts/");
        let mut kv = kv_of(&self.client);
        let headers = kv
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, &prefix, headers.kvs());
        let at = headers.header().map_or(0, |h| h.revision());
        let rprefix = self.key("rnodes/");
        let rows = kv
            .get(
                rprefix.clone(),
                Some(GetOptions::new().with_prefix().with_revision(at)),
            )
            .await
            .map_err(unavailable)?;
        self.note_read(reads::Read::Range, &rprefix, rows.kvs());
        let mut by_id: HashMap<String, Vec<RolloutNodeDoc>> = HashMap::new();
        for item in rows.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let Some((id, _)) = key[rprefix.len()..].split_once('/') else {
                continue;
            };
            let doc: RolloutNodeDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            by_id.entry(id.to_string()).or_default().push(doc);
        }
        let mut out = Vec::with_capacity(headers.kvs().len());
        for item in headers.kvs() {
            let key = String::from_utf8_lossy(item.key()).into_owned();
            let id = &key[prefix.len()..];
            let doc: RolloutDoc = serde_json::from_slice(item.value()).map_err(|e| corrupt(&key, e))?;
            out.push(doc.into_row(id, by_id.remove(id).unwrap_or_default())?);
        }
        Ok(out)
    }

    /// One node's row of rollout `id` whose header is `doc`, from etcd.
    pub(super) async fn row_of(
        &self,
        id: &str,
        doc: &RolloutDoc,
        node: &str,
    ) -> Result<Option<RolloutNodeDoc>> {
        if !doc.rows {
            return Ok(doc.nodes.iter().find(|n| n.name == node).cloned());
        }
        Ok(self
            .get::<RolloutNodeDoc>(&self.key(&row_key(id, node)))
            .await?
            .value)
    }

    /// A rollout about to be written: as [`Self::rollout`], converted first
    /// if it is stored with its rows inline.
    pub(super) async fn rollout_to_write(&self, id: &str) -> Result<Option<(RolloutRow, i64)>> {
        match self.rollout_as_stored(id).await? {
            Some((_, _, true)) => {
                self.convert_inline(id).await?;
                self.rollout(id).await
            }
            other => Ok(other.map(|(r, rev, _)| (r, rev))),
        }
    }

    /// Rewrites a document stored with its rows inline as a header and row
    /// keys: the rows first, each transaction comparing the unchanged
    /// document (so every row written is the document's), then the header.
    /// Nothing if it has row keys already (or does not exist).
    pub(super) async fn convert_inline(&self, id: &str) -> Result<()> {
        let key = self.key(&header_key(id));
        for _ in 0..MAX_ATTEMPTS {
            let doc: Doc<RolloutDoc> = self.get(&key).await?;
            let compare = doc.compare(&key);
            let Some(d) = doc.value else { return Ok(()) };
            if d.rows {
                return Ok(());
            }
            let row = d.into_row(id, Vec::new())?;
            let mut held = true;
            for chunk in row.nodes.chunks(ROWS_ALONE_PER_TXN) {
                let mut ops = Vec::with_capacity(chunk.len());
                for n in chunk {
                    ops.push(self.put(&row_key(id, &n.name), json(&RolloutNodeDoc::from_row(n))?));
                }
                if self.txn_at(vec![compare.clone()], ops).await?.is_none() {
                    held = false;
                    break;
                }
            }
            if held
                && self
                    .txn_at(
                        vec![compare],
                        vec![TxnOp::put(key.clone(), json(&RolloutDoc::header(&row))?, None)],
                    )
                    .await?
                    .is_some()
            {
                tracing::info!(
                    rollout = id,
                    nodes = row.nodes.len(),
                    "rollout stored with its rows as keys"
                );
                return Ok(());
            }
        }
        Err(busy("convert a stored rollout"))
    }

    /// [`Store::commit_rollout`] on etcd, in steps when the decision is
    /// larger than one transaction (module docs).
    pub(super) async fn commit_decision(&self, c: RolloutCommit) -> Result<(RolloutRow, Vec<String>)> {
        let id = c.rollout.id.clone();
        let mut c = c;
        let mut done: HashSet<String> = HashSet::new();
        let mut changed_all = Vec::new();
        let mut events_left = std::mem::take(&mut c.events);
        // Each attempt reads the rollout and stores what is left of the
        // decision, step by step, until a step loses a race.
        'attempts: for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                backoff(attempt).await;
            }
            let (mut stored, mut hrev) = self
                .rollout_to_write(&id)
                .await?
                .ok_or_else(|| StoreError::not_found(Kind::Rollout, id.to_string()))?;
            check_revision(&id, stored.revision, c.rollout.revision)?;
            let items = plan(&c, &stored, &done);
            let mut steps: Vec<&[Item]> = items.chunks(ROWS_PER_TXN).collect();
            if steps.is_empty() {
                steps.push(&[]);
            }
            let last = steps.len() - 1;
            for (i, step) in steps.into_iter().enumerate() {
                let fin = i == last;
                let names: HashSet<&str> = step.iter().map(|(n, _)| n.as_str()).collect();
                let (events, rest): (Vec<EventRow>, Vec<EventRow>) = std::mem::take(&mut events_left)
                    .into_iter()
                    .partition(|e| fin || names.contains(e.node.as_str()));
                events_left = rest;
                match self.commit_step(&c, &stored, hrev, step, &events, fin).await? {
                    Step::Stored(row, rev, changed) => {
                        for (n, v) in step {
                            if v.is_some() {
                                done.insert(n.clone());
                            }
                        }
                        changed_all.extend(changed);
                        if fin {
                            return Ok((*row, changed_all));
                        }
                        c.rollout.revision = row.revision;
                        stored = *row;
                        hrev = rev;
                    }
                    Step::Raced => {
                        // Read again and go on with what is left.
                        events_left.extend(events);
                        continue 'attempts;
                    }
                }
            }
        }
        Err(busy("commit rollout decision"))
    }

    /// One transaction of a decision: the rows of `step` (assigning the
    /// nodes that come with a version), `events`, the header; in the last
    /// step also the rollout's own fields, its target and active marker.
    async fn commit_step(
        &self,
        c: &RolloutCommit,
        stored: &RolloutRow,
        hrev: i64,
        step: &[Item],
        events: &[EventRow],
        fin: bool,
    ) -> Result<Step> {
        let id = &stored.id;
        let hkey = self.key(&header_key(id));
        let decided: HashMap<&str, &RolloutNodeRow> =
            c.rollout.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        // The rollout as this step leaves it: the stored one with this
        // step's rows as decided (and, at the end, the decision's own
        // fields; nodes that joined since the decision stay in).
        let mut r = if fin {
            RolloutRow {
                nodes: stored.nodes.clone(),
                ..c.rollout.clone()
            }
        } else {
            stored.clone()
        };
        for (name, _) in step {
            let (Some(dst), Some(src)) = (row_mut(&mut r.nodes, name), decided.get(name.as_str())) else {
                return Err(StoreError::backend(format!(
                    "rollout {id}: node {name} of the decision is not part of it"
                )));
            };
            *dst = (*src).clone();
        }
        let mut compares = vec![Compare::mod_revision(hkey.clone(), CompareOp::Equal, hrev)];
        let mut ops = Vec::new();
        let assign: Vec<(&String, &Option<String>)> = step
            .iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| (n, v)))
            .collect();
        let mut changed = Vec::new();
        if !assign.is_empty() {
            // Every node's desired state first, then the generation.
            let keys: Vec<String> = assign
                .iter()
                .map(|(n, _)| self.key(&format!("desired/{n}")))
                .collect();
            let docs: Vec<Doc<DesiredDoc>> = self.get_many(&keys).await?;
            let base = self.next_generation().await?;
            for (((node, version), dkey), desired) in assign.iter().zip(keys).zip(docs) {
                let n = row_mut(&mut r.nodes, node).ok_or_else(|| {
                    StoreError::backend(format!("rollout {id}: node {node} to assign is not part of it"))
                })?;
                // A node and its desired document are created and deleted
                // together, so one compare per node covers both.
                compares.push(desired.compare(&dkey));
                let Some(mut d) = desired.value else {
                    n.state = NodeState::Skipped;
                    n.message = "node was deleted".into();
                    continue;
                };
                let current = d.bundles.get(&r.bundle).map(String::from);
                let was_touched = row(&stored.nodes, node).is_some_and(|s| s.touched);
                if !n.reverting && !was_touched {
                    n.previous_version = current.unwrap_or_default();
                }
                match version {
                    Some(v) => {
                        d.bundles.insert(r.bundle.clone(), Name::from(v));
                    }
                    None => {
                        d.bundles.remove(&r.bundle);
                        d.retry.remove(&r.bundle);
                    }
                }
                let g = base.max(d.generation + 1);
                d.generation = g;
                ops.push(TxnOp::put(dkey, json(&d)?, None));
                n.generation = g;
                changed.push((*node).clone());
            }
        }
        for (name, _) in step {
            if let Some(n) = row(&r.nodes, name) {
                ops.push(self.put(&row_key(id, name), json(&RolloutNodeDoc::from_row(n))?));
            }
        }
        r.revision = stored.revision + 1;
        if fin {
            self.finish_ops(c, stored, &r, &mut compares, &mut ops).await?;
        }
        if let Some(op) = self.event_op(events)? {
            ops.push(op);
        }
        let drive_key = self.key(&format!("drive/{id}"));
        if r.needs_driving() {
            ops.push(TxnOp::put(drive_key, Vec::new(), None));
        } else {
            ops.push(TxnOp::delete(drive_key, None));
        }
        ops.push(TxnOp::put(hkey, json(&RolloutDoc::header(&r))?, None));
        match self.txn_at(compares, ops).await? {
            Some(rev) => Ok(Step::Stored(Box::new(r), rev, changed)),
            None => Ok(Step::Raced),
        }
    }

    /// The last step's compares and writes beyond the rows: the active
    /// marker when the rollout becomes active or ends, and its target.
    async fn finish_ops(
        &self,
        c: &RolloutCommit,
        stored: &RolloutRow,
        r: &RolloutRow,
        compares: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) -> Result<()> {
        let id = &r.id;
        let active_key = self.key(&format!("active/{}/{}", r.cluster, r.bundle));
        if r.state.is_active() && !stored.state.is_active() {
            match self.get_raw(&active_key).await? {
                Some((other, _)) if other != id.as_bytes() => {
                    let other = String::from_utf8_lossy(&other).into_owned();
                    let state = match self
                        .get::<RolloutDoc>(&self.key(&header_key(&other)))
                        .await?
                        .value
                    {
                        Some(d) => d.state,
                        None => "running".into(),
                    };
                    return Err(still_active(&r.cluster, &r.bundle, &other, &state));
                }
                Some((_, rev)) => {
                    compares.push(Compare::mod_revision(active_key.clone(), CompareOp::Equal, rev))
                }
                None => {
                    compares.push(Compare::create_revision(active_key.clone(), CompareOp::Equal, 0));
                    ops.push(TxnOp::put(active_key.clone(), id.as_bytes().to_vec(), None));
                }
            }
        } else if !r.state.is_active() && stored.state.is_active() {
            compares.push(Compare::value(
                active_key.clone(),
                CompareOp::Equal,
                id.as_bytes().to_vec(),
            ));
            ops.push(TxnOp::delete(active_key.clone(), None));
        }
        match c.target {
            TargetChange::Keep => {}
            TargetChange::SetToRollout => {
                ops.push(self.put(
                    &format!("targets/{}/{}", r.cluster, r.bundle),
                    json(&TargetDoc {
                        version: r.version.clone(),
                        selector: r.selector.clone(),
                        rollout_id: r.id.clone(),
                    })?,
                ));
            }
            TargetChange::RestorePrevious => {
                let tkey = self.key(&format!("targets/{}/{}", r.cluster, r.bundle));
                let current: Doc<TargetDoc> = self.get(&tkey).await?;
                compares.push(current.compare(&tkey));
                if current.value.as_ref().is_some_and(|t| t.rollout_id == r.id) {
                    match &r.previous_target {
                        Some(t) => ops.push(TxnOp::put(
                            tkey,
                            json(&TargetDoc {
                                version: t.version.clone(),
                                selector: t.selector.clone(),
                                rollout_id: t.rollout_id.clone(),
                            })?,
                            None,
                        )),
                        None => ops.push(TxnOp::delete(tkey, None)),
                    }
                }
            }
        }
        Ok(())
    }
}

/// A rollout with no nodes, for tests.
#[async_trait]
impl RolloutStore for EtcdStore {
    async fn start_rollout(&self, r: NewRollout) -> Result<RolloutRow> {
        self.start_rollout_in_etcd(r).await
    }

    async fn older_replica(&self, format: u32) -> Result<Option<OlderReplica>> {
        // Live replicas only: `replicas/ID` goes with its lease.
        let mut older: Vec<OlderReplica> = self
            .range::<ReplicaFormat>(&self.key("replicas/"))
            .await?
            .into_iter()
            .filter(|(_, r, _)| r.store_format < format)
            .map(|(id, r, _)| OlderReplica {
                replica: id,
                release: r.release,
                format: r.store_format,
            })
            .collect();
        older.sort_by(|a, b| a.replica.cmp(&b.replica));
        Ok(older.into_iter().next())
    }

    async fn get_rollout(&self, id: &str) -> Result<Option<RolloutRow>> {
        Ok(self.rollout(id).await?.map(|(r, _)| r))
    }

    async fn list_rollouts(&self, cluster: Option<&str>, only_active: bool) -> Result<Vec<RolloutRow>> {
        let mut out = Vec::new();
        if only_active {
            let mut kv = crate::kv_of(&self.client);
            let resp = kv
                .get(self.key("active/"), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(unavailable)?;
            for a in resp.kvs() {
                let id = String::from_utf8_lossy(a.value()).into_owned();
                if let Some(r) = self.get_rollout(&id).await? {
                    out.push(r);
                }
            }
        } else {
            out = self.all_rollouts().await?;
        }
        out.retain(|r| cluster.is_none_or(|c| r.cluster == c) && (!only_active || r.state.is_active()));
        out.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Ok(out)
    }

    async fn rollouts_to_drive(&self) -> Result<Vec<RolloutRow>> {
        // The leader asks at every step: from the watch-fed copy when it
        // is fresh (a decision on a stale one is refused at commit, whose
        // read is etcd's own).
        if let Some(Some(from_copy)) = self.with_cache(|c, _| c.driven_rollouts()).await {
            return from_copy;
        }
        let mut out = Vec::new();
        for id in self.keys(&self.key("drive/")).await? {
            if let Some(r) = self.get_rollout(&id).await? {
                out.push(r);
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Ok(out)
    }

    async fn commit_rollout(&self, c: RolloutCommit) -> Result<(RolloutRow, Vec<String>)> {
        self.commit_decision(c).await
    }

    async fn rollout_views(&self, rollout_id: &str) -> Result<BTreeMap<String, NodeBundleView>> {
        // A driven rollout and its nodes, all from the watch-fed copy when
        // it is fresh: nothing read from etcd.
        let views = |r: &RolloutRow, c: &cache::CacheState, live: &Liveness| {
            r.nodes
                .iter()
                .filter_map(|n| {
                    let doc = c.node(&n.name)?;
                    Some((
                        n.name.clone(),
                        node_view(&r.bundle, &n.name, doc, c.desired(&n.name), live),
                    ))
                })
                .collect::<BTreeMap<_, _>>()
        };
        let all_cached = self
            .with_cache(|c, live| {
                c.driven_rollout(rollout_id)
                    .map(|r| r.map(|(r, _, _)| views(&r, c, live)))
            })
            .await
            .flatten();
        if let Some(out) = all_cached {
            return out;
        }
        // Not driven (ended), or the copy is not fresh: the rollout from
        // etcd, its nodes from the copy if it is fresh now.
        let Some(r) = self.get_rollout(rollout_id).await? else {
            return Ok(BTreeMap::new());
        };
        let names: BTreeSet<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        if let Some(out) = self.with_cache(|c, live| views(&r, c, live)).await {
            return Ok(out);
        }
        tracing::debug!(
            rollout = rollout_id,
            "rollout view read from etcd: the watch-fed copy is not fresh"
        );
        let nodes = self.range::<NodeDoc>(&self.key("nodes/")).await?;
        let desired: HashMap<String, DesiredDoc> = self
            .range::<DesiredDoc>(&self.key("desired/"))
            .await?
            .into_iter()
            .filter(|(k, _, _)| names.contains(k.as_str()))
            .map(|(k, v, _)| (k, v))
            .collect();
        let live = self.liveness().await?;
        let mut out = BTreeMap::new();
        for (name, doc, _) in nodes {
            if !names.contains(name.as_str()) {
                continue;
            }
            let view = node_view(&r.bundle, &name, &doc, desired.get(&name), &live);
            out.insert(name, view);
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(super) fn test_row(id: &str) -> RolloutRow {
    RolloutRow {
        id: id.into(),
        cluster: "c".into(),
        bundle: "b".into(),
        version: "2".into(),
        selector: lks_proto::labels::Labels::new(),
        batch_size: 1,
        failure_threshold: 1,
        offline_deadline_ms: 1000,
        state: lks_store::RolloutState::Running,
        nodes: Vec::new(),
        created_at_ms: 1,
        updated_at_ms: 1,
        message: String::new(),
        revision: 0,
        previous_target: None,
        policy: Default::default(),
        pacing: Default::default(),
    }
}

#[cfg(test)]
mod tests;
