//! `STATE_DIR/reboot.json`: what this node owes a reboot, and the reboot it
//! is carrying out — a pure state machine, persisted by its owner
//! ([`super::Reboots`]) with one durable write after each change.
//!
//! ```text
//! { "boot_id": "…",                          // the boot the entries below belong to
//!   "bundles": { "kernel@6.1": 1700000000000 },  // applied in that boot, reboot = "required"
//!   "request": 7,                            // the last reboot request taken on
//!   "rebooting": { "request": 7, "boot_id_before": "…", "at_ms": … },  // absent unless rebooting
//!   "failure": { "reason": "…", "at_ms": … } }                          // absent unless it failed
//! ```
//!
//! A new boot ID (the node rebooted) clears the bundles, the reboot in
//! progress and its failure; `request` stays, so a request already taken
//! on is never carried out twice.

use std::collections::BTreeMap;
use std::time::Duration;

/// The reboot in progress: recorded before the reboot command runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rebooting {
    pub request: u64,
    pub boot_id_before: String,
    /// When the command was about to run (Unix ms).
    pub at_ms: i64,
}

/// Why the last reboot request did not reboot the node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    pub reason: String,
    pub at_ms: i64,
}

/// The file's contents.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebootFile {
    #[serde(default)]
    pub boot_id: String,
    /// `name@version` → since when (Unix ms).
    #[serde(default)]
    pub bundles: BTreeMap<String, i64>,
    #[serde(default)]
    pub request: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebooting: Option<Rebooting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// What a reboot request comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// Taken on: persist, then run the reboot command.
    Run,
    /// Already taken on (or older): nothing to do.
    Done,
}

/// Where the node stands, as reported (`RebootStatus.state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stance {
    #[default]
    None,
    Required,
    Rebooting,
    Failed,
}

impl Stance {
    pub fn as_str(self) -> &'static str {
        match self {
            Stance::None => "",
            Stance::Required => "required",
            Stance::Rebooting => "rebooting",
            Stance::Failed => "failed",
        }
    }
}

/// A reason to reboot from outside the file (the OS sentinel, the check
/// command), with since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub reason: String,
    pub since_ms: i64,
}

/// What the node reports about rebooting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebootReport {
    pub state: Stance,
    pub reason: String,
    pub since_ms: i64,
    pub boot_id: String,
    pub request: u64,
}

impl RebootFile {
    /// Brings the file to the boot `boot_id`: a different one than recorded
    /// means the node rebooted, which settles everything but `request`.
    /// True if anything changed (the caller persists it).
    pub fn on_boot(&mut self, boot_id: &str) -> bool {
        if self.boot_id == boot_id {
            return false;
        }
        if let Some(r) = &self.rebooting {
            tracing::info!(
                request = r.request,
                "the node rebooted (boot ID {} → {boot_id})",
                r.boot_id_before
            );
        }
        self.boot_id = boot_id.to_string();
        self.bundles.clear();
        self.rebooting = None;
        self.failure = None;
        true
    }

    /// A bundle version with `reboot = "required"` was applied at `now_ms`.
    /// True if that is news.
    pub fn bundle_applied(&mut self, id: &str, now_ms: i64) -> bool {
        if self.bundles.contains_key(id) {
            return false;
        }
        self.bundles.insert(id.to_string(), now_ms);
        true
    }

    /// Reboot request `id` arrived at `now_ms` in boot `boot_id`.
    pub fn take(&mut self, id: u64, boot_id: &str, now_ms: i64) -> Take {
        if id == 0 || id <= self.request {
            return Take::Done;
        }
        self.request = id;
        self.failure = None;
        self.rebooting = Some(Rebooting {
            request: id,
            boot_id_before: boot_id.to_string(),
            at_ms: now_ms,
        });
        Take::Run
    }

    /// The reboot in progress failed (the command failed, or the node is
    /// still in the same boot long after it returned): reported, and not
    /// tried again for this request.
    pub fn fail(&mut self, reason: String, now_ms: i64) {
        self.rebooting = None;
        self.failure = Some(Failure {
            reason,
            at_ms: now_ms,
        });
    }

    /// How long from `now_ms` until a reboot in progress counts as failed
    /// (`wait` after it started); `None` if none is in progress.
    pub fn overdue_in(&self, wait: Duration, now_ms: i64) -> Option<Duration> {
        let r = self.rebooting.as_ref()?;
        let due = r.at_ms.saturating_add(wait.as_millis() as i64);
        Some(Duration::from_millis(due.saturating_sub(now_ms).max(0) as u64))
    }

