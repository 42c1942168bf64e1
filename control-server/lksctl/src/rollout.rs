//! `lksctl rollout …`: starting rollouts with their policy, following them,
//! and the operator verbs.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Subcommand, ValueEnum};
use lks_proto::duration::parse_duration;
use lks_proto::names::{parse_bundle_ref, validate_cluster_name};
use lks_proto::pb::{self, RolloutState};
use lks_rollout::policy::{DEFAULT_CANARY_SOAK_TEXT, DrainOptions, DrainTimeout, OfflinePolicy, Policy};
use tokio_stream::StreamExt;

use crate::client::{Client, status};
use crate::flags::labels;
use crate::output::{self, Format, print_json};

/// `--offline`: what a node offline at its turn does
/// ([`OfflinePolicy`]'s words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Offline {
    Defer,
    Wait,
}

impl From<Offline> for OfflinePolicy {
    fn from(o: Offline) -> Self {
        match o {
            Offline::Defer => OfflinePolicy::Defer,
            Offline::Wait => OfflinePolicy::Wait,
        }
    }
}

/// `--on-drain-timeout`: what a node whose drain timed out becomes
/// ([`DrainTimeout`]'s words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnDrainTimeout {
    Fail,
    Skip,
}

impl From<OnDrainTimeout> for DrainTimeout {
    fn from(o: OnDrainTimeout) -> Self {
        match o {
            OnDrainTimeout::Fail => DrainTimeout::Fail,
            OnDrainTimeout::Skip => DrainTimeout::Skip,
        }
    }
}

#[derive(Subcommand)]
// Parsed once per run: the size of a variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum RolloutCmd {
    /// Start moving a cluster's matching nodes to NAME@VERSION.
    Start {
        /// Tenant cluster.
        #[arg(long)]
        cluster: String,
        /// NAME@VERSION of a published bundle.
        #[arg(long)]
        bundle: String,
        /// Only nodes with these labels (k=v,…).
        #[arg(long, default_value = "")]
        selector: String,
        #[command(flatten)]
        policy: PolicyArgs,
        /// Make the start idempotent: run again with the same ID (e.g. a CI
        /// job's ID), it prints the rollout the first run started and starts
        /// nothing; refused if that rollout was for another bundle or cluster.
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
        /// Wait until the rollout ends, showing progress; exit non-zero unless it completed.
        #[arg(long)]
        wait: bool,
        /// Start nothing: list the nodes the rollout would target, those that would
        /// fail at their turn (an architecture the bundle lacks, an agent without a
        /// feature it needs) first, with the reason.
        #[arg(long, conflicts_with = "wait")]
        dry_run: bool,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Show a rollout.
    Status {
        id: String,
        /// Follow the rollout until it ends.
        #[arg(long)]
        watch: bool,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// List rollouts.
    List {
        /// Only this tenant cluster.
        #[arg(long, default_value = "")]
        cluster: String,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value_t)]
        output: Format,
    },
    /// Pause a running rollout: no new node is started; nodes mid-apply finish.
    Pause { id: String },
    /// Resume a paused rollout.
    Resume { id: String },
    /// Stop a rollout for good: no new node is started; nodes mid-apply finish and keep the new version.
    Abort { id: String },
    /// Return every node the rollout changed to its previous version, in batches (stops the rollout first).
    Rollback { id: String },
}

pub async fn run(c: &mut Client, url: &str, cmd: RolloutCmd) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    match cmd {
        RolloutCmd::Start {
            cluster,
            bundle,
            selector,
            policy,
            request_id,
            wait,
            dry_run,
            output,
        } => {
            if dry_run {
                let plan = dry_run_plan(c, url, &cluster, &bundle, &selector).await?;
                if output == Format::Json {
                    print_json(&plan)?;
                } else {
                    out!("{}", dry_run_text(&plan));
                }
                return Ok(());
            }
            check_start(&cluster, &bundle, &selector)?;
            let policy = Policy::try_from(&policy)?;
            let (r, warnings) = start(
                c,
                url,
                &Start {
                    cluster: &cluster,
                    bundle: &bundle,
                    selector: &selector,
                    policy,
                    request_id: request_id.as_deref().unwrap_or_default(),
                },
            )
            .await?;
            for w in &warnings {
                eprintln!("warning: {w}");
            }
            follow_started(c, url, &r, wait, output).await
        }
        RolloutCmd::Status { id, watch: w, output } => status_of(c, url, &id, w, output).await,
        RolloutCmd::List { cluster, output } => {
            let r = c
                .list_rollouts(pb::ListRolloutsRequest { cluster })
                .await
                .map_err(st)
                .context("list rollouts")?
                .into_inner();
            if output == Format::Json {
                print_json(&serde_json::json!(
                    r.rollouts.iter().map(output::rollout_json).collect::<Vec<_>>()
                ))?;
            } else {
                out!("{}", output::rollouts_table(&r.rollouts));
            }
            Ok(())
        }
        RolloutCmd::Pause { id } => verb_line(c, url, Verb::Pause, &id).await,
        RolloutCmd::Resume { id } => verb_line(c, url, Verb::Resume, &id).await,
        RolloutCmd::Abort { id } => verb_line(c, url, Verb::Abort, &id).await,
        RolloutCmd::Rollback { id } => verb_line(c, url, Verb::Rollback, &id).await,
    }
}

