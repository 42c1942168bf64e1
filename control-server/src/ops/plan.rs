//! Release plans (issue [fleet-plans]): creating one — its groups expanded
//! into clusters once, in order, against the clusters and their labels as
//! they are now (`--dry-run` stores nothing and answers the same plan) —
//! and the operator verbs on it. The plan driver (`crate::plans`, leader
//! only) moves it on from the store; what it decides is
//! `lks_rollout::plan`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lks_proto::labels::{LabelError, Labels, parse_labels, selector_matches};
use lks_proto::names::{NameError, validate_bundle_name, validate_cluster_name, validate_version};
use lks_rollout::plan::{PlanVerb, PlanVerbError, apply_verb};
use lks_rollout::{Policy, PolicyError};
use prost::Message as _;

use super::{Kind, OpError};
use crate::store::{
    BundleStore, ClusterRow, ClusterStore, EventRow, NodeStore, OnHalt, PlanClusterRow, PlanGroupRow,
    PlanRow, PlanState, PlanStore, StoreError,
};

/// Longest plan name: its request IDs (`plan:NAME:CLUSTER`) must fit in 128 bytes.
pub const MAX_PLAN_NAME: usize = 48;
/// Most groups in a plan.
pub const MAX_GROUPS: usize = 64;
/// Longest soak and `--alert-after`.
pub const MAX_WAIT: Duration = Duration::from_secs(90 * 24 * 3600);
/// Tries of a verb that lost a race with the plan driver.
const VERB_ATTEMPTS: usize = 5;

/// A plan as the operator asked for it (the names are checked here).
#[derive(Clone, Debug, Default)]
pub struct CreatePlan {
    pub name: String,
    pub bundle: String,
    pub version: String,
    /// Which nodes of each cluster its rollout targets.
    pub selector: Labels,
    /// (name, selector) in order.
    pub groups: Vec<(String, String)>,
    pub soak: Duration,
    pub max_in_flight: u32,
    pub failure_budget: u32,
    pub on_halt: OnHalt,
    pub alert_after: Duration,
    /// Each cluster's rollout policy.
    pub policy: Policy,
    pub dry_run: bool,
    pub started_by: String,
}

/// Why a plan is not created or a verb not carried out.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("plan name {0:?}: use [a-z0-9][a-z0-9-]*, at most {MAX_PLAN_NAME} bytes")]
    PlanName(String),
    #[error("a plan needs at least one --group NAME=SELECTOR")]
    NoGroups,
    #[error("{0} groups; the limit is {MAX_GROUPS}")]
    TooManyGroups(usize),
    #[error("group name {0:?}: use [a-z0-9][a-z0-9-]*")]
    GroupName(String),
    #[error("group {0} is given twice")]
    GroupTwice(String),
    #[error("group {group}: selector {selector:?}: {source}")]
    Selector {
        group: String,
        selector: String,
        #[source]
        source: Box<LabelError>,
    },
    #[error("group {group}: cluster {cluster} does not exist")]
    NoCluster { group: String, cluster: String },
    #[error("group {group}: cluster {cluster} is already in group {earlier}")]
    ClusterTwice {
        group: String,
        cluster: String,
        earlier: String,
    },
    #[error("the plan's groups select no cluster")]
    NoClusters,
    #[error("bundle {bundle}@{version} is not published; publish it with `lksctl bundle publish DIR`")]
    NoBundle { bundle: String, version: String },
    #[error("{0} is longer than the limit of 90 days")]
    TooLong(&'static str),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("plan {0} does not exist")]
    NoPlan(String),
    #[error(transparent)]
    Verb(#[from] PlanVerbError),
}

impl PlanError {
    pub fn kind(&self) -> Kind {
        match self {
            PlanError::NoCluster { .. } | PlanError::NoBundle { .. } | PlanError::NoPlan(_) => Kind::NotFound,
            PlanError::Verb(_) => Kind::FailedPrecondition,
            PlanError::Policy(e) if e.is_precondition() => Kind::FailedPrecondition,
            _ => Kind::Invalid,
        }
    }
}

fn check_name(what: fn(String) -> PlanError, name: &str, max: usize) -> Result<(), PlanError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(()) } else { Err(what(name.to_string())) }
}

/// A plan name as `CreatePlan` and the verbs accept it.
pub fn check_plan_name(name: &str) -> Result<(), PlanError> {
    check_name(PlanError::PlanName, name, MAX_PLAN_NAME)
}

/// What a group's selector picks.
enum Pick {
    Names(Vec<String>),
    Labels(Labels),
    Rest,
}

fn parse_pick(group: &str, selector: &str) -> Result<Pick, PlanError> {
    let s = selector.trim();
    let bad = |source| PlanError::Selector {
        group: group.to_string(),
        selector: selector.to_string(),
        source: Box::new(source),
    };
    if s == "*" {
        return Ok(Pick::Rest);
    }
    if s.contains('=') {
        return parse_labels(s).map(Pick::Labels).map_err(bad);
    }
    let names: Vec<String> = s.split(',').map(|n| n.trim().to_string()).collect();
    for n in &names {
        validate_cluster_name(n)?;
    }
    Ok(Pick::Names(names))
}

