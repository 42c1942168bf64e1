//! `lksctl node …`: list and show nodes, delete one (its certificate
//! revoked), hold and release one, ask one to retry a version or to reboot.

use anyhow::Context;
use clap::Subcommand;
use lks_proto::pb;

use crate::client::{Client, status};
use crate::output::{self, Format, print_json};

#[derive(Subcommand)]
pub enum NodeCmd {
    /// List nodes.
    List {
        /// Only this tenant cluster.
        #[arg(long, default_value = "")]
        cluster: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Show one node.
    Get {
        name: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Delete a node and revoke its certificate (the name may join again).
    Delete { name: String },
    /// Hold a node: no rollout gives it a new desired state (it keeps repairing drift).
    Hold {
        name: String,
        /// Why, shown in `node get` and the event log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Release a held node: it catches up with the rollouts it missed.
    Unhold { name: String },
    /// Make a node try its desired version again: one it gave up on after
    /// crashing in a loop (or waits to retry with a backoff), or rolled back.
    Retry {
        name: String,
        /// Only this bundle [default: every bundle of the node].
        #[arg(long)]
        bundle: Option<String>,
    },
    /// Reboot a node now with its agent's reboot command (`systemctl reboot`
    /// by default). The node must be connected and its agent announce the
    /// "reboot" feature; `node list` shows it `rebooting`, then its new boot ID.
    Reboot { name: String },
}

/// `lksctl node …`.
pub async fn run(c: &mut Client, url: &str, cmd: NodeCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        NodeCmd::List { cluster, output } => {
            let r = c
                .list_nodes(pb::ListNodesRequest { cluster })
                .await
                .map_err(st)
                .context("list nodes")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.nodes.iter().map(output::node_json).collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::nodes_table(&r.nodes));
            }
        }
        NodeCmd::Get { name, output } => {
            let n = c
                .get_node(pb::GetNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("get node {name}"))?
                .into_inner();
            if output == Format::Json {
                print_json(&output::node_json(&n))?;
            } else {
                out!("{}", output::node_text(&n));
            }
        }
        NodeCmd::Delete { name } => {
            c.delete_node(pb::DeleteNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("delete node {name}"))?;
            outln!("node {name} deleted; its certificate no longer works");
        }
        NodeCmd::Hold { name, reason } => {
            c.hold_node(pb::HoldNodeRequest {
                name: name.clone(),
                reason,
            })
            .await
            .map_err(st)
            .with_context(|| format!("hold node {name}"))?;
            outln!("node {name} held: no rollout gives it a new version until `lksctl node unhold {name}`");
        }
        NodeCmd::Retry { name, bundle } => {
            let r = c
                .retry_node(pb::RetryNodeRequest {
                    name: name.clone(),
                    bundle: bundle.unwrap_or_default(),
                })
                .await
                .map_err(st)
                .with_context(|| format!("retry node {name}"))?
                .into_inner();
            outln!("node {name}: retry of {} requested", r.bundles.join(", "));
        }
        NodeCmd::Reboot { name } => {
            let r = c
                .reboot_node(pb::RebootNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("reboot node {name}"))?
                .into_inner();
            outln!(
                "node {name}: reboot requested (request {}); `lksctl node get {name}` shows it rebooting, then its new boot ID",
                r.request
            );
        }
        NodeCmd::Unhold { name } => {
            c.unhold_node(pb::UnholdNodeRequest { name: name.clone() })
                .await
                .map_err(st)
                .with_context(|| format!("unhold node {name}"))?;
            outln!("node {name} released: it catches up with the rollouts it missed");
        }
    }
    Ok(())
}
