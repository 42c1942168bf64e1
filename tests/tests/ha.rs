//! Several control-server replicas on one etcd (DESIGN §8): a throwaway etcd
//! on loopback, replicas with separate data dirs, real agents that join with
//! every replica's URL, real lksctl against any replica.
//!
//! - The kill test: publish through one replica, start a batched rollout
//!   through another, kill -9 the leader and the publisher mid-rollout; the
//!   survivor finishes it, every agent reconnects to it and every file
//!   arrives, and no node is started twice.
//! - Two replicas race for the last use of a token: exactly one node enrols.
//! - etcd killed and restarted under load: streams stay up, writes fail
//!   with `unavailable`, and the replicas recover without a restart.
//! - A replica killed hard: its node shows disconnected within the lease
//!   TTL and keeps the last-seen time the dead replica last wrote.
//! - A replica that stops and comes back empty gets its share of 24
//!   agents back from the others, who ask a few at a time to move to it.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::server::{Server, enroll_raw, make_csr};
use lks_e2e::wait_until;

/// Short leases keep the test quick; the logic is the same at 10 s.
const LEASE: &str = "3s";

fn replica(etcd: &Etcd, prefix: &str) -> Server {
    etcd.replica(prefix, &[])
}

fn is_leader(s: &Server) -> bool {
    s.log().contains("elected: this replica drives rollouts")
}

/// The join line's server list, rotated so that agents spread over replicas.
fn rotated(list: &str, by: usize) -> String {
    let mut v: Vec<&str> = list.split(',').collect();
    let n = v.len();
    v.rotate_left(by % n);
    v.join(",")
}

fn node_list(via: &Server) -> serde_json::Value {
    via.lksctl_json(&["node", "list"])
}

/// Joins and starts `n` agents named PREFIX0…, agent `i` dialling
/// `servers(i)` with the token `tok` (`token create -o json`).
fn join_agents(
    prefix: &str,
    n: usize,
    tok: &serde_json::Value,
    servers: impl Fn(usize) -> String,
) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let mut a = Agent::new(&format!("{prefix}{i}"));
            let out = a.join_raw(
                &servers(i),
                tok["token"].as_str().unwrap(),
                tok["ca_cert_hash"].as_str().unwrap(),
                &[],
            );
            assert!(
                out.status.success(),
                "join {prefix}{i}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            a.start();
            a
        })
        .collect()
}

fn all_connected(via: &Server, n: usize) -> bool {
    let v = node_list(via);
    let nodes = v.as_array().cloned().unwrap_or_default();
    nodes.len() == n && nodes.iter().all(|x| x["connected"] == true)
}

