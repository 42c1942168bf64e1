//! An operator verb on a rollout (pause, resume, abort, rollback), carried
//! out by the rollout controller. A rollback is refused first if a version
//! it would return nodes to was deleted (`bundle delete`, allowed once the
//! rollout finished): that version is named rather than assigned.

use std::collections::HashSet;

use lks_rollout::Verb;

use super::{Kind, OpError};
use crate::controller;
use crate::store::{BundleStore, RolloutRow, RolloutStore};

/// Longest rollout ID (a random or derived one is 12 hex digits).
const MAX_ID: usize = 64;

/// Why a verb is refused before the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbRefusal {
    #[error("rollout ID is empty or too long")]
    BadId,
    #[error("rollout {0} does not exist")]
    NoRollout(String),
    #[error(
        "rollout {id} cannot be rolled back: it would return nodes to {bundle}@{version}, which was deleted; \
         publish that version again, or roll the nodes forward with a new rollout"
    )]
    VersionDeleted {
        id: String,
        bundle: String,
        version: String,
    },
}

impl VerbRefusal {
    pub fn kind(&self) -> Kind {
        match self {
            VerbRefusal::BadId => Kind::Invalid,
            VerbRefusal::NoRollout(_) => Kind::NotFound,
            VerbRefusal::VersionDeleted { .. } => Kind::FailedPrecondition,
        }
    }
}

fn check_id(id: &str) -> Result<(), VerbRefusal> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(VerbRefusal::BadId);
    }
    Ok(())
}

/// The rollout `id` names, as stored.
pub async fn load(store: &(impl RolloutStore + ?Sized), id: &str) -> Result<RolloutRow, OpError> {
    check_id(id)?;
    Ok(store
        .get_rollout(id)
        .await?
        .ok_or_else(|| VerbRefusal::NoRollout(id.to_string()))?)
}

/// Applies `verb` to the rollout `id`; returns the rollout after it took
/// effect.
pub async fn apply(controller: &controller::Handle, id: &str, verb: Verb) -> Result<RolloutRow, OpError> {
    check_id(id)?;
    let row = controller.verb(id, verb).await?;
    tracing::info!(rollout = %id, ?verb, state = row.state.as_str(), "operator verb applied");
    Ok(row)
}

/// Rolls the rollout `id` back, unless a version it would return nodes to
/// was deleted.
pub async fn rollback(
    store: &(impl RolloutStore + BundleStore + ?Sized),
    controller: &controller::Handle,
    id: &str,
) -> Result<RolloutRow, OpError> {
    let r = load(store, id).await?;
    for v in returned_to(&r) {
        if store.get_bundle(&r.bundle, v).await?.is_none() {
            return Err(VerbRefusal::VersionDeleted {
                id: id.to_string(),
                bundle: r.bundle.clone(),
                version: v.to_string(),
            }
            .into());
        }
    }
    apply(controller, id, Verb::Rollback).await
}

/// The versions a rollback of `r` returns nodes to: those its touched
/// nodes held before.
fn returned_to(r: &RolloutRow) -> HashSet<&str> {
    r.nodes
        .iter()
        .filter(|n| n.touched && !n.previous_version.is_empty())
        .map(|n| n.previous_version.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_id_is_one_to_sixty_four_bytes() {
        assert_eq!(check_id(""), Err(VerbRefusal::BadId));
        assert_eq!(check_id(&"a".repeat(65)), Err(VerbRefusal::BadId));
        check_id("0123456789ab").unwrap();
        check_id(&"a".repeat(64)).unwrap();
        assert_eq!(VerbRefusal::BadId.kind(), Kind::Invalid);
        assert_eq!(VerbRefusal::BadId.to_string(), "rollout ID is empty or too long");
    }

    #[test]
    fn a_deleted_version_is_named_with_what_to_do() {
        let e = VerbRefusal::VersionDeleted {
            id: "r1".into(),
            bundle: "kubelet".into(),
            version: "1".into(),
        };
        assert_eq!(e.kind(), Kind::FailedPrecondition);
        assert!(
            e.to_string()
                .starts_with("rollout r1 cannot be rolled back: it would return nodes to kubelet@1, which was deleted; publish"),
            "{e}"
        );
    }
}
