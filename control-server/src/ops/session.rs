//! What a node's agent reports on its `Connect` stream, checked and made
//! into rows: its `Hello` (the facts kept, the bundles it holds, its
//! release trust), its status reports and its events (a peer it reports
//! for bad bytes named no more for a while); and how they are stored — a
//! report the store cannot take while it is unavailable is deferred to
//! the stream's next message rather than ending the stream. The stream
//! itself (its task, the hub, pings, the desired states sent) is the
//! handler's.

use lks_proto::convert::bundle_state_from_i32;
use lks_proto::manifest::ManifestError;
use lks_proto::names::{NameError, validate_bundle_name, validate_version};
use lks_proto::pb;

use lks_proto::identity::NodeIdentity;
use lks_tracker::Tracker;

use super::event::{self, MAX_TEXT, NodeEvent, clip};
use super::{Kind, OpError};
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::store::{
    BundleStatusRow, EventStore, NodeReboot, NodeStatusStore, NodeTrust, RebootState, StoreError, TrustHealth,
};

/// Bundle statuses one message may report.
pub const MAX_STATUSES: usize = 1024;
/// Longest trust message kept.
pub const MAX_TRUST_MESSAGE: usize = 1024;
/// Longest reboot reason kept.
pub const MAX_REBOOT_REASON: usize = 1024;

/// Why a report is refused (the stream ends with it).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0} bundle statuses; the limit is {MAX_STATUSES}")]
    TooManyStatuses(usize),
    #[error("bundles[{index}]: {source}")]
    Bundle {
        index: usize,
        #[source]
        source: BadStatus,
    },
    /// `state` clipped to 64 bytes.
    #[error("trust.state {state:?}: one of {}", trust_states())]
    TrustState { state: String },
    /// `state` clipped to 64 bytes.
    #[error("reboot.state {state:?}: one of \"\", required, rebooting, failed")]
    RebootState { state: String },
}

