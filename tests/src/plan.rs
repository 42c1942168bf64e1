//! Readers of a release plan as `lksctl plan status -o json` prints it,
//! shared by the plan tests (plans.rs, plans_scale.rs, console.rs).

use serde_json::Value;

/// One cluster of a plan: its group's index, name, state and its rollout's
/// state (empty while it has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanCluster {
    pub group: usize,
    pub name: String,
    pub state: String,
    pub rollout_state: String,
}

/// Every cluster of the plan, group by group.
pub fn clusters(p: &Value) -> Vec<PlanCluster> {
    let mut out = Vec::new();
    let groups = p["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("no groups in {p:#}"));
    for (group, g) in groups.iter().enumerate() {
        for c in g["clusters"]
            .as_array()
            .unwrap_or_else(|| panic!("no clusters in {g:#}"))
        {
            out.push(PlanCluster {
                group,
                name: c["name"].as_str().unwrap_or_default().to_string(),
                state: c["state"].as_str().unwrap_or_default().to_string(),
                rollout_state: c["rollout_state"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    out
}

/// The plan's cluster `name`, as JSON; panics naming the plan if it has
/// none.
pub fn cluster<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["clusters"].as_array().into_iter().flatten())
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the plan: {p:#}"))
}
