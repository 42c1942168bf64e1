//! A replica's watch-fed copy of what rollout steps read — node documents,
//! desired states, the live replicas, when each replica last heard its
//! agents (and the last-seen documents of the version before) and the
//! rollouts being driven — so that the leader's step
//! ([`EtcdStore::rollouts_to_drive`], [`EtcdStore::rollout_views`]) reads
//! nothing from etcd: not the whole `nodes/` and `desired/` ranges, and not
//! every driven rollout's document (~100 KiB at 1,000 nodes, an estimate)
//! at every step. During a rollout to 10,000 nodes etcd sent its clients
//! 30 MiB/s before this, 17 times what was written; these re-reads were,
//! by count, a large part of it (BENCHMARKS.md, "Where a rollout's time
//! went"). A decision taken on the copy is checked at commit against
//! etcd's own read of the rollout.
//!
//! Consistency with etcd's revisions:
//! - the copy is loaded as one snapshot (every range read at one revision
//!   R), and the watch starts at R + 1, so no change falls between them;
//! - an event at a revision the copy already covers is skipped, so a
//!   reload while the watch runs never goes back in time;
//! - a read waits until the copy holds this replica's own newest write
//!   (read-your-writes: the leader's next step sees its last decision).
//!   If that write's revision does not show within [`SHORT_WAIT`] (it
//!   touched no watched key), one transaction of compares, with no data,
//!   proves that no watched key was written since the copy's revision; a
//!   copy that is not loaded (start, a compacted watch) or does not catch
//!   up within [`CATCH_UP`] is not used: the view is read from etcd (at
//!   once when the copy is not loaded). What
//!   other replicas wrote reaches the copy within the watch's delay
//!   (milliseconds), the same window in which a direct read is stale by the
//!   time its decision commits;
//! - the copy is loaded again after a compaction that outran the watch,
//!   and every [`RELOAD_EVERY`] anyway, which also mends a copy that missed
//!   an event for any reason.
//!
//! [`EtcdStore::watch_changes`] runs the watch: it feeds the copy and tells
//! its caller what changed (the replica wires that to agent streams and the
//! rollout controller).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use etcd_client::{Event, EventType, WatchOptions, WatchResponse, WatchStream};
use tokio_util::sync::CancellationToken;

use etcd_client::{Compare, CompareOp, GetOptions, Txn};
use serde::de::DeserializeOwned;

use lks_store::{Result, RolloutRow, StoreError};

use crate::docs::{DesiredDoc, HeardDoc, NodeDoc};
use crate::rolloutdocs::{RolloutDoc, RolloutNodeDoc};
use crate::seen::Liveness;
use crate::{Doc, EtcdStore, corrupt, kv_of, name, reads, unavailable};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a read waits for the copy to hold this replica's own writes
/// before it reads etcd instead.
pub const CATCH_UP: Duration = Duration::from_secs(2);
/// How long it waits before it checks with etcd whether it needs to.
pub const SHORT_WAIT: Duration = Duration::from_millis(100);
/// The copy is loaded afresh this often.
pub const RELOAD_EVERY: Duration = Duration::from_secs(300);

