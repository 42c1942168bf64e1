//! Unit tests of the rollout rules, one file per phase; the helpers that
//! drive a rollout the way the controller and the store do are here.

use lks_proto::BundleState;
use lks_proto::windows;
use lks_store::{BundleStatusRow, NodeState, OfflinePolicy, RolloutNodeRow, RolloutPolicy, TargetChange};

use super::*;

mod batch;
mod canary;
mod drain;
mod policy;
mod props;
mod reboot;
mod settle;
mod verbs;
mod window;

const V: &str = "2";

fn rollout(nodes: &[&str], batch: u32, threshold: u32) -> RolloutRow {
    RolloutRow {
        id: "r".into(),
        cluster: "c".into(),
        bundle: "k".into(),
        version: V.into(),
        selector: Default::default(),
        batch_size: batch,
        failure_threshold: threshold,
        offline_deadline_ms: 10_000,
        state: RolloutState::Running,
        nodes: nodes.iter().map(|n| RolloutNodeRow::waiting(n, "1")).collect(),
        created_at_ms: 0,
        updated_at_ms: 0,
        message: String::new(),
        revision: 0,
        previous_target: None,
        policy: RolloutPolicy::legacy(),
        pacing: Default::default(),
    }
}

fn online(desired: &str) -> NodeView {
    NodeView {
        desired: Some(desired.into()),
        actual: Some(report(desired, BundleState::Applied, 1)),
        connected: true,
        last_seen_ms: 0,
        held: false,
        claimed_by: None,
        unsupported: None,
        kube: None,
    }
}

fn report(version: &str, state: BundleState, generation: u64) -> BundleStatusRow {
    BundleStatusRow {
        fetched_from_server: 0,
        fetched_from_peers: 0,
        fetched_as_delta: 0,
        name: "k".into(),
        version: version.into(),
        state,
        message: if state == BundleState::Applied {
            String::new()
        } else {
            "boom".into()
        },
        updated_at_ms: 0,
        generation,
    }
}

fn views(nodes: &[&str]) -> BTreeMap<String, NodeView> {
    nodes.iter().map(|n| (n.to_string(), online("1"))).collect()
}

fn at(ms: i64) -> Clock {
    Clock {
        now_ms: ms,
        since_ms: 0,
        windows: Vec::new(),
        windows_unreadable: false,
    }
}

/// Stores the decision the way the store does: assigned nodes get a
/// generation, desired states follow.
fn commit(d: Decision, v: &mut BTreeMap<String, NodeView>, generation: &mut u64) -> RolloutRow {
    let mut r = d.rollout;
    for (node, version) in d.assign {
        *generation += 1;
        if let Some(n) = r.nodes.iter_mut().find(|n| n.name == node) {
            n.generation = *generation;
        }
        if let Some(view) = v.get_mut(&node) {
            view.desired = version;
        }
    }
    r.revision += 1;
    r
}

fn states(r: &RolloutRow) -> Vec<&'static str> {
    r.nodes.iter().map(|n| n.state.as_str()).collect()
}

fn reply(v: &mut BTreeMap<String, NodeView>, r: &RolloutRow, node: &str, version: &str, state: BundleState) {
    let g = r.nodes.iter().find(|n| n.name == node).unwrap().generation;
    v.get_mut(node).unwrap().actual = Some(report(version, state, g));
}

fn deferring(nodes: &[&str], batch: u32, threshold: u32) -> RolloutRow {
    let mut r = rollout(nodes, batch, threshold);
    r.policy = RolloutPolicy::default();
    r
}

fn offline(v: &mut BTreeMap<String, NodeView>, node: &str) {
    v.get_mut(node).unwrap().connected = false;
}

/// Replies "applied" for every applying node and steps, until the
/// rollout stops changing; returns it.
fn settle(mut r: RolloutRow, v: &mut BTreeMap<String, NodeView>, g: &mut u64, clock: &Clock) -> RolloutRow {
    for _ in 0..50 {
        for n in r.nodes.clone().iter().filter(|n| n.state == NodeState::Applying) {
            if v[&n.name].connected {
                reply(v, &r, &n.name, V, BundleState::Applied);
            }
        }
        match step(&r, v, clock.clone()) {
            Some(d) => r = commit(d, v, g),
            None => return r,
        }
    }
    panic!("the rollout never settled: {r:?}");
}

/// A deferring rollout of `nodes` started at t=1 and settled (every
/// reachable node replies "applied").
fn run_deferring(nodes: &[&str], batch: u32, v: &mut BTreeMap<String, NodeView>, g: &mut u64) -> RolloutRow {
    let r = commit(step(&deferring(nodes, batch, 1), v, at(1)).unwrap(), v, g);
    settle(r, v, g, &at(1))
}

fn windowed(ms: i64, specs: &[&str]) -> Clock {
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    Clock {
        now_ms: ms,
        since_ms: 0,
        windows: windows::parse_all(&specs).unwrap(),
        windows_unreadable: false,
    }
}

fn ms(rfc3339: &str) -> i64 {
    rfc3339.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

fn canaried(nodes: &[&str], batch: u32, canary: u32, soak_ms: u64) -> RolloutRow {
    let mut r = deferring(nodes, batch, 5);
    r.policy.canary = canary;
    r.policy.canary_soak_ms = soak_ms;
    r.policy.canary_seed = 42;
    r
}
