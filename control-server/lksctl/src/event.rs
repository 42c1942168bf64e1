//! `lksctl event list`: what happened (enrolments, rollouts, node
//! reports), oldest first.

use anyhow::Context;
use clap::Subcommand;
use lks_proto::pb;

use crate::client::{Client, status};
use crate::output::{self, Format, print_json};

#[derive(Subcommand)]
pub enum EventCmd {
    /// List recent events, oldest first.
    List {
        /// Only this node.
        #[arg(long, default_value = "")]
        node: String,
        /// Only this tenant cluster.
        #[arg(long, default_value = "")]
        cluster: String,
        /// Only this rollout.
        #[arg(long, default_value = "")]
        rollout: String,
        /// At most this many events (0: server default).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
}

/// `lksctl event …`.
pub async fn run(c: &mut Client, url: &str, cmd: EventCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    let EventCmd::List {
        node,
        cluster,
        rollout,
        limit,
        output,
    } = cmd;
    let r = c
        .list_events(pb::ListEventsRequest {
            cluster,
            node,
            rollout_id: rollout,
            limit,
        })
        .await
        .map_err(st)
        .context("list events")?
        .into_inner();
    if output == Format::Json {
        print_json(&serde_json::json!(
            r.events.iter().map(output::event_json).collect::<Vec<_>>()
        ))?;
    } else {
        out!("{}", output::events_table(&r.events));
    }
    Ok(())
}
