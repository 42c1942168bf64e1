//! The operator verbs on a rollout — pause, resume, abort, rollback — and
//! the states each is allowed from.

use lks_store::{NodeState, RolloutRow, RolloutState};

use crate::decision::{Decision, skip_waiting};
use crate::drain;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Pause,
    Resume,
    Abort,
    Rollback,
}

/// A verb the rollout's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    #[error("rollout {id} is {state}; only a running rollout can be paused")]
    NotRunning { id: String, state: &'static str },
    #[error("rollout {id} is {state}; only a paused rollout can be resumed")]
    NotPaused { id: String, state: &'static str },
    #[error("rollout {id} has already ended ({state})")]
    Ended { id: String, state: &'static str },
    #[error("rollout {id} is rolling back; wait for the rollback to finish")]
    RollingBack { id: String },
    #[error("rollout {id} was already rolled back")]
    RolledBack { id: String },
}

/// What `verb` does to `r`. The controller steps the result at once (so a
/// resume starts nodes and a rollback with nothing to undo ends).
pub fn apply_verb(r: &RolloutRow, verb: Verb, now_ms: i64) -> Result<Decision, VerbError> {
    let id = r.id.clone();
    let state = r.state.as_str();
    let mut d = Decision::new(r);
    d.rollout.updated_at_ms = now_ms;
    match (verb, r.state) {
        (Verb::Pause, RolloutState::Running) => {
            d.rollout.state = RolloutState::Paused;
            d.rollout.message = "paused by operator: no new node is started".into();
            drain::stop_drains(
                &mut d,
                NodeState::Waiting,
                "drain stopped: the rollout was paused; it drains again on resume",
            );
            d.note("", "paused", "");
        }
        (Verb::Pause, _) => return Err(VerbError::NotRunning { id, state }),
        (Verb::Resume, RolloutState::Paused) => {
            d.rollout.state = RolloutState::Running;
            d.rollout.message.clear();
            d.note("", "resumed", "");
        }
        (Verb::Resume, _) => return Err(VerbError::NotPaused { id, state }),
        (Verb::Abort, RolloutState::Running | RolloutState::Paused) => {
            d.rollout.state = RolloutState::Aborted;
            d.rollout.message = "aborted by operator; nodes already started keep the new version".into();
            skip_waiting(&mut d, "not started: the rollout was aborted");
            drain::stop_drains(
                &mut d,
                NodeState::Skipped,
                "not started: the rollout was aborted during its drain",
            );
            d.note("", "aborted", "");
        }
        (Verb::Abort | Verb::Rollback, RolloutState::RollingBack) => {
            return Err(VerbError::RollingBack { id });
        }
        (Verb::Abort, _) => return Err(VerbError::Ended { id, state }),
        (Verb::Rollback, RolloutState::RolledBack) => return Err(VerbError::RolledBack { id }),
        (Verb::Rollback, _) => {
            d.rollout.state = RolloutState::RollingBack;
            let touched = r.nodes.iter().filter(|n| n.touched).count();
            d.rollout.message =
                format!("rolling back: {touched} node(s) return to the version they had before");
            skip_waiting(&mut d, "not started: the rollout was rolled back");
            drain::stop_drains(
                &mut d,
                NodeState::Skipped,
                "not started: the rollout was rolled back during its drain",
            );
            d.note("", "rollout_rolling_back", format!("from {state}"));
        }
    }
    Ok(d)
}
