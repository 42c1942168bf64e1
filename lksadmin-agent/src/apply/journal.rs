//! The apply lifecycle as an explicit, persisted state machine.
//!
//! One transaction moves one bundle from what is installed (`from`, maybe
//! nothing) to a new version (`to`; `None` removes the bundle). Its phase
//! only changes through [`Phase::next`], a `match (event, phase)` that
//! refuses illegal transitions with a typed error, and every new phase is
//! written to `journal.json` durably *before* it takes effect. After a crash
//! the journal decides: a `Committed` transaction is rolled forward, any
//! other one is rolled back to the backups recorded in it.

use std::fmt;
use std::path::PathBuf;

use lks_proto::{BundlePath, Digest};

use lks_proto::Manifest;
use lks_proto::fsutil::{self, FsError};

use crate::apply::state::{Content, OriginalRec};

/// Where a transaction is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "phase", rename_all = "kebab-case")]
pub enum Phase {
    /// Intent recorded; temp entries are being staged next to the targets.
    Staging,
    /// Every temp entry staged and fsynced; the current files are being
    /// copied into the transaction's backup directory.
    BackingUp,
    /// Backups durable (recorded in the plans); targets are being switched.
    Switching,
    /// Every target switched; the new version's steps are running.
    Activating,
    /// Steps passed; the health check is running.
    Checking,
    /// The commit record: from here on the transaction only rolls forward.
    Committed,
    /// Undoing the transaction; `touched` if targets may have been switched.
    RollingBack {
        reason: String,
        touched: bool,
        /// The failure was a crash, not the bundle's fault: try again.
        retry: bool,
        /// The crash came while the bundle's own steps or health check ran
        /// (`Activating`, `Checking`): it counts toward the crash-loop
        /// guard. A crash in the agent's own phases (staging, backing up,
        /// switching) never does: the agent just tries again.
        #[serde(default)]
        guarded: bool,
    },
}

impl Phase {
    /// The name used in logs and as the fault point reached on entering it.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Staging => "staging",
            Phase::BackingUp => "backing-up",
            Phase::Switching => "switching",
            Phase::Activating => "activating",
            Phase::Checking => "checking",
            Phase::Committed => "committed",
            Phase::RollingBack { .. } => "rolling-back",
        }
    }

    /// True once targets may differ from what was there before.
    pub fn touched_targets(&self) -> bool {
        match self {
            Phase::Staging | Phase::BackingUp => false,
            Phase::Switching | Phase::Activating | Phase::Checking | Phase::Committed => true,
            Phase::RollingBack { touched, .. } => *touched,
        }
    }

    /// The one place phases change.
    pub fn next(&self, event: Event) -> Result<Next, IllegalTransition> {
        use Event as E;
        use Phase as P;
        Ok(match (event, self) {
            (E::Staged, P::Staging) => Next::Phase(P::BackingUp),
            (E::BackedUp, P::BackingUp) => Next::Phase(P::Switching),
            (E::Switched, P::Switching) => Next::Phase(P::Activating),
            (E::StepsPassed, P::Activating) => Next::Phase(P::Checking),
            (E::Healthy, P::Checking) => Next::Phase(P::Committed),
            (
                E::Failed { reason, retry },
                p @ (P::Staging | P::BackingUp | P::Switching | P::Activating | P::Checking),
            ) => Next::Phase(P::RollingBack {
                reason,
                touched: p.touched_targets(),
                retry,
                guarded: retry && matches!(p, P::Activating | P::Checking),
            }),
            (E::Finished, P::Committed | P::RollingBack { .. }) => Next::Done,
            (event, phase) => {
                return Err(IllegalTransition {
                    from: phase.name(),
                    event: event.name(),
                });
            }
        })
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Staged,
    BackedUp,
    Switched,
    StepsPassed,
    Healthy,
    Failed { reason: String, retry: bool },
    Finished,
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::Staged => "staged",
            Event::BackedUp => "backed-up",
            Event::Switched => "switched",
            Event::StepsPassed => "steps-passed",
            Event::Healthy => "healthy",
            Event::Failed { .. } => "failed",
            Event::Finished => "finished",
        }
    }
}

/// The outcome of a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    Phase(Phase),
    /// The transaction is over; its journal is removed.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition: event {event} in phase {from}")]
pub struct IllegalTransition {
    pub from: &'static str,
    pub event: &'static str,
}

/// What a transaction wants at one path.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Want {
    /// A file with these bytes; they come from the blob cache.
    Blob { digest: Digest, size: u64, mode: u32 },
    /// A file put back from the originals store.
    Original {
        digest: Digest,
        size: u64,
        mode: u32,
        stored: String,
    },
    /// Nothing.
    Absent,
}

impl Want {
    pub fn digest_mode(&self) -> Option<(Digest, u64, u32)> {
        match self {
            Want::Blob { digest, size, mode }
            | Want::Original {
                digest, size, mode, ..
            } => Some((*digest, *size, *mode)),
            Want::Absent => None,
        }
    }
}

