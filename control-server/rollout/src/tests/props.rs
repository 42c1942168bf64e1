//! Property tests: whatever happens, no decision breaks the batch, a hold or a window.

use proptest::prelude::*;

use super::*;

/// One random event in a rollout's life.
#[derive(Clone, Debug)]
enum Event {
    Step(i64),
    Report(usize, BundleState),
    Connect(usize, bool),
    Hold(usize, bool),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0i64..4 * 3_600_000).prop_map(Event::Step),
        (
            0usize..8,
            prop_oneof![Just(BundleState::Applied), Just(BundleState::Failed)]
        )
            .prop_map(|(n, s)| Event::Report(n, s)),
        (0usize..8, any::<bool>()).prop_map(|(n, c)| Event::Connect(n, c)),
        (0usize..8, any::<bool>()).prop_map(|(n, h)| Event::Hold(n, h)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Whatever happens: no decision exceeds the batch size,
    /// starts a held node, or starts a node while every window is
    /// closed (unless windows are ignored).
    #[test]
    fn decisions_keep_the_batch_holds_and_windows(
        batch in 1u32..4,
        canary in 0u32..3,
        wait in any::<bool>(),
        ignore in any::<bool>(),
        interval in prop_oneof![Just(0u64), Just(600_000u64)],
        events in proptest::collection::vec(event(), 1..60),
    ) {
        let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let mut v = views(&names);
        let mut r = deferring(&names, batch, 3);
        r.policy.offline = if wait { OfflinePolicy::Wait } else { OfflinePolicy::Defer };
        r.policy.ignore_windows = ignore;
        r.policy.canary = canary;
        r.policy.canary_soak_ms = 600_000;
        r.policy.batch_interval_ms = interval;
        let win = ["daily 01:00-02:00 UTC"];
        let mut now = ms("2026-11-24T00:30:00Z");
        let mut g = 0;
        for e in events {
            match e {
                Event::Step(dt) => {
                    now += dt;
                    let clock = windowed(now, &win);
                    let open = windows::is_open(&clock.windows, now);
                    if let Some(d) = step(&r, &v, clock) {
                        let applying = counts(&d.rollout).applying as usize;
                        prop_assert!(applying <= batch as usize, "{applying} applying, batch {batch}");
                        for (node, _) in &d.assign {
                            let reverting = d.rollout.nodes.iter().any(|n| n.name == *node && n.reverting);
                            let taken_back = d.rollout.nodes.iter()
                                .any(|n| n.name == *node && n.state == NodeState::Failed);
                            if reverting || taken_back {
                                continue;
                            }
                            prop_assert!(!v[node].held, "started held node {node}");
                            prop_assert!(open || ignore, "started {node} outside every window");
                        }
                        r = commit(d, &mut v, &mut g);
                    }
                }
                Event::Report(i, state) => {
                    let n = names[i];
                    if r.nodes.iter().any(|x| x.name == n && x.state == NodeState::Applying) {
                        reply(&mut v, &r, n, V, state);
                    }
                }
                Event::Connect(i, c) => v.get_mut(names[i]).unwrap().connected = c,
                Event::Hold(i, h) => v.get_mut(names[i]).unwrap().held = h,
            }
        }
    }
}