impl ReportError {
    pub fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// What is wrong with one reported bundle status.
#[derive(Debug, thiserror::Error)]
pub enum BadStatus {
    /// The bundle's name or version is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    State(#[from] ManifestError),
}

fn trust_states() -> String {
    let known: Vec<&str> = TrustHealth::ALL.iter().map(|h| h.as_str()).collect();
    known.join(", ")
}

/// Checks reported bundle statuses; `generation` is the desired state
/// they answer.
fn statuses(list: Vec<pb::BundleStatus>, generation: u64) -> Result<Vec<BundleStatusRow>, ReportError> {
    if list.len() > MAX_STATUSES {
        return Err(ReportError::TooManyStatuses(list.len()));
    }
    list.into_iter()
        .enumerate()
        .map(|(index, b)| status(b, generation).map_err(|source| ReportError::Bundle { index, source }))
        .collect()
}

fn status(b: pb::BundleStatus, generation: u64) -> Result<BundleStatusRow, BadStatus> {
    validate_bundle_name(&b.name)?;
    validate_version(&b.version)?;
    let state = bundle_state_from_i32(b.state)?;
    Ok(BundleStatusRow {
        name: b.name,
        version: b.version,
        state,
        message: clip(&b.message, MAX_TEXT).to_string(),
        updated_at_ms: if b.updated_at_ms > 0 {
            b.updated_at_ms
        } else {
            now_ms()
        },
        generation,
        // Reported by the node: kept within what the stores hold.
        fetched_from_server: b.fetched_from_server.min(i64::MAX as u64),
        fetched_from_peers: b.fetched_from_peers.min(i64::MAX as u64),
        fetched_as_delta: b.fetched_as_delta.min(b.fetched_from_server).min(i64::MAX as u64),
    })
}

/// Checks a reported `TrustStatus`: a known state while enabled.
fn trust(t: pb::TrustStatus) -> Result<NodeTrust, ReportError> {
    if !t.enabled {
        return Ok(NodeTrust::off());
    }
    let state = TrustHealth::parse(&t.state).ok_or_else(|| ReportError::TrustState {
        state: clip(&t.state, 64).to_string(),
    })?;
    Ok(NodeTrust {
        enabled: true,
        state: Some(state),
        message: clip(&t.message, MAX_TRUST_MESSAGE).to_string(),
        release_version: t.release_version,
        release_expires_at_ms: t.release_expires_at_ms,
        root_version: t.root_version,
    })
}

/// Checks a reported `RebootStatus`: a known state; text clipped.
fn reboot(r: pb::RebootStatus) -> Result<NodeReboot, ReportError> {
    let state = RebootState::parse(&r.state).ok_or_else(|| ReportError::RebootState {
        state: clip(&r.state, 64).to_string(),
    })?;
    Ok(NodeReboot {
        state,
        reason: clip(&r.reason, MAX_REBOOT_REASON).to_string(),
        since_ms: r.since_ms.max(0),
        boot_id: clip(&r.boot_id, 128).to_string(),
        request: r.request,
    })
}

/// The facts of a `Hello` as stored: each clipped, and only the values
/// the server uses that parse.
fn facts_json(h: &pb::Hello) -> String {
    let f = h.facts.clone().unwrap_or_default();
    let agent_version = if h.agent_version.is_empty() {
        f.agent_version.clone()
    } else {
        h.agent_version.clone()
    };
    serde_json::json!({
        "hostname": clip(&f.hostname, 256),
        "os": clip(&f.os, 256),
        "kernel": clip(&f.kernel, 256),
        "arch": clip(&f.arch, 64),
        // Only a name the bundle rules know: it selects files.
        "architecture": lks_proto::arch::Arch::parse(&f.architecture).map(|a| a.to_string()).unwrap_or_default(),
        "cpus": f.cpus,
        "memory_bytes": f.memory_bytes,
        "agent_version": clip(&agent_version, 128),
        "boot_id": clip(&f.boot_id, 128),
        "features": h.features.iter().take(32).map(|x| clip(x, 64)).collect::<Vec<_>>(),
        // Where it listens for peers if it said (the tracker names it).
        "peer_listen": f.peer_listen.parse::<std::net::SocketAddr>().map(|a| a.to_string()).unwrap_or_default(),
        // Only addresses that parse, at most as many as a serving
        // certificate takes: they become its IP SANs.
        "addresses": f.addresses.iter()
            .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
            .take(lks_proto::certs::MAX_ADDRESSES)
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        "disks": f.disks.iter().take(64).map(|d| serde_json::json!({
            "mount_point": clip(&d.mount_point, 1024),
            "total_bytes": d.total_bytes,
            "available_bytes": d.available_bytes,
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

/// A `Hello`, checked.
#[derive(Clone, Debug)]
pub struct Hello {
    /// What the node holds, answering the generation it says it has.
    pub held: Vec<BundleStatusRow>,
    /// `None`: not reported.
    pub trust: Option<NodeTrust>,
    pub facts_json: String,
    /// `None`: not reported (an agent without the "reboot" feature).
    pub reboot: Option<NodeReboot>,
}

/// Checks a `Hello`: its bundles, then its trust, then its reboot state.
pub fn hello(h: &pb::Hello) -> Result<Hello, ReportError> {
    let held = statuses(h.bundles.clone(), h.desired_generation)?;
    let trust = h.trust.clone().map(trust).transpose()?;
    let reboot = h.reboot.clone().map(reboot).transpose()?;
    Ok(Hello {
        held,
        trust,
        facts_json: facts_json(h),
        reboot,
    })
}

/// Records `node`'s `Hello` at `now_ms`: facts, what it holds, its trust
/// and its reboot state in one write (a reconnect storm costs one write per
/// node, and an agent that stopped reporting either shows none). Returns
/// the trust and reboot state now stored.
pub async fn record_hello(
    store: &(impl NodeStatusStore + ?Sized),
    node: &str,
    h: Hello,
    now_ms: i64,
) -> Result<(Option<NodeTrust>, Option<NodeReboot>), OpError> {
    store
        .node_hello(
            node,
            &h.facts_json,
            h.held,
            h.trust.clone(),
            h.reboot.clone(),
            now_ms,
        )
        .await?;
    Ok((h.trust, h.reboot))
}

/// A status report, checked.
#[derive(Clone, Debug)]
pub struct Report {
    pub rows: Vec<BundleStatusRow>,
    /// `None`: not reported.
    pub trust: Option<NodeTrust>,
    /// `None`: not reported.
    pub reboot: Option<NodeReboot>,
}

/// Checks a status report: its bundles, then its trust, then its reboot state.
pub fn report(r: pb::StatusReport) -> Result<Report, ReportError> {
    let rows = statuses(r.bundles, r.generation)?;
    let trust = r.trust.map(trust).transpose()?;
    let reboot = r.reboot.map(reboot).transpose()?;
    Ok(Report { rows, trust, reboot })
}

/// Stores `node`'s reboot state; false if not stored because the store is
/// unavailable (reported again with the next change or connect).
pub async fn record_reboot(
    store: &(impl NodeStatusStore + ?Sized),
    node: &str,
    r: NodeReboot,
) -> Result<bool, OpError> {
    match store.record_reboot(node, r).await {
        Ok(()) => Ok(true),
        Err(StoreError::Unavailable(e)) => {
            tracing::warn!(error = %e, "reboot state not stored; the store is unavailable");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Stores `node`'s release trust; false if not stored because the store
/// is unavailable (it is reported again with the next report; nothing to
/// keep).
pub async fn record_trust(
    store: &(impl NodeStatusStore + ?Sized),
    node: &str,
    t: NodeTrust,
) -> Result<bool, OpError> {
    match store.record_trust(node, t).await {
        Ok(()) => Ok(true),
        Err(StoreError::Unavailable(e)) => {
            tracing::warn!(error = %e, "release trust not stored; the store is unavailable");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// What became of a status report.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    Stored,
    /// The store is unavailable (etcd down): the rows, to be stored with
    /// the stream's next message ([`defer`]); the node keeps its desired
    /// state meanwhile.
    Deferred(Vec<BundleStatusRow>),
}

/// Stores a status report of `node`, or defers it while the store is
/// unavailable.
pub async fn record_status(
    store: &(impl NodeStatusStore + ?Sized),
    node: &str,
    rows: Vec<BundleStatusRow>,
) -> Result<Recorded, OpError> {
    match store.record_status(node, rows.clone()).await {
        Ok(()) => Ok(Recorded::Stored),
        Err(StoreError::Unavailable(e)) => {
            tracing::warn!(error = %e, "status report kept until the store is back");
            Ok(Recorded::Deferred(rows))
        }
        Err(e) => Err(e.into()),
    }
}

/// The rows deferred: those `kept` from before, each replaced by a newer
/// report of its bundle in `rows`, and `rows`.
pub fn defer(kept: Option<Vec<BundleStatusRow>>, rows: Vec<BundleStatusRow>) -> Vec<BundleStatusRow> {
    let mut merged = kept.unwrap_or_default();
    merged.retain(|old| !rows.iter().any(|r| r.name == old.name));
    merged.extend(rows);
    merged
}

/// Records an event `id` reported, at its time (or now, if it gave
/// none), and counts it: bytes an apply fetched from peers; a peer that
/// served bytes not matching their digest, which the tracker then names
/// to the cluster's nodes no more for a while.
pub async fn node_event(
    store: &(impl EventStore + ?Sized),
    tracker: &Tracker,
    metrics: &Metrics,
    id: &NodeIdentity,
    e: pb::NodeEvent,
) {
    let at = if e.at_ms > 0 { e.at_ms } else { now_ms() };
    if e.kind == "applied" && e.fetched_from_peers > 0 {
        metrics.blob_bytes_from_peers(e.fetched_from_peers);
    }
    if e.kind == "bad_peer" && !e.peer.is_empty() {
        tracing::warn!(peer = %clip(&e.peer, 253), "a node reports a peer that served bytes not matching their digest");
        tracker.blame(&id.cluster, clip(&e.peer, 253));
        metrics.bad_peer_reported();
    }
    let event = NodeEvent {
        kind: &e.kind,
        bundle: &e.bundle,
        version: &e.version,
        message: e.message,
        at_ms: at,
    };
    event::record(store, id, event).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeStore;
    use crate::store::sqlite::SqliteStore;

    fn applied(name: &str) -> pb::BundleStatus {
        pb::BundleStatus {
            fetched_from_server: 0,
            fetched_from_peers: 0,
            fetched_as_delta: 0,
            name: name.into(),
            version: "1".into(),
            state: pb::BundleState::Applied as i32,
            message: String::new(),
            updated_at_ms: 5,
        }
    }

    #[test]
    fn statuses_are_validated() {
        let ok = applied("kubelet");
        assert_eq!(statuses(vec![ok.clone()], 3).unwrap()[0].updated_at_ms, 5);
        let mut bad = ok.clone();
        bad.state = 0;
        let e = statuses(vec![bad], 0).unwrap_err();
        assert!(
            matches!(
                e,
                ReportError::Bundle {
                    index: 0,
                    source: BadStatus::State(_)
                }
            ),
            "{e}"
        );
        let mut bad = ok.clone();
        bad.name = "../x".into();
        let e = OpError::from(statuses(vec![ok, bad], 0).unwrap_err());
        assert_eq!(e.kind(), Some(Kind::Invalid));
        assert!(e.to_string().starts_with("bundles[1]: "), "{e}");
        let e = statuses(vec![applied("kubelet"); MAX_STATUSES + 1], 0).unwrap_err();
        assert_eq!(e.to_string(), "1025 bundle statuses; the limit is 1024");
    }

    #[test]
    fn reported_trust_is_validated_and_bounded() {
        let off = trust(pb::TrustStatus {
            enabled: false,
            state: "ok".into(),
            release_version: 3,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (off.label(), off.release_version),
            ("off", 0),
            "off carries nothing"
        );
        let stale = trust(pb::TrustStatus {
            enabled: true,
            state: "stale-release".into(),
            message: "x".repeat(5000),
            release_version: 7,
            release_expires_at_ms: 9,
            root_version: 2,
        })
        .unwrap();
        assert_eq!(stale.state, Some(TrustHealth::StaleRelease));
        assert_eq!(stale.message.len(), MAX_TRUST_MESSAGE);
        let e = trust(pb::TrustStatus {
            enabled: true,
            state: "fine".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "trust.state \"fine\": one of ok, stale-release, no-release, refused, clock"
        );
    }

    #[test]
    fn a_reported_reboot_state_is_validated_and_bounded() {
        let r = reboot(pb::RebootStatus {
            state: "required".into(),
            reason: "r".repeat(5000),
            since_ms: -4,
            boot_id: "b".repeat(500),
            request: 7,
        })
        .unwrap();
        assert_eq!(r.state, RebootState::Required);
        assert_eq!((r.reason.len(), r.boot_id.len()), (MAX_REBOOT_REASON, 128));
        assert_eq!((r.since_ms, r.request), (0, 7));
        assert_eq!(
            reboot(pb::RebootStatus::default()).unwrap().state,
            RebootState::None
        );
        let e = reboot(pb::RebootStatus {
            state: "soon".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "reboot.state \"soon\": one of \"\", required, rebooting, failed"
        );
    }

    #[test]
    fn a_deferred_report_keeps_the_newest_of_each_bundle() {
        let rows = |names: &[(&str, &str)]| -> Vec<BundleStatusRow> {
            names
                .iter()
                .map(|(name, version)| {
                    let mut b = applied(name);
                    b.version = version.to_string();
                    status(b, 1).unwrap()
                })
                .collect()
        };
        let kept = defer(None, rows(&[("a", "1"), ("b", "1")]));
        let merged = defer(Some(kept), rows(&[("b", "2"), ("c", "1")]));
        let got: Vec<(&str, &str)> = merged
            .iter()
            .map(|r| (r.name.as_str(), r.version.as_str()))
            .collect();
        assert_eq!(got, [("a", "1"), ("b", "2"), ("c", "1")]);
    }

    /// Cluster `a` with node `n1` enrolled, never connected.
    async fn store() -> SqliteStore {
        let store = SqliteStore::open_in_memory().unwrap();
        crate::ops::fixture::cluster_a(&store).await;
        crate::ops::fixture::enrol(&store, "n1", "01", "sha256:00").await;
        store
    }

    #[tokio::test]
    async fn a_refused_hello_stores_nothing_and_a_checked_one_its_facts() {
        let store = store().await;
        let mut h = pb::Hello {
            bundles: vec![applied("kubelet")],
            trust: Some(pb::TrustStatus {
                enabled: true,
                state: "fine".into(),
                ..Default::default()
            }),
            facts: Some(pb::NodeFacts {
                hostname: "w1".into(),
                addresses: vec!["192.0.2.1".into(), "nonsense".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = OpError::from(hello(&h).unwrap_err());
        assert!(
            matches!(e, OpError::Report(ReportError::TrustState { .. })),
            "{e}"
        );
        assert_eq!(e.kind(), Some(Kind::Invalid));
        assert!(!store.get_node("n1").await.unwrap().unwrap().connected);

        h.trust = None;
        let checked = hello(&h).unwrap();
        assert_eq!(
            record_hello(&store, "n1", checked, 7).await.unwrap(),
            (None, None)
        );
        let n = store.get_node("n1").await.unwrap().unwrap();
        assert!(n.connected);
        let facts: serde_json::Value = serde_json::from_str(&n.facts_json).unwrap();
        assert_eq!(facts["hostname"], "w1");
        assert_eq!(facts["addresses"], serde_json::json!(["192.0.2.1"]));

        let e = record_hello(&store, "gone", hello(&h).unwrap(), 8)
            .await
            .unwrap_err();
        assert!(matches!(e, OpError::Store(_)), "{e}");
    }

    #[tokio::test]
    async fn a_reported_bad_peer_is_recorded_and_counted() {
        let store = store().await;
        let (tracker, metrics) = (Tracker::new(None), Metrics::default());
        let id = NodeIdentity::new("a", "n1").unwrap();
        let e = pb::NodeEvent {
            kind: "bad_peer".into(),
            message: "piece 3 of sha256:00 did not match".into(),
            at_ms: 42,
            peer: "n2".into(),
            ..Default::default()
        };
        node_event(&store, &tracker, &metrics, &id, e).await;
        let filter = crate::store::EventFilter {
            limit: 10,
            ..Default::default()
        };
        let mut events = store.list_events(filter).await.unwrap();
        events.retain(|e| e.kind != "enrolled");
        let [row] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(
            (row.kind.as_str(), row.node.as_str(), row.at_ms),
            ("bad_peer", "n1", 42)
        );
        assert!(
            metrics
                .render()
                .lines()
                .any(|l| l == "lks_bad_peers_reported_total 1"),
            "{}",
            metrics.render()
        );
    }
}