/// One path of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathPlan {
    pub path: BundlePath,
    /// Name of the staged temp entry in the target's directory.
    pub temp: String,
    pub want: Want,
    /// What was there before; recorded when entering `Switching`.
    #[serde(default)]
    pub backup: Option<Content>,
    /// The bundle did not own this path before: its backup becomes the
    /// bundle's original for it.
    #[serde(default)]
    pub newly_owned: bool,
}

/// The transaction in `journal.json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Txn {
    pub seq: u64,
    pub bundle: String,
    pub from: Option<Manifest>,
    pub to: Option<Manifest>,
    pub plans: Vec<PathPlan>,
    /// Originals the bundle keeps after this transaction commits, for paths
    /// it owned before and still owns.
    #[serde(default)]
    pub kept_originals: Vec<OriginalRec>,
    /// Identity of the target bundle content (manifest and signature).
    #[serde(default)]
    pub key: String,
    /// The same version again with newly issued certificates.
    #[serde(default)]
    pub renewal: bool,
    pub phase: Phase,
}

impl Txn {
    /// `name@version` of the target (or of what is removed).
    pub fn describe(&self) -> String {
        match (&self.to, &self.from) {
            (Some(to), _) => format!("{}@{}", to.name, to.version),
            (None, Some(from)) => format!("removal of {}@{}", from.name, from.version),
            (None, None) => format!("{} (empty)", self.bundle),
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The journal file.
#[derive(Clone, Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(path: PathBuf) -> Self {
        Journal { path }
    }

    pub fn load(&self) -> Result<Option<Txn>, FsError> {
        fsutil::read_optional(&self.path)?
            .map(|bytes| self.parse(&bytes))
            .transpose()
    }

    /// The transaction in `bytes`, as [`Journal::load`] reads it from this
    /// journal's file.
    pub fn parse(&self, bytes: &[u8]) -> Result<Txn, FsError> {
        fsutil::parse_json(&self.path, bytes)
    }

    /// The bytes [`Journal::write`] stores for `txn`.
    pub fn encode(&self, txn: &Txn) -> Result<Vec<u8>, FsError> {
        fsutil::encode_json(&self.path, txn)
    }

    /// Durably records `txn` (temp → fsync → rename → fsync dir).
    pub fn write(&self, txn: &Txn) -> Result<(), FsError> {
        fsutil::write_atomic(&self.path, &self.encode(txn)?, 0o600)
    }

    pub fn clear(&self) -> Result<(), FsError> {
        fsutil::remove_file_durable(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path_reaches_done() {
        let mut p = Phase::Staging;
        for ev in [
            Event::Staged,
            Event::BackedUp,
            Event::Switched,
            Event::StepsPassed,
            Event::Healthy,
        ] {
            p = match p.next(ev).unwrap() {
                Next::Phase(p) => p,
                Next::Done => panic!("done too early"),
            };
        }
        assert_eq!(p, Phase::Committed);
        assert_eq!(p.next(Event::Finished).unwrap(), Next::Done);
    }

    #[test]
    fn failure_records_whether_targets_were_touched() {
        let fail = || Event::Failed {
            reason: "x".into(),
            retry: false,
        };
        assert!(matches!(
            Phase::BackingUp.next(fail()).unwrap(),
            Next::Phase(Phase::RollingBack { touched: false, .. })
        ));
        assert!(matches!(
            Phase::Activating.next(fail()).unwrap(),
            Next::Phase(Phase::RollingBack { touched: true, .. })
        ));
    }

    #[test]
    fn illegal_transitions_are_typed_errors() {
        let err = Phase::Committed
            .next(Event::Failed {
                reason: "late".into(),
                retry: false,
            })
            .unwrap_err();
        assert_eq!(
            err,
            IllegalTransition {
                from: "committed",
                event: "failed"
            }
        );
        assert!(Phase::Staging.next(Event::Healthy).is_err());
        assert!(Phase::Switching.next(Event::Finished).is_err());
        let rb = Phase::RollingBack {
            reason: String::new(),
            touched: true,
            retry: false,
            guarded: false,
        };
        assert!(rb.next(Event::Staged).is_err());
    }

    #[test]
    fn journal_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::new(d.path().join("journal.json"));
        assert_eq!(j.load().unwrap(), None);
        let t = Txn {
            seq: 3,
            bundle: "b".into(),
            from: None,
            to: None,
            plans: vec![PathPlan {
                path: BundlePath::new("/etc/x").unwrap(),
                temp: ".x.tmp".into(),
                want: Want::Absent,
                backup: Some(Content::Absent),
                newly_owned: true,
            }],
            kept_originals: vec![],
            key: String::new(),
            renewal: false,
            phase: Phase::RollingBack {
                reason: "r".into(),
                touched: true,
                retry: true,
                guarded: true,
            },
        };
        j.write(&t).unwrap();
        assert_eq!(j.load().unwrap(), Some(t));
        j.clear().unwrap();
        assert_eq!(j.load().unwrap(), None);
    }
}
