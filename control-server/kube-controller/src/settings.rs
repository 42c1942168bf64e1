//! An `LksCluster`'s reboot policy and labels → what a `SetCluster` sends
//! (issue [reboots], `cluster set --reboots … --labels …`): each field the
//! spec gives and the server's cluster does not have; a field absent from
//! the spec is left as the server has it.

use std::time::Duration;

use lks_proto::pb;

use crate::crd::LksClusterSpec;
use crate::policy::{SpecError, choice};

/// Puts into `set` the reboot policy and labels of `spec` that differ from
/// `server`'s; true when it put anything.
pub fn reboots_and_labels(
    spec: &LksClusterSpec,
    server: &pb::Cluster,
    set: &mut pb::SetClusterRequest,
) -> Result<bool, SpecError> {
    let mut any = false;
    if let Some(r) = &spec.reboots {
        let have = server.reboots.clone().unwrap_or_default();
        let mode = choice("reboots.mode", &r.mode)?;
        if let Some(m) = mode
            && pb::RebootMode::try_from(have.mode).unwrap_or(pb::RebootMode::Off) != m
        {
            set.reboots = Some(m as i32);
            any = true;
        }
        if let Some(n) = r.max_concurrent
            && n != have.max_concurrent
        {
            set.max_concurrent_reboots = Some(n);
            any = true;
        }
        if let Some(t) = &r.timeout {
            let d = t.duration().map_err(|source| SpecError::Duration {
                field: "spec.reboots.timeout",
                source,
            })?;
            let ms = u64::try_from(d.max(Duration::from_millis(1)).as_millis()).unwrap_or(u64::MAX);
            if ms != have.timeout_ms {
                set.reboot_timeout_ms = Some(ms);
                any = true;
            }
        }
        let on = choice("reboots.onTimeout", &r.on_timeout)?;
        if let Some(p) = on
            && pb::RebootTimeoutPolicy::try_from(have.on_timeout).unwrap_or(pb::RebootTimeoutPolicy::Free)
                != p
        {
            set.on_reboot_timeout = Some(p as i32);
            any = true;
        }
        any |= gates(r, &have, set);
    }
    if let Some(labels) = &spec.labels {
        let have: std::collections::BTreeMap<&String, &String> = server.labels.iter().collect();
        let want: std::collections::BTreeMap<&String, &String> = labels.iter().collect();
        if have != want {
            set.labels = labels.clone().into_iter().collect();
            set.clear_labels = labels.is_empty();
            any = true;
        }
    }
    Ok(any)
}

