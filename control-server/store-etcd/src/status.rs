//! Group commit of status reports and connects.
//!
//! Every agent report changes its node's document, and so does every
//! stream's opening (the Hello: facts, the replica holding it, what the
//! node holds). After a replica dies its agents open streams on the
//! survivors by the thousand, one read and one write each before this. One etcd transaction per
//! report made a rollout to 10,000 nodes cost about one raft proposal, one
//! WAL fsync on every member and three read transactions per node, and the
//! three etcd members used more CPU than the replicas (BENCHMARKS.md, "A
//! region on replicas"). Here reports that arrive while another batch is
//! being committed wait for the next one, and a batch is read in one
//! transaction and written in one: the cost per report falls with the load,
//! and a lone report still goes out at once (nothing waits for a timer).
//!
//! A batch holds each node once. Its write compares every document it read,
//! as the single-report path does; if any of them changed meanwhile (the
//! leader assigned one of the nodes a new desired state), the batch is not
//! written and each report takes the single-report path, which retries on
//! its own.
//!
//! A caller whose report was taken into another caller's batch waits for
//! that batch's answer. The batch is committed on a task of its own, so a
//! committing caller that is cancelled (its stream ended) does not take
//! the other reports of its batch with it.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use etcd_client::{Compare, Txn, TxnOp};

use lks_store::NodeTrust;
use std::sync::Arc;

use tokio::sync::{Semaphore, oneshot};

use super::{Doc, EtcdStore, MAX_ATTEMPTS, backoff, busy, json, read_answers, typed};
use crate::docs::{DesiredDoc, NodeDoc, actual_doc};
use lks_store::{BundleStatusRow, NodeReboot, NodeStatusStore, Result, StoreError};

/// Reports in one batch: two compares and one write each, under etcd's
/// default `--max-txn-ops` of 128.
const MAX_BATCH: usize = 60;
/// Tries of one batch against concurrent changes of its documents, each
/// with the documents its failed try read, before each report goes alone.
const BATCH_ATTEMPTS: usize = 4;
/// Batches committed at once by one replica. A batch is capped at
/// [`MAX_BATCH`] by etcd's limit on operations per transaction, so under a
/// reconnecting crowd (a replica's agents arriving on the survivors) this
/// bounds how many streams a replica opens per second: each opening waits
/// for its Hello's batch.
const COMMITTERS: usize = 4;
/// Nodes remembered as written before those the copy holds are forgotten.
const WRITTEN_KEPT: usize = 4096;

/// What one caller changes in its node's document.
pub(super) enum Update {
    /// A status report: its bundles' rows, and rows no longer desired
    /// and left out of the report removed.
    Status(Vec<BundleStatusRow>),
    /// A stream's Hello: the node's facts, the replica holding its
    /// stream, and everything it holds (its rows replaced).
    Connected {
        facts_json: String,
        held: Vec<BundleStatusRow>,
        trust: Option<NodeTrust>,
        reboot: Option<NodeReboot>,
        now_ms: i64,
    },
}

/// One update waiting to be written.
struct Pending {
    id: u64,
    node: String,
    update: Update,
    done: oneshot::Sender<Result<()>>,
}

/// The queue of reports and the right to commit a batch of them.
pub(super) struct StatusQueue {
    queue: Mutex<VecDeque<Pending>>,
    committers: Arc<Semaphore>,
    next_id: std::sync::atomic::AtomicU64,
    /// Node → revision of this replica's last batch write of its document,
    /// while the watch-fed copy may not hold it yet.
    written: Mutex<std::collections::HashMap<String, i64>>,
}

impl Default for StatusQueue {
    fn default() -> Self {
        StatusQueue {
            queue: Mutex::default(),
            committers: Arc::new(Semaphore::new(COMMITTERS)),
            next_id: Default::default(),
            written: Mutex::default(),
        }
    }
}

