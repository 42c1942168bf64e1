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
    let Some(r) = roll_out_to_tenant(NODES, true, "200mbit", SIZE) else {
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
}

/// `None`: namespaces cannot be made and `LKS_SKIP_NETNS=1` says to skip.
fn roll_out_to_tenant(n: usize, on: bool, rate: &str, size: usize) -> Option<Run> {
    let net = Net::tenant_lan(n)?;
    let s = net.server(&[]);
    s.create_cluster("c1");
    let mut agents = Vec::new();
    for i in 1..=n {
        let mut a = net.agent(i, &format!("n{i}"));
        a.join(&s, "c1", &[]);
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
    net.limit_lan(rate);
    let bytes = noise(size, 23);
    let id = s.publish(&s.write_bundle("kubelet-1", "kubelet", "1", &[(FILE, &bytes, "0755")]));
    let cpu0: f64 = agents.iter().filter_map(|a| a.pid()).map(cpu_seconds).sum();
    let (served0, link0) = (s.metric(SERVED), net.lan_tx_bytes());
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
    let served = s.metric(SERVED) - served0;
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
        let (x, y) = a.fetched_bytes();
        (from_server, from_peers) = (from_server + x, from_peers + y);
    }
    drop(agents);
    drop(s);
    net.close();
    Some(Run {
        secs,
        served,
        link,
        from_server,
        from_peers,
        agent_cpu,
    })
}

/// `bash scripts/bench.sh --only swarm` (BENCHMARKS.md, "Peer sharing"):
/// N = `SWARM_NODES` (default 8 16 32 64) nodes, the link capped at
/// `SWARM_RATE` (200mbit), a `SWARM_MIB` (64) MiB file; sharing off (unless
/// `SWARM_OFF=0`) and on, and one node alone as the baseline. Binaries from
/// `LKS_BIN_DIR`.
#[test]
#[ignore = "benchmark: bash scripts/bench.sh --only swarm"]
fn swarm_bench() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let nodes: Vec<usize> = env("SWARM_NODES", "8 16 32 64")
        .split_whitespace()
        .map(|x| x.parse().expect("SWARM_NODES"))
        .collect();
    let rate = env("SWARM_RATE", "200mbit");
    let mib: usize = env("SWARM_MIB", "64").parse().expect("SWARM_MIB");
    let size = mib << 20;
    let alone = roll_out_to_tenant(1, false, &rate, size).expect("network namespaces");
    println!(
        "| nodes | sharing | rollout s | × one node alone | server egress MiB | × file | link MiB | from peers MiB | agents' CPU s | serving CPU s per {mib} MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mib_of = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "| 1 | off | {:.1} | 1.0 | {:.0} | {:.2} | {:.0} | 0 | {:.1} | - |",
        alone.secs,
        mib_of(alone.served),
        alone.served as f64 / size as f64,
        mib_of(alone.link),
        alone.agent_cpu
    );
    // SWARM_OFF=0 skips the runs without sharing (N copies through a slow
    // link take long).
    let with_off = env("SWARM_OFF", "1") != "0";
    for n in nodes {
        let off = with_off.then(|| roll_out_to_tenant(n, false, &rate, size).expect("network namespaces"));
        let on = roll_out_to_tenant(n, true, &rate, size).expect("network namespaces");
        for (name, r) in [("off", off.as_ref()), ("on", Some(&on))] {
            let Some(r) = r else { continue };
            // What serving costs: the CPU sharing adds over fetching from
            // the server, per file's worth of bytes served to peers.
            let serving = match (&off, name) {
                (Some(off), "on") if r.from_peers > 0 => format!(
                    "{:.2}",
                    (on.agent_cpu - off.agent_cpu).max(0.0) / (r.from_peers as f64 / size as f64)
                ),
                _ => "-".into(),
            };
            println!(
                "| {n} | {name} | {:.1} | {:.1} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} | {serving} |",
                r.secs,
                r.secs / alone.secs,
                mib_of(r.served),
                r.served as f64 / size as f64,
                mib_of(r.link),
                mib_of(r.from_peers),
                r.agent_cpu,
            );
        }
    }
}
