//! `lksctl plan …`: release plans (issue [fleet-plans]) — one bundle
//! version to many clusters in ordered groups, each cluster by a rollout
//! of its own with the policy `rollout start` takes (its flags, reused);
//! creating one (`--dry-run` shows what it would touch), following it, and
//! the verbs on it.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use lks_proto::duration::parse_duration;
use lks_proto::names::parse_bundle_ref;
use lks_proto::pb;
use lks_rollout::Policy;
use serde_json::{Value, json};

use crate::client::{Client, status};
use crate::flags::labels;
use crate::output::{self, Format, print_json, rfc3339_ms};
use crate::rollout::PolicyArgs;

/// `--on-halt`: what a plan at its failure budget does with its running rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnHalt {
    /// Pause them (nodes mid-apply finish).
    Pause,
    /// Let them finish.
    Finish,
}

/// `plan create`'s flags.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// The plan's name ([a-z0-9-], at most 48 bytes).
    pub name: String,
    /// NAME@VERSION of a published bundle.
    #[arg(long)]
    pub bundle: String,
    /// A group, in order: NAME=SELECTOR, where SELECTOR is cluster names
    /// (a,b), cluster labels (tier=early[,k=v]) or * (every cluster not in
    /// an earlier group). Repeatable.
    #[arg(long = "group", value_name = "NAME=SELECTOR", required = true)]
    pub groups: Vec<String>,
    /// Wait this long after a group is done before the next starts.
    #[arg(long, value_parser = parse_duration)]
    pub soak: Option<Duration>,
    /// Most clusters with a running rollout at once.
    #[arg(long, default_value_t = 1)]
    pub max_clusters_in_flight: u32,
    /// Failed cluster rollouts that halt the plan.
    #[arg(long, default_value_t = 1)]
    pub failure_budget: u32,
    /// What a halted plan does with its running rollouts.
    #[arg(long, value_enum, default_value_t = OnHalt::Pause)]
    pub on_halt: OnHalt,
    /// Raise an alert (`lks_plans_overdue`) when the plan runs longer than this.
    #[arg(long, value_parser = parse_duration)]
    pub alert_after: Option<Duration>,
    /// Only nodes with these labels (k=v,…), in every cluster.
    #[arg(long, default_value = "")]
    pub selector: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Store nothing: print every group, its clusters, their node counts,
    /// windows and holds.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Subcommand)]
// Parsed once per run: the size of a variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum PlanCmd {
    /// Create a release plan and start it (the replica driving rollouts runs it).
    Create(CreateArgs),
    /// Show a plan: each group and cluster, with why.
    Status {
        name: String,
        /// Follow the plan until it completes, halts or ends.
        #[arg(long)]
        watch: bool,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// List plans.
    List {
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Pause a running plan: nothing new starts, its running rollouts are paused.
    Pause { name: String },
    /// Resume a paused or halted plan (the failure budget counts afresh).
    Resume { name: String },
    /// Stop a plan for good: its running rollouts are aborted, clusters not reached skipped.
    Abort { name: String },
    /// Roll back every cluster rollout the plan started, newest first.
    Rollback { name: String },
}

/// `NAME=SELECTOR` split at the first `=`.
fn group(s: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((n, sel)) if !n.is_empty() && !sel.trim().is_empty() => Ok((n.to_string(), sel.to_string())),
        _ => bail!(
            "--group {s:?}: give NAME=SELECTOR, e.g. canary=tenant-a,tenant-b or early=tier=early or rest=*"
        ),
    }
}

/// Checks what `plan create` can check before dialling.
pub fn check_create(a: &CreateArgs) -> anyhow::Result<()> {
    parse_bundle_ref(&a.bundle).context("--bundle")?;
    labels("--selector", &a.selector)?;
    for g in &a.groups {
        group(g)?;
    }
    Policy::try_from(&a.policy).map(|_| ())
}

pub async fn run(c: &mut Client, url: &str, cmd: PlanCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        PlanCmd::Create(a) => create(c, url, a).await,
        PlanCmd::Status { name, watch, output } => {
            if watch {
                return follow(c, url, &name, output).await;
            }
            let p = get(c, url, &name).await?;
            show(&p, output)
        }
        PlanCmd::List { output } => {
            let r = c
                .list_plans(pb::ListPlansRequest {})
                .await
                .map_err(st)
                .context("list plans")?
                .into_inner();
            if output == Format::Json {
                print_json(&json!(r.plans.iter().map(plan_json).collect::<Vec<_>>()))
            } else {
                out!("{}", plans_table(&r.plans));
                Ok(())
            }
        }
        PlanCmd::Pause { name } => verb(c, url, Verb::Pause, &name).await,
        PlanCmd::Resume { name } => verb(c, url, Verb::Resume, &name).await,
        PlanCmd::Abort { name } => verb(c, url, Verb::Abort, &name).await,
        PlanCmd::Rollback { name } => verb(c, url, Verb::Rollback, &name).await,
    }
}

/// A verb on a plan (`plan pause|resume|abort|rollback`; the console's
/// buttons): the rollouts' four.
pub use crate::rollout::Verb;

