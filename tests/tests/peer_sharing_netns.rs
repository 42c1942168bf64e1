//! Peer sharing in one tenant network (issue 28 item 5): 16 nodes on one
//! bridge behind a router whose link into the network is capped, the
//! server on the other side. A 64 MiB file rolled out to all of them at
//! once crosses the link at most twice: counted by the server's own
//! `lks_blob_bytes_served_total` and by the router's counters. Nodes find
//! each other at the addresses they report and the cluster's peer port
//! (no `--peer-listen`), as on real VMs.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::netns::Net;
use lks_e2e::{noise, wait_until};

const FILE: &str = "/usr/local/bin/kubelet";
/// What the server sent (not what nodes took from peers).
const SERVED: &str = "lks_blob_bytes_served_total{source=\"server\"}";
const SIZE: usize = 64 << 20;
const NODES: usize = 16;

#[test]
fn sixteen_nodes_behind_a_capped_link_take_the_file_through_it_at_most_twice() {
    let Some(r) = roll_out_to_tenant(NODES, true, "200mbit", SIZE, 1) else {
        return;
    };
    println!(
        "SWARM nodes={NODES} file={SIZE} server_egress={} link_bytes={} agents_from_server={} agents_from_peers={}",
        r.served, r.link, r.from_server, r.from_peers
    );
    assert_eq!(r.from_server + r.from_peers, (NODES * SIZE) as u64);
    // Nobody had it: one copy at least comes from the server.
    assert!(
        (SIZE as u64..=2 * SIZE as u64).contains(&r.served),
        "the server sent {} bytes",
        r.served
    );
    // TLS, HTTP/2 and TCP/IP framing on top of the bytes: a few percent.
    assert!(
        r.link <= 2 * SIZE as u64 * 21 / 20,
        "the link carried {} bytes",
        r.link
    );
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`; idle and
/// iowait are not busy).
fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let total: f64 = f.iter().take(8).sum();
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// User and system CPU seconds a process has used (`/proc/PID/stat`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime, in USER_HZ ticks (100 a second on Linux).
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// One rollout of a `size`-byte file to `n` nodes of one tenant network
/// behind a link capped at `rate`, sharing on or off; every node is checked
/// to hold the exact bytes.
struct Run {
    secs: f64,
    /// What the server sent (its own counter).
    served: u64,
    /// What the router sent into the network.
    link: u64,
    /// What the agents took from the server and from peers (their logs).
    from_server: u64,
    from_peers: u64,
    agent_cpu: f64,
    /// What the server(s) and etcd used meanwhile.
    control_cpu: f64,
    /// The share of the machine's CPU time that was busy meanwhile (all
    /// processes and the kernel; iowait counts as idle).
    busy: f64,
}

/// `None`: namespaces cannot be made and `LKS_SKIP_NETNS=1` says to skip.
/// `rate` `none`: the link is not capped. `replicas` > 1: that many
/// replicas on an etcd in the server namespace, each agent dialling them
/// in its own order.
fn roll_out_to_tenant(n: usize, on: bool, rate: &str, size: usize, replicas: usize) -> Option<Run> {
    let net = Net::tenant_lan(n)?;
    let etcd = (replicas > 1).then(|| net.etcd());
    let servers: Vec<lks_e2e::server::Server> = match &etcd {
        None => vec![net.server(&[])],
        Some(e) => (0..replicas).map(|k| net.replica(k as u16, e, &[])).collect(),
    };
    let s = &servers[0];
    s.create_cluster("c1");
    let urls: Vec<String> = servers.iter().map(lks_e2e::server::Server::url).collect();
    let tok = s.lksctl_json(&["token", "create", "--cluster", "c1", "--uses", &n.to_string()]);
    let mut agents = Vec::new();
    for i in 1..=n {
        let mut a = net.agent(i, &format!("n{i}"));
        a.join_spread(&urls, i, &tok);
        a.start();
        agents.push(a);
    }
    if on {
        s.lksctl_ok(&["cluster", "set", "c1", "--peer-sharing", "on"]);
        for a in &agents {
            wait_until(Duration::from_secs(60), "peer listener up", || {
                a.log().contains("peer sharing on")
            });
        }
    }
    for a in &agents {
        wait_until(Duration::from_secs(60), "connected", || {
            a.log().contains("desired state received")
        });
    }
    if rate != "none" {
        net.limit_lan(rate);
    }
    let bytes = noise(size, 23);
    let id = s.publish(&s.write_bundle("kubelet-1", "kubelet", "1", &[(FILE, &bytes, "0755")]));
    let cpu0: f64 = agents.iter().filter_map(|a| a.pid()).map(cpu_seconds).sum();
    let control_pids: Vec<u32> = servers
        .iter()
        .map(lks_e2e::server::Server::pid)
        .chain(etcd.iter().map(lks_e2e::etcd::Etcd::pid))
        .filter(|&p| p != 0)
        .collect();
    let control_cpu = || control_pids.iter().copied().map(cpu_seconds).sum::<f64>();
    let control0 = control_cpu();
    let served_now = || servers.iter().map(|x| x.metric(SERVED)).sum::<u64>();
    let (served0, link0) = (served_now(), net.lan_tx_bytes());
    // What earlier rollouts left dirty is written back first, so that it
    // does not weigh on this one.
    let _ = std::process::Command::new("sync").status();
    let ticks0 = machine_ticks();
    let t = std::time::Instant::now();
    let batch = n.to_string();
    s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        &id,
        "--batch-size",
        &batch,
        "--wait",
    ]);
    let secs = t.elapsed().as_secs_f64();
    let agent_cpu: f64 = agents
        .iter()
        .filter_map(|a| a.pid())
        .map(cpu_seconds)
        .sum::<f64>()
        - cpu0;
    let control_cpu = control_cpu() - control0;
    let ticks = machine_ticks();
    let busy = (ticks.0 - ticks0.0) / (ticks.1 - ticks0.1).max(1.0);
    let served = served_now() - served0;
    let link = net.lan_tx_bytes() - link0;
    let (mut from_server, mut from_peers) = (0, 0);
    for a in &agents {
        a.wait_bundle("kubelet", "1", "applied");
        let got = std::fs::read(a.root.join(FILE.trim_start_matches('/'))).unwrap();
        assert!(
            got == bytes,
            "{}: the file differs from what was published",
            a.name
        );
        if std::env::var_os("SWARM_DEBUG").is_some() {
            for l in a.log().lines().filter(|l| {
                l.contains("desired state received")
                    || l.contains("blob fetched")
                    || l.contains("peer sharing:")
                    || l.contains("serving a piece")
                    || l.contains("copied into the cache")
                    || l.contains("kind=\"applied\"")
            }) {
                eprintln!("{} {l}", a.name);
            }
        }
        let (x, y) = a.fetched_bytes();
        (from_server, from_peers) = (from_server + x, from_peers + y);
    }
    drop(agents);
    drop(servers);
    drop(etcd);
    net.close();
    Some(Run {
        secs,
        served,
        link,
        from_server,
        from_peers,
        agent_cpu,
        control_cpu,
        busy,
    })
}

/// `bash scripts/bench.sh --only swarm` (BENCHMARKS.md, "Peer sharing"):
/// N = `SWARM_NODES` (default 8 16 32 64) nodes, the link capped at each
/// of `SWARM_RATE` (200mbit; `none`: not capped), one server or each of
/// `SWARM_REPLICAS` (1) replicas on etcd, a `SWARM_MIB` (64) MiB file;
/// sharing off (unless `SWARM_OFF=0`) and on (unless `SWARM_ON=0`), each
/// pair `SWARM_RUNS` (1) times with the median of on ÷ off, and one node
/// alone as the baseline of each link. Binaries from `LKS_BIN_DIR`.
#[test]
#[ignore = "benchmark: bash scripts/bench.sh --only swarm"]
fn swarm_bench() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let list =
        |k: &str, d: &str| -> Vec<String> { env(k, d).split_whitespace().map(str::to_string).collect() };
    let nodes: Vec<usize> = list("SWARM_NODES", "8 16 32 64")
        .iter()
        .map(|x| x.parse().expect("SWARM_NODES"))
        .collect();
    let replicas: Vec<usize> = list("SWARM_REPLICAS", "1")
        .iter()
        .map(|x| x.parse().expect("SWARM_REPLICAS"))
        .collect();
    let mib: usize = env("SWARM_MIB", "64").parse().expect("SWARM_MIB");
    let size = mib << 20;
    // SWARM_OFF=0 skips the runs without sharing (N copies through a slow
    // link take long).
    let with_off = env("SWARM_OFF", "1") != "0";
    // SWARM_ON=0 skips those with sharing (a profile of sharing off alone).
    let with_on = env("SWARM_ON", "1") != "0";
    // SWARM_RUNS: each pair of rollouts this many times, and the median
    // of on ÷ off.
    let runs: usize = env("SWARM_RUNS", "1").parse().expect("SWARM_RUNS");
    println!(
        "| link | replicas | nodes | sharing | rollout s | × one node alone | on ÷ off | server egress MiB | × file | link MiB | from peers MiB | agents' CPU s | control plane CPU s | machine busy % |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib_of = |b: u64| b as f64 / (1 << 20) as f64;
    for rate in list("SWARM_RATE", "200mbit") {
        let alone = roll_out_to_tenant(1, false, &rate, size, 1).expect("network namespaces");
        let row = |reps: usize, n: usize, name: &str, r: &Run, ratio: &str| {
            println!(
                "| {rate} | {reps} | {n} | {name} | {:.1} | {:.2} | {ratio} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} |",
                r.secs,
                r.secs / alone.secs,
                mib_of(r.served),
                r.served as f64 / size as f64,
                mib_of(r.link),
                mib_of(r.from_peers),
                r.agent_cpu,
                r.control_cpu,
                r.busy * 100.0,
            );
        };
        row(1, 1, "off", &alone, "-");
        for &reps in &replicas {
            for &n in &nodes {
                // Off and on take turns, so that a change in the machine
                // meanwhile weighs on both.
                let mut ratios = Vec::new();
                for _ in 0..runs {
                    let off = with_off.then(|| {
                        roll_out_to_tenant(n, false, &rate, size, reps).expect("network namespaces")
                    });
                    let on = with_on
                        .then(|| roll_out_to_tenant(n, true, &rate, size, reps).expect("network namespaces"));
                    if let Some(off) = &off {
                        row(reps, n, "off", off, "-");
                    }
                    if let Some(on) = &on {
                        let ratio = off.as_ref().map(|off| on.secs / off.secs);
                        ratios.extend(ratio);
                        row(
                            reps,
                            n,
                            "on",
                            on,
                            &ratio.map_or("-".into(), |r| format!("{r:.2}")),
                        );
                    }
                }
                if ratios.len() > 1 {
                    ratios.sort_by(f64::total_cmp);
                    println!(
                        "| {rate} | {reps} | {n} | median of {runs} | | | **{:.2}** | | | | | | | |",
                        ratios[ratios.len() / 2]
                    );
                }
            }
        }
    }
}