/// The documents a rollout step reads, as of `rev`.
#[derive(Default)]
pub(super) struct CacheState {
    /// The revision the copy reflects (0: not loaded).
    pub rev: i64,
    /// Each node's documents, by name: its node document and its desired
    /// state in one entry (either may be absent: a desired state can be
    /// written before its node document, or outlive it). Boxed: a map's
    /// table has a power of two of slots, often about half of them empty,
    /// and an empty slot costs what a full one does (at 30,000 nodes,
    /// 65,536 slots: the node and desired documents inline in two maps
    /// cost ~800 bytes a node in slots alone). Read through
    /// [`CacheState::node`],
    /// [`CacheState::desired`] and [`CacheState::nodes`].
    held: HashMap<Box<str>, Box<Held>>,
    /// The names the node documents share: clusters, bundles, versions
    /// (one allocation each; a reload starts afresh, so names no longer
    /// used go with it).
    names: name::Names,
    pub replicas: BTreeSet<String>,
    /// Replica → when it last heard its agents (`heard/ID`).
    pub heard: HashMap<String, i64>,
    /// `seen/ID` of replicas of the version before `heard/`.
    pub seen: HashMap<String, HashMap<String, i64>>,
    /// The rollouts the leader drives (`drive/ID`).
    pub drive: BTreeSet<String>,
    /// The headers of those rollouts, as stored (parsed when read: only
    /// the leader reads them often). A header that arrives without its
    /// drive key is dropped at the end of its watch answer
    /// ([`CacheState::keep_driven`]); the history of ended rollouts is not
    /// kept. With each, the revision it was written at: admin reads and
    /// the leader's commits use a copy only while etcd says it is current
    /// ([`EtcdStore::rollout`]).
    pub rollouts: HashMap<String, (i64, Arc<[u8]>)>,
    /// The node rows of those rollouts (`rnodes/ID/NODE`), for each
    /// rollout whose rows the copy holds whole: loaded with the copy, or
    /// read once by the watch when a rollout becomes driven (`fill`); rows
    /// of a rollout not held here are ignored.
    pub rows: HashMap<String, BTreeMap<String, RolloutNodeDoc>>,
    /// Driven rollouts whose rows the watch has yet to read: not used
    /// until it has.
    pub fill: BTreeSet<String>,
}

/// A node's documents as the copy holds them; an entry holds one or both.
#[derive(Default)]
struct Held {
    node: Option<NodeDoc>,
    desired: Option<DesiredDoc>,
    /// The documents' `mod_revision`s (0: absent), for a write computed
    /// from the copy to compare against (`status.rs`).
    node_rev: i64,
    desired_rev: i64,
}

/// A document the copy could not read.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {source}")]
struct Unreadable {
    key: String,
    source: serde_json::Error,
}

impl CacheState {
    /// Applies one change of the key `rest` (below the store's prefix);
    /// `value` is `None` for a deletion. Keys it does not keep are ignored.
    /// `mod_rev` is the revision of the change.
    fn apply(
        &mut self,
        rest: &str,
        value: Option<&[u8]>,
        mod_rev: i64,
    ) -> std::result::Result<(), Unreadable> {
        fn parse<T: DeserializeOwned>(rest: &str, v: &[u8]) -> std::result::Result<T, Unreadable> {
            serde_json::from_slice(v).map_err(|source| Unreadable {
                key: rest.to_string(),
                source,
            })
        }
        if let Some(n) = rest.strip_prefix("nodes/") {
            let mut doc: Option<NodeDoc> = value.map(|v| parse(rest, v)).transpose()?;
            if let Some(d) = &mut doc {
                d.cluster = self.names.intern(&d.cluster);
                d.actual
                    .intern(&mut self.names, |names, a| a.version = names.intern(&a.version));
            }
            self.hold(n, |h| {
                h.node_rev = if doc.is_some() { mod_rev } else { 0 };
                h.node = doc;
            });
        } else if let Some(n) = rest.strip_prefix("desired/") {
            let mut doc: Option<DesiredDoc> = value.map(|v| parse(rest, v)).transpose()?;
            if let Some(d) = &mut doc {
                d.bundles.intern(&mut self.names, |names, v| *v = names.intern(v));
                d.retry.intern(&mut self.names, |_, _| {});
            }
            self.hold(n, |h| {
                h.desired_rev = if doc.is_some() { mod_rev } else { 0 };
                h.desired = doc;
            });
        } else if let Some(r) = rest.strip_prefix("replicas/") {
            match value {
                Some(_) => drop(self.replicas.insert(r.to_string())),
                None => drop(self.replicas.remove(r)),
            }
        } else if let Some(r) = rest.strip_prefix("heard/") {
            match value {
                Some(v) => drop(
                    self.heard
                        .insert(r.to_string(), parse::<HeardDoc>(rest, v)?.at_ms),
                ),
                None => drop(self.heard.remove(r)),
            }
        } else if let Some(r) = rest.strip_prefix("seen/") {
            match value {
                Some(v) => drop(self.seen.insert(r.to_string(), parse(rest, v)?)),
                None => drop(self.seen.remove(r)),
            }
        } else if let Some(id) = rest.strip_prefix("drive/") {
            match value {
                Some(_) => {
                    self.drive.insert(id.to_string());
                    if !self.rows.contains_key(id) {
                        self.fill.insert(id.to_string());
                    }
                }
                None => {
                    self.drive.remove(id);
                    self.rollouts.remove(id);
                    self.rows.remove(id);
                    self.fill.remove(id);
                }
            }
        } else if let Some((id, node)) = rest.strip_prefix("rnodes/").and_then(|r| r.split_once('/')) {
            if let Some(rows) = self.rows.get_mut(id) {
                match value {
                    Some(v) => drop(rows.insert(node.to_string(), parse(rest, v)?)),
                    None => drop(rows.remove(node)),
                }
            }
        } else if let Some(id) = rest.strip_prefix("rollouts/") {
            match value {
                Some(v) => drop(self.rollouts.insert(id.to_string(), (mod_rev, Arc::from(v)))),
                None => drop(self.rollouts.remove(id)),
            }
        }
        Ok(())
    }