impl StatusQueue {
    fn push(&self, node: &str, update: Update) -> (u64, oneshot::Receiver<Result<()>>) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        self.lock().push_back(Pending {
            id,
            node: node.to_string(),
            update,
            done,
        });
        (id, rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `nodes` were written at revision `rev`; forgets what the
    /// copy (at `copy_rev`) holds already once many are noted.
    fn note_written(&self, nodes: impl Iterator<Item = String>, rev: i64, copy_rev: i64) {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        for n in nodes {
            w.insert(n, rev);
        }
        if w.len() > WRITTEN_KEPT {
            w.retain(|_, r| *r > copy_rev);
        }
    }

    /// This replica's last batch write of `node`, if the copy may lack it.
    fn last_written(&self, node: &str) -> i64 {
        let w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        w.get(node).copied().unwrap_or(0)
    }

    fn contains(&self, id: u64) -> bool {
        self.lock().iter().any(|p| p.id == id)
    }

    /// Up to [`MAX_BATCH`] reports, each node once, oldest first; a second
    /// report of a node stays queued for the next batch, after the first.
    fn take_batch(&self) -> Vec<Pending> {
        let mut q = self.lock();
        let mut seen = HashSet::new();
        let mut batch = Vec::new();
        let mut rest = VecDeque::with_capacity(q.len());
        while let Some(p) = q.pop_front() {
            if batch.len() < MAX_BATCH && seen.insert(p.node.clone()) {
                batch.push(p);
            } else {
                rest.push_back(p);
            }
        }
        *q = rest;
        batch
    }
}

/// Removes a report from the queue when its caller goes, unless a batch
/// took it already.
struct Unqueue<'a> {
    q: &'a StatusQueue,
    id: u64,
}

impl Drop for Unqueue<'_> {
    fn drop(&mut self) {
        self.q.lock().retain(|p| p.id != self.id);
    }
}

/// What one update makes of its node's documents: the compares its write
/// needs and the write, or nothing when the node is gone.
pub(super) fn node_update(
    store: &EtcdStore,
    name: &str,
    update: &Update,
    node: Option<Doc<serde_json::Value>>,
    desired: Option<Doc<serde_json::Value>>,
) -> Result<Option<(Vec<Compare>, TxnOp)>> {
    let nkey = store.key(&format!("nodes/{name}"));
    let dkey = store.key(&format!("desired/{name}"));
    let doc: Doc<NodeDoc> = typed(&nkey, node)?;
    let desired: Doc<DesiredDoc> = typed(&dkey, desired)?;
    let Some(mut d) = doc.value.clone() else {
        return Ok(None);
    };
    let compares = match update {
        Update::Status(statuses) => {
            let wanted = desired.value.clone().unwrap_or_default().bundles;
            for s in statuses {
                d.actual.insert(s.name.clone(), actual_doc(s));
            }
            // Left out of the report and no longer desired: removed.
            d.actual
                .retain(|b, _| wanted.contains_key(b) || statuses.iter().any(|s| s.name == *b));
            vec![doc.compare(&nkey), desired.compare(&dkey)]
        }
        Update::Connected {
            facts_json,
            held,
            trust,
            reboot,
            now_ms,
        } => {
            d.facts_json = facts_json.as_str().into();
            d.trust = trust.clone().map(Box::new);
            d.reboot = reboot.clone().map(Box::new);
            d.replica = store.replica.clone();
            d.last_seen_ms = d.last_seen_ms.max(*now_ms);
            // The Hello lists everything the node holds.
            d.actual = held.iter().map(|s| (s.name.clone(), actual_doc(s))).collect();
            // The desired state does not enter into it.
            vec![doc.compare(&nkey)]
        }
    };
    Ok(Some((compares, TxnOp::put(nkey, json(&d)?, None))))
}