/// The reboot gates of `r` that differ from `have` (the server stores a
/// URL without a trailing `/` and a selector in its canonical form).
fn gates(r: &crate::crd::Reboots, have: &pb::RebootPolicy, set: &mut pb::SetClusterRequest) -> bool {
    let mut any = false;
    if let Some(g) = &r.alert_gate {
        let had = have
            .alert_gate
            .as_ref()
            .map(|h| (h.url.as_str(), h.filter.as_str()));
        if g.url.is_empty() {
            if had.is_some() {
                set.clear_reboot_alert_gate = true;
                any = true;
            }
        } else if had != Some((g.url.trim_end_matches('/'), g.filter.as_str())) {
            set.reboot_alert_gate = Some(g.url.clone());
            set.alert_filter = Some(g.filter.clone());
            any = true;
        }
    }
    if let Some(sel) = &r.blocking_pod_selector {
        if sel.is_empty() {
            if !have.blocking_pod_selector.is_empty() {
                set.clear_blocking_pod_selector = true;
                any = true;
            }
        } else {
            // One that does not parse is sent: the server's refusal names it.
            let canonical =
                lks_proto::labels::parse_selector(sel).map_or_else(|_| sel.clone(), |s| s.to_string());
            if canonical != have.blocking_pod_selector {
                set.blocking_pod_selector = Some(sel.clone());
                any = true;
            }
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::crd::{Reboots, SpecValue};

    fn server() -> pb::Cluster {
        pb::Cluster {
            name: "a".into(),
            reboots: Some(pb::RebootPolicy {
                mode: pb::RebootMode::Off as i32,
                max_concurrent: 1,
                timeout_ms: 30 * 60_000,
                on_timeout: pb::RebootTimeoutPolicy::Free as i32,
                ..Default::default()
            }),
            labels: [("env".to_string(), "prod".to_string())].into(),
            ..Default::default()
        }
    }

    fn run(spec: &LksClusterSpec, server: &pb::Cluster) -> Result<Option<pb::SetClusterRequest>, SpecError> {
        let mut set = pb::SetClusterRequest::default();
        Ok(reboots_and_labels(spec, server, &mut set)?.then_some(set))
    }

    #[test]
    fn absent_fields_leave_the_server_as_it_is() {
        assert_eq!(run(&LksClusterSpec::default(), &server()), Ok(None));
        let spec = LksClusterSpec {
            reboots: Some(Reboots::default()),
            ..Default::default()
        };
        assert_eq!(
            run(&spec, &server()),
            Ok(None),
            "an empty reboots changes nothing"
        );
    }

    #[test]
    fn what_differs_is_sent() {
        let spec = LksClusterSpec {
            reboots: Some(Reboots {
                mode: Some(SpecValue::from("auto")),
                max_concurrent: Some(2),
                timeout: Some(SpecValue::from("45m")),
                on_timeout: Some(SpecValue::from("keep")),
                ..Default::default()
            }),
            labels: Some(BTreeMap::from([("env".to_string(), "staging".to_string())])),
            ..Default::default()
        };
        let set = run(&spec, &server()).unwrap().unwrap();
        assert_eq!(set.reboots, Some(pb::RebootMode::Auto as i32));
        assert_eq!(set.max_concurrent_reboots, Some(2));
        assert_eq!(set.reboot_timeout_ms, Some(45 * 60_000));
        assert_eq!(set.on_reboot_timeout, Some(pb::RebootTimeoutPolicy::Keep as i32));
        assert_eq!(set.labels.get("env").map(String::as_str), Some("staging"));
        assert!(!set.clear_labels);

        // The same policy again: nothing to send.
        let mut s = server();
        s.reboots = Some(pb::RebootPolicy {
            mode: pb::RebootMode::Auto as i32,
            max_concurrent: 2,
            timeout_ms: 45 * 60_000,
            on_timeout: pb::RebootTimeoutPolicy::Keep as i32,
            ..Default::default()
        });
        s.labels = [("env".to_string(), "staging".to_string())].into();
        assert_eq!(run(&spec, &s), Ok(None));

        // `labels: {}` removes them.
        let clear = LksClusterSpec {
            labels: Some(BTreeMap::new()),
            ..Default::default()
        };
        let set = run(&clear, &server()).unwrap().unwrap();
        assert!(set.clear_labels && set.labels.is_empty());
    }

    #[test]
    fn the_gates_are_sent_when_they_differ_and_removed_when_emptied() {
        let spec = |gate: Option<(&str, &str)>, sel: Option<&str>| LksClusterSpec {
            reboots: Some(Reboots {
                alert_gate: gate.map(|(url, filter)| crate::crd::AlertGateSpec {
                    url: url.into(),
                    filter: filter.into(),
                }),
                blocking_pod_selector: sel.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        };
        let set = run(
            &spec(Some(("http://prom:9090/", "^Kube")), Some("app = db")),
            &server(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(set.reboot_alert_gate.as_deref(), Some("http://prom:9090/"));
        assert_eq!(set.alert_filter.as_deref(), Some("^Kube"));
        assert_eq!(set.blocking_pod_selector.as_deref(), Some("app = db"));
        // As the server stored them: nothing to send.
        let mut s = server();
        s.reboots = Some(pb::RebootPolicy {
            alert_gate: Some(pb::RebootAlertGate {
                url: "http://prom:9090".into(),
                filter: "^Kube".into(),
            }),
            blocking_pod_selector: "app=db".into(),
            ..s.reboots.clone().unwrap()
        });
        assert_eq!(
            run(&spec(Some(("http://prom:9090/", "^Kube")), Some("app = db")), &s),
            Ok(None)
        );
        // Emptied: removed.
        let set = run(&spec(Some(("", "")), Some("")), &s).unwrap().unwrap();
        assert!(set.clear_reboot_alert_gate && set.clear_blocking_pod_selector);
        assert_eq!(run(&spec(Some(("", "")), Some("")), &server()), Ok(None));
    }

    #[test]
    fn text_that_names_nothing_is_refused_with_its_field() {
        let bad = |r: Reboots| {
            run(
                &LksClusterSpec {
                    reboots: Some(r),
                    ..Default::default()
                },
                &server(),
            )
            .unwrap_err()
            .to_string()
        };
        let e = bad(Reboots {
            mode: Some(SpecValue::from("sometimes")),
            ..Default::default()
        });
        assert_eq!(
            e,
            "spec.reboots.mode \"sometimes\" is unknown; use auto or manual or off"
        );
        let e = bad(Reboots {
            timeout: Some(SpecValue::from("soon")),
            ..Default::default()
        });
        assert!(e.starts_with("spec.reboots.timeout: "), "{e}");
        let e = bad(Reboots {
            on_timeout: Some(SpecValue::from("drop")),
            ..Default::default()
        });
        assert!(e.contains("free or keep"), "{e}");
    }
}
