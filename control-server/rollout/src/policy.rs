//! A rollout's policy as the operator asks for it, typed once: lksctl's
//! `rollout start` flags, an `LksRollout`'s spec and `StartRolloutRequest`
//! ([`wire`]) all convert to and from [`Policy`]. Its defaults are the
//! `DEFAULT_*` constants here, its one check is [`Policy::validate`], and
//! the server turns it, against the cluster it targets, into the
//! [`RolloutPolicy`] the rollout is stored with ([`Policy::resolve`]).
//!
//! The choices are the store's enums ([`OfflinePolicy`], [`DrainTimeout`]),
//! written as the same words everywhere ([`OfflinePolicy::as_str`]).

pub mod wire;

use std::time::Duration;

use lks_store::{ClusterRow, DrainPolicy, RolloutPolicy};
pub use lks_store::{DrainTimeout, OfflinePolicy};

/// Failures tolerated before a rollout fails, when the operator gives none.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 1;
/// How long a node may be offline at its turn, when the operator gives none.
pub const DEFAULT_OFFLINE_DEADLINE: Duration = Duration::from_secs(600);
/// How long canaries soak when the operator asks for canaries and no soak.
pub const DEFAULT_CANARY_SOAK: Duration = Duration::from_secs(600);
/// [`DEFAULT_CANARY_SOAK`] as lksctl's `--canary-soak` shows it.
pub const DEFAULT_CANARY_SOAK_TEXT: &str = "10m";
/// `--drain-timeout` unless given.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_millis(DrainPolicy::DEFAULT_TIMEOUT_MS);
/// `--ready-timeout` unless given.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_millis(DrainPolicy::DEFAULT_READY_TIMEOUT_MS);

/// Largest batch size.
pub const MAX_BATCH_SIZE: u32 = 100_000;
/// Longest offline deadline.
pub const MAX_OFFLINE_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest canary soak and batch interval.
pub const MAX_PAUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest drain timeout and Ready timeout.
pub const MAX_KUBE_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Longest kubelet version.
const MAX_KUBELET_VERSION: usize = 64;

/// What a rollout start asks for beyond which nodes (cluster, bundle,
/// selector): `None` is "not said", which the defaults fill in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Most nodes applying at once; `None`: 10 % of the target nodes,
    /// rounded up (decided where the start is recorded).
    pub batch_size: Option<u32>,
    /// Failed nodes that stop the rollout; `None`: [`DEFAULT_FAILURE_THRESHOLD`].
    pub failure_threshold: Option<u32>,
    /// What a node offline at its turn does; `None`: defer.
    pub offline: Option<OfflinePolicy>,
    /// How long a node offline at its turn (`wait`) or gone mid-apply is
    /// waited for; `None`: [`DEFAULT_OFFLINE_DEADLINE`].
    pub offline_deadline: Option<Duration>,
    /// Nodes that go first; 0: none.
    pub canary: u32,
    /// How long canaries must stay committed; `None`: [`DEFAULT_CANARY_SOAK`]
    /// (with canaries).
    pub canary_soak: Option<Duration>,
    /// Pause between batches; `None`: a freed slot is refilled at once.
    pub batch_interval: Option<Duration>,
    /// Start nodes outside the cluster's maintenance windows.
    pub ignore_windows: bool,
    pub drain: DrainOptions,
}

/// Whether and how the rollout drains each node around its turn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainOptions {
    /// `None`: the cluster's default (`cluster set --drain`).
    pub enabled: Option<bool>,
    /// How long one node's drain may take; `None`: [`DEFAULT_DRAIN_TIMEOUT`].
    pub timeout: Option<Duration>,
    /// How long after applying the Node must be Ready; `None`:
    /// [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Option<Duration>,
    /// Evict pods with hostPath volumes too.
    pub delete_local_data: bool,
    /// What a node whose drain timed out becomes; `None`: it fails.
    pub on_timeout: Option<DrainTimeout>,
    /// The kubelet version the Ready gate wants, e.g. "v1.37.2"; `None`: any.
    pub kubelet_version: Option<String>,
}

impl DrainOptions {
    /// Whether any option besides `enabled` is given (they need draining).
    pub fn tuned(&self) -> bool {
        self.timeout.is_some()
            || self.ready_timeout.is_some()
            || self.delete_local_data
            || self.on_timeout.is_some()
            || self.kubelet_version.is_some()
    }
}

/// Why a policy is refused (one line each; the server's answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("batch size {size} is larger than the limit of {MAX_BATCH_SIZE}")]
    BatchTooLarge { size: u32 },
    #[error("offline deadline is longer than the limit of 7 days")]
    DeadlineTooLong,
    #[error("offline policy {0:?} is unknown; use \"defer\" or \"wait\"")]
    UnknownOffline(String),
    /// An `OfflinePolicy` enum value this build does not know.
    #[error("offline_policy {0} is unknown; use \"defer\" or \"wait\"")]
    UnknownOfflineValue(i32),
    #[error("--canary {canary} is more than the {matched} node(s) the rollout matches")]
    TooManyCanaries { canary: u32, matched: usize },
    #[error("a canary soak needs --canary N")]
    SoakWithoutCanary,
    #[error("{0} is longer than the limit of 7 days")]
    PauseTooLong(&'static str),
    #[error(
        "--drain-timeout, --ready-timeout, --drain-delete-local-data, --on-drain-timeout and \
         --kubelet-version need --drain"
    )]
    TunedWithoutDrain,
    #[error(
        "cluster {0} has no kubeconfig, so its nodes cannot be drained: give it one with \
         `lksctl cluster set {0} --kubeconfig FILE` (packaging/kubernetes/tenant/README.md)"
    )]
    NoKubeconfig(String),
    #[error("{0} is longer than the limit of 24h")]
    WaitTooLong(&'static str),
    #[error("--on-drain-timeout {0:?} is unknown; use \"fail\" or \"skip\"")]
    UnknownDrainTimeout(String),
    /// A `DrainTimeoutAction` enum value this build does not know.
    #[error("drain_timeout_action {0} is unknown; use \"fail\" or \"skip\"")]
    UnknownDrainTimeoutValue(i32),
    #[error("--kubelet-version {0:?} is not a version like v1.37.2")]
    KubeletVersion(String),
}