/// After a start: a hint about the release, then the rollout's ID (or
/// JSON), or, with `--wait`, its progress until it ends.
async fn follow_started(
    c: &mut Client,
    url: &str,
    r: &pb::Rollout,
    wait: bool,
    output: Format,
) -> anyhow::Result<()> {
    if let Some(hint) = crate::release::start_hint(c, url, r).await {
        eprintln!("{hint}");
    }
    if !wait {
        if output == Format::Json {
            print_json(&output::rollout_json(r))?;
        } else {
            outln!("{}", r.id);
        }
        return Ok(());
    }
    if output != Format::Json {
        outln!("{}", r.id);
    }
    let progress = if std::io::stderr().is_terminal() {
        Progress::bar()
    } else if output == Format::Json {
        Progress::Quiet
    } else {
        Progress::Lines
    };
    let last = watch(c, url, &r.id, progress).await?;
    if output == Format::Json {
        print_json(&output::rollout_json(&last))?;
    }
    ended_ok(&last)
}

/// `rollout status ID`, once or `--watch`ed until it ends.
async fn status_of(c: &mut Client, url: &str, id: &str, w: bool, output: Format) -> anyhow::Result<()> {
    let st = |s: tonic::Status| status(url, s);
    if w {
        let progress = if output != Format::Json {
            Progress::Lines
        } else if std::io::stderr().is_terminal() {
            Progress::bar()
        } else {
            Progress::Quiet
        };
        let last = watch(c, url, id, progress).await?;
        if output == Format::Json {
            print_json(&output::rollout_json(&last))?;
        } else {
            out!("{}", output::rollout_text(&last));
        }
        return Ok(());
    }
    let r = c
        .get_rollout(pb::RolloutRef { id: id.to_string() })
        .await
        .map_err(st)
        .with_context(|| format!("get rollout {id}"))?
        .into_inner();
    if output == Format::Json {
        print_json(&output::rollout_json(&r))?;
    } else {
        out!("{}", output::rollout_text(&r));
    }
    Ok(())
}

async fn verb_line(c: &mut Client, url: &str, verb: Verb, id: &str) -> anyhow::Result<()> {
    let r = act(c, url, verb, id).await?;
    outln!("{}", output::rollout_line(&r));
    if verb == Verb::Rollback
        && let Some(hint) = crate::release::rollback_hint(c, url, &r).await
    {
        eprintln!("{hint}");
    }
    Ok(())
}

/// What `rollout start` sends.
pub struct Start<'a> {
    pub cluster: &'a str,
    pub bundle: &'a str,
    pub selector: &'a str,
    pub policy: Policy,
    /// `--request-id`; empty: none.
    pub request_id: &'a str,
}

