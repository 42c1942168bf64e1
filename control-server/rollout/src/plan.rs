//! Release plans (issue [fleet-plans]): what a plan does next, given the
//! plan as stored and how its clusters' rollouts stand — a pure function,
//! like a rollout's [`crate::step`]. The server's plan driver (leader only)
//! stores each [`PlanDecision`] on the plan's revision first, then carries
//! out its [`PlanAction`]s through the rollout machinery; a start is
//! idempotent (its request ID derives from plan and cluster), so a driver
//! that died between the two is followed by one that starts the same
//! rollout again, which starts nothing twice.
//!
//! The rules:
//! - Groups go in order. A group is done when every cluster in it settled
//!   (completed, failed or skipped); the next group starts `soak` after
//!   that. The last group done: the plan is `completed`.
//! - At most `max_in_flight` clusters have a running rollout at once;
//!   clusters start in the group's order.
//! - A cluster rollout that ends failed (or is aborted or rolled back by
//!   someone else) counts against the failure budget; at the budget the plan
//!   is `halted`: nothing new starts, and its running rollouts are paused
//!   (`on_halt: pause`) or left to finish.
//! - `pause` pauses the running rollouts too; `resume` resumes those the
//!   plan paused and gives the budget afresh; `abort` aborts them and skips
//!   the clusters not reached; `rollback` rolls back every rollout the plan
//!   started, newest first, at most `max_in_flight` at once.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use lks_store::{OnHalt, PlanClusterRow, PlanClusterState as C, PlanRow, PlanState, RolloutState};

/// How one of the plan's rollouts stands, as the driver read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutSeen {
    pub state: RolloutState,
    /// Nodes in the rollout.
    pub total: u32,
    pub updated: u32,
    pub failed: u32,
    pub message: String,
}

/// What the driver does after storing a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanAction {
    /// Start the plan's rollout in `cluster` (request ID
    /// [`request_id`]`(plan, cluster)`, so its ID is `rollout_id`).
    Start {
        cluster: String,
        rollout_id: String,
    },
    Pause {
        rollout_id: String,
    },
    Resume {
        rollout_id: String,
    },
    Abort {
        rollout_id: String,
    },
    Rollback {
        rollout_id: String,
    },
}

/// Something worth an event: `kind`, the cluster (may be empty), the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanNote {
    pub kind: &'static str,
    pub cluster: String,
    pub message: String,
}

/// The plan as it should be stored, what to do once it is, and the events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDecision {
    pub plan: PlanRow,
    pub actions: Vec<PlanAction>,
    pub notes: Vec<PlanNote>,
}

/// An operator verb on a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanVerb {
    Pause,
    Resume,
    Abort,
    Rollback,
}

impl PlanVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanVerb::Pause => "pause",
            PlanVerb::Resume => "resume",
            PlanVerb::Abort => "abort",
            PlanVerb::Rollback => "roll back",
        }
    }
}

/// A verb the plan's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {verb} plan {plan}: it is {state}")]
pub struct PlanVerbError {
    pub verb: &'static str,
    pub plan: String,
    pub state: &'static str,
}

/// The request ID a plan starts its rollout in `cluster` with.
pub fn request_id(plan: &str, cluster: &str) -> String {
    format!("plan:{plan}:{cluster}")
}

/// The rollout ID a request ID starts (12 hex digits of its SHA-256), so
/// that a retried start finds the rollout in one read and two starts with
/// one ID cannot both be stored.
pub fn request_rollout_id(request_id: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(format!("lksadmin rollout request {request_id}").as_bytes());
    d[..6].iter().map(|x| format!("{x:02x}")).collect()
}

