//! The reboot gates (issue [reboots] item 3), pure: what the answers of a
//! cluster's Prometheus (`--reboot-alert-gate URL --alert-filter REGEX`)
//! and of its tenant API (`--blocking-pod-selector`) mean for a node that
//! wants a reboot slot. The server asks them (only while a node could
//! otherwise take a slot) and hands the answers in: the clock's `alerts`,
//! each view's `blocking_pods`. A gate that was not asked, or could not be
//! asked, is closed: no slot is given on a guess. A slot already held is
//! never taken back by a gate.

use std::sync::Arc;

use lks_store::RebootPolicy;
use regex::Regex;

/// The longest alert filter accepted.
pub const MAX_FILTER: usize = 1024;
/// Most names a wait reason lists before "and N more".
const LISTED: usize = 5;

/// A gate's answer: `None` not asked; `Some(Err(why))` it could not be
/// asked; `Some(Ok(names))` what blocks (the firing alerts the filter
/// matches; the blocking pods on the node, `namespace/name`), empty: open.
pub type GateAnswer = Option<Result<Vec<String>, Unanswered>>;

/// Why a gate could not be asked: the asker's own error, kept whole with
/// its sources (the server's `AskError`: HTTP, timeout, tenant API, …;
/// this crate links neither reqwest nor kube, so it holds it as a trait
/// object). Shown as one line, its sources included, where a node's wait
/// reason is made. Shared, as one answer serves every waiting node.
#[derive(Clone, Debug)]
pub struct Unanswered(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Unanswered {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Unanswered {
        Unanswered(Arc::new(e))
    }

    /// An error already shared (a cached answer): not copied.
    pub fn shared(e: Arc<dyn std::error::Error + Send + Sync + 'static>) -> Unanswered {
        Unanswered(e)
    }
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&lks_proto::report::one_line(self.0.as_ref()))
    }
}

impl std::error::Error for Unanswered {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// Two answers are alike when they read alike (the views are compared
/// between passes; an error has no identity of its own).
impl PartialEq for Unanswered {
    fn eq(&self, other: &Unanswered) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Unanswered {}

/// An answer that failed with `why` (tests).
#[cfg(test)]
pub(crate) fn unanswered(why: &str) -> Unanswered {
    Unanswered::new(std::io::Error::other(why.to_string()))
}

/// Why a node that wants a reboot slot waits, as a class: the `reason`
/// label of `lks_reboot_waiting_nodes` (each [`Wait`] also says it in
/// words). The order is the order the conditions are checked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WaitKind {
    /// Reboots are off for the cluster.
    Off,
    /// Every maintenance window of the cluster is closed.
    Window,
    /// The node is held (`node hold`).
    Held,
    /// The node is not connected.
    Offline,
    /// Its agent does not announce the `reboot` feature.
    NoFeature,
    /// Every slot of the lock is taken.
    Slots,
    /// An alert the filter matches fires.
    Alert,
    /// A pod the selector matches runs on the node.
    BlockingPod,
    /// A gate could not be asked, or not yet (Prometheus or the tenant API
    /// down, no kubeconfig): closed, failing safe.
    GateUnanswered,
}

impl WaitKind {
    pub const ALL: [WaitKind; 9] = [
        WaitKind::Off,
        WaitKind::Window,
        WaitKind::Held,
        WaitKind::Offline,
        WaitKind::NoFeature,
        WaitKind::Slots,
        WaitKind::Alert,
        WaitKind::BlockingPod,
        WaitKind::GateUnanswered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Off => "off",
            WaitKind::Window => "window",
            WaitKind::Held => "held",
            WaitKind::Offline => "offline",
            WaitKind::NoFeature => "no_feature",
            WaitKind::Slots => "slots",
            WaitKind::Alert => "alert",
            WaitKind::BlockingPod => "blocking_pod",
            WaitKind::GateUnanswered => "gate_unanswered",
        }
    }
}

/// Why a node waits for a reboot slot: its class and the line `node get`,
/// `reboot status` and the console show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub kind: WaitKind,
    pub message: String,
}