impl EtcdStore {
    /// Stores an update of `name`'s document, in a batch with the others
    /// that arrive meanwhile.
    pub(super) async fn update_node_batched(&self, name: &str, update: Update) -> Result<()> {
        let q = &self.statuses;
        let (id, mut rx) = q.push(name, update);
        // A caller that is cancelled while its report still waits takes
        // the report back: written later, it could overwrite a newer one
        // the node sent through another stream.
        let _unqueue = Unqueue { q, id };
        loop {
            let permit = q
                .committers
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| StoreError::backend("status queue closed"))?;
            // Another committer may have taken this report meanwhile: its
            // answer is the one to wait for.
            if !q.contains(id) {
                drop(permit);
                return rx.await.unwrap_or_else(|_| {
                    Err(StoreError::Unavailable(
                        "the batch holding this status report was abandoned".into(),
                    ))
                });
            }
            let batch = q.take_batch();
            let store = self.clone();
            let commit = tokio::spawn(async move {
                store.commit_batch(batch).await;
                drop(permit);
            });
            // A panic in it drops the batch's answers: as abandoned.
            let _ = commit.await;
            // Ours was in it, unless a report of the same node queued
            // earlier kept it for the next batch.
            if let Ok(r) = rx.try_recv() {
                return r;
            }
        }
    }

    /// One update on its own, retried while other writers change the
    /// node's documents (the batch's fallback).
    pub(super) async fn update_node_one(&self, name: &str, update: &Update) -> Result<()> {
        for attempt in 0..MAX_ATTEMPTS {
            let nkey = self.key(&format!("nodes/{name}"));
            let dkey = self.key(&format!("desired/{name}"));
            // Both documents in one round trip.
            let mut pair = self
                .get_many::<serde_json::Value>(&[nkey, dkey])
                .await?
                .into_iter();
            let Some((compares, op)) = node_update(self, name, update, pair.next(), pair.next())? else {
                return Ok(());
            };
            if self.txn(compares, vec![op]).await? {
                return Ok(());
            }
            backoff(attempt).await;
        }
        Err(busy(match update {
            Update::Status(_) => "record status",
            Update::Connected { .. } => "update node",
        }))
    }

    /// Writes a batch and answers each of its callers.
    async fn commit_batch(&self, batch: Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        let mut docs = match self.batch_docs(&batch).await {
            Ok(d) => d,
            Err(e) => return answer_all(batch, e),
        };
        let mut batch = batch;
        for attempt in 0..BATCH_ATTEMPTS {
            let mut compares = Vec::with_capacity(batch.len() * 2);
            let mut ops = Vec::with_capacity(batch.len());
            let mut written = Vec::with_capacity(batch.len());
            let mut read = Vec::with_capacity(batch.len() * 2);
            let mut it = docs.into_iter();
            for p in batch {
                let (n, d) = (it.next(), it.next());
                match node_update(self, &p.node, &p.update, n, d) {
                    Ok(Some((c, op))) => {
                        compares.extend(c);
                        ops.push(op);
                        read.push(self.key(&format!("nodes/{}", p.node)));
                        read.push(self.key(&format!("desired/{}", p.node)));
                        written.push(p);
                    }
                    // The node is gone, or its document unreadable: that
                    // answer does not depend on the write.
                    Ok(None) => {
                        let _ = p.done.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = p.done.send(Err(e));
                    }
                }
            }
            if written.is_empty() {
                return;
            }
            // If a compare fails, the same round trip reads the documents
            // again for the next attempt.
            let on_failure = read.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            match self.txn_or_read(compares, ops, on_failure).await {
                Ok(Outcome::Written(rev)) => {
                    let copy_rev = self.cache.loaded().map_or(0, |c| c.rev);
                    self.statuses
                        .note_written(written.iter().map(|p| p.node.clone()), rev, copy_rev);
                    for p in written {
                        let _ = p.done.send(Ok(()));
                    }
                    return;
                }
                Ok(Outcome::Changed(fresh)) if attempt + 1 < BATCH_ATTEMPTS => {
                    docs = fresh;
                    batch = written;
                }
                // Still losing, or a document changed into something
                // unreadable: each on its own, as a single report retries
                // (and says which document).
                Ok(Outcome::Changed(_) | Outcome::Unreadable) => {
                    let each = written.into_iter().map(|p| async move {
                        let r = self.update_node_one(&p.node, &p.update).await;
                        let _ = p.done.send(r);
                    });
                    futures::future::join_all(each).await;
                    return;
                }
                Err(e) => return answer_all(written, e),
            }
        }
    }

    /// One transaction: `ops` if the compares hold, else the reads of
    /// `on_failure`.
    /// The node and desired documents of a batch's nodes, in order (two
    /// per node). Taken from the watch-fed copy for each node whose
    /// documents it holds as of this replica's last write of them: a
    /// round trip and a read of every document less per batch (a replica
    /// taking over a dead one's agents writes thousands of Hellos, each
    /// waiting for its batch). A document someone else changed meanwhile
    /// fails its compare, and the same round trip reads it (`txn_or_read`).
    /// The others, or all when the copy is not loaded, are read from etcd.
    async fn batch_docs(&self, batch: &[Pending]) -> Result<Vec<Doc<serde_json::Value>>> {
        let mut docs: Vec<Option<Doc<serde_json::Value>>> = Vec::with_capacity(batch.len() * 2);
        let mut keys = Vec::new();
        {
            let copy = self.cache.loaded();
            for p in batch {
                // A node the copy does not hold may have been enrolled a
                // moment ago (its Hello follows at once): etcd says.
                let from_copy = match &copy {
                    Some(c) if c.node(&p.node).is_some() && c.rev >= self.statuses.last_written(&p.node) => {
                        Some(c.docs_of(&p.node)?)
                    }
                    _ => None,
                };
                match from_copy {
                    Some([n, d]) => docs.extend([Some(n), Some(d)]),
                    None => {
                        keys.push(self.key(&format!("nodes/{}", p.node)));
                        keys.push(self.key(&format!("desired/{}", p.node)));
                        docs.extend([None, None]);
                    }
                }
            }
        }
        let mut read = if keys.is_empty() {
            Vec::new().into_iter()
        } else {
            self.get_many::<serde_json::Value>(&keys).await?.into_iter()
        };
        docs.into_iter()
            .map(|d| match d {
                Some(d) => Ok(d),
                None => read
                    .next()
                    .ok_or_else(|| StoreError::backend("etcd answered fewer reads than asked")),
            })
            .collect()
    }

    async fn txn_or_read(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
        on_failure: Vec<TxnOp>,
    ) -> Result<Outcome> {
        let wanted = on_failure.len();
        let mut kv = super::kv_of(&self.client);
        let resp = kv
            .txn(Txn::new().when(compares).and_then(ops).or_else(on_failure))
            .await
            .map_err(super::unavailable)?;
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            self.wrote(rev);
            return Ok(Outcome::Written(rev));
        }
        let answers = read_answers(resp, wanted)?;
        for g in &answers {
            if let Some(kv) = g.kvs().first() {
                self.note_read(
                    super::reads::Read::Get,
                    &String::from_utf8_lossy(kv.key()),
                    g.kvs(),
                );
            }
        }
        let mut out = Vec::with_capacity(wanted);
        for g in answers {
            out.push(match g.kvs().first() {
                None => Doc { value: None, rev: 0 },
                Some(kv) => match serde_json::from_slice(kv.value()) {
                    Ok(v) => Doc {
                        value: Some(v),
                        rev: kv.mod_revision(),
                    },
                    Err(_) => return Ok(Outcome::Unreadable),
                },
            });
        }
        Ok(Outcome::Changed(out))
    }
}