/// The plan after `verb`, or why the verb does not apply.
pub fn apply_verb(p: &PlanRow, verb: PlanVerb, now_ms: i64) -> Result<PlanRow, PlanVerbError> {
    let to = match (verb, p.state) {
        (PlanVerb::Pause, PlanState::Running) => PlanState::Paused,
        (PlanVerb::Resume, PlanState::Paused | PlanState::Halted) => PlanState::Running,
        (PlanVerb::Abort, PlanState::Running | PlanState::Paused | PlanState::Halted) => PlanState::Aborted,
        (PlanVerb::Rollback, s) if !matches!(s, PlanState::RollingBack | PlanState::RolledBack) => {
            PlanState::RollingBack
        }
        _ => {
            return Err(PlanVerbError {
                verb: verb.as_str(),
                plan: p.name.clone(),
                state: p.state.as_str(),
            });
        }
    };
    let mut out = p.clone();
    if verb == PlanVerb::Resume {
        out.failures_at_resume = out.failures;
    }
    out.message = match verb {
        PlanVerb::Pause => "paused by the operator".into(),
        PlanVerb::Resume => "resumed by the operator".into(),
        PlanVerb::Abort => "aborted by the operator".into(),
        PlanVerb::Rollback => "rolling back every cluster rollout it started, newest first".into(),
    };
    set_state(&mut out, to, now_ms);
    Ok(out)
}

fn set_state(p: &mut PlanRow, to: PlanState, now_ms: i64) {
    if p.state != to {
        p.state = to;
        p.state_since_ms = now_ms;
    }
}

/// Whether the driver has anything to look at in `p`: a live plan, and an
/// aborted one only while one of its rollouts runs.
pub fn needs_driving(p: &PlanRow) -> bool {
    match p.state {
        PlanState::Completed | PlanState::RolledBack => false,
        PlanState::Aborted => p
            .clusters()
            .any(|c| matches!(c.state, C::Running | C::RollingBack)),
        _ => true,
    }
}

/// The next decision for `p`, given its rollouts as `seen` (by rollout ID;
/// a rollout missing from it does not exist), or `None` if nothing changes.
pub fn step(p: &PlanRow, seen: &BTreeMap<String, RolloutSeen>, now_ms: i64) -> Option<PlanDecision> {
    let mut d = PlanDecision {
        plan: p.clone(),
        actions: Vec::new(),
        notes: Vec::new(),
    };
    observe(&mut d, seen, now_ms);
    if d.plan.state == PlanState::Running && d.plan.budget_used() >= d.plan.failure_budget.max(1) {
        let msg = format!(
            "{} cluster rollout(s) failed: the failure budget of {} is used; resume or roll back",
            d.plan.budget_used(),
            d.plan.failure_budget.max(1)
        );
        set_state(&mut d.plan, PlanState::Halted, now_ms);
        d.plan.message = msg.clone();
        note(&mut d, "plan_halted", "", msg);
    }
    match d.plan.state {
        PlanState::Running => {
            restart_missing(&mut d, seen);
            resume_paused(&mut d, seen);
            advance(&mut d, now_ms);
        }
        PlanState::Paused => pause_running(&mut d, seen),
        PlanState::Halted if d.plan.on_halt == OnHalt::Pause => pause_running(&mut d, seen),
        PlanState::Aborted => abort(&mut d, seen, now_ms),
        PlanState::RollingBack => roll_back(&mut d, seen, now_ms),
        PlanState::Halted | PlanState::Completed | PlanState::RolledBack => {}
    }
    if d.plan == *p && d.actions.is_empty() && d.notes.is_empty() {
        return None;
    }
    d.plan.updated_at_ms = now_ms;
    Some(d)
}

fn note(d: &mut PlanDecision, kind: &'static str, cluster: &str, message: String) {
    d.notes.push(PlanNote {
        kind,
        cluster: cluster.to_string(),
        message,
    });
}

/// Every cluster whose rollout runs (forward or back) takes in what its
/// rollout did.
fn observe(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>, now_ms: i64) {
    let starting = d.plan.state == PlanState::Running;
    let mut notes = Vec::new();
    let mut failures = 0;
    for c in d.plan.groups.iter_mut().flat_map(|g| g.clusters.iter_mut()) {
        let Some(r) = seen.get(&c.rollout_id) else {
            match c.state {
                // Stored as started, but its start never happened (the
                // driver died in between): it is started again below, or
                // waits again if nothing may start now.
                C::Running if !starting => {
                    c.state = C::Waiting;
                    c.seq = 0;
                    c.started_at_ms = 0;
                }
                C::RollingBack => {
                    c.state = C::RolledBack;
                    c.message = format!("rollout {} no longer exists", c.rollout_id);
                }
                _ => {}
            }
            continue;
        };
        if let Some((kind, failed)) = settle(c, r, now_ms) {
            failures += u32::from(failed);
            notes.push((kind, c.name.clone(), c.message.clone()));
        }
    }
    d.plan.failures += failures;
    for (kind, cluster, message) in notes {
        note(d, kind, &cluster, message);
    }
}

