//! Coordinated reboots, the operator's side (issue [reboots]): the reboot
//! part of `SetCluster` (`--reboots`, `--max-concurrent-reboots`,
//! `--reboot-timeout`, `--on-reboot-timeout`), a rolling reboot's start
//! (`lksctl reboot start`) and verbs (pause, resume, abort), and its
//! status. The verbs write the cluster's reboot lock only if it is still
//! the revision they read (the leader steps it meanwhile), and try again.

use std::collections::BTreeMap;
use std::time::Duration;

use lks_proto::labels::{Labels, selector_matches};
use lks_rollout::reboot::{self, NodeLine, RebootClock};

use super::{Kind, OpError};
use crate::store::{
    ClusterRow, EventRow, LockAt, RebootLock, RebootMode, RebootPolicy, RebootRun, RebootStore,
    RebootTimeout, RunState, Store, StoreError,
};

/// Most slots an operator may allow.
pub const MAX_CONCURRENT: u32 = 10_000;
const MIN_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Tries of a lock write that lost a race with the leader.
const ATTEMPTS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("--max-concurrent-reboots {0} is out of range: give 1 to {MAX_CONCURRENT}")]
    MaxConcurrent(u32),
    #[error("--reboot-timeout {0} is out of range: give 5s to 7d")]
    Timeout(String),
    #[error("cluster {0} does not exist")]
    NoCluster(String),
    #[error("cluster {0} has reboots off; first: lksctl cluster set {0} --reboots manual (or auto)")]
    Off(String),
    #[error(
        "cluster {0} has a rolling reboot {1} already; abort it first (lksctl reboot abort --cluster {0})"
    )]
    Active(String, &'static str),
    #[error("no node of cluster {0} matches the selector")]
    NoNodes(String),
    #[error("cluster {0} has no rolling reboot to {1}")]
    NoRun(String, &'static str),
    #[error("the rolling reboot of cluster {cluster} is {state}; it cannot be {verb}")]
    Verb {
        cluster: String,
        state: &'static str,
        verb: &'static str,
    },
    #[error("the reboot lock of cluster {0} kept changing; try again")]
    Busy(String),
}

impl RebootError {
    pub fn kind(&self) -> Kind {
        match self {
            RebootError::MaxConcurrent(_) | RebootError::Timeout(_) => Kind::Invalid,
            RebootError::NoCluster(_) => Kind::NotFound,
            RebootError::Busy(_) => Kind::Unavailable,
            _ => Kind::FailedPrecondition,
        }
    }
}

/// The reboot part of a `SetCluster` request: each field replaces the
/// stored one only when given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebootChange {
    pub mode: Option<RebootMode>,
    pub max_concurrent: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub on_timeout: Option<RebootTimeout>,
}

impl RebootChange {
    /// Checks the fields given; `None` if none is.
    pub fn check(self) -> Result<Option<Self>, RebootError> {
        if let Some(n) = self.max_concurrent
            && !(1..=MAX_CONCURRENT).contains(&n)
        {
            return Err(RebootError::MaxConcurrent(n));
        }
        if let Some(ms) = self.timeout_ms {
            let d = Duration::from_millis(ms);
            if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&d) {
                return Err(RebootError::Timeout(lks_proto::duration::format_duration(d)));
            }
        }
        Ok((self != RebootChange::default()).then_some(self))
    }

    pub fn merge(self, old: RebootPolicy) -> RebootPolicy {
        RebootPolicy {
            mode: self.mode.unwrap_or(old.mode),
            max_concurrent: self.max_concurrent.unwrap_or(old.max_concurrent),
            timeout_ms: self.timeout_ms.unwrap_or(old.timeout_ms),
            on_timeout: self.on_timeout.unwrap_or(old.on_timeout),
        }
    }
}

/// "reboots auto, at most 2 at once, 30m to be back, then the slot is freed".
pub fn describe(p: &RebootPolicy) -> String {
    format!(
        "reboots {}, at most {} at once, {} to be back, then the slot is {}",
        p.mode.as_str(),
        p.max_concurrent,
        lks_proto::duration::format_duration(Duration::from_millis(p.timeout_ms)),
        match p.on_timeout {
            RebootTimeout::Free => "freed",
            RebootTimeout::Keep => "kept",
        }
    )
}

/// Stores `name`'s reboot policy merged with `change`; the cluster as it
/// is now.
pub async fn set_policy(
    store: &(impl Store + ?Sized),
    name: &str,
    change: RebootChange,
    admin: &str,
    now_ms: i64,
) -> Result<ClusterRow, OpError> {
    let old = store
        .get_cluster(name)
        .await?
        .ok_or_else(|| RebootError::NoCluster(name.into()))?
        .reboots;
    let policy = change.merge(old);
    let event = event(
        name,
        "reboot_policy",
        format!("{} (by {admin})", describe(&policy)),
        now_ms,
    );
    let row = store.set_cluster_reboots(name, policy, event).await?;
    tracing::info!(cluster = %name, admin = %admin, policy = %describe(&policy), "reboot policy set");
    Ok(row)
}

