//! Networks as in production (issue [reliability] item 3, DESIGN §9): the
//! control server and each tenant VM's agent in their own network
//! namespaces, routed so that agents dial the server and the server cannot
//! dial them (checked), with faults injected at the router: the link cut
//! mid-download, cut for long while idle, and lossy. Each test prints one
//! `NETFAULT` summary line (RELIABILITY.md copies them).

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use lks_e2e::agent::{BundleFile, node_connected, publish_and_roll_out, wait_node_bundle, write_bundle};
use lks_e2e::netns::Net;
use lks_e2e::rollout::first_line;
use lks_e2e::wait_until;

/// Long enough for a silent cut to be noticed (agent keepalive 20 s + 10 s,
/// server 30 s + 20 s) and for the reconnect backoff, on a loaded machine.
const NOTICE: Duration = Duration::from_secs(75);

fn sha256_hex(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A bundle whose step appends one line per run to `$LKS_ROOT/runs-NAME`.
fn counted_bundle(parent: &Path, name: &str, version: &str, content: &[u8]) -> std::path::PathBuf {
    let path = format!("/etc/{name}.conf");
    write_bundle(
        parent,
        name,
        version,
        &[BundleFile {
            path: &path,
            content,
            mode: "0644",
        }],
        &format!(
            "[[step]]\nname = \"count\"\nrun = [\"/bin/sh\", \"-c\", \"echo {version} >> \\\"$LKS_ROOT/runs-{name}\\\"\"]\n"
        ),
    )
}

fn runs(root: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(root.join(format!("runs-{name}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn pseudo_random(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(977)) >> 13) as u8)
        .collect()
}

#[test]
fn link_cut_mid_download_resumes_and_never_shows_a_corrupt_file() {
    let Some(net) = Net::new(1) else { return };
    let t0 = Instant::now();
    let server = net.server(&[]);
    net.check_one_way(1);
    server.create_cluster("c1");
    let mut a = net.agent(1, "n1");
    a.join(&server, "c1", &[]);
    a.start();
    a.wait_connected();

    const SIZE: usize = 24 << 20;
    let bytes = pseudo_random(SIZE, 7);
    let dir = write_bundle(
        server.work_dir(),
        "big",
        "1",
        &[BundleFile {
            path: "/opt/big/blob",
            content: &bytes,
            mode: "0644",
        }],
        "",
    );
    let hex = sha256_hex(&dir.join("f0"));
    let partial = a.state_dir.join("cache/partial").join(&hex);
    let target = a.path("/opt/big/blob");
    // 16 Mbit/s: about 12 s for the whole blob, so the cut lands inside.
    net.rate(1, "16mbit");
    publish_and_roll_out(&server, "c1", &dir, None);
    let size_of = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    // Never a partial file at the target: absent or whole.
    let mut corrupt_seen = 0u32;
    let mut check_target = || {
        let n = size_of(&target);
        if target.exists() && n != SIZE as u64 {
            corrupt_seen += 1;
        }
    };
    wait_until(
        Duration::from_secs(60),
        "a quarter of the blob downloaded",
        || {
            check_target();
            size_of(&partial) >= (SIZE / 4) as u64
        },
    );
    net.cut(1);
    let at_cut = size_of(&partial);
    assert!(at_cut < SIZE as u64, "the download ended before the cut");
    wait_until(NOTICE, "the agent notices the cut", || {
        check_target();
        a.status()["connection"]["connected"] == false
    });
    assert!(!target.exists(), "nothing installed while the blob is incomplete");
    net.unlimit(1);
    net.restore(1);
    let start = Instant::now();
    while start.elapsed() < NOTICE {
        check_target();
        if a.bundle("big")
            .is_some_and(|(v, s, _)| v == "1" && s == "applied")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    a.wait_bundle("big", "1", "applied");
    assert_eq!(corrupt_seen, 0, "a partial file was visible at the target");
    assert_eq!(sha256_hex(&target), hex, "the installed file is exact");
    let log = a.log();
    let resumed_at: u64 = log
        .lines()
        .find_map(|l| l.split("resuming download at byte ").nth(1))
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no resumed download in the agent log:\n{log}"));
    assert!(
        resumed_at >= at_cut && resumed_at < SIZE as u64,
        "resumed at byte {resumed_at}, {at_cut} were kept at the cut"
    );
    assert!(!partial.exists(), "the partial download is gone once complete");
    eprintln!(
        "NETFAULT link-cut-mid-download: cuts=1 cut_at_byte={at_cut}/{SIZE} resumed_at_byte={resumed_at} \
         corrupt_files_seen={corrupt_seen} sha256_ok=1 secs={}",
        t0.elapsed().as_secs()
    );
    drop(a);
    drop(server);
    net.close();
}

#[test]
fn long_cut_repairs_offline_defers_the_rollout_and_catches_up_without_reapplying() {
    let Some(net) = Net::new(2) else { return };
    let t0 = Instant::now();
    let server = net.server(&[]);
    net.check_one_way(1);
    net.check_one_way(2);
    server.create_cluster("c1");
    let mut agents = Vec::new();
    for i in 1..=2 {
        let mut a = net.agent(i, &format!("n{i}"));
        a.heal_interval = "1s".into();
        a.join(&server, "c1", &[]);
        a.start();
        a.wait_connected();
        agents.push(a);
    }
    let keep = counted_bundle(server.work_dir(), "keep", "1", b"keep me\n");
    publish_and_roll_out(&server, "c1", &keep, None);
    let motd1 = counted_bundle(server.work_dir(), "motd", "1", b"motd v1\n");
    publish_and_roll_out(&server, "c1", &motd1, None);
    for a in &agents {
        wait_node_bundle(&server, &a.name, "keep", "1", "applied");
        wait_node_bundle(&server, &a.name, "motd", "1", "applied");
    }

    // n2's link is cut while it idles on its stream.
    net.cut(2);
    let n2 = &agents[1];
    wait_until(NOTICE, "n2 notices the cut", || {
        n2.status()["connection"]["connected"] == false
    });
    // Drift is repaired while offline, from the local cache.
    std::fs::write(n2.path("/etc/motd.conf"), b"tampered\n").unwrap();
    std::fs::remove_file(n2.path("/etc/keep.conf")).unwrap();
    wait_until(Duration::from_secs(30), "n2 repairs its files offline", || {
        n2.read("/etc/motd.conf").map(|(b, _)| b) == Some(b"motd v1\n".to_vec())
            && n2.read("/etc/keep.conf").map(|(b, _)| b) == Some(b"keep me\n".to_vec())
    });
    // A rollout started while n2 is offline completes for the others.
    wait_until(NOTICE, "the server sees n2 offline", || {
        !node_connected(&server, "n2")
    });
    let motd2 = counted_bundle(server.work_dir(), "motd", "2", b"motd v2\n");
    let id = server.lksctl_ok(&["bundle", "publish", motd2.to_str().unwrap()]);
    let out = server.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c1",
        "--bundle",
        id.trim(),
        "--wait",
    ]);
    let rid = first_line(&out);
    let st = server.lksctl_json(&["rollout", "status", &rid]);
    assert_eq!(st["state"], "completed", "{st}");
    assert_eq!(st["deferred"], 1, "{st}");
    wait_node_bundle(&server, "n1", "motd", "2", "applied");
    assert_eq!(
        n2.read("/etc/motd.conf").map(|(b, _)| b),
        Some(b"motd v1\n".to_vec())
    );

    // The link returns: n2 reconnects with backoff and catches up.
    let cut_for = t0.elapsed();
    net.restore(2);
    wait_until(NOTICE, "n2 reconnects", || {
        n2.status()["connection"]["connected"] == true
    });
    wait_node_bundle(&server, "n2", "motd", "2", "applied");
    assert_eq!(
        n2.read("/etc/motd.conf").map(|(b, _)| b),
        Some(b"motd v2\n".to_vec())
    );
    // Nothing applied twice: `keep` ran once per node, motd once per version.
    for a in &agents {
        assert_eq!(runs(&a.root, "keep"), ["1"], "{}: keep@1 ran again", a.name);
        assert_eq!(runs(&a.root, "motd"), ["1", "2"], "{}: motd steps", a.name);
    }
    let log = n2.log();
    let failures = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&server.url()))
        .count();
    eprintln!(
        "NETFAULT long-link-cut: cuts=1 offline_repairs=2/2 rollout=completed deferred={} caught_up=1 \
         duplicate_applies=0 reconnect_failures_logged={failures} secs={}",
        st["deferred"],
        cut_for.as_secs()
    );
    drop(agents);
    drop(server);
    net.close();
}

#[test]
fn lossy_slow_link_still_enrols_rolls_out_and_repairs() {
    let Some(net) = Net::new(1) else { return };
    let t0 = Instant::now();
    let server = net.server(&[]);
    net.check_one_way(1);
    server.create_cluster("c1");
    net.loss(1, 10);
    let delayed = net.delay(1, 100);
    if !delayed {
        eprintln!("tc netem is not in this kernel: injecting 10% loss without the 100 ms delay");
    }
    let mut a = net.agent(1, "n1");
    a.heal_interval = "2s".into();
    a.join(&server, "c1", &[]);
    a.start();
    wait_until(NOTICE, "connected over the lossy link", || {
        a.status()["connection"]["connected"] == true
    });
    let content = pseudo_random(2 << 20, 3);
    let dir = write_bundle(
        server.work_dir(),
        "lossy",
        "1",
        &[BundleFile {
            path: "/opt/lossy/data",
            content: &content,
            mode: "0644",
        }],
        "",
    );
    publish_and_roll_out(&server, "c1", &dir, None);
    wait_until(NOTICE, "applied over the lossy link", || {
        a.bundle("lossy")
            .is_some_and(|(v, s, _)| v == "1" && s == "applied")
    });
    assert_eq!(a.read("/opt/lossy/data").map(|(b, _)| b == content), Some(true));
    std::fs::remove_file(a.path("/opt/lossy/data")).unwrap();
    wait_until(NOTICE, "drift repaired", || {
        a.read("/opt/lossy/data").map(|(b, _)| b == content) == Some(true)
    });
    wait_until(NOTICE, "the server sees it applied", || {
        lks_e2e::agent::node_bundle(&server, "n1", "lossy")
            .is_some_and(|(v, s, _)| v == "1" && s == "applied")
    });
    eprintln!(
        "NETFAULT lossy-link: loss_percent=10 delay_ms={} enrolled=1 rollout_applied=1 drift_repaired=1 secs={}",
        if delayed { 100 } else { 0 },
        t0.elapsed().as_secs()
    );
    drop(a);
    drop(server);
    net.close();
}
