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
    AlertGate, ClusterRow, EventRow, LockAt, RebootLock, RebootMode, RebootPolicy, RebootRun, RebootStore,
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
    #[error("--reboot-alert-gate {url:?}: {why}")]
    GateUrl { url: String, why: &'static str },
    #[error("{0}")]
    Filter(#[from] lks_rollout::gates::FilterError),
    #[error("give --reboot-alert-gate or --no-reboot-alert-gate, not both")]
    GateBoth,
    #[error("--alert-filter needs an alert gate: give --reboot-alert-gate URL too")]
    FilterWithoutGate,
    #[error("--blocking-pod-selector {selector:?}: {source}")]
    Selector {
        selector: String,
        source: lks_proto::labels::SelectorError,
    },
    #[error("give --blocking-pod-selector or --no-blocking-pod-selector, not both")]
    SelectorBoth,
}

impl RebootError {
    pub fn kind(&self) -> Kind {
        match self {
            RebootError::MaxConcurrent(_)
            | RebootError::Timeout(_)
            | RebootError::GateUrl { .. }
            | RebootError::Filter(_)
            | RebootError::GateBoth
            | RebootError::FilterWithoutGate
            | RebootError::Selector { .. }
            | RebootError::SelectorBoth => Kind::Invalid,
            RebootError::NoCluster(_) => Kind::NotFound,
            RebootError::Busy(_) => Kind::Unavailable,
            _ => Kind::FailedPrecondition,
        }
    }
}

/// The reboot part of a `SetCluster` request: each field replaces the
/// stored one only when given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebootChange {
    pub mode: Option<RebootMode>,
    pub max_concurrent: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub on_timeout: Option<RebootTimeout>,
    /// `--reboot-alert-gate URL` (checked: the URL as stored).
    pub alert_gate: Option<String>,
    /// `--alert-filter REGEX` (empty: every firing alert blocks).
    pub alert_filter: Option<String>,
    /// `--no-reboot-alert-gate`.
    pub clear_alert_gate: bool,
    /// `--blocking-pod-selector` (checked: its canonical form).
    pub blocking_pod_selector: Option<String>,
    /// `--no-blocking-pod-selector`.
    pub clear_blocking_pod_selector: bool,
}

/// The longest alert gate URL accepted.
const MAX_URL: usize = 2048;