/// `c` after its rollout `r`: the event kind and whether it failed, when
/// the cluster changed state.
fn settle(c: &mut PlanClusterRow, r: &RolloutSeen, now_ms: i64) -> Option<(&'static str, bool)> {
    let progress = format!("{}/{} node(s) updated", r.updated, r.total);
    let why = |r: &RolloutSeen| {
        if r.message.is_empty() {
            format!("rollout {}", r.state.as_str())
        } else {
            format!("rollout {}: {}", r.state.as_str(), r.message)
        }
    };
    let (state, kind, failed, message) = match (c.state, r.state) {
        (C::Running, RolloutState::Completed) if r.total == 0 => (
            C::Skipped,
            "plan_cluster_skipped",
            false,
            "no node matched at its start".into(),
        ),
        (C::Running, RolloutState::Completed) => (C::Completed, "plan_cluster_completed", false, progress),
        (C::Running, RolloutState::Failed | RolloutState::Aborted | RolloutState::RolledBack) => {
            (C::Failed, "plan_cluster_failed", true, why(r))
        }
        // Progress is read from the rollout when the plan is shown, not
        // written into the plan: the plan is written only when a cluster
        // changes state.
        (C::Running, RolloutState::Running | RolloutState::Paused | RolloutState::RollingBack) => {
            c.paused_by_plan &= r.state == RolloutState::Paused;
            return None;
        }
        (C::RollingBack, RolloutState::RolledBack) => (
            C::RolledBack,
            "plan_cluster_rolled_back",
            false,
            format!("rollout {} rolled back", c.rollout_id),
        ),
        _ => return None,
    };
    c.state = state;
    c.message = message;
    c.ended_at_ms = now_ms;
    c.paused_by_plan = false;
    Some((kind, failed))
}

/// A cluster stored as started whose rollout does not exist: the driver
/// died between storing the plan and starting it. Started again (the same
/// request ID, so never twice).
fn restart_missing(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>) {
    for c in d.plan.clusters() {
        if c.state == C::Running && !seen.contains_key(&c.rollout_id) {
            d.actions.push(PlanAction::Start {
                cluster: c.name.clone(),
                rollout_id: c.rollout_id.clone(),
            });
        }
    }
}

fn resume_paused(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>) {
    for c in d.plan.groups.iter_mut().flat_map(|g| g.clusters.iter_mut()) {
        if c.state == C::Running
            && c.paused_by_plan
            && seen.get(&c.rollout_id).map(|r| r.state) == Some(RolloutState::Paused)
        {
            c.paused_by_plan = false;
            d.actions.push(PlanAction::Resume {
                rollout_id: c.rollout_id.clone(),
            });
        }
    }
}

fn pause_running(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>) {
    for c in d.plan.groups.iter_mut().flat_map(|g| g.clusters.iter_mut()) {
        if c.state == C::Running && seen.get(&c.rollout_id).map(|r| r.state) == Some(RolloutState::Running) {
            c.paused_by_plan = true;
            d.actions.push(PlanAction::Pause {
                rollout_id: c.rollout_id.clone(),
            });
        }
    }
}