    /// Changes what the copy holds of node `name` with `f`; an entry left
    /// with neither document is removed.
    fn hold(&mut self, name: &str, f: impl FnOnce(&mut Held)) {
        match self.held.get_mut(name) {
            Some(h) => {
                f(h);
                if h.node.is_none() && h.desired.is_none() {
                    self.held.remove(name);
                }
            }
            None => {
                let mut h = Box::<Held>::default();
                f(&mut h);
                if h.node.is_some() || h.desired.is_some() {
                    self.held.insert(name.into(), h);
                }
            }
        }
    }

    /// Node `name`'s document.
    pub fn node(&self, name: &str) -> Option<&NodeDoc> {
        self.held.get(name)?.node.as_ref()
    }

    /// Node `name`'s desired state.
    pub fn desired(&self, name: &str) -> Option<&DesiredDoc> {
        self.held.get(name)?.desired.as_ref()
    }

    /// Node `name`'s node and desired documents with their revisions, as
    /// the store's reads give them (`value: None, rev: 0` if absent).
    pub(super) fn docs_of(&self, name: &str) -> Result<[Doc<serde_json::Value>; 2]> {
        let doc = |v: Option<serde_json::Value>, rev: i64| match v {
            Some(v) => Doc { value: Some(v), rev },
            None => Doc { value: None, rev: 0 },
        };
        let encode = |e: serde_json::Error| StoreError::backend_at("encode", e);
        let Some(h) = self.held.get(name) else {
            return Ok([doc(None, 0), doc(None, 0)]);
        };
        let node = h
            .node
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(encode)?;
        let desired = h
            .desired
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(encode)?;
        Ok([doc(node, h.node_rev), doc(desired, h.desired_rev)])
    }

