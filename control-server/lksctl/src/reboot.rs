//! `lksctl reboot …`: a cluster's coordinated reboots (issue [reboots]) —
//! start a rolling reboot of the nodes a selector picks, show where each
//! node stands, pause, resume or abort it.

use anyhow::Context;
use clap::Subcommand;
use lks_proto::pb;
use serde_json::{Value, json};

use crate::client::{Client, status};
use crate::flags::labels;
use crate::output::{self, Format, print_json};

#[derive(Subcommand)]
pub enum RebootCmd {
    /// Reboot every node the selector picks, whether or not it says it
    /// needs a reboot, one slot at a time (`cluster set --reboots manual|auto
    /// --max-concurrent-reboots N`), inside the maintenance windows, each
    /// drained first and back Ready after boot.
    Start {
        #[arg(long)]
        cluster: String,
        /// Only nodes with these labels (k=v,…) [default: every node].
        #[arg(long, default_value = "")]
        selector: String,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Where each node stands: waiting (and why), draining, rebooting,
    /// back (waiting for Ready), lost, done.
    Status {
        #[arg(long)]
        cluster: String,
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Give no new slot; the nodes holding one finish.
    Pause {
        #[arg(long)]
        cluster: String,
    },
    /// Give slots again.
    Resume {
        #[arg(long)]
        cluster: String,
    },
    /// End the rolling reboot: no new slot; the holders finish, and lost
    /// holders kept by `--on-reboot-timeout keep` give their slots back.
    Abort {
        #[arg(long)]
        cluster: String,
    },
}

impl RebootCmd {
    /// The cluster it names, and its selector checked.
    pub fn check(&self) -> anyhow::Result<()> {
        let cluster = match self {
            RebootCmd::Start {
                cluster, selector, ..
            } => {
                labels("--selector", selector)?;
                cluster
            }
            RebootCmd::Status { cluster, .. }
            | RebootCmd::Pause { cluster }
            | RebootCmd::Resume { cluster }
            | RebootCmd::Abort { cluster } => cluster,
        };
        lks_proto::names::validate_cluster_name(cluster).context("--cluster")?;
        Ok(())
    }
}

/// `lksctl reboot …`.
pub async fn run(c: &mut Client, url: &str, cmd: RebootCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    let verb = |cluster: String, verb: pb::RebootRunVerb| pb::SetRebootRunRequest {
        cluster,
        verb: verb as i32,
    };
    let (r, output, said) = match cmd {
        RebootCmd::Start {
            cluster,
            selector,
            output,
        } => {
            let r = c
                .start_reboots(pb::StartRebootsRequest {
                    cluster: cluster.clone(),
                    selector: labels("--selector", &selector)?.into_iter().collect(),
                })
                .await
                .map_err(st)
                .with_context(|| format!("start a rolling reboot of cluster {cluster}"))?
                .into_inner();
            (r, output, Some("started"))
        }
        RebootCmd::Status { cluster, output } => {
            let r = c
                .get_reboots(pb::GetRebootsRequest {
                    cluster: cluster.clone(),
                })
                .await
                .map_err(st)
                .with_context(|| format!("reboot status of cluster {cluster}"))?
                .into_inner();
            (r, output, None)
        }
        RebootCmd::Pause { cluster } => {
            let r = c
                .set_reboot_run(verb(cluster.clone(), pb::RebootRunVerb::Pause))
                .await;
            (
                r.map_err(st)
                    .with_context(|| format!("pause the rolling reboot of {cluster}"))?
                    .into_inner(),
                Format::Table,
                Some("paused"),
            )
        }
        RebootCmd::Resume { cluster } => {
            let r = c
                .set_reboot_run(verb(cluster.clone(), pb::RebootRunVerb::Resume))
                .await;
            (
                r.map_err(st)
                    .with_context(|| format!("resume the rolling reboot of {cluster}"))?
                    .into_inner(),
                Format::Table,
                Some("resumed"),
            )
        }
        RebootCmd::Abort { cluster } => {
            let r = c
                .set_reboot_run(verb(cluster.clone(), pb::RebootRunVerb::Abort))
                .await;
            (
                r.map_err(st)
                    .with_context(|| format!("abort the rolling reboot of {cluster}"))?
                    .into_inner(),
                Format::Table,
                Some("aborted"),
            )
        }
    };
    if output == Format::Json {
        return print_json(&reboots_json(&r));
    }
    match said {
        Some(s) => outln!(
            "cluster {}: rolling reboot {s} ({} node(s) waiting); `lksctl reboot status --cluster {}` follows it",
            r.cluster,
            r.nodes.iter().filter(|n| n.state == "waiting").count(),
            r.cluster
        ),
        None => out!("{}", reboots_text(&r)),
    }
    Ok(())
}

fn reboots_json(r: &pb::RebootsStatus) -> Value {
    json!({
        "cluster": r.cluster,
        "policy": output::reboot_policy_json(r.policy.as_ref()),
        "run": (!r.run_state.is_empty()).then(|| json!({
            "state": r.run_state,
            "selector": r.selector,
            "started_at": output::rfc3339_ms(r.started_ms),
            "started_by": r.started_by,
        })),
        "slots_taken": r.slots_taken,
        "window_open": r.window_open,
        "next_window": (r.next_window_ms > 0).then(|| output::rfc3339_ms(r.next_window_ms)).flatten(),
        "nodes": r.nodes.iter().map(|n| json!({
            "name": n.name,
            "state": n.state,
            "message": n.message,
            "since": (n.since_ms > 0).then(|| output::rfc3339_ms(n.since_ms)).flatten(),
        })).collect::<Vec<_>>(),
    })
}

fn reboots_text(r: &pb::RebootsStatus) -> String {
    let p = r.policy.clone().unwrap_or_default();
    let mut s = format!(
        "Cluster:   {}\nReboots:   {}\nGates:     {}\nSlots:     {} of {} taken\nWindow:    {}\n",
        r.cluster,
        output::reboot_policy_text(r.policy.as_ref()),
        output::reboot_gates_text(r.policy.as_ref()),
        r.slots_taken,
        p.max_concurrent,
        if r.window_open {
            "open".to_string()
        } else {
            match output::rfc3339_ms(r.next_window_ms) {
                Some(t) if r.next_window_ms > 0 => format!("closed; the next opens at {t}"),
                _ => "closed".to_string(),
            }
        }
    );
    if !r.run_state.is_empty() {
        s.push_str(&format!(
            "Run:       {} (started by {} at {})\n",
            r.run_state,
            r.started_by,
            output::rfc3339_ms(r.started_ms).unwrap_or_default()
        ));
    }
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| vec![n.name.clone(), n.state.clone(), n.message.clone()])
        .collect();
    s.push('\n');
    s.push_str(&output::table(&["NODE", "STATE", "MESSAGE"], &rows));
    s
}