#[test]
fn survivor_finishes_the_rollout_after_the_leader_and_the_publisher_die() {
    let etcd = Etcd::start();
    let prefix = "/lks-test-kill/";
    let mut r1 = replica(&etcd, prefix);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let mut r2 = replica(&etcd, prefix);
    let r3 = replica(&etcd, prefix);
    // Every replica shares one CA: the pin works with any of them.
    assert_eq!(r1.admin_conf().ca_cert, r3.admin_conf().ca_cert);

    r1.lksctl_ok(&["cluster", "create", "c1"]);
    let tok = r3.lksctl_json(&["token", "create", "--cluster", "c1", "--uses", "4"]);
    let servers = tok["server"].as_str().unwrap().to_string();
    assert_eq!(
        servers.split(',').count(),
        3,
        "the join line lists every replica: {servers}"
    );
    let agents = join_agents("n", 4, &tok, |i| rotated(&servers, i));
    wait_until(CONVERGE, "4 agents connected", || all_connected(&r2, 4));

    // Published through r2: 3 files, one of 2.5 MiB (three chunks in etcd).
    let big: Vec<u8> = (0..(5 << 19)).map(|i: u32| (i % 251) as u8).collect();
    let dir = write_bundle(
        r2.work_dir(),
        "app",
        "2",
        &[
            BundleFile {
                path: "/etc/app/a.conf",
                content: b"a=2\n",
                mode: "0644",
            },
            BundleFile {
                path: "/etc/app/b.conf",
                content: b"b=2\n",
                mode: "0600",
            },
            BundleFile {
                path: "/opt/app/blob",
                content: &big,
                mode: "0755",
            },
        ],
        // Each node takes a moment, and counts how often its step ran.
        "[[step]]\nname = \"count\"\nrun = [\"sh\", \"-c\", \"echo x >> \\\"$LKS_ROOT/ran\\\"; sleep 1\"]\n",
    );
    assert_eq!(
        r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()])
            .trim(),
        "app@2"
    );
    // Started through r3, which does not lead: the leader drives it.
    let id = r3
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c1",
            "--bundle",
            "app@2",
            "--batch-size",
            "1",
        ])
        .trim()
        .to_string();
    wait_until(CONVERGE, "the first node updated", || {
        r3.lksctl_json(&["rollout", "status", &id])["updated"].as_u64() >= Some(1)
    });
    let before = r3.lksctl_json(&["rollout", "status", &id]);
    assert!(
        before["updated"].as_u64() < Some(4),
        "still mid-rollout: {before}"
    );

    r1.kill9(); // the leader
    r2.kill9(); // the publisher
    let done = |s: &serde_json::Value| s["state"] == "completed";
    wait_until(
        Duration::from_secs(90),
        "the survivor completes the rollout",
        || done(&r3.lksctl_json(&["rollout", "status", &id])),
    );
    assert!(is_leader(&r3), "r3 took over:\n{}", r3.log());
    let st = r3.lksctl_json(&["rollout", "status", &id]);
    assert_eq!(st["updated"], 4, "{st}");
    assert_eq!(st["failed"], 0, "{st}");
    wait_until(CONVERGE, "every agent on the survivor", || all_connected(&r3, 4));
    for a in &agents {
        a.wait_bundle("app", "2", "applied");
        assert_eq!(a.read("/etc/app/a.conf").unwrap(), (b"a=2\n".to_vec(), 0o644));
        assert_eq!(a.read("/etc/app/b.conf").unwrap(), (b"b=2\n".to_vec(), 0o600));
        assert_eq!(a.read("/opt/app/blob").unwrap(), (big.clone(), 0o755));
        let ran = std::fs::read_to_string(a.root.join("ran")).unwrap();
        assert_eq!(ran.lines().count(), 1, "{}: its step ran once", a.name);
    }
    // No node was started twice by the two leaders.
    let events = r3.lksctl_json(&["event", "list", "--rollout", &id, "--limit", "1000"]);
    for a in &agents {
        let starts = events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "node_started" && e["node"] == a.name.as_str())
            .count();
        assert_eq!(starts, 1, "{} started once: {events}", a.name);
    }
    // The survivor's admin.conf works alone.
    assert!(r3.lksctl_ok(&["cluster", "list"]).contains("c1"));
}

