//! The command line of `lks-loadgen` and what several modes read off it
//! (the clusters the agents go to; how long a final count waits).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// How long the final count waits for agents still moving between
/// replicas after a failover, and the end of a rollout for the last agents
/// to hold its version.
pub const SETTLE: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Simulate many lksadmin agents against a running control server"
)]
pub struct Args {
    /// admin.conf of the server under test.
    #[arg(long, env = "LKSCTL_CONFIG", default_value = "admin.conf")]
    pub config: PathBuf,
    /// Cluster to enrol the simulated agents into (created if missing).
    #[arg(long)]
    pub cluster: String,
    /// Spread the agents over this many clusters, CLUSTER-0 … CLUSTER-(K-1)
    /// (agent i in the (i mod K)-th, numbered from --first-agent), as a
    /// region holds many tenant clusters; --rollout then starts one rollout
    /// per cluster at once.
    #[arg(long, default_value_t = 1)]
    pub clusters: usize,
    /// Number of simulated agents.
    #[arg(long)]
    pub agents: usize,
    /// Replicas to spread the agents over, comma-separated (agent i uses
    /// the (i mod n)-th); default: admin.conf's server.
    #[arg(long, value_delimiter = ',', value_name = "URL")]
    pub servers: Vec<String>,
    /// Number this process's agents from here: their source addresses and
    /// first servers follow on from another process's (which had this
    /// many).
    #[arg(long, default_value_t = 0)]
    pub first_agent: usize,
    /// Seconds to keep every stream open after all agents connected.
    #[arg(long, default_value_t = 0)]
    pub hold: u64,
    /// Agents enrolling or connecting at the same time.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Give each agent its own 127.x.y.z source address (the default when
    /// the server is on IPv4 loopback).
    #[arg(long)]
    pub spread_source_ips: bool,
    /// Connect every agent from the one default source address.
    #[arg(long, conflicts_with = "spread_source_ips")]
    pub no_spread_source_ips: bool,
    /// Reconnect storm: start the server from the command after `--`,
    /// connect the agents, restart the server and measure until every agent
    /// has its desired state again.
    #[arg(long)]
    pub storm: bool,
    /// Stop the server with SIGKILL instead of SIGTERM.
    #[arg(long, requires = "storm")]
    pub storm_kill: bool,
    /// Seconds to wait for every agent to be back after the restart.
    #[arg(long, default_value_t = 300, requires = "storm")]
    pub storm_timeout: u64,
    /// Append the started server's output to this file (default: discard).
    #[arg(long, requires = "storm")]
    pub server_log: Option<PathBuf>,
    /// The server command line (storm mode).
    #[arg(last = true, value_name = "SERVER_CMD")]
    pub server_cmd: Vec<String>,
    /// Publish a bundle and roll it out to all simulated agents.
    #[arg(long)]
    pub rollout: bool,
    /// Files in that bundle (small, distinct; the simulated agents
    /// acknowledge without downloading them).
    #[arg(long, default_value_t = 0, requires = "rollout")]
    pub files: usize,
    /// Failover under load: SIGKILL these processes mid-rollout (once
    /// --kill-at of the agents have the new desired state).
    #[arg(long, value_delimiter = ',', value_name = "PID", requires = "rollout")]
    pub kill_mid_rollout: Vec<i32>,
    /// Fraction of the agents (0–1] holding the new desired state when
    /// --kill-mid-rollout kills.
    #[arg(long, default_value_t = 0.3)]
    pub kill_at: f64,
    /// Start the rollout once the cluster has this many connected nodes
    /// (the agents of other load generator processes too).
    #[arg(long, requires = "rollout")]
    pub rollout_after_nodes: Option<usize>,
    /// Other load generator processes to send SIGUSR1 at the kill.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "PID",
        requires = "kill_mid_rollout"
    )]
    pub notify_at_kill: Vec<i32>,
    /// Seconds the rollout may take, and (with --kill-mid-rollout) every
    /// dropped agent to be back.
    #[arg(long, default_value_t = 300)]
    pub rollout_timeout: u64,
    /// Batch size of that rollout (default: all agents at once).
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Start the rollouts through one release plan over the clusters
    /// (`CreatePlan`) instead of one `StartRollout` each; the report's
    /// `rollouts_started_seconds` is then the plan's create → its last
    /// cluster rollout stored.
    #[arg(long, requires = "rollout", conflicts_with = "kill_mid_rollout")]
    pub plan: bool,
    /// The plan's groups: the clusters in this many consecutive slices, by
    /// name, in order.
    #[arg(long, default_value_t = 1, requires = "plan")]
    pub plan_groups: usize,
    /// The plan's --max-clusters-in-flight (default: every cluster).
    #[arg(long, requires = "plan")]
    pub plan_in_flight: Option<u32>,
    /// The agents enrolled in these clusters report every bundle of each
    /// desired state failed ("lks-loadgen --fail-in"), as a node whose
    /// health check fails: failure injection for rollouts and plans.
    #[arg(long, value_delimiter = ',', value_name = "CLUSTER")]
    pub fail_in: Vec<String>,
    /// The agents enrolled in these clusters take --slow-ms to apply a
    /// desired state that has bundles (a slow node).
    #[arg(long, value_delimiter = ',', value_name = "CLUSTER")]
    pub slow_in: Vec<String>,
    #[arg(long, default_value_t = 5000)]
    pub slow_ms: u64,
    /// Measure an idle in-process tonic server instead (no control server needed).
    #[arg(long)]
    pub baseline: bool,
    /// Keep the enrolled nodes instead of deleting them at the end.
    #[arg(long)]
    pub keep_nodes: bool,
    /// Output format: text or json.
    #[arg(short = 'o', long, default_value = "text")]
    pub output: String,
}

/// The clusters the agents are enrolled in: `--cluster`, or with
/// `--clusters K` CLUSTER-0 … CLUSTER-(K-1).
pub fn cluster_names(args: &Args) -> Vec<String> {
    if args.clusters <= 1 {
        vec![args.cluster.clone()]
    } else {
        (0..args.clusters)
            .map(|k| format!("{}-{k}", args.cluster))
            .collect()
    }
}