/// Groups in order: closes a group whose clusters all settled, waits out
/// the soak, starts the current group's clusters within the limit, and
/// completes the plan after the last group.
fn advance(d: &mut PlanDecision, now_ms: i64) {
    let soak = i64::try_from(d.plan.soak_ms).unwrap_or(i64::MAX);
    let last = d.plan.groups.len().saturating_sub(1);
    let mut in_flight = d.plan.clusters().filter(|c| c.state == C::Running).count();
    let mut seq = d.plan.clusters().map(|c| c.seq).max().unwrap_or(0);
    let mut notes = Vec::new();
    let mut actions = Vec::new();
    let name = d.plan.name.clone();
    let limit = d.plan.max_in_flight.max(1) as usize;
    let mut all_done = true;
    for (i, g) in d.plan.groups.iter_mut().enumerate() {
        if g.done_at_ms == 0 {
            for c in g.clusters.iter_mut().filter(|c| c.state == C::Waiting) {
                if c.nodes == 0 {
                    c.state = C::Skipped;
                    c.message = "no node matches the plan's selector".into();
                    c.ended_at_ms = now_ms;
                    notes.push(("plan_cluster_skipped", c.name.clone(), c.message.clone()));
                } else if in_flight < limit {
                    in_flight += 1;
                    seq += 1;
                    c.state = C::Running;
                    c.seq = seq;
                    c.started_at_ms = now_ms;
                    c.rollout_id = request_rollout_id(&request_id(&name, &c.name));
                    c.message = format!("rollout {} started", c.rollout_id);
                    actions.push(PlanAction::Start {
                        cluster: c.name.clone(),
                        rollout_id: c.rollout_id.clone(),
                    });
                    notes.push(("plan_cluster_started", c.name.clone(), c.message.clone()));
                }
            }
            if !g.clusters.iter().all(|c| c.state.is_settled()) {
                all_done = false;
                break;
            }
            g.done_at_ms = now_ms;
            notes.push((
                "plan_group_done",
                String::new(),
                group_done_line(g, i == last, soak),
            ));
        }
        if i < last && now_ms < g.done_at_ms.saturating_add(soak) {
            all_done = false;
            break;
        }
    }
    d.actions.extend(actions);
    for (kind, cluster, message) in notes {
        note(d, kind, &cluster, message);
    }
    if all_done {
        let failed = d.plan.clusters().filter(|c| c.state == C::Failed).count();
        let msg = format!(
            "every group is done: {} cluster(s) completed, {failed} failed, {} skipped",
            d.plan.clusters().filter(|c| c.state == C::Completed).count(),
            d.plan.clusters().filter(|c| c.state == C::Skipped).count(),
        );
        set_state(&mut d.plan, PlanState::Completed, now_ms);
        d.plan.message = msg.clone();
        note(d, "plan_completed", "", msg);
    }
}

fn group_done_line(g: &lks_store::PlanGroupRow, last: bool, soak_ms: i64) -> String {
    let skipped: Vec<&str> = g
        .clusters
        .iter()
        .filter(|c| c.state == C::Skipped)
        .map(|c| c.name.as_str())
        .collect();
    let mut s = format!("group {} done", g.name);
    if !skipped.is_empty() {
        s.push_str(&format!("; skipped: {}", skipped.join(", ")));
    }
    if !last && soak_ms > 0 {
        s.push_str(&format!(
            "; the next group starts after a soak of {}s",
            soak_ms / 1000
        ));
    }
    s
}

fn abort(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>, now_ms: i64) {
    for c in d.plan.groups.iter_mut().flat_map(|g| g.clusters.iter_mut()) {
        match c.state {
            C::Waiting => {
                c.state = C::Skipped;
                c.message = "the plan was aborted first".into();
                c.ended_at_ms = now_ms;
            }
            C::Running
                if seen
                    .get(&c.rollout_id)
                    .is_some_and(|r| matches!(r.state, RolloutState::Running | RolloutState::Paused)) =>
            {
                d.actions.push(PlanAction::Abort {
                    rollout_id: c.rollout_id.clone(),
                });
            }
            _ => {}
        }
    }
}