async fn create(c: &mut Client, url: &str, a: CreateArgs) -> anyhow::Result<()> {
    check_create(&a)?;
    let (bundle, version) = parse_bundle_ref(&a.bundle).context("--bundle")?;
    let policy = Policy::try_from(&a.policy)?;
    let groups = a
        .groups
        .iter()
        .map(|g| group(g).map(|(name, selector)| pb::PlanGroupSpec { name, selector }))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rollout = pb::StartRolloutRequest {
        selector: labels("--selector", &a.selector)?.into_iter().collect(),
        ..policy.to_request()
    };
    let p = c
        .create_plan(pb::CreatePlanRequest {
            name: a.name.clone(),
            bundle,
            version,
            groups,
            soak_seconds: a.soak.map_or(0, |d| d.as_secs()),
            max_clusters_in_flight: a.max_clusters_in_flight,
            failure_budget: a.failure_budget,
            on_halt: match a.on_halt {
                OnHalt::Pause => pb::PlanOnHalt::Pause as i32,
                OnHalt::Finish => pb::PlanOnHalt::Finish as i32,
            },
            alert_after_seconds: a.alert_after.map_or(0, |d| d.as_secs()),
            rollout: Some(rollout),
            dry_run: a.dry_run,
        })
        .await
        .map_err(|e| status(url, e))
        .with_context(|| format!("create plan {}", a.name))?
        .into_inner();
    if a.output == Format::Json {
        return print_json(&plan_json(&p));
    }
    if a.dry_run {
        out!(
            "dry run: nothing stored; the plan would start as follows\n{}",
            plan_text(&p)
        );
    } else {
        outln!("{}", p.name);
    }
    Ok(())
}

/// `plan status NAME`'s read: the plan as the server has it.
pub async fn get(c: &mut Client, url: &str, name: &str) -> anyhow::Result<pb::Plan> {
    c.get_plan(pb::PlanRef {
        name: name.to_string(),
    })
    .await
    .map_err(|e| status(url, e))
    .with_context(|| format!("get plan {name}"))
    .map(tonic::Response::into_inner)
}

fn show(p: &pb::Plan, output: Format) -> anyhow::Result<()> {
    if output == Format::Json {
        print_json(&plan_json(p))
    } else {
        out!("{}", plan_text(p));
        Ok(())
    }
}

