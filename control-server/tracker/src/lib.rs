//! The tracker of peer sharing (`FindPeers`): which nodes of a cluster can
//! give a blob to a node that must fetch it.
//!
//! Two kinds of holders are named:
//! - nodes whose last report has a bundle version containing the blob
//!   applied (they hold it whole and verified in their cache);
//! - nodes fetching it now (they asked in the last [`FETCHING_TTL`]); they
//!   serve the chunks they have verified so far, which lets one copy from
//!   the server spread through a batch that starts at once;
//! - for a binary-delta patch (issue [delta]), which no bundle lists: the
//!   nodes that asked this replica for it in the last [`PATCH_HELD_TTL`]
//!   and no longer do (they fetched it, and keep it while its file is
//!   installed).
//!
//! The server stays the seed: a node may fetch from the server itself only
//! while fewer than [`MAX_SEEDS`] connected nodes of its cluster do so for
//! that blob and nobody holds it whole (or when the tracker has nobody to
//! name). The
//! agent falls back to the server on its own when no peer gives it
//! anything for a while, so a wrong answer here costs time, never a
//! rollout.
//!
//! Load is spread by counting how often each node was named lately (halved
//! every [`LOAD_HALF_LIFE`]); nodes on a subnet of the caller come first,
//! then the least named, random among equals. A node reported for serving
//! a bad chunk is not named again for [`BLAME_TTL`].
//!
//! Multi-arch bundles: a node holds, and is named for, only the files of
//! its own architecture and the neutral ones ([`Contents`]), and a node may
//! fetch only those ([`Tracker::blob_allowed`], the check of `FetchBlob`
//! and `FindPeers`).
//!
//! Holders come from the store (the node reports); fetchers and load from
//! this replica's own answers, in memory. With replicas on etcd the
//! fetchers of the other replicas and the one seed of the fleet are shared
//! through etcd ([`ledger`]): a node is named to nodes on any replica, and
//! one node of a cluster fetches a blob from the server, not one per
//! replica.
//!
//! A crate of its own (issue [shape-3]): it links the store's rows and
//! traits and the etcd backend its ledger lives in, never the server.

#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lks_proto::arch::Arch;
use lks_proto::{BundleState, Digest, Manifest};
use lks_store::{BundleStore, DesiredStore, NodeStore, StoreError};
use lks_store_etcd::EtcdStore;

pub mod ledger;

/// How many peers one answer names at most.
pub const MAX_PEERS: usize = 8;
/// How many nodes of a cluster fetch one blob from the server at once: one
/// copy crosses the link at its full rate and the others take it from that
/// node as its pieces arrive (measured against two, which split the link
/// and each fetched nearly all of it: BENCHMARKS.md, "Peer sharing"). A
/// seed that goes away frees its place at once; a node that gets nothing
/// for a while fetches from the server on its own (agent, `STALL`).
pub const MAX_SEEDS: usize = 1;
/// How long a node that asked counts as fetching (agents ask again while
/// they fetch, every few seconds).
pub const FETCHING_TTL: Duration = Duration::from_secs(30);
/// How long a node that asked for a patch (binary delta) is named as
/// holding it, once it no longer asks: agents keep a patch they fetched
/// while the file it rebuilds is installed or desired, and forget it when
/// they restart (then they say so, and the asker goes on).
pub const PATCH_HELD_TTL: Duration = Duration::from_secs(3600);
/// How long a cluster's holders are read from the store again.
const INDEX_TTL: Duration = Duration::from_secs(2);
const LOAD_HALF_LIFE: Duration = Duration::from_secs(10);
/// How long a node that served a bad chunk is not named.
pub const BLAME_TTL: Duration = Duration::from_secs(600);

/// One node the caller may fetch from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: String,
    pub address: SocketAddr,
    /// Holds the blob whole (false: fetching it now).
    pub whole: bool,
}

/// The tracker's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub peers: Vec<Peer>,
    /// The caller may fetch from the server now.
    pub server: bool,
}

#[derive(Default)]
pub struct Tracker {
    inner: Mutex<Inner>,
    /// Replicas on etcd: what the others know ([`ledger`]).
    ledger: Option<ledger::Ledger>,
}

