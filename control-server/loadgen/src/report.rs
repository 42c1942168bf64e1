//! What a run measured: latency summaries, the report printed as JSON
//! (`--json`) or as text.

/// Latencies in milliseconds, summarised.
#[derive(serde::Serialize, Default)]
pub(crate) struct Summary {
    pub(crate) count: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

pub(crate) fn summarise(mut v: Vec<f64>) -> Summary {
    if v.is_empty() {
        return Summary::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Summary {
        count: v.len(),
        p50_ms: at(0.5),
        p90_ms: at(0.9),
        p99_ms: at(0.99),
        max_ms: v[v.len() - 1],
    }
}

#[derive(serde::Serialize)]
pub(crate) struct Report {
    pub(crate) mode: &'static str,
    pub(crate) agents: usize,
    pub(crate) enrol_seconds: f64,
    pub(crate) enrol_per_second: f64,
    pub(crate) enrol: Summary,
    /// Enrolments refused with "try again" and retried.
    pub(crate) enrol_retries: u64,
    pub(crate) connect_seconds: f64,
    /// Connection start → first desired state (baseline: first Watch message).
    pub(crate) first_message: Summary,
    pub(crate) rollout_seconds: Option<f64>,
    /// The first admin call that starts the rollouts (the first
    /// `StartRollout`, or with `--plan` the `CreatePlan`) → the last
    /// cluster's rollout stored (its `created_at`, the server's clock).
    pub(crate) rollouts_started_seconds: Option<f64>,
    /// Rollout start → agent holds the new desired state.
    pub(crate) fanout: Option<Summary>,
    pub(crate) errors: usize,
    /// Agents sent a bundle version in more than one desired-state
    /// generation (assigned twice): 0 unless the server repeats itself.
    pub(crate) assigned_twice: usize,
    /// unauthenticated + permission_denied over the whole run: must be 0.
    pub(crate) auth_errors: u64,
    /// Before any storm or kill: connection attempts that failed (each
    /// also counted in `errors`) and streams that were up and ended, by
    /// class.
    pub(crate) failed_attempts: std::collections::BTreeMap<&'static str, u64>,
    pub(crate) dropped_streams: std::collections::BTreeMap<&'static str, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) storm: Option<StormReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failover: Option<FailoverReport>,
}

/// What killing processes mid-rollout did.
#[derive(serde::Serialize, Default)]
pub(crate) struct FailoverReport {
    /// Empty in a process told of the kill by SIGUSR1.
    pub(crate) killed_pids: Vec<i32>,
    /// Rollout start → the kill (the process that killed).
    pub(crate) killed_after_seconds: Option<f64>,
    /// Its agents that had the new desired state at the kill.
    pub(crate) had_it_at_kill: Option<usize>,
    /// Agents with a stream up, per server of --servers, just before the
    /// kill and when the run ended.
    pub(crate) held_before: Vec<i64>,
    pub(crate) held_after: Vec<i64>,
    /// Agents between servers at the kill: a replica had asked them to
    /// move and they were not up on the next one yet (held by nobody).
    pub(crate) moving_at_kill: i64,
    /// Agents whose stream ended after the kill, not because a replica
    /// asked them to move, and that connected again.
    pub(crate) reconnected: usize,
    /// Kill → the last of them had its desired state again (None: not all
    /// were back within --rollout-timeout).
    pub(crate) all_back_seconds: Option<f64>,
    pub(crate) back_after: Summary,
    /// Kill → the rollout was no longer running.
    pub(crate) rollout_done_after_kill_seconds: Option<f64>,
    /// Streams ended and connection attempts failed after the kill, by class.
    pub(crate) dropped: std::collections::BTreeMap<&'static str, u64>,
    pub(crate) errors: std::collections::BTreeMap<&'static str, u64>,
    /// unauthenticated + permission_denied after the kill: must be 0.
    pub(crate) auth_errors: u64,
    /// Agents a replica asked to move (rebalance) after the kill.
    pub(crate) moved_by_server: u64,
    /// Admin calls (rollout status) that failed and went to the next server.
    pub(crate) admin_retries: u64,
}

/// What a server restart under N connected agents did.
#[derive(serde::Serialize)]
pub(crate) struct StormReport {
    pub(crate) signal: &'static str,
    /// Signal → the old server exited (its graceful shutdown, if SIGTERM).
    pub(crate) exit_seconds: f64,
    /// Signal → the first agent had its desired state again.
    pub(crate) first_back_seconds: Option<f64>,
    /// Signal → every agent had its desired state again (None: not all
    /// came back within --storm-timeout).
    pub(crate) all_back_seconds: Option<f64>,
    /// Agents back.
    pub(crate) back: usize,
    /// Per agent: signal → desired state on a new stream.
    pub(crate) back_after: Summary,
    /// Per agent: connection attempts until back (1: the first one held).
    pub(crate) attempts_p50: u32,
    pub(crate) attempts_p99: u32,
    pub(crate) attempts_max: u32,
    /// Streams ended by the restart, by class.
    pub(crate) dropped: std::collections::BTreeMap<&'static str, u64>,
    /// Reconnection attempts that failed, by class.
    pub(crate) errors: std::collections::BTreeMap<&'static str, u64>,
    /// unauthenticated + permission_denied, dropped or failed: must be 0.
    pub(crate) auth_errors: u64,
    /// Refusals that carried a retry hint (each waited at least that long).
    pub(crate) retry_hints: u64,
    /// unavailable / resource_exhausted refusals without a hint.
    pub(crate) refusals_without_hint: u64,
    pub(crate) max_retry_hint_ms: u64,
}

pub(crate) fn print_text(r: &Report) {
    let s = |x: &Summary| {
        format!(
            "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
            x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, x.count
        )
    };
    println!("mode:            {}", r.mode);
    println!("agents:          {}", r.agents);
    if r.mode == "control-server" {
        println!(
            "enrolment:       {:.2} s, {:.0}/s; {} ({} retried)",
            r.enrol_seconds,
            r.enrol_per_second,
            s(&r.enrol),
            r.enrol_retries
        );
    }
    println!("connect (all):   {:.2} s", r.connect_seconds);
    println!("first message:   {}", s(&r.first_message));
    if let (Some(t), Some(f)) = (r.rollout_seconds, &r.fanout) {
        println!("rollout:         completed in {t:.2} s; fan-out {}", s(f));
    }
    if let Some(t) = r.rollouts_started_seconds {
        println!("rollouts started: the last {t:.2} s after the first admin call");
    }
    println!(
        "errors:          {}; auth errors {}; assigned twice {}",
        r.errors, r.auth_errors, r.assigned_twice
    );
    if let Some(st) = &r.storm {
        let all = st.all_back_seconds.map_or_else(
            || format!("NOT all back ({}/{})", st.back, r.agents),
            |t| format!("{t:.2} s"),
        );
        println!(
            "storm:           {} → exited in {:.2} s; all back {all}",
            st.signal, st.exit_seconds
        );
        println!("back after:      {}", s(&st.back_after));
        println!(
            "attempts:        p50 {}, p99 {}, max {}",
            st.attempts_p50, st.attempts_p99, st.attempts_max
        );
        println!("streams dropped: {:?}", st.dropped);
        println!("failed attempts: {:?}", st.errors);
        println!(
            "auth errors:     {}; retry hints {} (max {} ms), refusals without a hint {}",
            st.auth_errors, st.retry_hints, st.max_retry_hint_ms, st.refusals_without_hint
        );
    }
    if let Some(f) = &r.failover {
        let all = f.all_back_seconds.map_or_else(
            || "NOT all back".to_string(),
            |t| format!("all back {t:.2} s after the kill"),
        );
        let when = match (f.killed_after_seconds, f.had_it_at_kill) {
            (Some(t), Some(had)) => format!(
                "killed {:?} {t:.2} s into the rollout ({had} agents had it)",
                f.killed_pids
            ),
            _ => "told of a kill (SIGUSR1)".to_string(),
        };
        println!("failover:        {when}; {} reconnected, {all}", f.reconnected);
        println!(
            "held per server: {:?} before, {:?} after",
            f.held_before, f.held_after
        );
        println!("back after:      {}", s(&f.back_after));
        println!(
            "rollout done:    {} after the kill",
            f.rollout_done_after_kill_seconds
                .map_or_else(|| "not".to_string(), |t| format!("{t:.2} s"))
        );
        println!("streams dropped: {:?}", f.dropped);
        println!("failed attempts: {:?}", f.errors);
        println!(
            "auth errors:     {}; moved by a replica {}; admin calls retried {}",
            f.auth_errors, f.moved_by_server, f.admin_retries
        );
    }
}

/// unauthenticated + permission_denied in these counts.
pub fn auth(m: &std::collections::BTreeMap<&str, u64>) -> u64 {
    m.get("unauthenticated").copied().unwrap_or(0) + m.get("permission_denied").copied().unwrap_or(0)
}