/// `plan status --watch`: a line whenever the plan moves, until it ends
/// or halts; then the plan.
async fn follow(c: &mut Client, url: &str, name: &str, output: Format) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let p = get(c, url, name).await?;
        let line = plan_line(&p);
        if line != last && output != Format::Json {
            outln!("{line}");
            last = line;
        }
        if matches!(p.state.as_str(), "completed" | "halted" | "rolled_back")
            || (p.state == "aborted" && p.in_flight == 0)
        {
            return show(&p, output);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn verb(c: &mut Client, url: &str, verb: Verb, name: &str) -> anyhow::Result<()> {
    let p = act(c, url, verb, name).await?;
    outln!("{}", plan_line(&p));
    Ok(())
}

/// Runs `verb` on plan `name`; the plan as it is after.
pub async fn act(c: &mut Client, url: &str, verb: Verb, name: &str) -> anyhow::Result<pb::Plan> {
    let r = pb::PlanRef {
        name: name.to_string(),
    };
    Ok(match verb {
        Verb::Pause => c.pause_plan(r).await,
        Verb::Resume => c.resume_plan(r).await,
        Verb::Abort => c.abort_plan(r).await,
        Verb::Rollback => c.rollback_plan(r).await,
    }
    .map_err(|e| status(url, e))
    .with_context(|| format!("{} plan {name}", verb.words()))?
    .into_inner())
}

/// One line: where the plan stands.
pub fn plan_line(p: &pb::Plan) -> String {
    let clusters: Vec<&pb::PlanCluster> = p.groups.iter().flat_map(|g| &g.clusters).collect();
    let n = |s: &str| clusters.iter().filter(|c| c.state == s).count();
    let group = p
        .groups
        .iter()
        .find(|g| g.state != "done")
        .map(|g| format!(", group {} {}", g.name, g.state))
        .unwrap_or_default();
    format!(
        "plan {} {}{group}: {} cluster(s), {} completed, {} running, {} failed, {} skipped{}",
        p.name,
        p.state,
        clusters.len(),
        n("completed") + n("soaking"),
        n("running"),
        n("failed"),
        n("skipped"),
        if p.message.is_empty() {
            String::new()
        } else {
            format!(" — {}", p.message)
        }
    )
}

fn cluster_progress(c: &pb::PlanCluster) -> String {
    match c.state.as_str() {
        "running" if c.total > 0 => format!("running {}/{}", c.updated, c.total),
        s => s.to_string(),
    }
}

fn windows_cell(c: &pb::PlanCluster) -> String {
    if c.maintenance_windows.is_empty() {
        return "always".into();
    }
    let when = if c.window_open {
        "open now".to_string()
    } else {
        rfc3339_ms(c.next_window_ms).map_or_else(|| "closed".into(), |t| format!("next {t}"))
    };
    format!("{} ({when})", c.maintenance_windows.join("; "))
}

/// The plan as `plan status` and `plan create --dry-run` print it.
pub fn plan_text(p: &pb::Plan) -> String {
    let mut s = format!(
        "{}\nbundle {}@{}, {} cluster(s) in flight at most, failure budget {} ({} used), on halt {}, soak {}s\n",
        plan_line(p),
        p.bundle,
        p.version,
        p.max_clusters_in_flight,
        p.failure_budget,
        p.budget_used,
        p.on_halt,
        p.soak_seconds
    );
    for g in &p.groups {
        let soak = rfc3339_ms(g.soak_until_ms)
            .map(|t| format!(", soaking until {t}"))
            .unwrap_or_default();
        s.push_str(&format!(
            "\ngroup {} ({}): {}{soak}\n",
            g.name, g.selector, g.state
        ));
        let rows: Vec<Vec<String>> = g
            .clusters
            .iter()
            .map(|c| {
                vec![
                    c.name.clone(),
                    cluster_progress(c),
                    c.nodes.to_string(),
                    c.held.to_string(),
                    windows_cell(c),
                    if c.rollout_id.is_empty() {
                        "-".into()
                    } else {
                        c.rollout_id.clone()
                    },
                    c.message.clone(),
                ]
            })
            .collect();
        s.push_str(&output::table(
            &["CLUSTER", "STATE", "NODES", "HELD", "WINDOWS", "ROLLOUT", "WHY"],
            &rows,
        ));
    }
    s
}

fn plans_table(plans: &[pb::Plan]) -> String {
    let rows: Vec<Vec<String>> = plans
        .iter()
        .map(|p| {
            let clusters: Vec<&pb::PlanCluster> = p.groups.iter().flat_map(|g| &g.clusters).collect();
            let done = clusters
                .iter()
                .filter(|c| matches!(c.state.as_str(), "completed" | "soaking"))
                .count();
            vec![
                p.name.clone(),
                format!("{}@{}", p.bundle, p.version),
                p.state.clone(),
                format!("{done}/{}", clusters.len()),
                p.failures.to_string(),
                output::rfc3339_ms(p.created_at_ms).unwrap_or_default(),
            ]
        })
        .collect();
    output::table(
        &["NAME", "BUNDLE", "STATE", "COMPLETED", "FAILED", "CREATED"],
        &rows,
    )
}

fn group_json(g: &pb::PlanGroup) -> Value {
    json!({
        "name": g.name,
        "selector": g.selector,
        "state": g.state,
        "soak_until": rfc3339_ms(g.soak_until_ms),
        "clusters": g.clusters.iter().map(cluster_json).collect::<Vec<_>>(),
    })
}

fn cluster_json(c: &pb::PlanCluster) -> Value {
    json!({
        "name": c.name,
        "state": c.state,
        "rollout_id": (!c.rollout_id.is_empty()).then_some(&c.rollout_id),
        "message": c.message,
        "nodes": c.nodes,
        "total": c.total,
        "updated": c.updated,
        "failed": c.failed,
        "rollout_state": (!c.rollout_state.is_empty()).then_some(&c.rollout_state),
        "maintenance_windows": c.maintenance_windows,
        "window_open": c.window_open,
        "next_window": rfc3339_ms(c.next_window_ms),
        "held": c.held,
        "connected": c.connected,
    })
}

/// `plan status -o json` (and `plan list -o json`'s items).
pub fn plan_json(p: &pb::Plan) -> Value {
    let skipped: Vec<&str> = p
        .groups
        .iter()
        .flat_map(|g| &g.clusters)
        .filter(|c| c.state == "skipped")
        .map(|c| c.name.as_str())
        .collect();
    json!({
        "name": p.name,
        "bundle": format!("{}@{}", p.bundle, p.version),
        "state": p.state,
        "message": p.message,
        "dry_run": p.dry_run,
        "selector": p.selector.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "soak_seconds": p.soak_seconds,
        "max_clusters_in_flight": p.max_clusters_in_flight,
        "in_flight": p.in_flight,
        "failure_budget": p.failure_budget,
        "budget_used": p.budget_used,
        "failures": p.failures,
        "on_halt": p.on_halt,
        "alert_after_seconds": p.alert_after_seconds,
        "overdue": p.overdue,
        "created_at": rfc3339_ms(p.created_at_ms),
        "updated_at": rfc3339_ms(p.updated_at_ms),
        "state_since": rfc3339_ms(p.state_since_ms),
        "started_by": p.started_by,
        "skipped": skipped,
        "groups": p.groups.iter().map(group_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_a_name_and_a_selector_split_at_the_first_equals() {
        assert_eq!(
            group("early=tier=early").unwrap(),
            ("early".into(), "tier=early".into())
        );
        assert_eq!(group("rest=*").unwrap(), ("rest".into(), "*".into()));
        assert_eq!(group("c=a,b").unwrap(), ("c".into(), "a,b".into()));
        let e = group("nothing").unwrap_err().to_string();
        assert!(e.starts_with("--group \"nothing\": give NAME=SELECTOR"), "{e}");
        assert!(group("=x").is_err());
        assert!(group("g=").is_err());
    }
}