fn event(cluster: &str, kind: &str, message: String, at_ms: i64) -> EventRow {
    EventRow::about(cluster, "", kind, at_ms, message)
}

/// Reads the lock, changes it with `f` and writes it if it is still the
/// revision read, trying again when the leader wrote first.
async fn change_lock(
    store: &(impl RebootStore + ?Sized),
    cluster: &str,
    f: impl Fn(&mut RebootLock) -> Result<EventRow, RebootError>,
) -> Result<LockAt, OpError> {
    for _ in 0..ATTEMPTS {
        let at = store.reboot_lock(cluster).await?;
        let mut lock = at.lock.clone();
        let e = f(&mut lock)?;
        match store.put_reboot_lock(cluster, &lock, at.revision, vec![e]).await {
            Ok(Some(revision)) => return Ok(LockAt { lock, revision }),
            Ok(None) => continue,
            Err(StoreError::NotFound { .. }) => return Err(RebootError::NoCluster(cluster.into()).into()),
            Err(e) => return Err(e.into()),
        }
    }
    Err(RebootError::Busy(cluster.into()).into())
}

/// `lksctl reboot start`: a rolling reboot of every node of `cluster` the
/// selector matches, whether it needs one or not.
pub async fn start(
    store: &(impl Store + ?Sized),
    cluster: &str,
    selector: Labels,
    admin: &str,
    now_ms: i64,
) -> Result<LockAt, OpError> {
    let c = store
        .get_cluster(cluster)
        .await?
        .ok_or_else(|| RebootError::NoCluster(cluster.into()))?;
    if c.reboots.mode == RebootMode::Off {
        return Err(RebootError::Off(cluster.into()).into());
    }
    let mut nodes: Vec<String> = store
        .list_nodes(Some(cluster))
        .await?
        .into_iter()
        .filter(|n| selector_matches(&selector, &n.labels))
        .map(|n| n.name)
        .collect();
    nodes.sort();
    if nodes.is_empty() {
        return Err(RebootError::NoNodes(cluster.into()).into());
    }
    change_lock(store, cluster, |lock| {
        if let Some(r) = lock.run.as_ref().filter(|r| r.state.is_active()) {
            return Err(RebootError::Active(cluster.into(), r.state.as_str()));
        }
        lock.run = Some(RebootRun {
            state: RunState::Running,
            selector: selector.clone(),
            started_ms: now_ms,
            started_by: admin.to_string(),
            waiting: nodes.clone(),
            ended: BTreeMap::new(),
        });
        let m = format!("rolling reboot of {} node(s) started by {admin}", nodes.len());
        Ok(event(cluster, "reboot_run_started", m, now_ms))
    })
    .await
}

/// What an operator does to a rolling reboot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunVerb {
    Pause,
    Resume,
    Abort,
}

impl RunVerb {
    fn as_str(self) -> &'static str {
        match self {
            RunVerb::Pause => "paused",
            RunVerb::Resume => "resumed",
            RunVerb::Abort => "aborted",
        }
    }
}

/// `lksctl reboot pause|resume|abort`: the nodes holding a slot finish;
/// an abort also frees the slots of lost holders kept by the policy.
pub async fn run_verb(
    store: &(impl Store + ?Sized),
    cluster: &str,
    verb: RunVerb,
    admin: &str,
    now_ms: i64,
) -> Result<LockAt, OpError> {
    change_lock(store, cluster, |lock| {
        let Some(run) = lock.run.as_mut() else {
            return Err(RebootError::NoRun(cluster.into(), verb_name(verb)));
        };
        let next = match (verb, run.state) {
            (RunVerb::Pause, RunState::Running) => RunState::Paused,
            (RunVerb::Resume, RunState::Paused) => RunState::Running,
            (RunVerb::Abort, RunState::Running | RunState::Paused) => RunState::Aborted,
            (_, state) => {
                return Err(RebootError::Verb {
                    cluster: cluster.into(),
                    state: state.as_str(),
                    verb: verb.as_str(),
                });
            }
        };
        run.state = next;
        if verb == RunVerb::Abort {
            lock.slots.retain(|s| !s.phase.is_lost());
        }
        let m = format!("rolling reboot {} by {admin}", verb.as_str());
        Ok(event(
            cluster,
            &format!("reboot_run_{}", verb.as_str()),
            m,
            now_ms,
        ))
    })
    .await
}

fn verb_name(v: RunVerb) -> &'static str {
    match v {
        RunVerb::Pause => "pause",
        RunVerb::Resume => "resume",
        RunVerb::Abort => "abort",
    }
}