/// A Prometheus base URL: http or https, a host, no credentials, no query;
/// stored without a trailing `/`.
fn check_gate_url(url: &str) -> Result<String, RebootError> {
    let bad = |why| RebootError::GateUrl {
        url: url.to_string(),
        why,
    };
    if url.len() > MAX_URL {
        return Err(bad("over 2048 characters"));
    }
    let u = reqwest::Url::parse(url).map_err(|_| bad("not a URL; give http[s]://HOST:PORT[/PATH]"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err(bad("give http[s]://HOST:PORT[/PATH]"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("credentials in the URL are not supported"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("give the base URL, without ?query or #fragment"));
    }
    Ok(u.as_str().trim_end_matches('/').to_string())
}

impl RebootChange {
    /// Checks the fields given (the URL and selector in the form stored);
    /// `None` if none is.
    pub fn check(self) -> Result<Option<Self>, RebootError> {
        let mut c = self;
        if let Some(n) = c.max_concurrent
            && !(1..=MAX_CONCURRENT).contains(&n)
        {
            return Err(RebootError::MaxConcurrent(n));
        }
        if let Some(ms) = c.timeout_ms {
            let d = Duration::from_millis(ms);
            if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&d) {
                return Err(RebootError::Timeout(lks_proto::duration::format_duration(d)));
            }
        }
        if c.clear_alert_gate && (c.alert_gate.is_some() || c.alert_filter.is_some()) {
            return Err(RebootError::GateBoth);
        }
        if let Some(u) = &c.alert_gate {
            c.alert_gate = Some(check_gate_url(u)?);
        }
        if let Some(f) = &c.alert_filter {
            lks_rollout::gates::compile_filter(f)?;
        }
        if c.clear_blocking_pod_selector && c.blocking_pod_selector.is_some() {
            return Err(RebootError::SelectorBoth);
        }
        if let Some(sel) = &c.blocking_pod_selector {
            let parsed = lks_proto::labels::parse_selector(sel).map_err(|source| RebootError::Selector {
                selector: sel.clone(),
                source,
            })?;
            c.blocking_pod_selector = Some(parsed.to_string());
        }
        Ok((c != RebootChange::default()).then_some(c))
    }

    /// The policy `old` with this change; an alert filter needs a gate
    /// (given now, or kept).
    pub fn merge(self, old: RebootPolicy) -> Result<RebootPolicy, RebootError> {
        let alert_gate = if self.clear_alert_gate {
            None
        } else {
            match (self.alert_gate, old.alert_gate) {
                (Some(url), old) => Some(AlertGate {
                    url,
                    filter: self
                        .alert_filter
                        .clone()
                        .or(old.map(|g| g.filter))
                        .unwrap_or_default(),
                }),
                (None, Some(g)) => Some(AlertGate {
                    filter: self.alert_filter.clone().unwrap_or(g.filter),
                    url: g.url,
                }),
                (None, None) if self.alert_filter.is_some() => return Err(RebootError::FilterWithoutGate),
                (None, None) => None,
            }
        };
        let blocking_pod_selector = if self.clear_blocking_pod_selector {
            String::new()
        } else {
            self.blocking_pod_selector.unwrap_or(old.blocking_pod_selector)
        };
        Ok(RebootPolicy {
            mode: self.mode.unwrap_or(old.mode),
            max_concurrent: self.max_concurrent.unwrap_or(old.max_concurrent),
            timeout_ms: self.timeout_ms.unwrap_or(old.timeout_ms),
            on_timeout: self.on_timeout.unwrap_or(old.on_timeout),
            alert_gate,
            blocking_pod_selector,
        })
    }
}

/// "reboots auto, at most 2 at once, 30m to be back, then the slot is freed".
pub fn describe(p: &RebootPolicy) -> String {
    format!(
        "reboots {}, at most {} at once, {} to be back, then the slot is {}{}",
        p.mode.as_str(),
        p.max_concurrent,
        lks_proto::duration::format_duration(Duration::from_millis(p.timeout_ms)),
        match p.on_timeout {
            RebootTimeout::Free => "freed",
            RebootTimeout::Keep => "kept",
        },
        gates(p)
    )
}

/// "; no slot while an alert matching ^Kube fires in http://…, nor on a
/// node running a pod matching app=db".
fn gates(p: &RebootPolicy) -> String {
    let mut out = String::new();
    if let Some(g) = &p.alert_gate {
        let which = if g.filter.is_empty() {
            "an alert".to_string()
        } else {
            format!("an alert matching {}", g.filter)
        };
        out.push_str(&format!("; no slot while {which} fires in {}", g.url));
    }
    if !p.blocking_pod_selector.is_empty() {
        out.push_str(&format!(
            "; none for a node running a pod matching {}",
            p.blocking_pod_selector
        ));
    }
    out
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
    let policy = change.merge(old)?;
    let event = event(
        name,
        "reboot_policy",
        format!("{} (by {admin})", describe(&policy)),
        now_ms,
    );
    let row = store.set_cluster_reboots(name, policy.clone(), event).await?;
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
    gates: &crate::rebootgates::Gates,
    now_ms: i64,
) -> Result<Status, OpError> {
    let c = store
        .get_cluster(cluster)
        .await?
        .ok_or_else(|| RebootError::NoCluster(cluster.into()))?;
    let at = store.reboot_lock(cluster).await?;
    let mut views = store
        .list_nodes(Some(cluster))
        .await?
        .into_iter()
        .map(|n| {
            let v = crate::reboots::view_of(&n, connected(&n));
            (n.name, v)
        })
        .collect();
    let mut clock = crate::reboots::clock_of(&c, now_ms);
    gates.fill(&c, &at.lock, &mut views, &mut clock).await;
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
        assert_eq!(none.clone().check().unwrap(), None);
        let bad = RebootChange {
            max_concurrent: Some(0),
            ..none.clone()
        };
        assert_eq!(
            bad.check().unwrap_err().to_string(),
            "--max-concurrent-reboots 0 is out of range: give 1 to 10000"
        );
        let short = RebootChange {
            timeout_ms: Some(1000),
            ..none.clone()
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
        let p = auto
            .check()
            .unwrap()
            .unwrap()
            .merge(RebootPolicy {
                on_timeout: RebootTimeout::Keep,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            describe(&p),
            "reboots auto, at most 3 at once, 30m to be back, then the slot is kept"
        );
    }

    #[test]
    fn the_gates_are_checked_stored_canonical_and_merged() {
        let change = |f: fn(&mut RebootChange)| {
            let mut c = RebootChange::default();
            f(&mut c);
            c.check()
        };
        for (f, want) in [
            (
                (|c: &mut RebootChange| c.alert_gate = Some("ftp://x".into())) as fn(&mut RebootChange),
                "--reboot-alert-gate \"ftp://x\": give http[s]://HOST:PORT[/PATH]",
            ),
            (
                |c| c.alert_gate = Some("prometheus:9090".into()),
                "--reboot-alert-gate \"prometheus:9090\": give http[s]://HOST:PORT[/PATH]",
            ),
            (
                |c| c.alert_gate = Some("http://u:p@prom:9090".into()),
                "--reboot-alert-gate \"http://u:p@prom:9090\": credentials in the URL are not supported",
            ),
            (
                |c| c.alert_filter = Some("(Kube".into()),
                "--alert-filter \"(Kube\" is not a regular expression: unclosed group",
            ),
            (
                |c| {
                    c.alert_gate = Some("http://p".into());
                    c.clear_alert_gate = true;
                },
                "give --reboot-alert-gate or --no-reboot-alert-gate, not both",
            ),
            (
                |c| c.blocking_pod_selector = Some("app in db".into()),
                "--blocking-pod-selector \"app in db\": at \"db\": expected ( after in or notin",
            ),
            (
                |c| {
                    c.blocking_pod_selector = Some("a=b".into());
                    c.clear_blocking_pod_selector = true;
                },
                "give --blocking-pod-selector or --no-blocking-pod-selector, not both",
            ),
        ] {
            assert_eq!(change(f).unwrap_err().to_string(), want);
        }
        let set = change(|c| {
            c.alert_gate = Some("http://prom:9090/".into());
            c.alert_filter = Some("^Kube".into());
            c.blocking_pod_selector = Some("app = db, tier in (a, b)".into());
        })
        .unwrap()
        .unwrap();
        let p = set.merge(RebootPolicy::default()).unwrap();
        assert_eq!(
            p.alert_gate,
            Some(AlertGate {
                url: "http://prom:9090".into(),
                filter: "^Kube".into()
            })
        );
        assert_eq!(p.blocking_pod_selector, "app=db,tier in (a,b)");
        assert_eq!(
            describe(&p),
            "reboots off, at most 1 at once, 30m to be back, then the slot is freed; no slot while an alert matching ^Kube fires in http://prom:9090; none for a node running a pod matching app=db,tier in (a,b)"
        );
        // A new URL keeps the filter; a filter alone changes it.
        let url = change(|c| c.alert_gate = Some("https://prom2".into()))
            .unwrap()
            .unwrap();
        let p = url.merge(p).unwrap();
        assert_eq!(p.alert_gate.as_ref().unwrap().filter, "^Kube");
        let filter = change(|c| c.alert_filter = Some(String::new())).unwrap().unwrap();
        let p = filter.merge(p).unwrap();
        assert_eq!(
            p.alert_gate.clone().unwrap(),
            AlertGate {
                url: "https://prom2".into(),
                filter: String::new()
            }
        );
        let clear = change(|c| {
            c.clear_alert_gate = true;
            c.clear_blocking_pod_selector = true;
        })
        .unwrap()
        .unwrap();
        let p = clear.merge(p).unwrap();
        assert_eq!(
            (p.alert_gate.clone(), p.blocking_pod_selector.as_str()),
            (None, "")
        );
        let filter = change(|c| c.alert_filter = Some("x".into())).unwrap().unwrap();
        assert_eq!(
            filter.merge(p).unwrap_err().to_string(),
            "--alert-filter needs an alert gate: give --reboot-alert-gate URL too"
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