/// How a batch's transaction ended.
enum Outcome {
    /// At this revision.
    Written(i64),
    /// A compare failed: the batch's documents as they are now, in order.
    Changed(Vec<Doc<serde_json::Value>>),
    /// A compare failed and a document no longer parses.
    Unreadable,
}

/// The same failure for every report of a batch ([`StoreError::shared`]):
/// `Unavailable` stays so (the agents keep their reports for later),
/// anything else is a failure that keeps `e` as its source.
fn answer_all(batch: Vec<Pending>, e: StoreError) {
    let e = Arc::new(e);
    for p in batch {
        let _ = p.done.send(Err(StoreError::shared(&e)));
    }
}

#[async_trait]
impl NodeStatusStore for EtcdStore {
    async fn node_hello(
        &self,
        name: &str,
        facts_json: &str,
        held: Vec<BundleStatusRow>,
        trust: Option<NodeTrust>,
        reboot: Option<NodeReboot>,
        now_ms: i64,
    ) -> Result<()> {
        self.heard_at
            .fetch_max(now_ms, std::sync::atomic::Ordering::Relaxed);
        // In a batch with the reports and other connects of the moment
        // (`status.rs`): a replica taking over a dead one's agents opens
        // thousands of streams at once.
        let update = Update::Connected {
            facts_json: facts_json.to_string(),
            held,
            trust,
            reboot,
            now_ms,
        };
        self.update_node_batched(name, update).await
    }

