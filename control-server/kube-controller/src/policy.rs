//! An `LksRollout`'s spec ↔ the rollout policy ([`Policy`], the one type
//! lksctl's flags and `StartRolloutRequest` convert to as well): what a
//! declared rollout asks the server for, and the spec a mirror of a
//! started rollout shows. Defaults are the policy's (`spec.canary.soak`
//! absent is [`lks_rollout::policy::DEFAULT_CANARY_SOAK`]); the server
//! checks the policy ([`Policy::validate`]); only what the spec's text
//! cannot say is refused here.

use std::time::Duration;

use lks_rollout::policy::{DrainOptions, Policy};

use crate::crd::{Canary, Drain, RolloutPolicySpec, SpecText, SpecValue};

/// A spec that cannot be sent as written (one line).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.bundle {0:?} is not NAME@VERSION")]
    Bundle(String),
    #[error("{field}: {source}")]
    Duration {
        field: &'static str,
        #[source]
        source: lks_proto::duration::DurationError,
    },
    #[error("spec.{field} {value:?} is unknown; use {allowed}")]
    Choice {
        field: &'static str,
        value: String,
        allowed: String,
    },
}

/// A duration of the spec in whole seconds, at least one (the wire's
/// unit, where 0 is "not given").
pub fn secs(field: &'static str, v: &Option<SpecValue<Duration>>) -> Result<Option<Duration>, SpecError> {
    v.as_ref()
        .map(|v| {
            v.duration()
                .map(|d| Duration::from_secs(d.as_secs().max(1)))
                .map_err(|source| SpecError::Duration { field, source })
        })
        .transpose()
}

pub fn choice<T: SpecText>(field: &'static str, v: &Option<SpecValue<T>>) -> Result<Option<T>, SpecError> {
    v.as_ref()
        .map(|v| {
            v.get().ok_or_else(|| SpecError::Choice {
                field,
                value: v.text().to_string(),
                allowed: T::words().join(" or "),
            })
        })
        .transpose()
}

/// The policy a spec asks for (`spec.drain` absent: the cluster's
/// default; a canary count of 0 ignores the soak).
pub fn policy(spec: &RolloutPolicySpec) -> Result<Policy, SpecError> {
    let canary = spec.canary.clone().unwrap_or_default();
    let drain = spec.drain.clone().unwrap_or_default();
    Ok(Policy {
        batch_size: spec.batch_size,
        failure_threshold: spec.failure_threshold,
        offline: choice("offline", &spec.offline)?,
        offline_deadline: None,
        canary: canary.count,
        canary_soak: match canary.count {
            0 => None,
            _ => secs("spec.canary.soak", &canary.soak)?,
        },
        batch_interval: secs("spec.batchInterval", &spec.batch_interval)?,
        ignore_windows: spec.ignore_windows,
        drain: DrainOptions {
            enabled: spec.drain.as_ref().map(|d| d.enabled),
            timeout: secs("spec.drain.timeout", &drain.timeout)?,
            ready_timeout: secs("spec.drain.readyTimeout", &drain.ready_timeout)?,
            delete_local_data: drain.delete_local_data,
            on_timeout: choice("drain.onTimeout", &drain.on_timeout)?,
            kubelet_version: drain.kubelet_version.clone(),
        },
    })
}

