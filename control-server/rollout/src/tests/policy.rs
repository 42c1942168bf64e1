//! The policy a start asks for: its defaults, its one check, what the
//! server resolves it to against the cluster, and the round trips through
//! `StartRolloutRequest`.

use std::time::Duration;

use lks_proto::pb;
use lks_store::{ClusterRow, DrainPolicy, DrainTimeout, KubeFlags, OfflinePolicy};

use crate::policy::*;

fn cluster(drain: bool, kubeconfig: bool) -> ClusterRow {
    ClusterRow {
        name: "tenant-a".into(),
        created_at_ms: 0,
        node_count: 0,
        maintenance_windows: Vec::new(),
        ca_cert_pem: None,
        api_server: None,
        peer: Default::default(),
        kube: KubeFlags { kubeconfig, drain },
        labels: Default::default(),
        reboots: Default::default(),
    }
}

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

#[test]
fn defaults_fill_in_what_is_not_said() {
    let p = Policy::default();
    assert_eq!(p.offline(), OfflinePolicy::Defer);
    assert_eq!(p.failure_threshold(), DEFAULT_FAILURE_THRESHOLD);
    assert_eq!(p.offline_deadline(), DEFAULT_OFFLINE_DEADLINE);
    assert_eq!(p.canary_soak(), Duration::ZERO, "no canaries, no soak");
    let canary = Policy {
        canary: 2,
        ..Default::default()
    };
    assert_eq!(canary.canary_soak(), DEFAULT_CANARY_SOAK);
    assert_eq!(
        lks_proto::duration::parse_duration(DEFAULT_CANARY_SOAK_TEXT),
        Ok(DEFAULT_CANARY_SOAK),
        "lksctl shows the default it sends"
    );
    let r = p.resolve(&cluster(true, true), 0, "req", 7).unwrap();
    assert_eq!((r.batch_size, r.failure_threshold), (0, 1));
    assert_eq!(r.offline_deadline, DEFAULT_OFFLINE_DEADLINE);
    assert_eq!((r.policy.request_id.as_str(), r.policy.canary_seed), ("req", 7));
    let d = r.policy.drain.unwrap();
    assert_eq!(d, DrainPolicy::default(), "the cluster drains by default");
    assert_eq!(d.timeout_ms, DEFAULT_DRAIN_TIMEOUT.as_millis() as u64);
    assert_eq!(d.on_timeout, DrainTimeout::Fail);
}

#[test]
fn pacing_is_checked_against_the_matched_nodes() {
    let p = Policy {
        canary: 2,
        canary_soak: secs(60),
        batch_interval: secs(5),
        ..Default::default()
    };
    let got = p.resolve(&cluster(false, false), 2, "", 0).unwrap().policy;
    assert_eq!(
        (got.canary, got.canary_soak_ms, got.batch_interval_ms, got.drain),
        (2, 60_000, 5_000, None)
    );
    assert_eq!(
        p.resolve(&cluster(false, false), 1, "", 0)
            .unwrap_err()
            .to_string(),
        "--canary 2 is more than the 1 node(s) the rollout matches"
    );
}

#[test]
fn validate_names_the_first_mistake_in_one_line() {
    let bad = |p: Policy| p.validate().unwrap_err().to_string();
    assert_eq!(
        bad(Policy {
            batch_size: Some(MAX_BATCH_SIZE + 1),
            ..Default::default()
        }),
        "batch size 100001 is larger than the limit of 100000"
    );
    assert_eq!(
        bad(Policy {
            offline_deadline: secs(8 * 24 * 3600),
            ..Default::default()
        }),
        "offline deadline is longer than the limit of 7 days"
    );
    assert_eq!(
        bad(Policy {
            canary_soak: secs(1),
            ..Default::default()
        }),
        "a canary soak needs --canary N"
    );
    assert_eq!(
        bad(Policy {
            batch_interval: secs(8 * 24 * 3600),
            ..Default::default()
        }),
        "batch interval is longer than the limit of 7 days"
    );
    let drain = |d: DrainOptions| Policy {
        drain: d,
        ..Default::default()
    };
    assert_eq!(
        drain(DrainOptions {
            enabled: Some(false),
            on_timeout: Some(DrainTimeout::Skip),
            ..Default::default()
        })
        .validate(),
        Err(PolicyError::TunedWithoutDrain)
    );
    assert_eq!(
        bad(drain(DrainOptions {
            ready_timeout: secs(25 * 3600),
            ..Default::default()
        })),
        "--ready-timeout is longer than the limit of 24h"
    );
    assert_eq!(
        drain(DrainOptions {
            kubelet_version: Some("1.37".into()),
            ..Default::default()
        })
        .validate(),
        Err(PolicyError::KubeletVersion("1.37".into()))
    );
    Policy::default().validate().unwrap();
}