    async fn node_disconnected(&self, name: &str, now_ms: i64) -> Result<()> {
        // The node document names no replica from now on, so its own time
        // is its last-seen time: not before what it showed through this
        // replica's `heard/ID` (a clock that stepped back).
        let heard = self.heard_at.load(std::sync::atomic::Ordering::Relaxed);
        self.update_node(name, |d| {
            // Another replica may hold the node's newer stream.
            if d.replica != self.replica {
                return false;
            }
            d.replica.clear();
            d.last_seen_ms = d.last_seen_ms.max(now_ms).max(heard);
            true
        })
        .await
    }

    async fn record_trust(&self, name: &str, trust: NodeTrust) -> Result<()> {
        self.update_node(name, |d| {
            if d.trust.as_deref() == Some(&trust) {
                return false;
            }
            d.trust = Some(Box::new(trust.clone()));
            true
        })
        .await
    }

    async fn record_reboot(&self, name: &str, reboot: NodeReboot) -> Result<()> {
        self.update_node(name, |d| {
            if d.reboot.as_deref() == Some(&reboot) {
                return false;
            }
            d.reboot = Some(Box::new(reboot.clone()));
            true
        })
        .await
    }

    async fn record_status(&self, name: &str, statuses: Vec<BundleStatusRow>) -> Result<()> {
        self.update_node_batched(name, Update::Status(statuses)).await
    }

    async fn touch_nodes(&self, seen: Vec<(String, i64)>) -> Result<()> {
        if let Some(at) = seen.iter().map(|(_, t)| *t).max() {
            self.heard_at.fetch_max(at, std::sync::atomic::Ordering::Relaxed);
        }
        self.flush_heard().await
    }