impl PolicyError {
    /// The operator must change something outside the request (the
    /// cluster), not the request itself.
    pub fn is_precondition(&self) -> bool {
        matches!(self, PolicyError::NoKubeconfig(_))
    }
}

/// A start's policy as the server records it: the [`RolloutPolicy`] and
/// the limits kept beside it on the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// 0: the default, decided where the start is recorded.
    pub batch_size: u32,
    pub failure_threshold: u32,
    pub offline_deadline: Duration,
    pub policy: RolloutPolicy,
}

impl Policy {
    /// What a node offline at its turn does.
    pub fn offline(&self) -> OfflinePolicy {
        self.offline.unwrap_or_default()
    }

    /// How long canaries soak: zero without canaries.
    pub fn canary_soak(&self) -> Duration {
        match (self.canary, self.canary_soak) {
            (0, soak) => soak.unwrap_or(Duration::ZERO),
            (_, soak) => soak.unwrap_or(DEFAULT_CANARY_SOAK),
        }
    }

    pub fn failure_threshold(&self) -> u32 {
        self.failure_threshold
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_FAILURE_THRESHOLD)
    }

    pub fn offline_deadline(&self) -> Duration {
        self.offline_deadline.unwrap_or(DEFAULT_OFFLINE_DEADLINE)
    }

    /// The checks that need nothing but the policy, in the order the
    /// operator's mistakes are named.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if let Some(size) = self.batch_size.filter(|s| *s > MAX_BATCH_SIZE) {
            return Err(PolicyError::BatchTooLarge { size });
        }
        if self.offline_deadline() > MAX_OFFLINE_DEADLINE {
            return Err(PolicyError::DeadlineTooLong);
        }
        if self.canary == 0 && self.canary_soak.is_some_and(|s| !s.is_zero()) {
            return Err(PolicyError::SoakWithoutCanary);
        }
        if self.canary_soak() > MAX_PAUSE {
            return Err(PolicyError::PauseTooLong("canary soak"));
        }
        if self.batch_interval.is_some_and(|d| d > MAX_PAUSE) {
            return Err(PolicyError::PauseTooLong("batch interval"));
        }
        let d = &self.drain;
        if d.enabled == Some(false) && d.tuned() {
            return Err(PolicyError::TunedWithoutDrain);
        }
        if let Some(v) = &d.kubelet_version
            && (v.len() > MAX_KUBELET_VERSION
                || !v.starts_with('v')
                || v.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(PolicyError::KubeletVersion(v.clone()));
        }
        for (what, wait) in [
            ("--drain-timeout", d.timeout),
            ("--ready-timeout", d.ready_timeout),
        ] {
            if wait.is_some_and(|w| w > MAX_KUBE_WAIT) {
                return Err(PolicyError::WaitTooLong(what));
            }
        }
        Ok(())
    }

    /// The policy the rollout is stored with: [`Self::validate`], then what
    /// needs the target — `matched` counts the nodes the selector matches
    /// now (a canary count may not exceed it), the cluster's drain default
    /// and kubeconfig. `canary_seed` fixes the canary pick.
    pub fn resolve(
        &self,
        cluster: &ClusterRow,
        matched: usize,
        request_id: &str,
        canary_seed: u64,
    ) -> Result<Resolved, PolicyError> {
        self.validate()?;
        if self.canary as usize > matched {
            return Err(PolicyError::TooManyCanaries {
                canary: self.canary,
                matched,
            });
        }
        Ok(Resolved {
            batch_size: self.batch_size.unwrap_or(0),
            failure_threshold: self.failure_threshold(),
            offline_deadline: self.offline_deadline(),
            policy: RolloutPolicy {
                offline: self.offline(),
                canary: self.canary,
                canary_soak_ms: millis(self.canary_soak()),
                canary_seed,
                batch_interval_ms: self.batch_interval.map_or(0, millis),
                ignore_windows: self.ignore_windows,
                drain: self.drain.resolve(cluster)?,
                request_id: request_id.to_string(),
            },
        })
    }
}

impl DrainOptions {
    /// How the rollout drains, with the cluster's default: `None` when it
    /// does not. Draining needs the cluster's kubeconfig.
    fn resolve(&self, cluster: &ClusterRow) -> Result<Option<DrainPolicy>, PolicyError> {
        if !self.enabled.unwrap_or(cluster.kube.drain) {
            if self.tuned() {
                return Err(PolicyError::TunedWithoutDrain);
            }
            return Ok(None);
        }
        if !cluster.kube.kubeconfig {
            return Err(PolicyError::NoKubeconfig(cluster.name.clone()));
        }
        Ok(Some(DrainPolicy {
            timeout_ms: millis(self.timeout.unwrap_or(DEFAULT_DRAIN_TIMEOUT)),
            ready_timeout_ms: millis(self.ready_timeout.unwrap_or(DEFAULT_READY_TIMEOUT)),
            delete_local_data: self.delete_local_data,
            on_timeout: self.on_timeout.unwrap_or_default(),
            kubelet_version: self.kubelet_version.clone().unwrap_or_default(),
        }))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