/// The plan's groups expanded over `clusters` (by name), in order: a
/// cluster belongs to the first group that picks it; `*` takes every
/// cluster no earlier group took. Each cluster with the number of nodes
/// `node_counts` gives it.
fn expand(
    groups: &[(String, String)],
    clusters: &[ClusterRow],
    node_counts: &BTreeMap<String, u32>,
) -> Result<Vec<PlanGroupRow>, PlanError> {
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::with_capacity(groups.len());
    for (group, selector) in groups {
        let picked: Vec<String> = match parse_pick(group, selector)? {
            Pick::Names(names) => {
                for n in &names {
                    if !clusters.iter().any(|c| c.name == *n) {
                        return Err(PlanError::NoCluster {
                            group: group.clone(),
                            cluster: n.clone(),
                        });
                    }
                    if let Some(earlier) = taken.get(n) {
                        return Err(PlanError::ClusterTwice {
                            group: group.clone(),
                            cluster: n.clone(),
                            earlier: earlier.clone(),
                        });
                    }
                }
                names
            }
            Pick::Labels(sel) => clusters
                .iter()
                .filter(|c| !taken.contains_key(&c.name) && selector_matches(&sel, &c.labels))
                .map(|c| c.name.clone())
                .collect(),
            Pick::Rest => clusters
                .iter()
                .filter(|c| !taken.contains_key(&c.name))
                .map(|c| c.name.clone())
                .collect(),
        };
        let mut rows = Vec::with_capacity(picked.len());
        for name in picked {
            if taken.insert(name.clone(), group.clone()).is_some() {
                continue;
            }
            rows.push(PlanClusterRow::waiting(
                &name,
                node_counts.get(&name).copied().unwrap_or(0),
            ));
        }
        out.push(PlanGroupRow {
            name: group.clone(),
            selector: selector.clone(),
            done_at_ms: 0,
            clusters: rows,
        });
    }
    if taken.is_empty() {
        return Err(PlanError::NoClusters);
    }
    Ok(out)
}

fn check_request(r: &CreatePlan) -> Result<(), PlanError> {
    check_plan_name(&r.name)?;
    validate_bundle_name(&r.bundle)?;
    validate_version(&r.version)?;
    if r.groups.is_empty() {
        return Err(PlanError::NoGroups);
    }
    if r.groups.len() > MAX_GROUPS {
        return Err(PlanError::TooManyGroups(r.groups.len()));
    }
    let mut seen = BTreeSet::new();
    for (g, _) in &r.groups {
        check_name(PlanError::GroupName, g, 63)?;
        if !seen.insert(g) {
            return Err(PlanError::GroupTwice(g.clone()));
        }
    }
    if r.soak > MAX_WAIT {
        return Err(PlanError::TooLong("--soak"));
    }
    if r.alert_after > MAX_WAIT {
        return Err(PlanError::TooLong("--alert-after"));
    }
    r.policy.validate()?;
    Ok(())
}

/// Creates the plan `r` asks for (or, `dry_run`, answers it unstored).
pub async fn create(
    store: &(impl PlanStore + ClusterStore + NodeStore + BundleStore + ?Sized),
    r: CreatePlan,
    now_ms: i64,
) -> Result<PlanRow, OpError> {
    check_request(&r)?;
    if store.get_bundle(&r.bundle, &r.version).await?.is_none() {
        return Err(PlanError::NoBundle {
            bundle: r.bundle,
            version: r.version,
        }
        .into());
    }
    let clusters = store.list_clusters().await?;
    let mut node_counts: BTreeMap<String, u32> = BTreeMap::new();
    for n in store.list_nodes(None).await? {
        if selector_matches(&r.selector, &n.labels) {
            *node_counts.entry(n.cluster).or_default() += 1;
        }
    }
    let groups = expand(&r.groups, &clusters, &node_counts)?;
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let row = PlanRow {
        name: r.name,
        bundle: r.bundle,
        version: r.version,
        selector: r.selector,
        policy: r.policy.to_request().encode_to_vec(),
        soak_ms: ms(r.soak),
        max_in_flight: r.max_in_flight.max(1),
        failure_budget: r.failure_budget.max(1),
        on_halt: r.on_halt,
        alert_after_ms: ms(r.alert_after),
        state: PlanState::Running,
        groups,
        failures: 0,
        failures_at_resume: 0,
        message: String::new(),
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        state_since_ms: now_ms,
        started_by: r.started_by,
        revision: 0,
    };
    if r.dry_run {
        return Ok(row);
    }
    let event = plan_event(&row, "plan_created", "", created_line(&row), now_ms);
    let row = store.create_plan(row, event).await?;
    tracing::info!(plan = %row.name, bundle = %row.bundle, version = %row.version, clusters = row.clusters().count(), "plan created");
    Ok(row)
}