    /// Connection state is tied to each replica's lease, and a replica's id
    /// is new at every start, so there is nothing to reset: a node shows
    /// connected only while the replica holding its stream is alive.
    async fn mark_all_disconnected(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lks_store::{ClusterStore, NodeStore, TokenStore};

    /// A row saying `name@version` is applied.
    fn applied(name: &str, version: &str) -> BundleStatusRow {
        BundleStatusRow {
            fetched_from_server: 0,
            fetched_from_peers: 0,
            fetched_as_delta: 0,
            name: name.into(),
            version: version.into(),
            state: lks_proto::BundleState::Applied,
            message: String::new(),
            updated_at_ms: 5,
            generation: 0,
        }
    }

    /// etcd's current revision.
    async fn rev(s: EtcdStore) -> i64 {
        let mut kv = crate::kv_of(&s.client);
        kv.get("none", None).await.unwrap().header().unwrap().revision()
    }

    fn queued(q: &StatusQueue, node: &str) -> oneshot::Receiver<Result<()>> {
        q.push(node, Update::Status(Vec::new())).1
    }

    #[test]
    fn a_batch_holds_each_node_once_and_keeps_the_order() {
        let q = StatusQueue::default();
        let _a1 = queued(&q, "a");
        let _b = queued(&q, "b");
        let _a2 = queued(&q, "a");
        let _c = queued(&q, "c");
        let names = |v: &[Pending]| v.iter().map(|p| p.node.clone()).collect::<Vec<_>>();
        let first = q.take_batch();
        assert_eq!(names(&first), ["a", "b", "c"]);
        // The second report of `a` waits for the next batch.
        let second = q.take_batch();
        assert_eq!(names(&second), ["a"]);
        assert!(second[0].id > first[0].id);
        assert!(q.take_batch().is_empty());
    }

    #[test]
    fn a_batch_is_at_most_max_batch_reports() {
        let q = StatusQueue::default();
        let _rx: Vec<_> = (0..MAX_BATCH + 5).map(|i| queued(&q, &format!("n{i}"))).collect();
        assert_eq!(q.take_batch().len(), MAX_BATCH);
        assert_eq!(q.take_batch().len(), 5);
    }

    /// Many agents reporting at once, each twice in a row, while the leader
    /// changes some of their documents: every node ends with its last
    /// report, the writes went out in batches, and a batch that lost to a
    /// concurrent change fell back without losing a report.
    #[tokio::test]
    async fn concurrent_reports_are_batched_and_none_is_lost() {
        use crate::tests::{TestEtcd, new_node, token};
        use lks_store::{EventRow, NewCluster};

        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        s.create_token(token("tok000", None)).await.unwrap();
        let nodes: Vec<String> = (0..150).map(|i| format!("n{i:03}")).collect();
        for n in &nodes {
            s.enroll_node(new_node(n, "tok000")).await.unwrap();
        }
        let report = |version: &str| vec![applied("b", version)];
        let before = rev(s.clone()).await;
        let mut tasks = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let (s, n) = (s.clone(), n.clone());
            let (r1, r2) = (report("1"), report("2"));
            tasks.push(tokio::spawn(async move {
                s.record_status(&n, r1).await.unwrap();
                // Every tenth node is held by the leader meanwhile.
                if i % 10 == 0 {
                    let ev = EventRow {
                        id: 0,
                        at_ms: 6,
                        cluster: "c".into(),
                        node: n.clone(),
                        rollout_id: String::new(),
                        kind: "node_held".into(),
                        bundle: String::new(),
                        version: String::new(),
                        message: String::new(),
                    };
                    let hold = s.clone();
                    let n2 = n.clone();
                    let held =
                        tokio::spawn(async move { hold.set_node_hold(&n2, Some("x".into()), ev).await });
                    s.record_status(&n, r2).await.unwrap();
                    assert!(held.await.unwrap().unwrap());
                } else {
                    s.record_status(&n, r2).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let writes = rev(s.clone()).await - before;
        for (i, n) in nodes.iter().enumerate() {
            let row = s.get_node(n).await.unwrap().unwrap();
            assert_eq!(row.actual["b"].version, "2", "{n}");
            assert_eq!(row.hold.is_some(), i % 10 == 0, "{n}");
        }
        // 300 reports and 15 holds: one at a time would be 315 revisions
        // (measured: 22 with batches).
        assert!(writes < 80, "{writes} revisions for 300 reports: not batched");
    }

    /// A replica taking over a dead one's agents: many streams open at
    /// once, while the leader assigns some of those nodes a new desired
    /// state. The connects go out in batches, none is lost, each node's
    /// document says what its Hello said (facts, this replica, the rows it
    /// holds replaced), and a desired-state change does not make a
    /// connect fail or retry alone (it is not compared).
    #[tokio::test]
    async fn concurrent_connects_are_batched_and_each_node_says_what_its_hello_said() {
        use crate::tests::{TestEtcd, new_node, token};
        use lks_store::NewCluster;

        let etcd = TestEtcd::start();
        let s = etcd.store("r2").await;
        let leader = etcd.store("r1").await;
        s.create_cluster(NewCluster::new("c", 1)).await.unwrap();
        s.create_token(token("tok000", None)).await.unwrap();
        let nodes: Vec<String> = (0..120).map(|i| format!("n{i:03}")).collect();
        for n in &nodes {
            s.enroll_node(new_node(n, "tok000")).await.unwrap();
        }
        let row = |name: &str| applied(name, "1");
        // Each node first reported a bundle its next Hello no longer lists.
        for n in &nodes {
            s.record_status(n, vec![row("old")]).await.unwrap();
        }
        let before = rev(s.clone()).await;
        let mut tasks = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let (s, leader, n) = (s.clone(), leader.clone(), n.clone());
            tasks.push(tokio::spawn(async move {
                let facts = format!("{{\"hostname\":\"{n}\"}}");
                let connect = s.node_connected(&n, &facts, vec![row("new")], 1_000 + i as i64);
                if i % 10 == 0 {
                    // The leader writes the node's desired state meanwhile.
                    let assign = async {
                        let dkey = leader.key(&format!("desired/{n}"));
                        let mut d = leader.get::<DesiredDoc>(&dkey).await.unwrap().value.unwrap();
                        d.bundles.insert("app", crate::name::Name::from("2"));
                        d.generation += 1;
                        let mut kv = crate::kv_of(&leader.client);
                        kv.put(dkey, json(&d).unwrap(), None).await.unwrap();
                    };
                    let (c, ()) = tokio::join!(connect, assign);
                    c.unwrap();
                } else {
                    connect.await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let writes = rev(s.clone()).await - before;
        for (i, n) in nodes.iter().enumerate() {
            let node = s.get_node(n).await.unwrap().unwrap();
            assert!(node.facts_json.contains(n.as_str()), "{n}: {}", node.facts_json);
            assert_eq!(
                node.actual.keys().collect::<Vec<_>>(),
                ["new"],
                "{n}: the Hello's rows replace the old ones"
            );
            assert!(node.connected, "{n}: held by a live replica");
            assert!(node.last_seen_ms >= 1_000 + i as i64, "{n}");
        }
        // 120 connects and 12 assignments: one at a time would be 132
        // revisions.
        assert!(writes < 60, "{writes} revisions for 120 connects: not batched");
    }

    /// A caller that goes while its report waits (its stream ended)
    /// takes the report with it.
    #[tokio::test]
    async fn a_cancelled_caller_takes_its_waiting_report_back() {
        use crate::tests::TestEtcd;
        let etcd = TestEtcd::start();
        let s = etcd.store("r1").await;
        // Both committers busy: a report can only wait.
        let held = s
            .statuses
            .committers
            .clone()
            .acquire_many_owned(COMMITTERS as u32)
            .await
            .unwrap();
        let waiting = {
            let s = s.clone();
            tokio::spawn(async move { s.update_node_batched("n1", Update::Status(Vec::new())).await })
        };
        while s.statuses.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        assert!(s.statuses.lock().is_empty(), "the report left with its caller");
        drop(held);
    }

    #[test]
    fn a_failed_batch_answers_every_report() {
        let q = StatusQueue::default();
        let mut rx = [queued(&q, "a"), queued(&q, "b")];
        answer_all(q.take_batch(), StoreError::Unavailable("etcd: down".into()));
        for r in &mut rx {
            assert!(matches!(r.try_recv(), Ok(Err(StoreError::Unavailable(m))) if m == "etcd: down"));
        }
    }
}