impl Wait {
    pub fn new(kind: WaitKind, message: impl Into<String>) -> Wait {
        Wait {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One alert as Prometheus lists it (`GET /api/v1/alerts`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromAlert {
    /// Its `alertname` label.
    pub name: String,
    /// `firing` or `pending` (or whatever else Prometheus says).
    pub state: String,
}

/// Why an alert filter was refused.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("--alert-filter is over {MAX_FILTER} characters")]
    TooLong,
    #[error("--alert-filter {filter:?} is not a regular expression: {why}")]
    Regex { filter: String, why: String },
}

/// The filter compiled; `None` for the empty one (every alert matches).
pub fn compile_filter(filter: &str) -> Result<Option<Regex>, FilterError> {
    if filter.is_empty() {
        return Ok(None);
    }
    if filter.len() > MAX_FILTER {
        return Err(FilterError::TooLong);
    }
    Regex::new(filter).map(Some).map_err(|e| FilterError::Regex {
        filter: filter.to_string(),
        // The engine's message spans lines (the pattern, a caret, the
        // error); its last line says what is wrong.
        why: e
            .to_string()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("invalid")
            .trim()
            .trim_start_matches("error: ")
            .to_string(),
    })
}

/// The alerts that hold reboots: firing ones (pending ones do not count:
/// their rule's `for` has not passed) whose name the filter matches
/// anywhere (as kured's `--alert-filter-regexp` with
/// `--alert-filter-match-only`; anchor it, `^Name$`, for one name), by
/// name, each once.
pub fn blocking_alerts(alerts: &[PromAlert], filter: Option<&Regex>) -> Vec<String> {
    let mut out: Vec<String> = alerts
        .iter()
        .filter(|a| a.state == "firing")
        .filter(|a| filter.is_none_or(|f| f.is_match(&a.name)))
        .map(|a| a.name.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// "a, b, c, d, e and 2 more".
pub fn listed(names: &[String]) -> String {
    let shown = names.iter().take(LISTED).cloned().collect::<Vec<_>>().join(", ");
    match names.len().saturating_sub(LISTED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Why the gates keep a node (`pods`: its blocking-pod answer; `None` for
/// a FleetLock id that names no node, which no pod can run on) from a
/// slot; `None`: they are open. `tenant_api`: the cluster has a
/// kubeconfig.
pub fn closed(
    policy: &RebootPolicy,
    alerts: &GateAnswer,
    pods: Option<&GateAnswer>,
    tenant_api: bool,
) -> Option<Wait> {
    use WaitKind::{Alert, BlockingPod, GateUnanswered};
    if let Some(g) = &policy.alert_gate {
        match alerts {
            None => {
                return Some(Wait::new(
                    GateUnanswered,
                    format!("the alert gate has not asked {} yet", g.url),
                ));
            }
            Some(Err(why)) => {
                return Some(Wait::new(
                    GateUnanswered,
                    format!(
                        "the alert gate is closed: Prometheus at {} cannot be asked ({why})",
                        g.url
                    ),
                ));
            }
            Some(Ok(firing)) if !firing.is_empty() => {
                return Some(Wait::new(
                    Alert,
                    format!("alert firing in {}: {}", g.url, listed(firing)),
                ));
            }
            Some(Ok(_)) => {}
        }
    }
    let selector = &policy.blocking_pod_selector;
    if selector.is_empty() {
        return None;
    }
    if !tenant_api {
        return Some(Wait::new(
            GateUnanswered,
            format!(
                "the blocking-pod selector {selector:?} cannot be checked: the cluster has no kubeconfig (cluster set --kubeconfig, or --no-blocking-pod-selector)"
            ),
        ));
    }
    match pods? {
        None => Some(Wait::new(
            GateUnanswered,
            "the blocking-pod gate has not asked the tenant API yet",
        )),
        Some(Err(why)) => Some(Wait::new(
            GateUnanswered,
            format!("the blocking-pod gate is closed: the tenant API cannot be asked ({why})"),
        )),
        Some(Ok(p)) if !p.is_empty() => Some(Wait::new(
            BlockingPod,
            format!("blocking pod(s) on the node: {}", listed(p)),
        )),
        Some(Ok(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use lks_store::AlertGate;

    use super::*;

    fn alert(name: &str, state: &str) -> PromAlert {
        PromAlert {
            name: name.into(),
            state: state.into(),
        }
    }

    #[test]
    fn an_unanswered_gate_keeps_its_error_and_reads_as_one_line() {
        #[derive(Debug, thiserror::Error)]
        #[error("ask Prometheus")]
        struct Ask(#[source] std::io::Error);
        let u = Unanswered::new(Ask(std::io::Error::other("connection refused")));
        assert_eq!(u.to_string(), "ask Prometheus: connection refused");
        let source = std::error::Error::source(&u).expect("the asker's error");
        assert_eq!(source.to_string(), "ask Prometheus");
        assert!(source.source().is_some(), "with its own source");
        assert_eq!(u.clone(), u, "a shared answer equals itself");
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_firing_alerts_the_filter_matches_block() {
        let alerts = [
            alert("KubeNodeNotReady", "firing"),
            alert("EtcdNoLeader", "pending"),
            alert("Watchdog", "firing"),
            alert("KubeNodeNotReady", "firing"),
        ];
        assert_eq!(
            blocking_alerts(&alerts, None),
            names(&["KubeNodeNotReady", "Watchdog"])
        );
        let f = compile_filter("^Kube").unwrap();
        assert_eq!(blocking_alerts(&alerts, f.as_ref()), names(&["KubeNodeNotReady"]));
        // Searched anywhere in the name, as kured's.
        let f = compile_filter("Ready").unwrap();
        assert_eq!(blocking_alerts(&alerts, f.as_ref()), names(&["KubeNodeNotReady"]));
        let f = compile_filter("^Etcd").unwrap();
        assert!(
            blocking_alerts(&alerts, f.as_ref()).is_empty(),
            "pending does not count"
        );
        assert!(compile_filter("").unwrap().is_none());
    }

    #[test]
    fn a_bad_filter_is_one_line() {
        let e = compile_filter("(Kube").unwrap_err().to_string();
        assert_eq!(
            e,
            "--alert-filter \"(Kube\" is not a regular expression: unclosed group"
        );
        assert!(matches!(
            compile_filter(&"a".repeat(MAX_FILTER + 1)),
            Err(FilterError::TooLong)
        ));
    }

    #[test]
    fn the_gates_close_on_firing_alerts_blocking_pods_and_silence() {
        let mut p = RebootPolicy::default();
        assert_eq!(closed(&p, &None, Some(&None), false), None, "no gate set");
        p.alert_gate = Some(AlertGate {
            url: "http://prom:9090".into(),
            filter: String::new(),
        });
        let open: GateAnswer = Some(Ok(vec![]));
        use WaitKind::{Alert, BlockingPod, GateUnanswered};
        assert_eq!(
            closed(&p, &None, None, true).unwrap(),
            Wait::new(
                GateUnanswered,
                "the alert gate has not asked http://prom:9090 yet"
            )
        );
        assert_eq!(
            closed(&p, &Some(Err(unanswered("connection refused"))), None, true).unwrap(),
            Wait::new(
                GateUnanswered,
                "the alert gate is closed: Prometheus at http://prom:9090 cannot be asked (connection refused)"
            )
        );
        let many: Vec<String> = (1..=7).map(|i| format!("A{i}")).collect();
        assert_eq!(
            closed(&p, &Some(Ok(many)), None, true).unwrap(),
            Wait::new(
                Alert,
                "alert firing in http://prom:9090: A1, A2, A3, A4, A5 and 2 more"
            )
        );
        assert_eq!(closed(&p, &open, None, true), None);

        p.blocking_pod_selector = "app=db".into();
        assert_eq!(
            closed(&p, &open, None, true),
            None,
            "a FleetLock id that is no node"
        );
        let no_api = closed(&p, &open, Some(&open), false).unwrap();
        assert_eq!(no_api.kind, GateUnanswered);
        assert!(
            no_api
                .message
                .contains("cannot be checked: the cluster has no kubeconfig")
        );
        assert_eq!(
            closed(&p, &open, Some(&None), true).unwrap(),
            Wait::new(
                GateUnanswered,
                "the blocking-pod gate has not asked the tenant API yet"
            )
        );
        assert_eq!(
            closed(&p, &open, Some(&Some(Err(unanswered("403")))), true).unwrap(),
            Wait::new(
                GateUnanswered,
                "the blocking-pod gate is closed: the tenant API cannot be asked (403)"
            )
        );
        let pods = Some(Ok(names(&["db/pg-0", "db/pg-1"])));
        assert_eq!(
            closed(&p, &open, Some(&pods), true).unwrap(),
            Wait::new(BlockingPod, "blocking pod(s) on the node: db/pg-0, db/pg-1")
        );
        assert_eq!(closed(&p, &open, Some(&open), true), None);
        // The alert gate speaks first.
        let firing = Some(Ok(names(&["X"])));
        assert_eq!(closed(&p, &firing, Some(&pods), true).unwrap().kind, Alert);
    }
}