#[test]
fn two_replicas_race_for_the_last_use_of_a_token() {
    let etcd = Etcd::start();
    let prefix = "/lks-test-race/";
    let r1 = replica(&etcd, prefix);
    let r2 = replica(&etcd, prefix);
    r1.lksctl_ok(&["cluster", "create", "c1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for round in 0..5 {
        let tok = r1.lksctl_json(&["token", "create", "--cluster", "c1", "--uses", "1"]);
        let token = tok["token"].as_str().unwrap().to_string();
        let (csr_a, _) = make_csr(&[]);
        let (csr_b, _) = make_csr(&[]);
        let (name_a, name_b) = (format!("a{round}"), format!("b{round}"));
        let (a, b) = rt.block_on(async {
            tokio::join!(
                enroll_raw(&r1, &token, &name_a, &csr_a, &[]),
                enroll_raw(&r2, &token, &name_b, &csr_b, &[]),
            )
        });
        assert_eq!(
            a.is_ok() as u32 + b.is_ok() as u32,
            1,
            "round {round}: exactly one enrolment wins: {a:?} / {b:?}"
        );
        let loser = match (a, b) {
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
            _ => unreachable!("checked above"),
        };
        assert_eq!(loser.code(), tonic::Code::Unauthenticated, "{loser:?}");
        assert!(loser.message().contains("no uses left"), "{loser:?}");
    }
    let nodes = node_list(&r2);
    assert_eq!(nodes.as_array().unwrap().len(), 5, "{nodes}");

    // Same name through two replicas at once: one node.
    let tok = r1.lksctl_json(&["token", "create", "--cluster", "c1"]);
    let token = tok["token"].as_str().unwrap().to_string();
    let (csr_a, _) = make_csr(&[]);
    let (csr_b, _) = make_csr(&[]);
    let (a, b) = rt.block_on(async {
        tokio::join!(
            enroll_raw(&r1, &token, "same", &csr_a, &[]),
            enroll_raw(&r2, &token, "same", &csr_b, &[]),
        )
    });
    assert_eq!(a.is_ok() as u32 + b.is_ok() as u32, 1, "{a:?} / {b:?}");
}

#[test]
fn replicas_ride_out_an_etcd_restart() {
    let mut etcd = Etcd::start();
    let prefix = "/lks-test-etcd-restart/";
    let mut r1 = replica(&etcd, prefix);
    let mut r2 = replica(&etcd, prefix);
    r1.lksctl_ok(&["cluster", "create", "c1"]);
    let tok = r1.lksctl_json(&["token", "create", "--cluster", "c1"]);
    let servers = tok["server"].as_str().unwrap().to_string();
    let agents = join_agents("e", 3, &tok, |i| rotated(&servers, i));
    wait_until(CONVERGE, "agents connected", || all_connected(&r1, 3));

    etcd.kill9();
    // Writes are refused with one clear line while etcd is gone.
    let out = r2.lksctl(&["cluster", "create", "c2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unavailable"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // Longer than the lease: the replicas lose their leases meanwhile.
    std::thread::sleep(Duration::from_secs(5));
    for a in &agents {
        assert_eq!(
            a.status()["connection"]["connected"],
            true,
            "{}: stream kept",
            a.name
        );
    }
    etcd.start_again();

    wait_until(CONVERGE, "writes work again", || {
        r2.lksctl(&["cluster", "create", "c2"]).status.success()
    });
    wait_until(CONVERGE, "connection state back", || all_connected(&r2, 3));
    let dir = write_bundle(
        r2.work_dir(),
        "cfg",
        "1",
        &[BundleFile {
            path: "/etc/cfg",
            content: b"v1\n",
            mode: "0644",
        }],
        "",
    );
    r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()]);
    let out = r2.lksctl(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        "cfg@1",
        "--wait",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for a in &agents {
        a.wait_bundle("cfg", "1", "applied");
    }
    assert!(r1.running() && r2.running(), "no replica restarted");
}

/// True if any file under `dir` (etcd's WAL and database) holds `needle`.
fn etcd_files_contain(dir: &std::path::Path, needle: &[u8]) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
                return true;
            }
        }
    }
    false
}

#[test]
fn private_keys_in_etcd_are_sealed_with_the_encryption_key() {
    let key_dir = tempfile::tempdir().unwrap();
    let key = key_dir.path().join("encryption.key");
    // 32 bytes, base64, mode 0600: what `head -c 32 /dev/urandom | base64` makes.
    std::fs::write(&key, "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key_arg = key.display().to_string();

    let etcd = Etcd::start();
    let url = etcd.url();
    let base = [
        "--store",
        "etcd",
        "--etcd-endpoints",
        url.as_str(),
        "--etcd-prefix",
        "/lks-test-seal/",
        "--lease-ttl",
        LEASE,
    ];
    let args =
        |extra: &[&'static str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let with_key: Vec<String> = args(&["--encryption-key-file"])
        .into_iter()
        .chain([key_arg.clone()])
        .collect();
    let with_key: Vec<&str> = with_key.iter().map(String::as_str).collect();
    let r1 = Server::start_with(&with_key);
    r1.lksctl_ok(&["cluster", "create", "c1"]);
    assert!(!r1.log().contains("not encrypted"), "{}", r1.log());
    // A second replica with the key loads the same identity.
    let r2 = Server::start_with(&with_key);
    assert_eq!(r1.admin_conf().ca_cert, r2.admin_conf().ca_cert);
    assert!(r2.lksctl_ok(&["cluster", "list"]).contains("c1"));
    // Without the key: one line, non-zero exit.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(lks_e2e::bin("lks-control-server"));
    cmd.arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .args(args(&[]));
    let out = lks_e2e::run(cmd);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.trim()
            .lines()
            .last()
            .unwrap_or_default()
            .contains("encrypted (key k1:"),
        "{err}"
    );
    assert!(!dir.path().join("admin.conf").exists());
    // Nothing in etcd's files reveals a private key.
    assert!(!etcd_files_contain(&etcd.data_dir(), b"PRIVATE KEY"));

    // The same check on a control plane without the key does find them:
    // the check above can fail.
    let plain = Etcd::start();
    let r3 = Server::start_with(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &plain.url(),
        "--lease-ttl",
        LEASE,
    ]);
    assert!(
        r3.log().contains("private keys in etcd are not encrypted"),
        "{}",
        r3.log()
    );
    wait_until(Duration::from_secs(10), "etcd to write its files", || {
        etcd_files_contain(&plain.data_dir(), b"PRIVATE KEY")
    });
}

