//! A rollout start's policy options, checked and turned into the policy
//! the rollout is stored with: offline nodes, canaries and pacing, and how
//! (and whether) its nodes are drained.

use std::time::Duration;

use crate::ops::Kind;
use crate::store::{ClusterRow, DrainPolicy, DrainTimeout, OfflinePolicy, RolloutPolicy};

/// Longest canary soak and batch interval.
const MAX_PAUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest `--drain-timeout` and `--ready-timeout`.
const MAX_KUBE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The pacing options of a start, as asked for.
#[derive(Clone, Debug, Default)]
pub struct PolicyRequest {
    /// `defer`, `wait`, or empty (`defer`).
    pub offline: String,
    pub canary: u32,
    pub canary_soak_seconds: u64,
    pub batch_interval_seconds: u64,
    pub ignore_windows: bool,
}

/// The drain options of a start, as asked for.
#[derive(Clone, Debug, Default)]
pub struct DrainRequest {
    /// `None`: the cluster's default.
    pub drain: Option<bool>,
    pub drain_timeout_seconds: u64,
    pub ready_timeout_seconds: u64,
    pub delete_local_data: bool,
    /// `fail`, `skip`, or empty (`fail`).
    pub on_drain_timeout: String,
    pub kubelet_version: String,
}

/// Why the options of a start are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("offline policy {0:?} is unknown; use \"defer\" or \"wait\"")]
    UnknownOffline(String),
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
    #[error("--kubelet-version {0:?} is not a version like v1.37.2")]
    KubeletVersion(String),
}

impl PolicyError {
    pub fn kind(&self) -> Kind {
        match self {
            PolicyError::NoKubeconfig(_) => Kind::FailedPrecondition,
            _ => Kind::Invalid,
        }
    }
}

impl PolicyRequest {
    /// The policy of a start with `request_id`. `matched` counts the nodes
    /// the selector matches now, which a canary count may not exceed.
    pub fn check(&self, request_id: &str, matched: usize) -> Result<RolloutPolicy, PolicyError> {
        let offline = match self.offline.as_str() {
            "" => OfflinePolicy::Defer,
            s => OfflinePolicy::parse(s).ok_or_else(|| PolicyError::UnknownOffline(s.to_string()))?,
        };
        if self.canary as usize > matched {
            return Err(PolicyError::TooManyCanaries {
                canary: self.canary,
                matched,
            });
        }
        if self.canary == 0 && self.canary_soak_seconds > 0 {
            return Err(PolicyError::SoakWithoutCanary);
        }
        let mut seed = [0u8; 8];
        let _ = getrandom::getrandom(&mut seed);
        Ok(RolloutPolicy {
            offline,
            canary: self.canary,
            canary_soak_ms: pause("canary soak", self.canary_soak_seconds)?,
            canary_seed: u64::from_le_bytes(seed),
            batch_interval_ms: pause("batch interval", self.batch_interval_seconds)?,
            ignore_windows: self.ignore_windows,
            drain: None,
            request_id: request_id.to_string(),
        })
    }
}

fn pause(what: &'static str, secs: u64) -> Result<u64, PolicyError> {
    let d = Duration::from_secs(secs);
    if d > MAX_PAUSE {
        return Err(PolicyError::PauseTooLong(what));
    }
    Ok(d.as_millis() as u64)
}

impl DrainRequest {
    /// How the rollout drains, from the request and the cluster's default:
    /// `None` when it does not. Draining needs the cluster's kubeconfig.
    pub fn check(&self, cluster: &ClusterRow) -> Result<Option<DrainPolicy>, PolicyError> {
        let drain = self.drain.unwrap_or(cluster.kube.drain);
        let tuned = self.drain_timeout_seconds > 0
            || self.ready_timeout_seconds > 0
            || self.delete_local_data
            || !self.on_drain_timeout.is_empty()
            || !self.kubelet_version.is_empty();
        if !drain {
            if tuned {
                return Err(PolicyError::TunedWithoutDrain);
            }
            return Ok(None);
        }
        if !cluster.kube.kubeconfig {
            return Err(PolicyError::NoKubeconfig(cluster.name.clone()));
        }
        let on_timeout = match self.on_drain_timeout.as_str() {
            "" => DrainTimeout::Fail,
            s => DrainTimeout::parse(s).ok_or_else(|| PolicyError::UnknownDrainTimeout(s.to_string()))?,
        };
        let v = &self.kubelet_version;
        if !v.is_empty()
            && (v.len() > 64 || !v.starts_with('v') || v.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(PolicyError::KubeletVersion(v.clone()));
        }
        Ok(Some(DrainPolicy {
            timeout_ms: wait(
                "--drain-timeout",
                self.drain_timeout_seconds,
                DrainPolicy::DEFAULT_TIMEOUT_MS,
            )?,
            ready_timeout_ms: wait(
                "--ready-timeout",
                self.ready_timeout_seconds,
                DrainPolicy::DEFAULT_READY_TIMEOUT_MS,
            )?,
            delete_local_data: self.delete_local_data,
            on_timeout,
            kubelet_version: v.clone(),
        }))
    }
}

