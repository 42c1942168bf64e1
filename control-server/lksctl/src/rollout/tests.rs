//! `rollout start`'s policy flags: the policy they are, the words of
//! their choices, a bad one refused by the parser.

use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cmd {
    #[command(subcommand)]
    rollout: RolloutCmd,
}

fn policy(args: &[&str]) -> Result<anyhow::Result<Policy>, clap::Error> {
    let mut argv = vec!["rollout", "start", "--cluster", "a", "--bundle", "k@1"];
    argv.extend_from_slice(args);
    match Cmd::try_parse_from(argv)?.rollout {
        RolloutCmd::Start { policy, .. } => Ok(Policy::try_from(&policy)),
        _ => unreachable!("parsed as start"),
    }
}

#[test]
fn the_flags_choices_are_the_policys_words() {
    let words = |vs: Vec<clap::builder::PossibleValue>| {
        vs.iter().map(|v| v.get_name().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(
        words(
            Offline::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value())
                .collect()
        ),
        Offline::value_variants()
            .iter()
            .map(|v| OfflinePolicy::from(*v).as_str())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        words(
            OnDrainTimeout::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value())
                .collect()
        ),
        OnDrainTimeout::value_variants()
            .iter()
            .map(|v| DrainTimeout::from(*v).as_str())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_bad_choice_is_refused_by_the_parser_with_the_accepted_values() {
    let e = policy(&["--drain", "--on-drain-timeout", "bogus"])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("invalid value 'bogus' for '--on-drain-timeout"), "{e}");
    assert!(e.contains("[possible values: fail, skip]"), "{e}");
    let e = policy(&["--offline", "later"]).err().unwrap().to_string();
    assert!(e.contains("[possible values: defer, wait]"), "{e}");
}

#[test]
fn the_flags_are_the_policy_with_lksctls_defaults() {
    let p = policy(&[]).unwrap().unwrap();
    assert_eq!(
        p,
        Policy {
            offline: Some(OfflinePolicy::Defer),
            ..Default::default()
        }
    );
    let p = policy(&[
        "--batch-size",
        "2",
        "--canary",
        "1",
        "--offline",
        "wait",
        "--drain",
        "--drain-timeout",
        "5m",
        "--on-drain-timeout",
        "skip",
    ])
    .unwrap()
    .unwrap();
    assert_eq!(p.batch_size, Some(2));
    assert_eq!(p.offline, Some(OfflinePolicy::Wait));
    assert_eq!(
        p.canary_soak,
        Some(lks_rollout::policy::DEFAULT_CANARY_SOAK),
        "--canary-soak's default"
    );
    assert_eq!(p.drain.enabled, Some(true));
    assert_eq!(p.drain.timeout, Some(Duration::from_secs(300)));
    assert_eq!(p.drain.on_timeout, Some(DrainTimeout::Skip));
    let r = p.to_request();
    assert_eq!(
        (r.on_drain_timeout.as_str(), r.offline.as_str()),
        ("skip", "wait")
    );
    assert_eq!(
        policy(&["--ready-timeout", "500ms"])
            .unwrap()
            .unwrap_err()
            .to_string(),
        "--ready-timeout must be at least 1s"
    );
}