#[test]
fn join_lines_name_the_join_url_when_one_is_given() {
    let etcd = Etcd::start();
    let r1 = Server::start_with(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        &etcd.url(),
        "--lease-ttl",
        LEASE,
        "--tls-san",
        "lks.example.test",
        "--join-url",
        "https://lks.example.test:7443",
    ]);
    r1.lksctl_ok(&["cluster", "create", "c1"]);
    let tok = r1.lksctl_json(&["token", "create", "--cluster", "c1"]);
    assert_eq!(tok["server"], "https://lks.example.test:7443");
    assert!(
        tok["join_command"]
            .as_str()
            .unwrap()
            .starts_with("lksadmin-agent join --server https://lks.example.test:7443 --token "),
        "{tok}"
    );
    // admin.conf still names the replica itself: operators reach it directly.
    assert_eq!(r1.admin_conf().server, r1.url());
}

/// Rollout policies across replicas: a node offline at its turn is deferred
/// by the leader, comes back on the other replica and catches up there; a
/// hold and a maintenance window set through one replica hold on the leader.
#[test]
fn a_deferred_node_catches_up_through_another_replica_and_holds_and_windows_are_shared() {
    let etcd = Etcd::start();
    let prefix = "/lks-test-policy/";
    let r1 = replica(&etcd, prefix);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let r2 = replica(&etcd, prefix);
    r2.lksctl_ok(&["cluster", "create", "c1"]);
    let tok = r2.lksctl_json(&["token", "create", "--cluster", "c1", "--uses", "3"]);
    // Every agent dials r2, which does not lead.
    let mut agents = join_agents("p", 3, &tok, |_| r2.url());
    wait_until(CONVERGE, "3 agents connected", || all_connected(&r1, 3));
    assert_eq!(agents[2].stop(), Some(0));
    wait_until(CONVERGE, "p2 seen offline by the leader", || {
        let v = node_list(&r1);
        v.as_array()
            .unwrap()
            .iter()
            .any(|n| n["name"] == "p2" && n["connected"] == false)
    });
    let conf = |v: &'static [u8]| {
        [BundleFile {
            path: "/etc/p.conf",
            content: v,
            mode: "0644",
        }]
    };
    let dir = write_bundle(r2.work_dir(), "p", "1", &conf(b"p1\n"), "");
    r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()]);
    let st = r2.lksctl_json(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        "p@1",
        "--batch-size",
        "1",
        "--wait",
    ]);
    assert_eq!(
        (&st["state"], &st["updated"], &st["deferred"]),
        (&"completed".into(), &2.into(), &1.into()),
        "{st:#}"
    );
    let id = st["id"].as_str().unwrap().to_string();

    // Back, on r2: the leader sees it through etcd and starts it.
    agents[2].start();
    agents[2].wait_bundle("p", "1", "applied");
    wait_until(CONVERGE, "the catch-up is recorded on the rollout", || {
        r1.lksctl_json(&["rollout", "status", &id])["updated"] == 3
    });

    // A hold through r2 and a closed window through r1, both seen by the
    // leader's controller.
    r2.lksctl_ok(&["node", "hold", "p0", "--reason", "ha test"]);
    assert_eq!(node_list(&r1).as_array().unwrap()[0]["held"], true);
    let dir = write_bundle(r2.work_dir(), "p", "2", &conf(b"p2\n"), "");
    r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()]);
    let st = r1.lksctl_json(&["rollout", "start", "--cluster", "c1", "--bundle", "p@2", "--wait"]);
    assert_eq!((&st["updated"], &st["held"]), (&2.into(), &1.into()), "{st:#}");
    assert_eq!(
        agents[0].read("/etc/p.conf"),
        Some((b"p1\n".to_vec(), 0o644)),
        "held node kept p@1"
    );
    // A one-minute window three days from now: closed for certain.
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400;
    // 1970-01-01 was a Thursday.
    let day = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][((days + 3) % 7) as usize];
    r1.lksctl_ok(&[
        "cluster",
        "set",
        "c1",
        "--maintenance-window",
        &format!("{day} 00:00-00:01 UTC"),
    ]);
    r2.lksctl_ok(&["node", "unhold", "p0"]);
    std::thread::sleep(Duration::from_secs(3));
    let st = r2.lksctl_json(&["rollout", "status", st["id"].as_str().unwrap()]);
    assert_eq!(st["held"], 1, "released, but every window is closed: {st:#}");
    assert_eq!(st["waiting_for_window"], true, "{st:#}");
    assert_eq!(agents[0].read("/etc/p.conf"), Some((b"p1\n".to_vec(), 0o644)));
    r2.lksctl_ok(&["cluster", "set", "c1", "--no-maintenance-window"]);
    agents[0].wait_bundle("p", "2", "applied");
}

