//! The crash-loop guard end to end: a bundle whose step kills the real
//! agent is given up on after three interrupted attempts (the node shows
//! `failed` with the reason and when it tries again), and `lksctl node
//! retry` makes the node try at once. Bad requests are one error line.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lks_e2e::agent::{BundleFile, CONVERGE, node_bundle, node_events, wait_node_bundle, write_bundle};
use lks_e2e::rollout::Fleet;
use lks_e2e::{one_line_error, wait_until};

#[test]
fn a_bundle_that_kills_the_agent_is_given_up_then_retried_on_request() {
    let mut f = Fleet::start("c1", 1);
    let marker = f.agent("node-1").path("/crash-here");
    std::fs::write(&marker, b"").unwrap();
    // While the marker exists, the step kills the agent that runs it (its
    // parent), as a broken kubelet restart script might.
    let step = "[[step]]\nname = \"restart\"\nrun = [\"sh\", \"-c\", \
                \"if [ -e \\\"$LKS_ROOT/crash-here\\\" ]; then kill -9 $PPID; sleep 2; fi\"]\n";
    let dir = write_bundle(
        f.server.work_dir(),
        "crashy",
        "1",
        &[BundleFile {
            path: "/etc/crashy.conf",
            content: b"crashy v1\n",
            mode: "0644",
        }],
        step,
    );
    let b = f.server.publish(&dir);
    f.roll_out(&b, &[]);

    // Restart the agent each time it dies, as systemd would.
    let mut crashes = 0;
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < CONVERGE * 2,
            "never gave up; crashes: {crashes}"
        );
        if let Some((v, state, msg)) = node_bundle(&f.server, "node-1", "crashy")
            && state == "failed"
        {
            assert_eq!(v, "1");
            assert!(msg.starts_with("gave up after 3 interrupted attempts"), "{msg}");
            assert!(msg.contains("lksctl node retry node-1"), "{msg}");
            break;
        }
        let a = f.agent_mut("node-1");
        if !a.running() {
            crashes += 1;
            a.start();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(crashes, 3, "the guard trips on the third crash in a row");
    // Given up: the node stays up and keeps its old state.
    std::thread::sleep(Duration::from_secs(2));
    assert!(f.agent_mut("node-1").running());
    assert_eq!(f.agent("node-1").read("/etc/crashy.conf"), None);

    // Bad requests: one line each.
    let e = one_line_error(
        &f.server.lksctl(&["node", "retry", "node-9"]),
        "retry of an unknown node",
    );
    assert!(e.contains("node node-9 does not exist"), "{e}");
    let e = one_line_error(
        &f.server.lksctl(&["node", "retry", "node-1", "--bundle", "nope"]),
        "retry of a bundle the node does not have",
    );
    assert!(e.contains("bundle nope is not desired for node node-1"), "{e}");

    // The cause is fixed; the operator asks for a retry: it applies at once.
    std::fs::remove_file(&marker).unwrap();
    let said = f
        .server
        .lksctl_ok(&["node", "retry", "node-1", "--bundle", "crashy"]);
    assert!(said.contains("retry of crashy requested"), "{said}");
    wait_node_bundle(&f.server, "node-1", "crashy", "1", "applied");
    assert_eq!(
        f.agent("node-1").read("/etc/crashy.conf"),
        Some((b"crashy v1\n".to_vec(), 0o644))
    );
    let ev = node_events(&f.server, "node-1");
    assert!(
        ev.iter()
            .any(|(k, m)| k == "retry_requested" && m.starts_with("retry of crashy requested by")),
        "{ev:?}"
    );
    wait_until(CONVERGE, "the agent reports the retry", || {
        node_events(&f.server, "node-1").iter().any(|(k, _)| k == "retry")
    });
    // Every count is asserted above.
    eprintln!(
        "CRASH agent-killed-by-its-bundle-step: crashes={crashes} gave_up_after=3 node_stayed_up=1 \
         old_state_kept=1 bad_retry_requests_one_line=2 retried_on_request=1 applied_after_retry=1 \
         given_up_for_ever=0"
    );
}