#[derive(Default)]
struct Inner {
    clusters: HashMap<String, Arc<ClusterIndex>>,
    /// bundle@version → its files (versions are immutable).
    contents: HashMap<(String, String), Arc<Contents>>,
    /// (cluster, digest) → node → when it last asked, and whether it was
    /// told to fetch from the server.
    fetching: HashMap<(String, Digest), HashMap<String, (Instant, bool)>>,
    load: HashMap<String, (f64, Instant)>,
    /// (cluster, node) → when a node of that cluster reported it.
    blamed: HashMap<(String, String), Instant>,
}

/// What [`Inner::candidates`] found for one caller.
struct Candidates {
    /// In the order they would be named.
    peers: Vec<Peer>,
    whole_holders: usize,
    /// Connected nodes other than the caller fetching from the server.
    seeds: usize,
    /// The caller was told to fetch from the server last time.
    was_seed: bool,
}

struct ClusterIndex {
    at: Instant,
    nodes: Vec<NodeInfo>,
}

struct NodeInfo {
    name: String,
    connected: bool,
    /// Where its agent listens for peers, if it said (`--peer-listen`).
    listen: Option<SocketAddr>,
    addresses: Vec<IpAddr>,
    /// Bundle versions it reported applied.
    applied: Vec<(String, String)>,
    /// The architecture it reported: whose files of a multi-arch bundle it holds.
    arch: Option<Arch>,
}

/// The files of one bundle version by digest, with the architectures each
/// is for (`None`: arch-neutral).
#[derive(Debug, Default)]
pub struct Contents {
    files: HashMap<Digest, Vec<Option<Arch>>>,
}

impl Contents {
    /// The files of a manifest.
    pub fn of(m: &Manifest) -> Contents {
        let mut files: HashMap<Digest, Vec<Option<Arch>>> = HashMap::new();
        for f in &m.files {
            files.entry(f.digest).or_default().push(f.arch);
        }
        Contents { files }
    }

    /// Whether a node of `arch` installs a file with these bytes: an
    /// arch-neutral one, or one for `arch`.
    pub fn is_for(&self, d: &Digest, arch: Option<Arch>) -> bool {
        self.files
            .get(d)
            .is_some_and(|v| v.iter().any(|a| a.is_none() || (a.is_some() && *a == arch)))
    }

    /// Whether the bytes are an arch-neutral file's (any node may have them).
    fn neutral(&self, d: &Digest) -> bool {
        self.files.get(d).is_some_and(|v| v.iter().any(Option::is_none))
    }
}

impl Tracker {
    /// A tracker for this replica; `etcd`: the replicas' store, through
    /// which they share fetchers and the seed ([`ledger`]).
    pub fn new(etcd: Option<EtcdStore>) -> Tracker {
        Tracker {
            inner: Mutex::default(),
            ledger: etcd.map(ledger::Ledger::new),
        }
    }