/// `rollout start`'s policy flags ([`Policy`]).
#[derive(clap::Args, Clone, Debug)]
pub struct PolicyArgs {
    /// Most nodes applying at once (0: server default, 10% of the target nodes rounded up).
    #[arg(long, default_value_t = 0)]
    pub batch_size: u32,
    /// Failed nodes that stop the rollout (0: server default, 1).
    #[arg(long, default_value_t = 0)]
    pub failure_threshold: u32,
    /// What a node offline at its turn does: `defer` (no slot, no failure; it applies
    /// the version when it is back) or `wait` (it holds its slot up to --offline-deadline).
    #[arg(long, value_enum, default_value_t = Offline::Defer)]
    pub offline: Offline,
    /// How long a node offline at its turn (--offline wait) or gone mid-apply is
    /// waited for before it counts as failed [server default: 10m].
    #[arg(long, value_parser = parse_duration)]
    pub offline_deadline: Option<Duration>,
    /// Nodes picked at random that go first; no other node starts until they all
    /// stayed committed for --canary-soak. A canary failure fails the rollout.
    #[arg(long, default_value_t = 0)]
    pub canary: u32,
    /// How long every canary must stay committed and healthy.
    #[arg(long, value_parser = parse_duration, default_value = DEFAULT_CANARY_SOAK_TEXT, requires = "canary")]
    pub canary_soak: Duration,
    /// Pause between batches: the next batch starts this long after the last one settled.
    #[arg(long, value_parser = parse_duration)]
    pub batch_interval: Option<Duration>,
    /// Start nodes even while every maintenance window of the cluster is closed
    /// (recorded in the event log with your admin credential).
    #[arg(long)]
    pub ignore_windows: bool,
    #[command(flatten)]
    pub drain: DrainArgs,
}

/// `rollout start`'s drain options: each node is cordoned and drained
/// through its tenant cluster's API before its turn, and must be Ready
/// after (the cluster needs a kubeconfig: `cluster set --kubeconfig`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DrainArgs {
    /// Drain each node before its turn and wait for it to be Ready after
    /// [default: the cluster's, `cluster set NAME --drain on|off`].
    #[arg(long, conflicts_with = "no_drain")]
    pub drain: bool,
    /// Do not drain, whatever the cluster's default.
    #[arg(long)]
    pub no_drain: bool,
    /// How long one node's drain may take before it is given up
    /// (drain-blocked) and its cordon lifted [default: 10m].
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub drain_timeout: Option<Duration>,
    /// How long after applying the Node must be Ready [default: 5m].
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub ready_timeout: Option<Duration>,
    /// Evict pods with hostPath volumes too (their data on the node stays
    /// behind).
    #[arg(long)]
    pub drain_delete_local_data: bool,
    /// A node whose drain timed out: `fail` (counted against
    /// --failure-threshold) or `skip` (reported, no failure).
    #[arg(long, value_enum, value_name = "fail|skip")]
    pub on_drain_timeout: Option<OnDrainTimeout>,
    /// The kubelet version the bundle installs, e.g. v1.37.2: the Ready
    /// gate also wants the Node to report it.
    #[arg(long, value_name = "VERSION")]
    pub kubelet_version: Option<String>,
}