    /// Every node document, with its node's name, in no order.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeDoc)> {
        self.held
            .iter()
            .filter_map(|(n, h)| Some((&**n, h.node.as_ref()?)))
    }

    /// Forgets rollout documents whose rollout is not driven (ended, or
    /// never driven): called once a watch answer is applied, as a rollout
    /// and its drive key are written in one transaction.
    fn keep_driven(&mut self) {
        let drive = &self.drive;
        self.rollouts.retain(|id, _| drive.contains(id));
        self.rows.retain(|id, _| drive.contains(id));
        self.fill.retain(|id| drive.contains(id));
    }

    /// The driven rollouts, oldest first as the store lists them; `None`
    /// if the copy does not hold one of them whole yet.
    pub fn driven_rollouts(&self) -> Option<Result<Vec<RolloutRow>>> {
        let mut out = Vec::with_capacity(self.drive.len());
        for id in &self.drive {
            // Driven, but its header is gone: as a direct read finds it.
            if !self.rollouts.contains_key(id) {
                continue;
            }
            match self.driven_rollout(id)? {
                Ok((r, _, _)) => out.push(r),
                Err(e) => return Some(Err(e)),
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Some(Ok(out))
    }

    /// One driven rollout, its header's revision and whether it is stored
    /// with its rows inline; `None` if the copy does not hold it whole (not
    /// driven, as an ended rollout, or its rows not read yet): the caller
    /// reads etcd.
    pub fn driven_rollout(&self, id: &str) -> Option<Result<(RolloutRow, i64, bool)>> {
        let (rev, bytes) = self.rollouts.get(id)?;
        if self.fill.contains(id) {
            return None;
        }
        let key = format!("rollouts/{id}");
        let doc = match serde_json::from_slice::<RolloutDoc>(bytes) {
            Ok(d) => d,
            Err(e) => return Some(Err(corrupt(&key, e))),
        };
        let inline = !doc.rows;
        let rows = if inline {
            Vec::new()
        } else {
            self.rows.get(id)?.values().cloned().collect()
        };
        Some(doc.into_row(id, rows).map(|r| (r, *rev, inline)))
    }

    fn liveness(&self) -> Liveness {
        Liveness {
            replicas: self.replicas.clone(),
            heard: self.heard.clone(),
            legacy: Liveness::fold_legacy(self.seen.values()),
        }
    }
}

/// The copy, and a channel that says which revision it reached.
pub(super) struct ViewCache {
    state: RwLock<CacheState>,
    rev: tokio::sync::watch::Sender<i64>,
}

impl ViewCache {
    /// The copy as it is now, once loaded (no wait for it to catch up:
    /// callers check what they take against revisions).
    pub(super) fn loaded(&self) -> Option<std::sync::RwLockReadGuard<'_, CacheState>> {
        self.state.read().ok().filter(|c| c.rev > 0)
    }
}

impl Default for ViewCache {
    fn default() -> Self {
        ViewCache {
            state: RwLock::default(),
            rev: tokio::sync::watch::channel(0).0,
        }
    }
}