    /// Whom `node` of `cluster` may fetch `digest` from. `port`: the
    /// cluster's peer port, for nodes that did not name their own address.
    /// `patch`: `digest` is a binary-delta patch, which no bundle lists;
    /// its holders are the nodes that fetched it ([`PATCH_HELD_TTL`]).
    pub async fn find(
        &self,
        store: &(impl NodeStore + BundleStore + ?Sized),
        cluster: &str,
        node: &str,
        digest: Digest,
        port: u16,
        patch: bool,
    ) -> Result<Answer, StoreError> {
        let index = self.index(store, cluster).await?;
        // The bundle versions applied anywhere in the cluster whose content
        // is not known yet.
        let unknown: Vec<(String, String)> = {
            let g = self.lock();
            let mut seen = HashSet::new();
            index
                .nodes
                .iter()
                .flat_map(|n| n.applied.iter())
                .filter(|bv| !g.contents.contains_key(*bv) && seen.insert((*bv).clone()))
                .cloned()
                .collect()
        };
        for (b, v) in unknown {
            self.contents(store, &b, &v).await?;
        }

        // Other replicas' fetchers (replicas on etcd); on an etcd error,
        // this replica's own view, as a single server has.
        let others_within = |max_age: Duration| async move {
            match &self.ledger {
                Some(l) => l
                    .others_within(cluster, &digest, max_age)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::debug!("peer sharing: other replicas' fetchers: {e}");
                        Arc::default()
                    }),
                None => Arc::default(),
            }
        };
        let now = Instant::now();
        let blob = (digest, patch);
        let mut found = {
            let others = others_within(ledger::REMOTE_TTL).await;
            self.lock()
                .candidates(&index, cluster, node, blob, port, &others, now)
        };
        if self.ledger.is_some() && found.peers.len() < MAX_PEERS {
            // A short answer: at the start of a batch the other replicas'
            // fetchers change by the moment, so they are read fresher.
            let others = others_within(ledger::REMOTE_FRESH).await;
            found = self
                .lock()
                .candidates(&index, cluster, node, blob, port, &others, now);
        }
        let (peers, mut server, fetchers) = {
            let mut g = self.lock();
            let (peers, server) = g.pick(found, now);
            (peers, server, g.fetchers_of(cluster, digest))
        };
        let mut peers = peers;
        if server && let Some(l) = &self.ledger {
            // One seed for the fleet, whichever replica its node is on.
            match l
                .claim_seed(cluster, &digest, node, lks_store::clock::now_ms())
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    server = false;
                    if peers.is_empty() {
                        // The seed is a node this replica has not heard of
                        // yet (other replicas' fetchers are read once a
                        // second): read them now, so it is named.
                        let others = l.others_now(cluster, &digest).await.unwrap_or_default();
                        let mut g = self.lock();
                        peers = g
                            .answer(&index, cluster, node, (digest, patch), port, &others, now)
                            .0;
                    }
                }
                Err(e) => tracing::debug!("peer sharing: seed claim: {e}"),
            }
        }
        let mut fetchers = fetchers;
        fetchers.insert(node.to_string(), server);
        self.lock()
            .fetching
            .entry((cluster.to_string(), digest))
            .or_default()
            .insert(node.to_string(), (now, server));
        if let Some(l) = &self.ledger
            && let Err(e) = l.publish(cluster, &digest, fetchers).await
        {
            tracing::debug!("peer sharing: publish this replica's fetchers: {e}");
        }
        Ok(Answer { peers, server })
    }

    /// The files of `bundle@version`, read once.
    pub async fn contents(
        &self,
        store: &(impl BundleStore + ?Sized),
        bundle: &str,
        version: &str,
    ) -> Result<Arc<Contents>, StoreError> {
        let key = (bundle.to_string(), version.to_string());
        if let Some(c) = self.lock().contents.get(&key) {
            return Ok(c.clone());
        }
        let c = Arc::new(match store.get_bundle(bundle, version).await? {
            Some(row) => Contents::of(row.bundle.manifest()),
            None => Contents::default(),
        });
        self.lock().contents.insert(key, c.clone());
        Ok(c)
    }

    /// Whether `node` may have `digest`: it belongs to a bundle version
    /// the node may hold ([`DesiredStore::blob_grants`]) as an arch-neutral file
    /// or one for the node's architecture. Never another architecture's
    /// binary, whatever the node asks for.
    ///
    /// The node's architecture comes from the cluster's index, which
    /// `FindPeers` keeps anyway ([`INDEX_TTL`]): a `FetchBlob` per piece
    /// then reads no node document. A node not in it yet (enrolled a moment
    /// ago, or without an architecture there) is read from the store.
    pub async fn blob_allowed(
        &self,
        store: &(impl DesiredStore + BundleStore + NodeStore + ?Sized),
        cluster: &str,
        node: &str,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        let grants = store.blob_grants(node, digest).await?;
        let mut arch: Option<Option<Arch>> = None;
        for (b, v) in grants {
            let c = self.contents(store, &b, &v).await?;
            if c.neutral(digest) {
                return Ok(true);
            }
            let a = match arch {
                Some(a) => a,
                None => {
                    let known = self
                        .index(store, cluster)
                        .await?
                        .nodes
                        .iter()
                        .find(|n| n.name == node)
                        .and_then(|n| n.arch);
                    // Not known yet (enrolled or upgraded a moment ago):
                    // the node's own document.
                    let a = match known {
                        Some(a) => Some(a),
                        None => store
                            .get_node(node)
                            .await?
                            .and_then(|n| lks_store::facts_architecture(&n.facts_json)),
                    };
                    *arch.insert(a)
                }
            };
            if a.is_some() && c.is_for(digest, a) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A node of `cluster` says `peer` served it a chunk that did not
    /// match: `peer` is named to the nodes of that cluster no more for a
    /// while (a node can only speak for its own cluster).
    pub fn blame(&self, cluster: &str, peer: &str) {
        self.lock()
            .blamed
            .insert((cluster.to_string(), peer.to_string()), Instant::now());
    }

    /// `node` has the blob (or gave up): no longer a fetcher of it.
    pub fn done(&self, cluster: &str, node: &str, digest: Digest) {
        if let Some(f) = self.lock().fetching.get_mut(&(cluster.to_string(), digest)) {
            f.remove(node);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn index(
        &self,
        store: &(impl NodeStore + ?Sized),
        cluster: &str,
    ) -> Result<Arc<ClusterIndex>, StoreError> {
        if let Some(ix) = self.lock().clusters.get(cluster)
            && ix.at.elapsed() < INDEX_TTL
        {
            return Ok(ix.clone());
        }
        let rows = store.list_nodes(Some(cluster)).await?;
        let nodes = rows
            .into_iter()
            .map(|r| {
                let facts: serde_json::Value = serde_json::from_str(&r.facts_json).unwrap_or_default();
                NodeInfo {
                    arch: lks_store::facts_architecture(&r.facts_json),
                    connected: r.connected,
                    listen: facts["peer_listen"].as_str().and_then(|s| s.parse().ok()),
                    addresses: facts["addresses"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_str()?.parse().ok()).collect())
                        .unwrap_or_default(),
                    applied: r
                        .actual
                        .values()
                        .filter(|s| s.state == BundleState::Applied)
                        .map(|s| (s.name.clone(), s.version.clone()))
                        .collect(),
                    name: r.name,
                }
            })
            .collect();
        let ix = Arc::new(ClusterIndex {
            at: Instant::now(),
            nodes,
        });
        self.lock().clusters.insert(cluster.to_string(), ix.clone());
        Ok(ix)
    }
}

impl Inner {
    /// Whom `node` may fetch `digest` from, and whether from the server
    /// (before a fleet-wide seed claim); `others`: the nodes other
    /// replicas say fetch it (node, from the server).
    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        index: &ClusterIndex,
        cluster: &str,
        node: &str,
        blob: (Digest, bool),
        port: u16,
        others: &[(String, bool)],
        now: Instant,
    ) -> (Vec<Peer>, bool) {
        let c = self.candidates(index, cluster, node, blob, port, others, now);
        self.pick(c, now)
    }

    /// Every node `node` could be told of for `digest` (`patch`: a binary
    /// delta's), nearest and least named first, and what decides whether
    /// it may use the server; nothing is counted yet ([`Inner::pick`]).
    #[allow(clippy::too_many_arguments)]
    fn candidates(
        &mut self,
        index: &ClusterIndex,
        cluster: &str,
        node: &str,
        (digest, patch): (Digest, bool),
        port: u16,
        others: &[(String, bool)],
        now: Instant,
    ) -> Candidates {
        self.blamed.retain(|_, at| now.duration_since(*at) < BLAME_TTL);
        let me = index.nodes.iter().find(|n| n.name == node);
        let my_nets: Vec<IpAddr> = me.map(|n| n.addresses.clone()).unwrap_or_default();
        let key = (cluster.to_string(), digest);
        let fetching = self.fetching.entry(key).or_default();
        let ttl = if patch { PATCH_HELD_TTL } else { FETCHING_TTL };
        fetching.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        // Of a patch, those that asked earlier than FETCHING_TTL ago.
        let asked = fetching.clone();
        let fetching: HashMap<String, (Instant, bool)> = asked
            .iter()
            .filter(|(_, (at, _))| now.duration_since(*at) < FETCHING_TTL)
            .map(|(n, v)| (n.clone(), *v))
            .collect();
        let elsewhere = |n: &str| others.iter().any(|(o, _)| o == n);

        // Of a multi-arch bundle a node holds only its own variant.
        let holds = |n: &NodeInfo, g: &Inner| {
            n.applied
                .iter()
                .any(|bv| g.contents.get(bv).is_some_and(|c| c.is_for(&digest, n.arch)))
        };
        let mut list: Vec<(bool, f64, u64, Peer)> = Vec::new();
        let mut whole_holders = 0;
        for n in index.nodes.iter().filter(|n| n.name != node && n.connected) {
            if self.blamed.contains_key(&(cluster.to_string(), n.name.clone())) {
                continue;
            }
            // A patch's asker that stopped asking a while ago fetched it
            // (or gave up: then it answers that it has none, and the
            // caller goes on to others and the server).
            let whole =
                holds(n, self) || (patch && asked.contains_key(&n.name) && !fetching.contains_key(&n.name));
            if !whole && !fetching.contains_key(&n.name) && !elsewhere(&n.name) {
                continue;
            }
            let Some(address) = dial_address(n, &my_nets, port) else {
                continue;
            };
            whole_holders += usize::from(whole);
            let near = my_nets.iter().any(|m| same_subnet(*m, address.ip()));
            let load = self.load_of(&n.name, now);
            list.push((
                !near,
                load,
                random_u64(),
                Peer {
                    node: n.name.clone(),
                    address,
                    whole,
                },
            ));
        }
        list.sort_by(|a, b| {
            (a.0, a.1)
                .partial_cmp(&(b.0, b.1))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.2.cmp(&b.2))
        });
        // Seeds still connected, on this replica and the others: one that
        // went away frees its place.
        let connected = |n: &str| index.nodes.iter().any(|x| x.name == n && x.connected);
        let seeds = fetching
            .iter()
            .map(|(n, (_, from_server))| (n.as_str(), *from_server))
            .chain(others.iter().map(|(n, s)| (n.as_str(), *s)))
            .filter(|(n, from_server)| *from_server && *n != node && connected(n))
            .count();
        Candidates {
            peers: list.into_iter().map(|c| c.3).collect(),
            whole_holders,
            seeds,
            was_seed: fetching.get(node).is_some_and(|(_, s)| *s),
        }
    }

    /// The first [`MAX_PEERS`] of `c`, each counted as named once more,
    /// and whether the caller may use the server.
    fn pick(&mut self, c: Candidates, now: Instant) -> (Vec<Peer>, bool) {
        let peers: Vec<Peer> = c.peers.into_iter().take(MAX_PEERS).collect();
        for p in &peers {
            self.add_load(&p.node, now);
        }
        let server = peers.is_empty() || c.was_seed || (c.whole_holders == 0 && c.seeds < MAX_SEEDS);
        (peers, server)
    }

    /// This replica's fetchers of `digest` (node, from the server): those
    /// that asked in the last [`FETCHING_TTL`] (a patch's earlier askers
    /// are this replica's own knowledge).
    fn fetchers_of(&self, cluster: &str, digest: Digest) -> std::collections::BTreeMap<String, bool> {
        self.fetching
            .get(&(cluster.to_string(), digest))
            .map(|f| {
                f.iter()
                    .filter(|(_, (at, _))| at.elapsed() < FETCHING_TTL)
                    .map(|(n, (_, s))| (n.clone(), *s))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn load_of(&self, node: &str, now: Instant) -> f64 {
        self.load.get(node).map_or(0.0, |(l, at)| decayed(*l, *at, now))
    }

    fn add_load(&mut self, node: &str, now: Instant) {
        let l = self.load_of(node, now) + 1.0;
        self.load.insert(node.to_string(), (l, now));
    }
}

fn decayed(load: f64, at: Instant, now: Instant) -> f64 {
    load * 0.5f64.powf(now.duration_since(at).as_secs_f64() / LOAD_HALF_LIFE.as_secs_f64())
}

/// Where to dial `n`: the address it listens on if it named one (unless
/// that is a wildcard), else its address nearest the caller with the
/// cluster's port.
fn dial_address(n: &NodeInfo, near: &[IpAddr], port: u16) -> Option<SocketAddr> {
    if let Some(l) = n.listen {
        if !l.ip().is_unspecified() {
            return Some(l);
        }
        return pick_ip(&n.addresses, near).map(|ip| SocketAddr::new(ip, l.port()));
    }
    pick_ip(&n.addresses, near).map(|ip| SocketAddr::new(ip, port))
}

fn pick_ip(addresses: &[IpAddr], near: &[IpAddr]) -> Option<IpAddr> {
    addresses
        .iter()
        .find(|a| near.iter().any(|m| same_subnet(*m, **a)))
        .or_else(|| addresses.first())
        .copied()
}

/// Same /24 (IPv4) or /64 (IPv6): the "same tenant network" guess.
fn same_subnet(a: IpAddr, b: IpAddr) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => a.octets()[..3] == b.octets()[..3],
        (IpAddr::V6(a), IpAddr::V6(b)) => a.octets()[..8] == b.octets()[..8],
        _ => false,
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::getrandom(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests;