fn created_line(p: &PlanRow) -> String {
    let groups: Vec<String> = p
        .groups
        .iter()
        .map(|g| format!("{} ({} cluster(s))", g.name, g.clusters.len()))
        .collect();
    format!(
        "plan {} of {}@{} created by {}: groups {}",
        p.name,
        p.bundle,
        p.version,
        p.started_by,
        groups.join(", ")
    )
}

/// An event about plan `p` (`cluster` may be empty).
pub fn plan_event(p: &PlanRow, kind: &str, cluster: &str, message: String, at_ms: i64) -> EventRow {
    EventRow {
        id: 0,
        at_ms,
        cluster: cluster.to_string(),
        node: String::new(),
        rollout_id: String::new(),
        kind: kind.to_string(),
        bundle: p.bundle.clone(),
        version: p.version.clone(),
        message: format!("plan {}: {message}", p.name),
    }
}

/// The plan named `name`.
pub async fn get(store: &(impl PlanStore + ?Sized), name: &str) -> Result<PlanRow, OpError> {
    check_plan_name(name)?;
    Ok(store
        .get_plan(name)
        .await?
        .ok_or_else(|| PlanError::NoPlan(name.to_string()))?)
}

/// An operator verb on plan `name`, stored on the plan's revision (tried
/// again if the driver wrote in between); the driver carries it out.
pub async fn verb(
    store: &(impl PlanStore + ?Sized),
    name: &str,
    verb: PlanVerb,
    admin: &str,
    now_ms: i64,
) -> Result<PlanRow, OpError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let p = get(store, name).await?;
        let next = apply_verb(&p, verb, now_ms).map_err(PlanError::from)?;
        let kind = format!("plan_{}", next.state.as_str());
        let event = plan_event(&next, &kind, "", format!("{} by {admin}", verb.as_str()), now_ms);
        match store.update_plan(next, vec![event]).await {
            Ok(p) => {
                tracing::info!(plan = %name, verb = verb.as_str(), admin, "plan verb");
                return Ok(p);
            }
            Err(StoreError::Conflict(_)) if attempt < VERB_ATTEMPTS => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewCluster;

    fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterRow {
        ClusterRow {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NewCluster::new(name, 0).row()
        }
    }

    fn groups(g: &[(&str, &str)]) -> Vec<(String, String)> {
        g.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn groups_expand_in_order_by_name_label_and_rest() {
        let clusters = [
            cluster("a", &[]),
            cluster("b", &[("tier", "early")]),
            cluster("c", &[("tier", "early")]),
            cluster("d", &[]),
        ];
        let counts = BTreeMap::from([("a".to_string(), 3), ("c".to_string(), 1)]);
        let g = expand(
            &groups(&[("canary", "a,c"), ("early", "tier=early"), ("rest", "*")]),
            &clusters,
            &counts,
        )
        .unwrap();
        let names: Vec<Vec<&str>> = g
            .iter()
            .map(|g| g.clusters.iter().map(|c| c.name.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            [vec!["a", "c"], vec!["b"], vec!["d"]],
            "c stays in its first group"
        );
        assert_eq!(g[0].clusters[0].nodes, 3);
        assert_eq!(g[1].clusters[0].nodes, 0);
    }

    #[test]
    fn a_selector_naming_nothing_known_is_one_clear_line() {
        let clusters = [cluster("a", &[])];
        let none = BTreeMap::new();
        let e = expand(&groups(&[("g", "a,zz")]), &clusters, &none).unwrap_err();
        assert_eq!(e.to_string(), "group g: cluster zz does not exist");
        let e = expand(&groups(&[("g", "a"), ("h", "a")]), &clusters, &none).unwrap_err();
        assert_eq!(e.to_string(), "group h: cluster a is already in group g");
        let e = expand(&groups(&[("g", "tier=x")]), &clusters, &none).unwrap_err();
        assert_eq!(e.to_string(), "the plan's groups select no cluster");
        assert!(expand(&groups(&[("g", "A_B")]), &clusters, &none).is_err());
    }

    #[test]
    fn names_are_checked_before_anything_is_read() {
        let ok = CreatePlan {
            name: "fleet-1".into(),
            bundle: "kubelet".into(),
            version: "1.37.2".into(),
            groups: groups(&[("all", "*")]),
            ..Default::default()
        };
        assert!(check_request(&ok).is_ok());
        let long = CreatePlan {
            name: "x".repeat(49),
            ..ok.clone()
        };
        assert!(matches!(check_request(&long), Err(PlanError::PlanName(_))));
        let twice = CreatePlan {
            groups: groups(&[("a", "*"), ("a", "x")]),
            ..ok.clone()
        };
        assert_eq!(
            check_request(&twice).unwrap_err().to_string(),
            "group a is given twice"
        );
        let none = CreatePlan {
            groups: Vec::new(),
            ..ok
        };
        assert!(matches!(check_request(&none), Err(PlanError::NoGroups)));
    }
}