/// A node's last-seen time as `node list -o json` shows it (RFC 3339, UTC,
/// one format: compares as text).
fn last_seen(via: &Server, node: &str) -> String {
    let v = node_list(via);
    let n = v.as_array().unwrap().iter().find(|n| n["name"] == node).cloned();
    n.and_then(|n| n["last_seen"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn a_replica_killed_hard_loses_no_last_seen_time() {
    let etcd = Etcd::start();
    let prefix = "/lks-test-seen/";
    // r1 pings its agents every second, so it hears them often.
    let mut r1 = etcd.replica(prefix, &["--ping-interval", "1s"]);
    let r2 = replica(&etcd, prefix);
    r1.create_cluster("c");
    let tok = r1.lksctl_json(&["token", "create", "--cluster", "c"]);
    // The agent knows only r1, so it cannot fail over to r2.
    let mut a = Agent::new("n0");
    let out = a.join_raw(
        &r1.url(),
        tok["token"].as_str().unwrap(),
        tok["ca_cert_hash"].as_str().unwrap(),
        &[],
    );
    assert!(
        out.status.success(),
        "join: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.start();
    wait_until(CONVERGE, "n0 connected, seen through r2", || {
        all_connected(&r2, 1) && !last_seen(&r2, "n0").is_empty()
    });
    let first = last_seen(&r2, "n0");
    // Heard since: r1's batched last-seen document moved it on.
    wait_until(Duration::from_secs(30), "n0's last-seen to move on", || {
        last_seen(&r2, "n0") > first
    });
    let before_kill = last_seen(&r2, "n0");
    r1.kill9();
    // Within the lease TTL (3 s) the node shows disconnected, and its
    // last-seen time is what r1 last wrote, not its connect time.
    wait_until(
        Duration::from_secs(15),
        "n0 disconnected after r1's death",
        || !node_list(&r2)[0]["connected"].as_bool().unwrap_or(true),
    );
    let after = last_seen(&r2, "n0");
    assert!(
        after >= before_kill,
        "last-seen fell back: {after} < {before_kill} (first {first})"
    );
}

/// Agents each replica holds.
fn held(r: &Server) -> u64 {
    r.connected_agents()
}

#[test]
fn a_replica_that_comes_back_gets_its_share_of_the_agents() {
    let etcd = Etcd::start();
    let prefix = "/lks-test-spread/";
    let fast = ["--rebalance-interval", "1s"];
    let mut r1 = etcd.replica(prefix, &fast);
    let r2 = etcd.replica(prefix, &fast);
    let r3 = etcd.replica(prefix, &fast);
    r1.create_cluster("c");
    let tok = r1.lksctl_json(&["token", "create", "--cluster", "c", "--uses", "24"]);
    let servers = tok["server"].as_str().unwrap().to_string();
    let agents = join_agents("s", 24, &tok, |i| rotated(&servers, i));
    wait_until(CONVERGE, "24 agents connected", || all_connected(&r2, 24));

    // r1 goes away: its agents move to the others.
    r1.stop();
    wait_until(CONVERGE, "every agent on r2 or r3", || {
        held(&r2) + held(&r3) == 24
    });
    // r1 comes back empty; the others hand it agents, a few at a time,
    // each to the replica the trailer names.
    r1.start_again();
    wait_until(Duration::from_secs(60), "each replica near its share (8)", || {
        let h = [held(&r1), held(&r2), held(&r3)];
        h.iter().sum::<u64>() == 24 && h.iter().all(|&n| (6..=10).contains(&n))
    });
    assert!(r2.log().contains("rebalancing") || r3.log().contains("rebalancing"));
    assert!(
        agents
            .iter()
            .any(|a| a.log().contains("moving to another replica, as the server asked")),
        "the agents follow the replica the trailer names"
    );
    wait_until(CONVERGE, "all 24 connected after the moves", || {
        all_connected(&r1, 24)
    });
}

/// The region shape at CI size: three replicas on a three-member etcd
/// cluster; mid-rollout the leading replica and one etcd member are killed;
/// the rollout completes on the survivors, every agent ends up there with
/// every file, and no node ran its step twice.
#[test]
fn three_replicas_on_a_three_member_etcd_ride_out_the_leader_and_a_member_dying() {
    let mut etcd = lks_e2e::etcd::EtcdCluster::start(3);
    let prefix = "/lks-test-region/";
    let mut r1 = etcd.replica(prefix, &[]);
    wait_until(Duration::from_secs(15), "r1 elected", || is_leader(&r1));
    let r2 = etcd.replica(prefix, &[]);
    let r3 = etcd.replica(prefix, &[]);
    r2.create_cluster("c");
    let tok = r2.lksctl_json(&["token", "create", "--cluster", "c", "--uses", "6"]);
    let servers = tok["server"].as_str().unwrap().to_string();
    let agents = join_agents("m", 6, &tok, |i| rotated(&servers, i));
    wait_until(CONVERGE, "6 agents connected", || all_connected(&r2, 6));
    let dir = write_bundle(
        r2.work_dir(),
        "app",
        "1",
        &[BundleFile {
            path: "/etc/app/app.conf",
            content: b"v=1\n",
            mode: "0644",
        }],
        "[[step]]\nname = \"count\"\nrun = [\"sh\", \"-c\", \"echo x >> \\\"$LKS_ROOT/ran\\\"; sleep 1\"]\n",
    );
    r2.lksctl_ok(&["bundle", "publish", &dir.display().to_string()]);
    let id = r2
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c",
            "--bundle",
            "app@1",
            "--batch-size",
            "1",
        ])
        .trim()
        .to_string();
    wait_until(CONVERGE, "the first node updated", || {
        r2.lksctl_json(&["rollout", "status", &id])["updated"].as_u64() >= Some(1)
    });
    r1.kill9();
    etcd.kill9(0);
    // While etcd elects a new leader, reads may fail `unavailable` ("leader
    // changed"; one line, retry): poll through it.
    let status = |via: &Server| {
        let out = via.lksctl(&["rollout", "status", &id, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok())
            .flatten()
    };
    wait_until(
        Duration::from_secs(120),
        "the survivors complete the rollout",
        || status(&r3).is_some_and(|s| s["state"] == "completed"),
    );
    let st = r3.lksctl_json(&["rollout", "status", &id]);
    assert_eq!(
        (st["updated"].as_u64(), st["failed"].as_u64()),
        (Some(6), Some(0)),
        "{st}"
    );
    wait_until(CONVERGE, "every agent on a survivor", || all_connected(&r3, 6));
    for a in &agents {
        a.wait_bundle("app", "1", "applied");
        assert_eq!(a.read("/etc/app/app.conf").unwrap().0, b"v=1\n");
        let ran = std::fs::read_to_string(a.root.join("ran")).unwrap();
        assert_eq!(ran.lines().count(), 1, "the step ran once on {}", a.name);
    }
}