impl DrainArgs {
    fn drain(&self) -> Option<bool> {
        match (self.drain, self.no_drain) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// A duration flag the wire carries in whole seconds, where 0 is "not
/// given": under a second is refused.
fn whole_secs(flag: &str, d: Option<Duration>) -> anyhow::Result<Option<Duration>> {
    match d {
        Some(d) if d.as_secs() == 0 => bail!("{flag} must be at least 1s"),
        d => Ok(d),
    }
}

impl TryFrom<&PolicyArgs> for Policy {
    type Error = anyhow::Error;

    /// The flags as a policy; the server checks it ([`Policy::validate`]).
    fn try_from(a: &PolicyArgs) -> anyhow::Result<Policy> {
        Ok(Policy {
            batch_size: (a.batch_size > 0).then_some(a.batch_size),
            failure_threshold: (a.failure_threshold > 0).then_some(a.failure_threshold),
            offline: Some(a.offline.into()),
            offline_deadline: whole_secs("--offline-deadline", a.offline_deadline)?,
            canary: a.canary,
            canary_soak: (a.canary > 0).then_some(a.canary_soak),
            batch_interval: a.batch_interval.filter(|d| d.as_secs() > 0),
            ignore_windows: a.ignore_windows,
            drain: DrainOptions {
                enabled: a.drain.drain(),
                timeout: whole_secs("--drain-timeout", a.drain.drain_timeout)?,
                ready_timeout: whole_secs("--ready-timeout", a.drain.ready_timeout)?,
                delete_local_data: a.drain.drain_delete_local_data,
                on_timeout: a.drain.on_drain_timeout.map(Into::into),
                kubelet_version: a.drain.kubelet_version.clone(),
            },
        })
    }
}

/// Checks what `rollout start` can check before dialling.
pub fn check_start(cluster: &str, bundle: &str, selector: &str) -> anyhow::Result<()> {
    validate_cluster_name(cluster).context("--cluster")?;
    parse_bundle_ref(bundle).context("--bundle")?;
    labels("--selector", selector).map(|_| ())
}

/// `rollout start` (the CLI and the console): checks, then starts.
/// Starts a rollout; the rollout as it started and the server's warnings
/// about it (one line each, e.g. a kubelet version far behind the tenant
/// API server's), which the caller shows.
pub async fn start(c: &mut Client, url: &str, s: &Start<'_>) -> anyhow::Result<(pb::Rollout, Vec<String>)> {
    check_start(s.cluster, s.bundle, s.selector)?;
    let (name, version) = parse_bundle_ref(s.bundle).context("--bundle")?;
    c.start_rollout(pb::StartRolloutRequest {
        cluster: s.cluster.to_string(),
        bundle: name,
        version,
        selector: labels("--selector", s.selector)?.into_iter().collect(),
        request_id: s.request_id.to_string(),
        ..s.policy.to_request()
    })
    .await
    .map_err(|e| status(url, e))
    .with_context(|| format!("start rollout of {} on cluster {}", s.bundle, s.cluster))
    .map(|r| {
        let warnings = r
            .metadata()
            .get_all(lks_proto::wire::WARNING_METADATA)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        (r.into_inner(), warnings)
    })
}

/// `rollout start --dry-run`: the nodes the selector matches, in the order a
/// rollout starts them (name order), those that would fail at their turn
/// first — by the rule the rollout controller applies
/// ([`lks_proto::manifest::Needs::node_refusal`]). Nothing is started.
pub async fn dry_run_plan(
    c: &mut Client,
    url: &str,
    cluster: &str,
    bundle: &str,
    selector: &str,
) -> anyhow::Result<serde_json::Value> {
    check_start(cluster, bundle, selector)?;
    let sel = labels("--selector", selector)?;
    let b = crate::bundle::get(c, url, bundle).await?;
    let manifest = b
        .bundle
        .and_then(|sb| lks_proto::SignedBundle::try_from(sb).ok())
        .map(|sb| sb.manifest)
        .ok_or_else(|| anyhow!("bundle {bundle}: the server sent no valid manifest"))?;
    let needs = lks_proto::manifest::Needs::of(&manifest);
    let mut nodes = c
        .list_nodes(pb::ListNodesRequest {
            cluster: cluster.to_string(),
        })
        .await
        .map_err(|e| status(url, e))
        .context("list nodes")?
        .into_inner()
        .nodes;
    nodes.retain(|n| {
        let l: lks_proto::labels::Labels = n.labels.clone().into_iter().collect();
        lks_proto::labels::selector_matches(&sel, &l)
    });
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let rows: Vec<(Option<String>, serde_json::Value)> = nodes
        .iter()
        .map(|n| {
            // A node that never connected is judged when it first does,
            // as the rollout does.
            let refusal = n.facts.as_ref().and_then(|f| {
                let arch = lks_proto::arch::Arch::parse(&f.architecture).ok();
                needs.node_refusal(&f.features, arch)
            });
            let outcome = if refusal.is_some() {
                "fails"
            } else if n.held {
                "held"
            } else if !n.connected {
                "deferred"
            } else {
                "starts"
            };
            let v = serde_json::json!({
                "name": n.name,
                "architecture": output::node_arch(n),
                "connected": n.connected,
                "outcome": outcome,
                "reason": refusal,
            });
            (refusal, v)
        })
        .collect();
    let (fail, ok): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(r, _)| r.is_some());
    Ok(serde_json::json!({
        "dry_run": true,
        "cluster": cluster,
        "bundle": bundle,
        "architectures": manifest.arches().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "total": fail.len() + ok.len(),
        "fails": fail.len(),
        "nodes": fail.into_iter().chain(ok).map(|(_, v)| v).collect::<Vec<_>>(),
    }))
}

pub fn dry_run_text(plan: &serde_json::Value) -> String {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let arches: Vec<String> = plan["architectures"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let mut out = format!(
        "dry run: {} on cluster {} ({}): {} node(s), {} would fail at their turn; nothing started\n",
        s(&plan["bundle"]),
        s(&plan["cluster"]),
        output::arches_text(&arches),
        plan["total"],
        plan["fails"],
    );
    let rows: Vec<Vec<String>> = plan["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    vec![
                        s(&n["name"]),
                        s(&n["architecture"]),
                        s(&n["outcome"]),
                        n["reason"].as_str().unwrap_or("").to_string(),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&output::table(&["NODE", "ARCH", "OUTCOME", "REASON"], &rows));
    out
}

/// The operator verbs on a rollout (and on a plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Pause,
    Resume,
    Abort,
    Rollback,
}

impl Verb {
    /// As the console's URLs name it.
    pub fn parse(s: &str) -> Option<Verb> {
        Some(match s {
            "pause" => Verb::Pause,
            "resume" => Verb::Resume,
            "abort" => Verb::Abort,
            "rollback" => Verb::Rollback,
            _ => return None,
        })
    }