/// A cluster's reboots as `reboot status` shows them.
pub struct Status {
    pub cluster: ClusterRow,
    pub lock: RebootLock,
    pub clock: RebootClock,
    pub nodes: Vec<NodeLine>,
}

/// `lksctl reboot status`: the policy, the run, and each node the lock is
/// about (`connected`: whether a node's stream is open, here or elsewhere).
pub async fn status(
    store: &(impl Store + ?Sized),
    cluster: &str,
    connected: impl Fn(&crate::store::NodeRow) -> bool,
    now_ms: i64,
) -> Result<Status, OpError> {
    let c = store
        .get_cluster(cluster)
        .await?
        .ok_or_else(|| RebootError::NoCluster(cluster.into()))?;
    let at = store.reboot_lock(cluster).await?;
    let views = store
        .list_nodes(Some(cluster))
        .await?
        .into_iter()
        .map(|n| {
            let v = crate::reboots::view_of(&n, connected(&n));
            (n.name, v)
        })
        .collect();
    let clock = crate::reboots::clock_of(&c, now_ms);
    let nodes = reboot::status(&c.reboots, &at.lock, &views, &clock);
    Ok(Status {
        cluster: c,
        lock: at.lock,
        clock,
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::{cluster_a, enrol};
    use crate::store::SqliteStore;

    fn text(e: OpError) -> String {
        e.to_string()
    }

    #[test]
    fn the_policy_flags_are_checked_and_merged() {
        let none = RebootChange::default();
        assert_eq!(none.check().unwrap(), None);
        let bad = RebootChange {
            max_concurrent: Some(0),
            ..none
        };
        assert_eq!(
            bad.check().unwrap_err().to_string(),
            "--max-concurrent-reboots 0 is out of range: give 1 to 10000"
        );
        let short = RebootChange {
            timeout_ms: Some(1000),
            ..none
        };
        assert_eq!(
            short.check().unwrap_err().to_string(),
            "--reboot-timeout 1s is out of range: give 5s to 7d"
        );
        let auto = RebootChange {
            mode: Some(RebootMode::Auto),
            max_concurrent: Some(3),
            ..none
        };
        let p = auto.check().unwrap().unwrap().merge(RebootPolicy {
            on_timeout: RebootTimeout::Keep,
            ..Default::default()
        });
        assert_eq!(
            describe(&p),
            "reboots auto, at most 3 at once, 30m to be back, then the slot is kept"
        );
    }

    #[tokio::test]
    async fn a_run_starts_once_and_moves_only_by_its_verbs() {
        let s = SqliteStore::open_in_memory().unwrap();
        cluster_a(&s).await;
        enrol(&s, "n2", "s2", "k2").await;
        enrol(&s, "n1", "s1", "k1").await;
        let off = start(&s, "a", Labels::new(), "alice", 5).await.unwrap_err();
        assert_eq!(
            text(off),
            "cluster a has reboots off; first: lksctl cluster set a --reboots manual (or auto)"
        );
        let manual = RebootChange {
            mode: Some(RebootMode::Manual),
            ..Default::default()
        };
        set_policy(&s, "a", manual, "alice", 5).await.unwrap();
        let none = run_verb(&s, "a", RunVerb::Pause, "alice", 6).await.unwrap_err();
        assert_eq!(text(none), "cluster a has no rolling reboot to pause");
        let picky: Labels = [("pool".to_string(), "gpu".to_string())].into();
        let e = start(&s, "a", picky, "alice", 6).await.unwrap_err();
        assert_eq!(text(e), "no node of cluster a matches the selector");

        let at = start(&s, "a", Labels::new(), "alice", 7).await.unwrap();
        let run = at.lock.run.as_ref().unwrap();
        assert_eq!(
            (run.state, run.waiting.clone()),
            (RunState::Running, vec!["n1".to_string(), "n2".to_string()])
        );
        let again = start(&s, "a", Labels::new(), "bob", 8).await.unwrap_err();
        assert!(text(again).starts_with("cluster a has a rolling reboot running already"));
        let paused = run_verb(&s, "a", RunVerb::Pause, "alice", 9).await.unwrap();
        assert_eq!(paused.lock.run.unwrap().state, RunState::Paused);
        let e = run_verb(&s, "a", RunVerb::Pause, "alice", 9).await.unwrap_err();
        assert_eq!(
            text(e),
            "the rolling reboot of cluster a is paused; it cannot be paused"
        );
        run_verb(&s, "a", RunVerb::Resume, "alice", 10).await.unwrap();
        let aborted = run_verb(&s, "a", RunVerb::Abort, "alice", 11).await.unwrap();
        assert_eq!(aborted.lock.run.unwrap().state, RunState::Aborted);
        // A new run may start once the last ended.
        start(&s, "a", Labels::new(), "bob", 12).await.unwrap();
        let e = start(&s, "nope", Labels::new(), "bob", 12).await.unwrap_err();
        assert_eq!(text(e), "cluster nope does not exist");
    }
}