/// Rolls back the rollouts the plan started, newest first, at most
/// `max_in_flight` at once; the plan is `rolled_back` once none is left.
fn roll_back(d: &mut PlanDecision, seen: &BTreeMap<String, RolloutSeen>, now_ms: i64) {
    let limit = d.plan.max_in_flight.max(1) as usize;
    let mut in_flight = d.plan.clusters().filter(|c| c.state == C::RollingBack).count();
    let mut order: Vec<(u32, usize, usize)> = Vec::new();
    for (gi, g) in d.plan.groups.iter_mut().enumerate() {
        for (ci, c) in g.clusters.iter_mut().enumerate() {
            if c.state == C::Waiting {
                c.state = C::Skipped;
                c.message = "the plan was rolled back first".into();
                c.ended_at_ms = now_ms;
            } else if c.seq > 0 && matches!(c.state, C::Running | C::Completed | C::Failed) {
                order.push((c.seq, gi, ci));
            }
        }
    }
    order.sort_by_key(|o| std::cmp::Reverse(o.0));
    for (_, gi, ci) in order {
        let c = &mut d.plan.groups[gi].clusters[ci];
        match seen.get(&c.rollout_id).map(|r| r.state) {
            None | Some(RolloutState::RolledBack) => {
                c.state = C::RolledBack;
                c.message = "nothing to roll back".into();
                c.ended_at_ms = now_ms;
            }
            Some(RolloutState::RollingBack) => {
                c.state = C::RollingBack;
                in_flight += 1;
            }
            Some(_) if in_flight < limit => {
                in_flight += 1;
                c.state = C::RollingBack;
                c.message = format!("rolling back rollout {}", c.rollout_id);
                d.actions.push(PlanAction::Rollback {
                    rollout_id: c.rollout_id.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let left = d
        .plan
        .clusters()
        .any(|c| c.seq > 0 && matches!(c.state, C::Running | C::Completed | C::Failed | C::RollingBack));
    if !left {
        let n = d.plan.clusters().filter(|c| c.state == C::RolledBack).count();
        let msg = format!("{n} cluster rollout(s) rolled back");
        set_state(&mut d.plan, PlanState::RolledBack, now_ms);
        d.plan.message = msg.clone();
        note(d, "plan_rolled_back", "", msg);
    }
}

/// How a cluster of a plan reads at `now_ms`: its state, or `soaking` for
/// a completed cluster of a group whose soak still runs.
pub fn cluster_state_at(p: &PlanRow, group: usize, c: &PlanClusterRow, now_ms: i64) -> &'static str {
    let soaking = p.groups.get(group).is_some_and(|g| {
        g.done_at_ms > 0
            && group + 1 < p.groups.len()
            && now_ms
                < g.done_at_ms
                    .saturating_add(i64::try_from(p.soak_ms).unwrap_or(i64::MAX))
    });
    if soaking && c.state == C::Completed && p.state == PlanState::Running {
        "soaking"
    } else {
        c.state.as_str()
    }
}

/// How a group reads at `now_ms`: `waiting`, `running`, `soaking` (done,
/// the next one not started yet) or `done`.
pub fn group_state_at(p: &PlanRow, group: usize, now_ms: i64) -> &'static str {
    let Some(g) = p.groups.get(group) else {
        return "waiting";
    };
    if g.done_at_ms > 0 {
        let soak_end = g
            .done_at_ms
            .saturating_add(i64::try_from(p.soak_ms).unwrap_or(i64::MAX));
        if group + 1 < p.groups.len() && now_ms < soak_end && p.state == PlanState::Running {
            return "soaking";
        }
        return "done";
    }
    if g.clusters.iter().any(|c| c.state != C::Waiting) {
        "running"
    } else {
        "waiting"
    }
}

/// The rollouts [`step`] reads of `p`: those of clusters whose rollout
/// runs (forward or back), and while the plan rolls back every one it
/// started. A cluster that completed, failed or was skipped is not read
/// again, so a plan over 1,000 clusters soaking after a group costs its
/// driver no read a second (it read every rollout it had started).
pub fn rollouts_to_follow(p: &PlanRow) -> Vec<String> {
    if p.state == PlanState::RollingBack {
        return rollout_ids(p);
    }
    p.clusters()
        .filter(|c| !c.rollout_id.is_empty() && matches!(c.state, C::Running | C::RollingBack))
        .map(|c| c.rollout_id.clone())
        .collect()
}

/// The rollouts a plan started, by rollout ID, for the views it is shown
/// over.
pub fn rollout_ids(p: &PlanRow) -> Vec<String> {
    p.clusters()
        .filter(|c| !c.rollout_id.is_empty())
        .map(|c| c.rollout_id.clone())
        .collect()
}