    /// As an error's context says it ("roll back rollout …").
    pub fn words(self) -> &'static str {
        match self {
            Verb::Pause => "pause",
            Verb::Resume => "resume",
            Verb::Abort => "abort",
            Verb::Rollback => "roll back",
        }
    }
}

/// `rollout pause|resume|abort|rollback ID` (the CLI and the console).
pub async fn act(c: &mut Client, url: &str, verb: Verb, id: &str) -> anyhow::Result<pb::Rollout> {
    let r = pb::RolloutRef { id: id.to_string() };
    let r = match verb {
        Verb::Pause => c.pause_rollout(r).await,
        Verb::Resume => c.resume_rollout(r).await,
        Verb::Abort => c.abort_rollout(r).await,
        Verb::Rollback => c.rollback_rollout(r).await,
    };
    r.map_err(|s| status(url, s))
        .with_context(|| format!("{} rollout {id}", verb.words()))
        .map(tonic::Response::into_inner)
}

/// How `--wait` and `--watch` show progress.
enum Progress {
    /// One line on stdout per change (not a terminal, or `status --watch`).
    Lines,
    /// A bar on stderr (a terminal).
    Bar(indicatif::ProgressBar),
    Quiet,
}

impl Progress {
    fn bar() -> Self {
        let style = indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        let bar = indicatif::ProgressBar::new(0).with_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress::Bar(bar)
    }

    fn show(&self, r: &pb::Rollout) {
        match self {
            Progress::Lines => outln!("{}", output::rollout_line(r)),
            Progress::Bar(b) => {
                b.set_length(u64::from(r.total));
                b.set_position(u64::from(r.updated + r.failed));
                b.set_message(output::rollout_progress(r));
            }
            Progress::Quiet => {}
        }
    }

    fn finish(&self) {
        if let Progress::Bar(b) = self {
            b.finish();
        }
    }
}

/// Follows a rollout until it ends and returns its final state.
async fn watch(c: &mut Client, url: &str, id: &str, progress: Progress) -> anyhow::Result<pb::Rollout> {
    let mut stream = c
        .watch_rollout(pb::RolloutRef { id: id.to_string() })
        .await
        .map_err(|s| status(url, s))
        .with_context(|| format!("watch rollout {id}"))?
        .into_inner();
    let mut last = None;
    while let Some(r) = stream.next().await {
        let r = match r {
            Ok(r) => r,
            Err(s) => {
                progress.finish();
                return Err(status(url, s)).with_context(|| format!("watch rollout {id}"));
            }
        };
        progress.show(&r);
        last = Some(r);
    }
    progress.finish();
    let last = last.ok_or_else(|| anyhow!("watch rollout {id}: the server sent nothing"))?;
    if !is_terminal_state(last.state) {
        bail!(
            "watch rollout {id}: the stream ended while the rollout was still {}",
            output::rollout_state_str(last.state)
        );
    }
    Ok(last)
}

fn is_terminal_state(s: i32) -> bool {
    matches!(
        RolloutState::try_from(s),
        Ok(RolloutState::Completed | RolloutState::Failed | RolloutState::Aborted | RolloutState::RolledBack)
    )
}

fn ended_ok(r: &pb::Rollout) -> anyhow::Result<()> {
    if r.state == RolloutState::Completed as i32 {
        return Ok(());
    }
    let why = if r.message.is_empty() {
        String::new()
    } else {
        format!(": {}", r.message)
    };
    bail!(
        "rollout {} ended {} ({}/{} updated, {} failed){why}",
        r.id,
        output::rollout_state_str(r.state),
        r.updated,
        r.total,
        r.failed
    )
}

#[cfg(test)]
mod tests;