/// What changed, as the watch tells its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<'a> {
    /// A node's desired state changed.
    Desired(&'a str),
    /// A node document changed (report, connection) or was deleted.
    Node { name: &'a str, deleted: bool },
    /// A rollout document changed.
    Rollout,
    /// A replica came or went.
    Replicas,
    /// The watch started afresh: anything may have changed.
    Resync,
}

/// The keys the watch covers: `desired/` up to and including `seen/`
/// (desired, drive, heard, identity, leader, load, meta, nodes, replicas,
/// rollouts, seen; and `events/` of a replica not yet upgraded), not blob
/// chunks or records, nor the event log (`timeline/`, `events.rs`).
const WATCH_FROM: &str = "desired/";
const WATCH_TO: &str = "seen0";

impl EtcdStore {
    /// Loads the copy as one snapshot; the revision it was read at.
    pub async fn cache_load(&self) -> Result<i64> {
        let mut kv = crate::kv_of(&self.client);
        let first = kv
            .get(self.key("nodes/"), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let rev = first.header().map_or(0, |h| h.revision());
        let mut state = CacheState {
            rev,
            ..Default::default()
        };
        let load = |state: &mut CacheState, kvs: &[etcd_client::KeyValue]| -> Result<()> {
            if let Some(first) = kvs.first() {
                self.note_read(reads::Read::Range, &String::from_utf8_lossy(first.key()), kvs);
            }
            for item in kvs {
                let key = String::from_utf8_lossy(item.key());
                let rest = key.strip_prefix(&self.prefix).unwrap_or(&key).to_string();
                state
                    .apply(&rest, Some(item.value()), item.mod_revision())
                    .map_err(|e| corrupt(&rest, e))?;
            }
            Ok(())
        };
        load(&mut state, first.kvs())?;
        for p in ["desired/", "replicas/", "heard/", "seen/", "drive/"] {
            let resp = kv
                .get(
                    self.key(p),
                    Some(GetOptions::new().with_prefix().with_revision(rev)),
                )
                .await
                .map_err(unavailable)?;
            load(&mut state, resp.kvs())?;
        }
        // The driven rollouts' documents, at the same revision (not the
        // whole `rollouts/` history).
        let driven: Vec<String> = state.drive.iter().cloned().collect();
        for id in driven {
            let resp = kv
                .get(
                    self.key(&format!("rollouts/{id}")),
                    Some(GetOptions::new().with_revision(rev)),
                )
                .await
                .map_err(unavailable)?;
            load(&mut state, resp.kvs())?;
            let rows = self.rows_at(&id, rev).await?;
            state.fill.remove(&id);
            state
                .rows
                .insert(id, rows.into_iter().map(|r| (r.name.clone(), r)).collect());
        }
        if let Ok(mut s) = self.cache.state.write() {
            *s = state;
        }
        self.cache.rev.send_replace(rev);
        Ok(rev)
    }

    /// Forgets the copy (reads go to etcd until it is loaded again).
    pub fn cache_invalidate(&self) {
        if let Ok(mut s) = self.cache.state.write() {
            *s = CacheState::default();
        }
        self.cache.rev.send_replace(0);
    }

    /// Applies one watched event at `mod_rev`, unless the copy is not
    /// loaded or already covers it.
    fn cache_event(&self, rest: &str, value: Option<&[u8]>, mod_rev: i64) {
        let Ok(mut s) = self.cache.state.write() else {
            return;
        };
        if s.rev == 0 || mod_rev <= s.rev {
            return;
        }
        if let Err(e) = s.apply(rest, value, mod_rev) {
            tracing::warn!(error = %e, "etcd watch: an unreadable document; the view copy is reloaded");
            *s = CacheState::default();
            self.cache.rev.send_replace(0);
        }
    }

    /// The copy reflects everything up to `rev` (the last event applied).
    fn cache_advance(&self, rev: i64) {
        let Ok(mut s) = self.cache.state.write() else {
            return;
        };
        if s.rev > 0 && rev > s.rev {
            s.keep_driven();
            s.rev = rev;
            drop(s);
            self.cache.rev.send_replace(rev);
        }
    }

    /// Notes a revision this replica wrote.
    pub(super) fn wrote(&self, rev: i64) {
        self.written.fetch_max(rev, std::sync::atomic::Ordering::Relaxed);
    }

    /// True if no watched key was put after `rev` (one transaction of
    /// compares on the prefixes, reading no data). `heard/` is left out on
    /// purpose: every replica writes it every few seconds, and a copy a
    /// few seconds behind on it is off only in last-seen times by as much.
    async fn nothing_watched_changed_since(&self, rev: i64) -> bool {
        let compares: Vec<Compare> = [
            "nodes/",
            "desired/",
            "replicas/",
            "seen/",
            "drive/",
            "rollouts/",
            "rnodes/",
        ]
        .iter()
        .map(|p| Compare::mod_revision(self.key(p), CompareOp::Less, rev + 1).with_prefix())
        .collect();
        let mut kv = crate::kv_of(&self.client);
        matches!(kv.txn(Txn::new().when(compares)).await, Ok(r) if r.succeeded())
    }

    /// A rollout as etcd holds it now, with its header's revision, taken
    /// from the copy when the copy has that revision: etcd is asked for the
    /// header's revision alone (`keys_only`, still a linearizable read,
    /// ~100 bytes) and sends the rollout only when the copy's is not
    /// current, e.g. an ended rollout, which the copy does not keep. Every
    /// row is written with its header (module `rollouts`), so a current
    /// header means current rows. An admin read (`rollout status`, a load
    /// generator polling its rollouts) and the leader's commit get what a
    /// plain read would, for a fraction of what etcd sends.
    pub(super) async fn rollout(&self, id: &str) -> Result<Option<(RolloutRow, i64)>> {
        Ok(self.rollout_as_stored(id).await?.map(|(r, rev, _)| (r, rev)))
    }

    /// [`Self::rollout`], and whether it is stored with its rows inline.
    pub(super) async fn rollout_as_stored(&self, id: &str) -> Result<Option<(RolloutRow, i64, bool)>> {
        let copied = self.cache.state.read().ok().and_then(|s| s.driven_rollout(id));
        if let Some(Ok((row, rev, inline))) = copied {
            let key = self.key(&format!("rollouts/{id}"));
            let resp = kv_of(&self.client)
                .get(key, Some(GetOptions::new().with_keys_only()))
                .await
                .map_err(unavailable)?;
            match resp.kvs().first() {
                None => return Ok(None),
                Some(kv) if kv.mod_revision() == rev => return Ok(Some((row, rev, inline))),
                Some(_) => {}
            }
        }
        self.rollout_from_etcd_as_stored(id).await
    }

    /// A node's desired document as the watch-fed copy holds it now, if the
    /// copy is loaded (no wait for it to catch up).
    pub(super) fn cached_desired(&self, node: &str) -> Option<DesiredDoc> {
        let s = self.cache.state.read().ok()?;
        if s.rev == 0 {
            return None;
        }
        s.desired(node).cloned()
    }

    /// Reads the rows of the rollouts that became driven in a watch answer
    /// whose last event is at `rev`, as etcd held them at `rev`.
    async fn cache_fill(&self, rev: i64) -> Result<()> {
        let pending: Vec<String> = match self.cache.state.read() {
            Ok(s) if s.rev > 0 => s.fill.iter().cloned().collect(),
            _ => return Ok(()),
        };
        for id in pending {
            let rows = self.rows_at(&id, rev).await?;
            let Ok(mut s) = self.cache.state.write() else {
                return Ok(());
            };
            if s.drive.contains(&id) && s.fill.remove(&id) {
                s.rows
                    .insert(id, rows.into_iter().map(|r| (r.name.clone(), r)).collect());
            }
        }
        Ok(())
    }

    /// Runs `f` on the copy once it holds this replica's own writes;
    /// `None` if it is not loaded or does not catch up in time.
    pub(super) async fn with_cache<T>(&self, f: impl FnOnce(&CacheState, &Liveness) -> T) -> Option<T> {
        let want = self.written.load(std::sync::atomic::Ordering::Relaxed);
        let mut rx = self.cache.rev.subscribe();
        // Not loaded (no watch yet, or a reload under way): etcd at once.
        if *rx.borrow() == 0 {
            return None;
        }
        let reached = |r: &i64| *r > 0 && *r >= want;
        if tokio::time::timeout(SHORT_WAIT, rx.wait_for(reached))
            .await
            .is_err()
        {
            let at = *rx.borrow();
            let fresh = at > 0 && self.nothing_watched_changed_since(at).await;
            if !fresh
                && !matches!(
                    tokio::time::timeout(CATCH_UP, rx.wait_for(reached)).await,
                    Ok(Ok(_))
                )
            {
                return None;
            }
        }
        let s = self.cache.state.read().ok()?;
        if s.rev == 0 {
            return None;
        }
        let live = s.liveness();
        Some(f(&s, &live))
    }

    /// Watches the keys that matter to a replica until `cancel` fires,
    /// feeding the view copy and telling `on` what changed. Re-establishes
    /// itself after errors, resuming where it was (or reloading the copy
    /// and reporting [`Change::Resync`] when etcd compacted the history it
    /// needed).
    pub async fn watch_changes(&self, cancel: &CancellationToken, on: impl FnMut(Change<'_>)) {
        self.watch_from(0, cancel, on).await;
    }

    /// [`Self::watch_changes`] resuming at `next_rev` (0: from a fresh
    /// snapshot) with the copy as it is.
    async fn watch_from(
        &self,
        mut next_rev: i64,
        cancel: &CancellationToken,
        mut on: impl FnMut(Change<'_>),
    ) {
        let mut loaded_at = tokio::time::Instant::now();
        let mut warned = false;
        loop {
            if cancel.is_cancelled() {
                return;
            }
            if next_rev == 0 {
                // A fresh start: the copy from one snapshot, the watch
                // right after it; anything may have changed meanwhile.
                if let Some(rev) = self.load_copy().await {
                    next_rev = rev + 1;
                    loaded_at = tokio::time::Instant::now();
                }
                on(Change::Resync);
            }
            let Some(mut stream) = self.open_watch(next_rev, &mut warned).await else {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            };
            loop {
                let msg = tokio::select! {
                    _ = cancel.cancelled() => return,
                    m = stream.message() => m,
                };
                let resp = match msg {
                    Ok(Some(r)) => r,
                    Ok(None) | Err(_) => {
                        if !warned {
                            tracing::warn!("etcd watch ended; re-establishing");
                            warned = true;
                        }
                        break;
                    }
                };
                if resp.compact_revision() > 0 {
                    // History we needed is gone: start over from a snapshot.
                    self.cache_invalidate();
                    next_rev = 0;
                    break;
                }
                if resp.canceled() {
                    break;
                }
                for ev in resp.events() {
                    self.apply_event(ev, &mut next_rev, &mut on);
                }
                if !self.advance_copy(&resp).await {
                    next_rev = 0;
                    break;
                }
                // The safety net: a fresh snapshot now and then. Events the
                // watch then replays are older than it and skipped.
                if loaded_at.elapsed() >= RELOAD_EVERY {
                    loaded_at = tokio::time::Instant::now();
                    if let Err(e) = self.cache_load().await {
                        tracing::debug!(error = %e, "reload the view copy");
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Loads the copy from one snapshot; its revision, or `None` (the copy
    /// invalidated) if etcd did not answer.
    async fn load_copy(&self) -> Option<i64> {
        match self.cache_load().await {
            Ok(rev) => Some(rev),
            Err(e) => {
                self.cache_invalidate();
                tracing::debug!(error = %e, "load the view copy");
                None
            }
        }
    }

    /// Opens the watch at `next_rev` (0: from now); `None` if etcd refused
    /// it. Warns once per outage, and says when it is back.
    async fn open_watch(&self, next_rev: i64, warned: &mut bool) -> Option<WatchStream> {
        let mut opts = WatchOptions::new().with_range(self.key(WATCH_TO));
        if next_rev > 0 {
            opts = opts.with_start_revision(next_rev);
        }
        let mut wc = crate::watch_of(&self.client);
        match wc.watch(self.key(WATCH_FROM), Some(opts)).await {
            Ok(w) => {
                if *warned {
                    tracing::info!("etcd watch re-established");
                    *warned = false;
                }
                Some(w)
            }
            Err(e) => {
                if !*warned {
                    tracing::warn!(error = %e, "etcd watch failed; retrying");
                    *warned = true;
                }
                None
            }
        }
    }

    /// One watched event into the copy, and to `on` as the change it is.
    fn apply_event(&self, ev: &Event, next_rev: &mut i64, on: &mut impl FnMut(Change<'_>)) {
        let Some(kv) = ev.kv() else { return };
        *next_rev = (*next_rev).max(kv.mod_revision() + 1);
        let key = String::from_utf8_lossy(kv.key());
        let Some(rest) = key.strip_prefix(&self.prefix) else {
            return;
        };
        let deleted = ev.event_type() == EventType::Delete;
        reads::note(reads::Read::Watch, rest, kv.value().len());
        self.cache_event(rest, (!deleted).then(|| kv.value()), kv.mod_revision());
        if let Some(node) = rest.strip_prefix("desired/") {
            if !deleted {
                on(Change::Desired(node));
            }
        } else if let Some(name) = rest.strip_prefix("nodes/") {
            on(Change::Node { name, deleted });
        } else if rest.starts_with("rollouts/") {
            on(Change::Rollout);
        } else if rest.starts_with("replicas/") {
            on(Change::Replicas);
        }
    }

    /// Says the copy reached the last event of `resp`; false (the copy
    /// invalidated, to reload) if a driven rollout's rows could not be read.
    async fn advance_copy(&self, resp: &WatchResponse) -> bool {
        // The copy reflects the last event applied: a header's
        // revision would say more than was delivered (the `created`
        // answer, or a batch of a watch still catching up).
        if let Some(last) = resp
            .events()
            .iter()
            .filter_map(|e| e.kv())
            .map(|kv| kv.mod_revision())
            .max()
        {
            // Rollouts driven from this answer on: their rows as
            // of it, before the copy says it reached it.
            if let Err(e) = self.cache_fill(last).await {
                tracing::debug!(error = %e, "read a driven rollout's rows; the view copy is reloaded");
                self.cache_invalidate();
                return false;
            }
            self.cache_advance(last);
        }
        true
    }
}

#[cfg(test)]
mod tests;
