//! What this replica read from etcd, by kind of read and key prefix:
//! requests and bytes of values received, for `/metrics`
//! (`lks_etcd_read_bytes_total{read, prefix}`, `lks_etcd_reads_total`) and
//! the scale-out benchmark. etcd counts what it sends (all of it, by
//! member); this says who asked for it: a range of every node document
//! is ~16 MiB at 30,000 nodes, and a few of those in a rollout's window
//! outweigh everything else it reads.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// How a value came: a point read, a range, or the watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Read {
    Get,
    Range,
    Watch,
}

impl Read {
    pub fn as_str(self) -> &'static str {
        match self {
            Read::Get => "get",
            Read::Range => "range",
            Read::Watch => "watch",
        }
    }
}

/// The prefixes told apart; anything else is "other".
const PREFIXES: &[&str] = &[
    "active", "blobrecs", "blobs", "bundles", "certs", "clusters", "desired", "drive", "events", "heard",
    "identity", "leader", "load", "meta", "nodes", "relhead", "releases", "replicas", "rnodes", "rollouts",
    "roots", "seen", "swarm", "targets", "timeline", "tokens",
];

type Counts = BTreeMap<(Read, &'static str), (u64, u64)>;

static READS: Mutex<Counts> = Mutex::new(BTreeMap::new());

/// The prefix of `rest` (a key below the store's prefix) as counted.
fn prefix_of(rest: &str) -> &'static str {
    let first = rest.split('/').next().unwrap_or("");
    PREFIXES.iter().find(|p| **p == first).copied().unwrap_or("other")
}

/// Notes one read of `bytes` bytes of values under `rest`.
pub fn note(read: Read, rest: &str, bytes: usize) {
    if let Ok(mut m) = READS.lock() {
        let e = m.entry((read, prefix_of(rest))).or_default();
        e.0 += 1;
        e.1 += bytes as u64;
    }
}

/// Every count so far: (read, prefix, requests, bytes).
pub fn snapshot() -> Vec<(&'static str, &'static str, u64, u64)> {
    READS
        .lock()
        .map(|m| {
            m.iter()
                .map(|((r, p), (n, b))| (r.as_str(), *p, *n, *b))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_counted_by_kind_and_prefix() {
        note(Read::Range, "nodes/", 100);
        note(Read::Range, "nodes/", 50);
        note(Read::Watch, "rnodes/r1/n1", 7);
        note(Read::Get, "whatever/x", 1);
        let s = snapshot();
        let find = |r: &str, p: &str| s.iter().find(|x| x.0 == r && x.1 == p).map(|x| (x.2, x.3));
        // Other tests may read too: at least these.
        let (n, b) = find("range", "nodes").unwrap();
        assert!(n >= 2 && b >= 150);
        assert!(find("watch", "rnodes").unwrap().1 >= 7);
        assert!(find("get", "other").is_some());
    }
}
