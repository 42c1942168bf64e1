//! Test-only fault injection: `LKS_AGENT_FAULT=<name>` makes the process
//! abort (`std::process::abort`, like a `kill -9` at that instant) when the
//! apply engine reaches the named point. Crash tests use it to prove that a
//! restart finishes or undoes every interrupted transition.
//!
//! Every point sits right after a durable journal record, or in the middle
//! of an effect that a crash must never leave half-done:
//!
//! | name               | where                                                                 |
//! |--------------------|-----------------------------------------------------------------------|
//! | `staging`          | intent journalled; no temp entry staged yet                           |
//! | `staged-partial`   | first temp entry staged next to its target, others not yet            |
//! | `backing-up`       | every temp entry staged and fsynced; backups not taken yet            |
//! | `switching`        | backups durable in the state dir; no target switched yet              |
//! | `switch-partial`   | first target switched by rename, the others still old                 |
//! | `activating`       | every target switched and its directory fsynced; steps not run yet    |
//! | `checking`         | steps passed; health check not run yet                                |
//! | `committed`        | commit record durable; state and backups not yet updated              |
//! | `rolling-back`     | rollback record durable; nothing restored yet                         |
//! | `rollback-partial` | first target restored from its backup, the others not yet             |
//! | `state-saved`      | state file updated after commit or rollback; journal not yet removed  |
//! | `cache-copy`       | new version committed and reported; a blob it moved into place is not |
//! |                    | in the cache yet (copy from the target not started)                   |
//! | `cache-copy-partial` | first chunk of that copy written to `cache/partial/<hex>.copy`,     |
//! |                    | not fsynced, not verified                                             |
//! | `cache-promoting`  | copy verified and fsynced; not yet renamed into `cache/sha256/`       |
//! | `delta-rebuilding` | a file being rebuilt from a binary delta: its first 1 MiB written to  |
//! |                    | `cache/partial/<hex>.delta`, not verified; no target touched          |

// Besides the points: `LKS_AGENT_CLOCK_OFFSET_MS` ([`clock_offset_ms`])
// moves the clock of the release trust checks, for the attack tests.

/// Every fault point, in the order an apply reaches them.
pub const POINTS: &[&str] = &[
    "staging",
    "staged-partial",
    "backing-up",
    "switching",
    "switch-partial",
    "activating",
    "checking",
    "committed",
    "rolling-back",
    "rollback-partial",
    "state-saved",
    "cache-copy",
    "cache-copy-partial",
    "cache-promoting",
    "delta-rebuilding",
];

/// The environment variable that arms a fault point.
pub const ENV: &str = "LKS_AGENT_FAULT";

/// Whether this build has fault points: only with the `fault-injection`
/// feature, which the e2e crate turns on for the workspace's test builds
/// and no package or release build has. Without it every point is a no-op
/// and `LKS_AGENT_FAULT` is ignored (with a warning at start, [`warn_if_set`]).
pub const COMPILED_IN: bool = cfg!(feature = "fault-injection");

#[cfg(feature = "fault-injection")]
fn armed() -> Option<&'static str> {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|s| !s.is_empty()))
        .as_deref()
}

#[cfg(not(feature = "fault-injection"))]
fn armed() -> Option<&'static str> {
    None
}

/// Aborts the process if `name` is the armed fault point.
pub fn point(name: &'static str) {
    debug_assert!(POINTS.contains(&name), "unknown fault point {name}");
    #[cfg(feature = "fault-injection")]
    if armed() == Some(name) {
        eprintln!("{ENV}={name}: aborting here");
        std::process::abort();
    }
}

/// `LKS_AGENT_FAULT=peer-corrupt`: the peer listener flips a byte of every
/// piece it serves (a lying peer, for the peer-sharing tests).
pub fn peer_corrupt() -> bool {
    armed() == Some("peer-corrupt")
}

/// Says so when `LKS_AGENT_FAULT` is set on a build without fault points
/// (someone copied a test's environment onto a node): it does nothing.
pub fn warn_if_set() {
    if !COMPILED_IN && std::env::var_os(ENV).is_some_and(|v| !v.is_empty()) {
        tracing::warn!("{ENV} is set, but this build has no fault points (they are for tests): ignored");
    }
    if !COMPILED_IN && std::env::var_os(CLOCK_OFFSET_ENV).is_some_and(|v| !v.is_empty()) {
        tracing::warn!(
            "{CLOCK_OFFSET_ENV} is set, but this build has no fault points (they are for tests): ignored"
        );
    }
}

/// Test-only: `LKS_AGENT_CLOCK_OFFSET_MS=<signed ms>` is added to the clock
/// the release trust checks read (the attack tests set a node's clock back
/// without touching the machine's). Read once; 0 without the
/// `fault-injection` feature, or when unset or not a number.
pub const CLOCK_OFFSET_ENV: &str = "LKS_AGENT_CLOCK_OFFSET_MS";

#[cfg(feature = "fault-injection")]
pub fn clock_offset_ms() -> i64 {
    use std::sync::OnceLock;
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var(CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

#[cfg(not(feature = "fault-injection"))]
pub fn clock_offset_ms() -> i64 {
    0
}