/// A kube wait in milliseconds: `default_ms` if not given.
fn wait(what: &'static str, secs: u64, default_ms: u64) -> Result<u64, PolicyError> {
    if secs == 0 {
        return Ok(default_ms);
    }
    if Duration::from_secs(secs) > MAX_KUBE_WAIT {
        return Err(PolicyError::WaitTooLong(what));
    }
    Ok(secs.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(drain: bool, kubeconfig: bool) -> ClusterRow {
        let mut c = ClusterRow {
            name: "tenant-a".into(),
            created_at_ms: 0,
            node_count: 0,
            maintenance_windows: Vec::new(),
            ca_cert_pem: None,
            api_server: None,
            peer: crate::store::PeerSettings::default(),
            kube: Default::default(),
        };
        c.kube.drain = drain;
        c.kube.kubeconfig = kubeconfig;
        c
    }

    #[test]
    fn pacing_is_checked_against_the_matched_nodes() {
        let p = PolicyRequest {
            canary: 2,
            canary_soak_seconds: 60,
            batch_interval_seconds: 5,
            ..Default::default()
        };
        let got = p.check("req", 2).unwrap();
        assert_eq!(
            (got.canary, got.canary_soak_ms, got.batch_interval_ms),
            (2, 60_000, 5_000)
        );
        assert_eq!(got.request_id, "req");
        assert_eq!(got.offline, OfflinePolicy::Defer);
        assert_eq!(
            p.check("", 1).unwrap_err().to_string(),
            "--canary 2 is more than the 1 node(s) the rollout matches"
        );
        let soak = PolicyRequest {
            canary_soak_seconds: 1,
            ..Default::default()
        };
        assert_eq!(soak.check("", 3), Err(PolicyError::SoakWithoutCanary));
        let long = PolicyRequest {
            batch_interval_seconds: 8 * 24 * 3600,
            ..Default::default()
        };
        assert_eq!(
            long.check("", 3).unwrap_err().to_string(),
            "batch interval is longer than the limit of 7 days"
        );
        let odd = PolicyRequest {
            offline: "later".into(),
            ..Default::default()
        };
        assert_eq!(odd.check("", 3).unwrap_err().kind(), Kind::Invalid);
    }

    #[test]
    fn draining_follows_the_cluster_and_needs_its_kubeconfig() {
        let plain = DrainRequest::default();
        assert_eq!(plain.check(&cluster(false, true)), Ok(None));
        let tuned = DrainRequest {
            drain_timeout_seconds: 60,
            ..Default::default()
        };
        assert_eq!(
            tuned.check(&cluster(false, true)),
            Err(PolicyError::TunedWithoutDrain)
        );
        let d = plain.check(&cluster(true, true)).unwrap().unwrap();
        assert_eq!(d.timeout_ms, DrainPolicy::DEFAULT_TIMEOUT_MS);
        assert_eq!(d.on_timeout, DrainTimeout::Fail);
        let e = plain.check(&cluster(true, false)).unwrap_err();
        assert_eq!(e.kind(), Kind::FailedPrecondition);
        assert!(
            e.to_string().starts_with("cluster tenant-a has no kubeconfig"),
            "{e}"
        );
        let off = DrainRequest {
            drain: Some(false),
            ..Default::default()
        };
        assert_eq!(off.check(&cluster(true, false)), Ok(None));
        let long = DrainRequest {
            drain: Some(true),
            ready_timeout_seconds: 25 * 3600,
            ..Default::default()
        };
        assert_eq!(
            long.check(&cluster(false, true)).unwrap_err().to_string(),
            "--ready-timeout is longer than the limit of 24h"
        );
        let version = DrainRequest {
            drain: Some(true),
            kubelet_version: "1.37".into(),
            ..Default::default()
        };
        assert_eq!(
            version.check(&cluster(false, true)),
            Err(PolicyError::KubeletVersion("1.37".into()))
        );
    }
}