    /// The report: rebooting, else a failure, else what requires a reboot
    /// (the bundles first, then `needs`), else nothing.
    pub fn report(&self, needs: &[Need]) -> RebootReport {
        let base = RebootReport {
            boot_id: self.boot_id.clone(),
            request: self.request,
            ..RebootReport::default()
        };
        if let Some(r) = &self.rebooting {
            return RebootReport {
                state: Stance::Rebooting,
                since_ms: r.at_ms,
                ..base
            };
        }
        if let Some(f) = &self.failure {
            return RebootReport {
                state: Stance::Failed,
                reason: f.reason.clone(),
                since_ms: f.at_ms,
                ..base
            };
        }
        let all: Vec<Need> = self
            .bundles
            .iter()
            .map(|(id, at)| Need {
                reason: format!("bundle {id}"),
                since_ms: *at,
            })
            .chain(needs.iter().cloned())
            .collect();
        if all.is_empty() {
            return base;
        }
        RebootReport {
            state: Stance::Required,
            reason: all
                .iter()
                .map(|n| n.reason.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            since_ms: all
                .iter()
                .map(|n| n.since_ms)
                .filter(|t| *t > 0)
                .min()
                .unwrap_or(0),
            ..base
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_requires_a_reboot_until_the_boot_id_changes() {
        let mut f = RebootFile::default();
        assert!(f.on_boot("boot-1"));
        assert!(!f.on_boot("boot-1"));
        assert_eq!(f.report(&[]).state, Stance::None);
        assert!(f.bundle_applied("kernel@6.1", 100));
        assert!(!f.bundle_applied("kernel@6.1", 200), "once per boot");
        let r = f.report(&[Need {
            reason: "packages: linux-image-6.1".into(),
            since_ms: 50,
        }]);
        assert_eq!(r.state, Stance::Required);
        assert_eq!(r.reason, "bundle kernel@6.1; packages: linux-image-6.1");
        assert_eq!((r.since_ms, r.boot_id.as_str()), (50, "boot-1"));
        // Persisted and read back by a restarted agent: the same.
        let back: RebootFile = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
        let mut after = back.clone();
        assert!(!after.on_boot("boot-1"), "an agent restart is no reboot");
        assert_eq!(after.report(&[]).reason, "bundle kernel@6.1");
        assert!(after.on_boot("boot-2"));
        assert_eq!(after.report(&[]).state, Stance::None);
        assert_eq!(after.report(&[]).boot_id, "boot-2");
    }

    #[test]
    fn one_request_reboots_once_and_its_end_is_the_new_boot() {
        let mut f = RebootFile::default();
        f.on_boot("b1");
        f.bundle_applied("kernel@2", 10);
        assert_eq!(f.take(0, "b1", 20), Take::Done, "0 is never a request");
        assert_eq!(f.take(5, "b1", 20), Take::Run);
        let r = f.report(&[]);
        assert_eq!((r.state, r.since_ms, r.request), (Stance::Rebooting, 20, 5));
        // The agent restarted before the node went down: the same request
        // again is not run again.
        let mut restarted: RebootFile = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert!(!restarted.on_boot("b1"));
        assert_eq!(restarted.take(5, "b1", 30), Take::Done);
        assert_eq!(restarted.report(&[]).state, Stance::Rebooting);
        // The node came back in another boot: done, and still not again.
        assert!(restarted.on_boot("b2"));
        let r = restarted.report(&[]);
        assert_eq!((r.state, r.request), (Stance::None, 5));
        assert_eq!(restarted.take(5, "b2", 40), Take::Done);
        assert_eq!(restarted.take(6, "b2", 40), Take::Run, "a new request is");
    }

    #[test]
    fn a_reboot_that_never_happens_is_a_failure_not_a_loop() {
        let mut f = RebootFile::default();
        f.on_boot("b1");
        f.take(3, "b1", 1_000);
        let wait = Duration::from_secs(60);
        assert_eq!(f.overdue_in(wait, 1_000), Some(Duration::from_secs(60)));
        assert_eq!(f.overdue_in(wait, 90_000), Some(Duration::ZERO));
        f.fail("boot ID unchanged".into(), 61_000);
        assert_eq!(f.overdue_in(wait, 90_000), None);
        let r = f.report(&[Need {
            reason: "x".into(),
            since_ms: 1,
        }]);
        assert_eq!(
            (r.state, r.reason.as_str()),
            (Stance::Failed, "boot ID unchanged")
        );
        assert_eq!(f.take(3, "b1", 62_000), Take::Done, "not tried again");
        // A later reboot (by other means) clears the failure.
        f.on_boot("b2");
        assert_eq!(f.report(&[]).state, Stance::None);
    }

    #[test]
    fn an_empty_or_older_file_loads() {
        let f: RebootFile = serde_json::from_str("{}").unwrap();
        assert_eq!(f, RebootFile::default());
    }
}