/// `spec` with its policy fields saying `p` (the inverse of [`policy`]
/// for what a spec can say: drain options need `enabled`, and the spec
/// has no offline deadline).
pub fn with_policy(p: &Policy) -> RolloutPolicySpec {
    let d = &p.drain;
    RolloutPolicySpec {
        batch_size: p.batch_size,
        failure_threshold: p.failure_threshold,
        offline: p.offline.map(SpecValue::from),
        canary: (p.canary > 0).then(|| Canary {
            count: p.canary,
            soak: p.canary_soak.map(SpecValue::from),
        }),
        batch_interval: p.batch_interval.map(SpecValue::from),
        ignore_windows: p.ignore_windows,
        drain: d.enabled.map(|enabled| Drain {
            enabled,
            timeout: d.timeout.map(SpecValue::from),
            ready_timeout: d.ready_timeout.map(SpecValue::from),
            on_timeout: d.on_timeout.map(SpecValue::from),
            delete_local_data: d.delete_local_data,
            kubelet_version: d.kubelet_version.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use lks_rollout::policy::{DEFAULT_CANARY_SOAK, DrainTimeout, OfflinePolicy};

    use super::*;

    fn spec() -> RolloutPolicySpec {
        RolloutPolicySpec::default()
    }

    fn full() -> RolloutPolicySpec {
        RolloutPolicySpec {
            batch_size: Some(2),
            failure_threshold: Some(3),
            offline: Some(SpecValue::from("wait")),
            canary: Some(Canary {
                count: 1,
                soak: Some(SpecValue::from("1m30s")),
            }),
            batch_interval: Some(SpecValue::from("5m")),
            ignore_windows: true,
            drain: Some(Drain {
                enabled: true,
                timeout: Some(SpecValue::from("10m")),
                ready_timeout: Some(SpecValue::from("5m")),
                on_timeout: Some(SpecValue::from("skip")),
                delete_local_data: true,
                kubelet_version: Some("v1.37.2".into()),
            }),
        }
    }

    #[test]
    fn a_spec_is_its_policy_and_back() {
        let p = policy(&full()).unwrap();
        assert_eq!(p.offline, Some(OfflinePolicy::Wait));
        assert_eq!(p.canary_soak, Some(Duration::from_secs(90)));
        assert_eq!(p.drain.on_timeout, Some(DrainTimeout::Skip));
        assert_eq!(p.drain.timeout, Some(Duration::from_secs(600)));
        assert_eq!(with_policy(&p), full());
        assert_eq!(policy(&spec()).unwrap(), Policy::default());
        assert_eq!(with_policy(&Policy::default()), spec());
        // ... and through the wire: spec → policy → request → policy → spec.
        let wire = Policy::try_from(&p.to_request()).unwrap();
        assert_eq!(with_policy(&wire), full());
    }

    #[test]
    fn the_policy_fills_in_the_defaults_the_spec_leaves_out() {
        let mut s = spec();
        s.canary = Some(Canary { count: 2, soak: None });
        let p = policy(&s).unwrap();
        assert_eq!(p.canary_soak(), DEFAULT_CANARY_SOAK);
        assert_eq!(p.offline(), OfflinePolicy::Defer);
        s.canary = Some(Canary {
            count: 1,
            soak: Some(SpecValue::from("500ms")),
        });
        assert_eq!(
            policy(&s).unwrap().canary_soak,
            Some(Duration::from_secs(1)),
            "whole seconds, at least one"
        );
    }

    #[test]
    fn text_that_names_nothing_is_refused_naming_the_field() {
        let mut s = spec();
        s.offline = Some(SpecValue::from("later"));
        assert_eq!(
            policy(&s).unwrap_err().to_string(),
            "spec.offline \"later\" is unknown; use defer or wait"
        );
        let mut s = spec();
        s.drain = Some(Drain {
            enabled: true,
            on_timeout: Some(SpecValue::from("retry")),
            ..Default::default()
        });
        assert_eq!(
            policy(&s).unwrap_err().to_string(),
            "spec.drain.onTimeout \"retry\" is unknown; use fail or skip"
        );
        let mut s = spec();
        s.batch_interval = Some(SpecValue::from("soon"));
        let e = policy(&s).unwrap_err().to_string();
        assert!(
            e.starts_with("spec.batchInterval: invalid duration \"soon\""),
            "{e}"
        );
    }

    #[test]
    fn spec_values_read_and_write_the_text_as_written() {
        let s: crate::crd::LksRolloutSpec = serde_json::from_value(serde_json::json!({
            "cluster": "a", "bundle": "k@1", "offline": "later",
            "canary": {"count": 1, "soak": "90s"},
        }))
        .unwrap();
        assert_eq!(
            s.policy.offline.as_ref().map(SpecValue::get),
            Some(None),
            "read, refused later"
        );
        let soak = s.policy.canary.as_ref().and_then(|c| c.soak.clone()).unwrap();
        assert_eq!((soak.text(), soak.get()), ("90s", Some(Duration::from_secs(90))));
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["canary"]["soak"], "90s", "not rewritten as 1m30s");
        assert_eq!(back["offline"], "later");
    }
}