#[test]
fn draining_follows_the_cluster_and_needs_its_kubeconfig() {
    let plain = Policy::default();
    assert_eq!(
        plain
            .resolve(&cluster(false, true), 0, "", 0)
            .unwrap()
            .policy
            .drain,
        None
    );
    let tuned = Policy {
        drain: DrainOptions {
            timeout: secs(60),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        tuned.resolve(&cluster(false, true), 0, "", 0),
        Err(PolicyError::TunedWithoutDrain),
        "the cluster does not drain, so nothing can be tuned"
    );
    let e = plain.resolve(&cluster(true, false), 0, "", 0).unwrap_err();
    assert!(e.is_precondition());
    assert!(
        e.to_string().starts_with("cluster tenant-a has no kubeconfig"),
        "{e}"
    );
    let off = Policy {
        drain: DrainOptions {
            enabled: Some(false),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        off.resolve(&cluster(true, false), 0, "", 0).unwrap().policy.drain,
        None
    );
    let on = Policy {
        drain: DrainOptions {
            enabled: Some(true),
            timeout: secs(90),
            on_timeout: Some(DrainTimeout::Skip),
            kubelet_version: Some("v1.37.2".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let d = on
        .resolve(&cluster(false, true), 0, "", 0)
        .unwrap()
        .policy
        .drain
        .unwrap();
    assert_eq!((d.timeout_ms, d.on_timeout), (90_000, DrainTimeout::Skip));
    assert_eq!(d.ready_timeout_ms, DEFAULT_READY_TIMEOUT.as_millis() as u64);
    assert_eq!(d.kubelet_version, "v1.37.2");
}

fn full() -> Policy {
    Policy {
        batch_size: Some(3),
        failure_threshold: Some(2),
        offline: Some(OfflinePolicy::Wait),
        offline_deadline: secs(120),
        canary: 1,
        canary_soak: secs(90),
        batch_interval: secs(30),
        ignore_windows: true,
        drain: DrainOptions {
            enabled: Some(true),
            timeout: secs(600),
            ready_timeout: secs(300),
            delete_local_data: true,
            on_timeout: Some(DrainTimeout::Skip),
            kubelet_version: Some("v1.37.2".into()),
        },
    }
}

#[test]
fn a_policy_goes_over_the_wire_and_back_unchanged() {
    for p in [full(), Policy::default()] {
        let r = p.to_request();
        assert_eq!(Policy::try_from(&r).unwrap(), p);
        assert_eq!(Policy::try_from(&r).unwrap().to_request(), r);
    }
    let r = full().to_request();
    assert_eq!(
        (r.offline.as_str(), r.offline_policy),
        ("wait", pb::OfflinePolicy::Wait as i32)
    );
    assert_eq!(
        (r.on_drain_timeout.as_str(), r.drain_timeout_action),
        ("skip", pb::DrainTimeoutAction::Skip as i32),
        "both forms, for servers that read only the string"
    );
    let plain = Policy::default().to_request();
    assert_eq!((plain.offline.as_str(), plain.offline_policy), ("", 0));
    // Canaries without a soak: the default goes on the wire.
    let canary = Policy {
        canary: 1,
        ..Default::default()
    };
    let r = canary.to_request();
    assert_eq!(r.canary_soak_seconds, DEFAULT_CANARY_SOAK.as_secs());
    assert_eq!(Policy::try_from(&r).unwrap().canary_soak(), canary.canary_soak());
}

#[test]
fn the_typed_choice_wins_and_an_unknown_one_is_one_line() {
    let req = |offline: &str, typed: i32| pb::StartRolloutRequest {
        offline: offline.into(),
        offline_policy: typed,
        ..Default::default()
    };
    let offline = |r: &pb::StartRolloutRequest| Policy::try_from(r).map(|p| p.offline);
    assert_eq!(offline(&req("", 0)), Ok(None));
    assert_eq!(
        offline(&req("wait", 0)),
        Ok(Some(OfflinePolicy::Wait)),
        "an older client"
    );
    assert_eq!(
        offline(&req("", pb::OfflinePolicy::Wait as i32)),
        Ok(Some(OfflinePolicy::Wait)),
        "a client that sends only the enum"
    );
    assert_eq!(
        offline(&req("wait", pb::OfflinePolicy::Defer as i32)),
        Ok(Some(OfflinePolicy::Defer)),
        "the enum wins"
    );
    assert_eq!(
        offline(&req("later", 0)).unwrap_err().to_string(),
        "offline policy \"later\" is unknown; use \"defer\" or \"wait\""
    );
    assert_eq!(
        offline(&req("", 9)).unwrap_err().to_string(),
        "offline_policy 9 is unknown; use \"defer\" or \"wait\""
    );
    let drain = |s: &str, typed: i32| {
        Policy::try_from(&pb::StartRolloutRequest {
            on_drain_timeout: s.into(),
            drain_timeout_action: typed,
            ..Default::default()
        })
        .map(|p| p.drain.on_timeout)
    };
    assert_eq!(drain("skip", 0), Ok(Some(DrainTimeout::Skip)));
    assert_eq!(
        drain("skip", pb::DrainTimeoutAction::Fail as i32),
        Ok(Some(DrainTimeout::Fail))
    );
    assert_eq!(
        drain("bogus", 0).unwrap_err().to_string(),
        "--on-drain-timeout \"bogus\" is unknown; use \"fail\" or \"skip\""
    );
    assert_eq!(drain("", 5), Err(PolicyError::UnknownDrainTimeoutValue(5)));
}

#[test]
fn zero_soak_on_the_wire_with_canaries_stays_zero() {
    // What servers always did with it: API clients that send canaries
    // without a soak keep getting none.
    let r = pb::StartRolloutRequest {
        canary: 1,
        ..Default::default()
    };
    assert_eq!(Policy::try_from(&r).unwrap().canary_soak(), Duration::ZERO);
    let soak_only = pb::StartRolloutRequest {
        canary_soak_seconds: 5,
        ..Default::default()
    };
    assert_eq!(
        Policy::try_from(&soak_only).unwrap().validate(),
        Err(PolicyError::SoakWithoutCanary)
    );
}
