//! Binary deltas (issue [delta]), end to end with a real server, `lksctl`
//! and agent:
//!
//! - after a publish, the server makes a patch from the earlier version's
//!   file at the same path (off the publish path) and `bundle get -o json`
//!   lists it; a node holding the earlier bytes fetches the patch, rebuilds
//!   the file byte-exact, and the server sends a small fraction of the file
//!   (`lks_blob_bytes_served_by_kind_total`, bytes saved);
//! - a patch corrupted in the server's blob store is refused by the node,
//!   which fetches the whole file and still installs the right bytes;
//! - a node whose cache lost the base rebuilds from the installed file;
//! - a node without the base (one that joins later) fetches the whole file;
//! - on two replicas over etcd (blobs in etcd), a patch one replica made is
//!   served by the other, through the shared blob store;
//! - with peer sharing on, a patch crosses from the server about once: the
//!   nodes take it from each other (one seed per batch, then the nodes that
//!   hold it), each rebuilds its file byte-exact;
//! - an agent killed (`kill -9`, a fault point) while it rebuilds a file
//!   leaves the old file whole, and converges when it runs again;
//! - two real patch releases of kubectl (the official builds of 1.37.0 and
//!   1.37.1, fetched once by `scripts/kubectl-releases.sh`): the upgrade
//!   moves under 2 % of the binary and the rebuilt kubectl runs;
//! - (issue [upgrade-cost]) a version unrelated to the one a node holds
//!   gets no patch: the estimate skips it before any diff, `bundle get`
//!   says why, the node fetches the whole file; the next version, a small
//!   edit of it, still gets a patch, and the maker's metrics count both.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, wait_node_bundle, write_bundle};
use lks_e2e::etcd::Etcd;
use lks_e2e::server::Server;
use lks_e2e::{noise, wait_until};
use lks_proto::Digest;

const SIZE: usize = 6 << 20;
const PATH: &str = "/opt/app/bin/app";

/// The patch-release scenario, case by case.
#[path = "delta/scenario.rs"]
mod scenario;

use scenario::scenario;

/// A "patch release" of `old`: a few bytes changed across the file and a
/// short insertion that shifts everything after it, as a rebuilt binary.
fn next_release(old: &[u8], seed: usize) -> Vec<u8> {
    let mut new = old.to_vec();
    for i in (seed * 1000..new.len()).step_by(new.len() / 9) {
        new[i] ^= 0x5a;
    }
    let at = new.len() / 3 + seed * 4096;
    new.splice(at..at, format!("release {seed}").into_bytes());
    new
}

fn version(dir: &Path, v: &str, content: &[u8]) -> PathBuf {
    write_bundle(
        dir,
        "app",
        v,
        &[BundleFile {
            path: PATH,
            content,
            mode: "0755",
        }],
        "",
    )
}

/// Rolls `id` out and waits for it; `rollout status -o json`'s `fetched`.
fn roll_out(server: &Server, id: &str) -> serde_json::Value {
    let out = server.lksctl_ok(&["rollout", "start", "--cluster", "c", "--bundle", id, "--wait"]);
    let rid = out.lines().next().unwrap_or_default().trim().to_string();
    server.lksctl_json(&["rollout", "status", &rid])["fetched"].clone()
}

/// The deltas `bundle get -o json` lists for app@`v`, once there are `n`.
fn wait_deltas(server: &Server, v: &str, n: usize) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    // The maker is CPU-bound and built in debug here: 20 s alone on 2
    // cores, past 60 s when the suite shares them with builds, past 120 s
    // with two busy loops beside the suite (seen once).
    wait_until(
        Duration::from_secs(300),
        &format!("{n} deltas of app@{v}"),
        || {
            let b = server.lksctl_json(&["bundle", "get", &format!("app@{v}")]);
            got = b["deltas"].as_array().cloned().unwrap_or_default();
            got.len() >= n
        },
    );
    got
}

fn local_copy(server: &Server, hex: &str) -> PathBuf {
    server
        .work_dir()
        .join("data/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
}

fn served(server: &Server, kind: &str) -> u64 {
    server.metric(&format!("lks_blob_bytes_served_by_kind_total{{kind=\"{kind}\"}}"))
}

fn served_saved(server: &Server) -> u64 {
    server.metric("lks_blob_delta_bytes_saved_total")
}

#[test]
fn a_patch_release_moves_a_few_percent_and_any_failure_falls_back_to_the_whole_file() {
    let server = Server::start_with(&["--delta-interval", "1s"]);
    let corrupt = |hex: &str| {
        let p = local_copy(&server, hex);
        let mut bytes = std::fs::read(&p).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0xff;
        std::fs::write(&p, bytes).unwrap();
    };
    scenario(&server, &server, "bsdiff4-zstd", Some(&corrupt));
}

/// Issue [upgrade-cost] item 2: app@2 is unrelated to app@1 (other random
/// bytes): the maker's estimate skips the pair without a diff, records it,
/// and `bundle get` says why in JSON (`no_deltas`) and text; the node
/// fetches app@2 whole. app@3, a small edit of app@2, gets a patch from
/// app@2 (and none from app@1, unrelated too), which the node fetches.
#[test]
fn an_unrelated_version_gets_no_patch_and_says_why_and_a_small_edit_still_does() {
    let server = Server::start_with(&["--delta-interval", "1s"]);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let (v1, v2) = (noise(SIZE, 21), noise(SIZE, 22));
    let v3 = next_release(&v2, 3);
    let mut a = Agent::new("u0");
    a.join(&server, "c", &[]);
    a.start();
    assert_eq!(server.publish(&version(work.path(), "1", &v1)), "app@1");
    roll_out(&server, "app@1");
    assert_eq!(server.publish(&version(work.path(), "2", &v2)), "app@2");
    let no_delta = |v: &str, n: usize| {
        let mut got = Vec::new();
        wait_until(
            Duration::from_secs(60),
            &format!("{n} pairs of app@{v} without a patch"),
            || {
                let b = server.lksctl_json(&["bundle", "get", &format!("app@{v}")]);
                got = b["no_deltas"].as_array().cloned().unwrap_or_default();
                got.len() >= n
            },
        );
        got
    };
    let skipped = no_delta("2", 1);
    let s = &skipped[0];
    assert_eq!(
        (&s["path"], &s["from_version"], &s["reason"]),
        (&PATH.into(), &"1".into(), &"estimate".into())
    );
    assert!(s["estimated_saving"].as_u64().unwrap() < 5, "{s}");
    assert_eq!(s["min_saving"], 20, "--delta-min-saving's default");
    let text = server.lksctl_ok(&["bundle", "get", "app@2"]);
    assert!(
        text.contains("No patch:") && text.contains("none (estimated saving "),
        "{text}"
    );
    let b2 = server.lksctl_json(&["bundle", "get", "app@2"]);
    assert_eq!(b2["deltas"], serde_json::json!([]), "no patch made");
    // Counted once recorded (just after bundle get can see the record).
    let counted = |result: &str, n: u64| {
        let series = format!("lks_delta_patches_total{{result=\"{result}\"}}");
        wait_until(Duration::from_secs(10), &format!("{series} {n}"), || {
            server.metric(&series) == n
        });
    };
    counted("skipped", 1);
    assert_eq!(server.metric("lks_delta_patches_total{result=\"made\"}"), 0);
    let fetched = roll_out(&server, "app@2");
    assert_eq!(fetched["as_delta"], 0, "{fetched}");

    assert_eq!(server.publish(&version(work.path(), "3", &v3)), "app@3");
    let made = wait_deltas(&server, "3", 1);
    assert_eq!(made[0]["from_version"], "2");
    let none = no_delta("3", 1);
    assert_eq!(
        (&none[0]["from_version"], &none[0]["reason"]),
        (&"1".into(), &"estimate".into())
    );
    counted("made", 1);
    counted("skipped", 2);
    let saved = server.metric("lks_delta_bytes_saved_total");
    assert!(saved > SIZE as u64 / 2, "{saved}");
    let fetched = roll_out(&server, "app@3");
    assert!(fetched["as_delta"].as_u64().unwrap() > 0, "{fetched}");
    assert!(std::fs::read(a.root.join(&PATH[1..])).unwrap() == v3);
    a.stop();
}

/// The maker's limits (issue [upgrade-cost]): a bad value is one error
/// line naming the flag, exit 2, before anything is started.
#[test]
fn bad_delta_limits_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--delta-min-saving", "150"),
        ("--delta-min-saving", "half"),
        ("--delta-max-memory", "0"),
        ("--delta-jobs", "0"),
    ] {
        let mut cmd = std::process::Command::new(lks_e2e::bin("lks-control-server"));
        cmd.arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([flag, value]);
        let out = lks_e2e::run(cmd);
        let e = lks_e2e::one_line_error(&out, &format!("{flag} {value}"));
        assert!(e.starts_with("error: ") && e.contains(flag), "{e}");
        assert_eq!(out.status.code(), Some(2));
        assert!(!dir.path().join("data").exists(), "nothing started");
    }
}

/// Issue [delta] item 6: the agent aborts (`LKS_AGENT_FAULT=
/// delta-rebuilding`, as a `kill -9` would) after the first MiB of the
/// rebuilt file is written. The installed file is the old one, whole; run
/// again, the agent rebuilds (or fetches) the new one and converges.
#[test]
fn a_crash_while_rebuilding_leaves_the_old_file_and_converges() {
    let server = Server::start_with(&["--delta-interval", "1s"]);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let v1 = noise(SIZE, 11);
    let v2 = next_release(&v1, 5);
    let mut a = Agent::new("c0");
    a.heal_interval = "1h".into();
    a.join(&server, "c", &[]);
    a.start();
    assert_eq!(server.publish(&version(work.path(), "1", &v1)), "app@1");
    roll_out(&server, "app@1");
    wait_node_bundle(&server, "c0", "app", "1", "applied");
    let cached = a.state_dir.join("cache/sha256").join(Digest::of(&v1).hex());
    wait_until(Duration::from_secs(30), "app@1 in the node's cache", || {
        cached.exists()
    });
    assert_eq!(server.publish(&version(work.path(), "2", &v2)), "app@2");
    wait_deltas(&server, "2", 1);

    a.stop();
    a.run_env = vec![("LKS_AGENT_FAULT".into(), "delta-rebuilding".into())];
    a.start();
    server.lksctl_ok(&["rollout", "start", "--cluster", "c", "--bundle", "app@2"]);
    wait_until(Duration::from_secs(60), "the agent to abort mid-rebuild", || {
        a.exited().is_some()
    });
    assert!(
        a.log()
            .contains("LKS_AGENT_FAULT=delta-rebuilding: aborting here")
    );
    let installed = a.root.join(&PATH[1..]);
    assert!(std::fs::read(&installed).unwrap() == v1, "the old file, whole");

    a.run_env.clear();
    a.start();
    wait_node_bundle(&server, "c0", "app", "2", "applied");
    assert!(std::fs::read(&installed).unwrap() == v2, "converged byte-exact");
    let partial = a
        .state_dir
        .join("cache/partial")
        .join(format!("{}.delta", Digest::of(&v2).hex()));
    assert!(!partial.exists(), "no half-rebuilt file left behind");
    a.stop();
}

/// The two kubectl releases `scripts/kubectl-releases.sh` fetched.
fn kubectl_release(version: &str) -> Vec<u8> {
    let cache = std::env::var_os("LKS_KUBE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").expect("HOME is set")).join(".cache/lksadmin")
        });
    let p = cache.join("kubectl-releases").join(version).join("kubectl");
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: fetch the kubectl releases with `bash scripts/kubectl-releases.sh` (scripts/setup.sh runs it)",
            p.display()
        )
    })
}

/// Issue [delta] item 6 on real binaries: kubectl 1.37.0 then 1.37.1 (two
/// adjacent patch releases, 62 MB each) published as app@1 and app@2. The
/// upgrade sends the node a patch under 2 % of the file (0.77 % measured),
/// counted as a delta with no whole-file byte, and the rebuilt file is
/// byte-exact and runs as kubectl 1.37.1.
#[test]
fn a_real_kubectl_patch_release_moves_under_two_percent() {
    let (v1, v2) = (kubectl_release("1.37.0"), kubectl_release("1.37.1"));
    let server = Server::start_with(&["--delta-interval", "1s"]);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let mut a = Agent::new("k0");
    a.join(&server, "c", &[]);
    a.start();
    assert_eq!(server.publish(&version(work.path(), "1", &v1)), "app@1");
    roll_out(&server, "app@1");
    wait_node_bundle(&server, "k0", "app", "1", "applied");
    let cached = a.state_dir.join("cache/sha256").join(Digest::of(&v1).hex());
    wait_until(
        Duration::from_secs(60),
        "kubectl 1.37.0 in the node's cache",
        || cached.exists(),
    );

    assert_eq!(server.publish(&version(work.path(), "2", &v2)), "app@2");
    // Making it: about 20 s of one core for 62 MB (more on a busy machine).
    let mut d = serde_json::Value::Null;
    wait_until(Duration::from_secs(240), "the patch of app@2", || {
        let b = server.lksctl_json(&["bundle", "get", "app@2"]);
        d = b["deltas"][0].clone();
        !d.is_null()
    });
    assert_eq!(d["algorithm"], "bsdiff4-zstd", "{d}");
    let patch = d["size"].as_u64().unwrap();
    assert!(
        patch * 50 < v2.len() as u64,
        "a patch of {patch} bytes for {} bytes",
        v2.len()
    );
    let (delta0, whole0) = (served(&server, "delta"), served(&server, "whole"));
    let fetched = roll_out(&server, "app@2");
    wait_node_bundle(&server, "k0", "app", "2", "applied");
    assert_eq!(
        (&fetched["as_delta"], &fetched["whole"]),
        (&patch.into(), &0.into()),
        "{fetched}"
    );
    assert_eq!(served(&server, "delta") - delta0, patch);
    assert_eq!(served(&server, "whole"), whole0, "no whole file");
    let installed = a.root.join(&PATH[1..]);
    assert!(std::fs::read(&installed).unwrap() == v2, "rebuilt byte-exact");
    let out = std::process::Command::new(&installed)
        .args(["version", "--client"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("v1.37.1"), "the rebuilt kubectl runs: {text}");
    println!(
        "DELTA kubectl 1.37.0 -> 1.37.1: file={} patch={patch} ({:.2} %)",
        v2.len(),
        patch as f64 * 100.0 / v2.len() as f64
    );
    a.stop();
}

/// Also the older format: replicas told to make `bsdiff4` patches (for a
/// fleet of agents from before `bsdiff4-zstd`), which agents still apply.
#[test]
fn replicas_on_etcd_serve_patches_another_replica_made() {
    let etcd = Etcd::start();
    let args = ["--delta-interval", "1s", "--delta-algorithm", "bsdiff4"];
    let r1 = etcd.replica("/lks-test-delta/", &args);
    let r2 = etcd.replica("/lks-test-delta/", &args);
    scenario(&r1, &r2, "bsdiff4", None);
}

#[test]
fn with_peer_sharing_a_patch_crosses_from_the_server_about_once() {
    const NODES: usize = 4;
    let server = Server::start_with(&["--delta-interval", "1s"]);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let v1 = noise(SIZE, 21);
    let v2 = next_release(&v1, 1);
    // Two waves: p0, p1, then p2, p3.
    let mut agents: Vec<(Agent, std::net::SocketAddr)> = (0..NODES)
        .map(|i| {
            let mut a = Agent::new(&format!("p{i}"));
            a.join(&server, "c", &["--labels", &format!("wave={}", 1 + i / 2)]);
            let peer = lks_e2e::free_addr();
            a.run_args = vec!["--peer-listen".into(), peer.to_string()];
            a.start();
            (a, peer)
        })
        .collect();
    server.lksctl_ok(&["cluster", "set", "c", "--peer-sharing", "on"]);
    for (_, peer) in &agents {
        peer_listening(peer);
    }
    app_1_in_every_nodes_cache(&server, &work, &v1, &agents);
    let patch_size = wave_1_takes_the_patch_from_the_server_once(&server, &work, &v2, &agents);
    wave_2_does_not_wait_for_peers_that_forgot_the_patch(&server, &v2, patch_size, &mut agents);
    for (a, _) in &mut agents {
        a.stop();
    }
}

/// Waits until a node's peer listener at `peer` accepts connections.
fn peer_listening(peer: &std::net::SocketAddr) {
    wait_until(Duration::from_secs(20), "peer listener up", || {
        std::net::TcpStream::connect_timeout(peer, Duration::from_millis(300)).is_ok()
    });
}

/// Rolls `id` out to `selector`'s nodes two at a time and waits; returns
/// the rollout's ID and what its nodes fetched.
fn roll_waves(server: &Server, id: &str, selector: &str) -> (String, serde_json::Value) {
    let out = server.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "c",
        "--bundle",
        id,
        "--selector",
        selector,
        "--batch-size",
        "2",
        "--wait",
    ]);
    let rid = out.lines().next().unwrap_or_default().trim().to_string();
    let fetched = server.lksctl_json(&["rollout", "status", &rid])["fetched"].clone();
    (rid, fetched)
}

/// Each of `agents` holds app@2, rebuilt byte-exact from a patch.
fn rebuilt_from_the_patch(server: &Server, v2: &[u8], agents: &[(Agent, std::net::SocketAddr)]) {
    for (a, _) in agents {
        wait_node_bundle(server, &a.name, "app", "2", "applied");
        assert_eq!(
            std::fs::read(a.root.join(&PATH[1..])).unwrap(),
            v2,
            "{}: rebuilt byte-exact",
            a.name
        );
        assert!(
            a.log().contains("blob rebuilt from a delta and verified"),
            "{}",
            a.name
        );
    }
}

/// app@1 rolled out to every node and in its cache.
fn app_1_in_every_nodes_cache(
    server: &Server,
    work: &tempfile::TempDir,
    v1: &[u8],
    agents: &[(Agent, std::net::SocketAddr)],
) {
    assert_eq!(server.publish(&version(work.path(), "1", v1)), "app@1");
    roll_waves(server, "app@1", "");
    for (a, _) in agents {
        let cached = a.state_dir.join("cache/sha256").join(Digest::of(v1).hex());
        wait_until(Duration::from_secs(30), "app@1 in the node's cache", || {
            cached.exists()
        });
    }
}

/// Wave 1: a seed, and a node that takes the patch from it: the patch
/// crosses from the server once, as `rollout status` (JSON and text) and
/// `rollout list` say. Returns the patch's size.
fn wave_1_takes_the_patch_from_the_server_once(
    server: &Server,
    work: &tempfile::TempDir,
    v2: &[u8],
    agents: &[(Agent, std::net::SocketAddr)],
) -> u64 {
    assert_eq!(server.publish(&version(work.path(), "2", v2)), "app@2");
    let patch_size = wait_deltas(server, "2", 1)[0]["size"].as_u64().unwrap();
    let (delta0, whole0) = (served(server, "delta"), served(server, "whole"));
    let (rid, fetched) = roll_waves(server, "app@2", "wave=1");
    rebuilt_from_the_patch(server, v2, &agents[..2]);
    let from_server = served(server, "delta") - delta0;
    assert_eq!(served(server, "whole"), whole0, "no whole file");
    assert_eq!(from_server, patch_size, "the patch crossed from the server once");
    assert_eq!(
        (&fetched["as_delta"], &fetched["from_peers"], &fetched["whole"]),
        (&patch_size.into(), &patch_size.into(), &0.into()),
        "one node took it from the server, the other from that node: {fetched}"
    );
    println!("PEERS patch={patch_size} server_sent={from_server} fetched={fetched}");
    // The same in the text forms: `rollout status` (and `--watch`), and a
    // column of `rollout list`.
    let line =
        format!("{patch_size} B from the server ({patch_size} B as deltas), {patch_size} B from peers");
    for args in [
        vec!["rollout", "status", &rid],
        vec!["rollout", "status", &rid, "--watch"],
    ] {
        let text = server.lksctl_ok(&args);
        assert!(text.contains(&format!("Fetched:    {line}")), "{text}");
    }
    let list = server.lksctl_ok(&["rollout", "list"]);
    let cell = format!("{patch_size} B/{patch_size} B/{patch_size} B");
    assert!(
        list.lines()
            .any(|l| l.starts_with(&rid) && l.trim_end().ends_with(&cell)),
        "{list}"
    );

    patch_size
}

/// Wave 2, after wave 1's agents restarted: they forgot the patch they
/// held (the tracker still names them); the new nodes drop them at
/// their first word and do not wait out the swarm's stall.
fn wave_2_does_not_wait_for_peers_that_forgot_the_patch(
    server: &Server,
    v2: &[u8],
    patch_size: u64,
    agents: &mut [(Agent, std::net::SocketAddr)],
) {
    for (a, peer) in &mut agents[..2] {
        a.stop();
        a.start();
        peer_listening(peer);
    }
    for (a, _) in &agents[..2] {
        a.wait_connected();
    }
    let started = std::time::Instant::now();
    let (_, fetched) = roll_waves(server, "app@2", "wave=2");
    let took = started.elapsed();
    rebuilt_from_the_patch(server, v2, &agents[2..]);
    assert!(
        took < Duration::from_secs(12),
        "wave 2 took {took:?}: waited for peers that do not hold the patch"
    );
    assert_eq!(fetched["whole"], 0, "{fetched}");
    assert_eq!(
        fetched["as_delta"].as_u64().unwrap() + fetched["from_peers"].as_u64().unwrap(),
        2 * patch_size,
        "{fetched}"
    );
    println!("PEERS wave 2 took {took:?} fetched={fetched}");
}

/// A patch of several pieces (over the 8 MiB a blob without a piece list
/// may have to move through peers): the server gives its piece list with
/// the offer, and peers pass it on piece by piece, each checked.
#[test]
fn with_peer_sharing_a_patch_of_several_pieces_moves_in_checked_pieces() {
    const NODES: usize = 3;
    const BIG: usize = 24 << 20;
    let server = Server::start_with(&["--delta-interval", "1s"]);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let v1 = noise(BIG, 31);
    // 10 MiB of new bytes: a patch of about that, three 4 MiB pieces.
    let mut v2 = v1.clone();
    v2[4 << 20..14 << 20].copy_from_slice(&noise(10 << 20, 32));
    let mut agents: Vec<Agent> = (0..NODES)
        .map(|i| {
            let mut a = Agent::new(&format!("q{i}"));
            a.join(&server, "c", &[]);
            let peer = lks_e2e::free_addr();
            a.run_args = vec!["--peer-listen".into(), peer.to_string()];
            a.start();
            wait_until(Duration::from_secs(20), "agent up", || a.running());
            a
        })
        .collect();
    server.lksctl_ok(&["cluster", "set", "c", "--peer-sharing", "on"]);
    let batch = NODES.to_string();
    let roll = |id: &str| {
        let out = server.lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c",
            "--bundle",
            id,
            "--batch-size",
            &batch,
            "--wait",
        ]);
        let rid = out.lines().next().unwrap_or_default().trim().to_string();
        server.lksctl_json(&["rollout", "status", &rid])["fetched"].clone()
    };
    assert_eq!(server.publish(&version(work.path(), "1", &v1)), "app@1");
    roll("app@1");
    for a in &agents {
        let cached = a.state_dir.join("cache/sha256").join(Digest::of(&v1).hex());
        wait_until(Duration::from_secs(30), "app@1 in the node's cache", || {
            cached.exists()
        });
    }
    assert_eq!(server.publish(&version(work.path(), "2", &v2)), "app@2");
    let patch_size = wait_deltas(&server, "2", 1)[0]["size"].as_u64().unwrap();
    assert!(patch_size > 8 << 20, "a patch of {patch_size} bytes");
    let delta0 = served(&server, "delta");
    let fetched = roll("app@2");
    for a in &agents {
        wait_node_bundle(&server, &a.name, "app", "2", "applied");
        assert_eq!(std::fs::read(a.root.join(&PATH[1..])).unwrap(), v2, "{}", a.name);
        assert!(
            a.log().contains("blob rebuilt from a delta and verified"),
            "{}",
            a.name
        );
    }
    let from_server = served(&server, "delta") - delta0;
    println!("PIECES patch={patch_size} server_sent={from_server} fetched={fetched}");
    assert_eq!(fetched["whole"], 0, "{fetched}");
    assert!(
        from_server <= 2 * patch_size,
        "the server sent {from_server} bytes of a {patch_size}-byte patch to {NODES} nodes"
    );
    assert!(
        fetched["from_peers"].as_u64().unwrap() >= patch_size,
        "peers passed the patch on: {fetched}"
    );
    for a in &mut agents {
        a.stop();
    }
}

/// BENCHMARKS.md, "Binary deltas end to end": a rollout of `v1` then of
/// `v2` (through a patch) to `LKS_DELTA_BENCH_NODES` nodes (default 8)
/// with peer sharing on, from files given in `LKS_DELTA_BENCH_V1` and
/// `LKS_DELTA_BENCH_V2`: time, bytes the server sent (whole and as
/// deltas) and bytes nodes took from peers, for each. The v1 rollout is
/// the same run's whole-file baseline. `LKS_DELTA_BENCH_ALGORITHM`: the
/// server's `--delta-algorithm` (default: its default).
///
/// `LKS_DELTA_BENCH_V1=old LKS_DELTA_BENCH_V2=new cargo test -p lks-e2e
/// --test delta bench -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark: needs two real binaries (see the doc comment)"]
fn bench_a_patch_release_to_nodes_sharing_with_peers() {
    let file = |var: &str| {
        let p = std::env::var(var).unwrap_or_else(|_| panic!("{var}: the path of a binary"));
        std::fs::read(&p).unwrap_or_else(|e| panic!("{var}={p}: {e}"))
    };
    let (v1, v2) = (file("LKS_DELTA_BENCH_V1"), file("LKS_DELTA_BENCH_V2"));
    let nodes: usize = std::env::var("LKS_DELTA_BENCH_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    let mut args = vec!["--delta-interval".to_string(), "1s".into()];
    if let Ok(alg) = std::env::var("LKS_DELTA_BENCH_ALGORITHM") {
        args.extend(["--delta-algorithm".into(), alg]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_with(&args);
    server.create_cluster("c");
    let work = tempfile::tempdir().unwrap();
    let mut agents: Vec<Agent> = (0..nodes)
        .map(|i| {
            let mut a = Agent::new(&format!("b{i}"));
            a.join(&server, "c", &[]);
            a.run_args = vec!["--peer-listen".into(), lks_e2e::free_addr().to_string()];
            a.start();
            a
        })
        .collect();
    server.lksctl_ok(&["cluster", "set", "c", "--peer-sharing", "on"]);
    std::thread::sleep(Duration::from_secs(6));
    let batch = nodes.to_string();
    let sent = |kind: &str| served(&server, kind);
    let roll = |id: &str| {
        let (d0, w0) = (sent("delta"), sent("whole"));
        let t = std::time::Instant::now();
        let out = server.lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c",
            "--bundle",
            id,
            "--batch-size",
            &batch,
            "--wait",
        ]);
        let took = t.elapsed();
        let rid = out.lines().next().unwrap_or_default().trim().to_string();
        let f = server.lksctl_json(&["rollout", "status", &rid])["fetched"].clone();
        println!(
            "BENCH {id} nodes={nodes} took={:.1}s server_whole={} server_delta={} from_peers={} fetched={f}",
            took.as_secs_f64(),
            sent("whole") - w0,
            sent("delta") - d0,
            f["from_peers"]
        );
    };
    assert_eq!(server.publish(&version(work.path(), "1", &v1)), "app@1");
    roll("app@1");
    for a in &agents {
        let cached = a.state_dir.join("cache/sha256").join(Digest::of(&v1).hex());
        wait_until(Duration::from_secs(120), "app@1 in the node's cache", || {
            cached.exists()
        });
    }
    let t = std::time::Instant::now();
    assert_eq!(server.publish(&version(work.path(), "2", &v2)), "app@2");
    let published = t.elapsed();
    let d = wait_deltas(&server, "2", 1);
    println!(
        "BENCH file={} patch={} {} ({:.2} %) publish={:.1}s patch_listed_after={:.1}s",
        v2.len(),
        d[0]["size"],
        d[0]["algorithm"],
        d[0]["size"].as_u64().unwrap() as f64 * 100.0 / v2.len() as f64,
        published.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    roll("app@2");
    for a in &agents {
        wait_node_bundle(&server, &a.name, "app", "2", "applied");
        assert_eq!(std::fs::read(a.root.join(&PATH[1..])).unwrap(), v2, "{}", a.name);
        // Where each node's time went: the patch's fetch and the rebuild.
        let log = a.log();
        let ms = |what: &str| {
            log.lines()
                .filter(|l| l.contains(what))
                .filter_map(|l| {
                    l.split(" ms=")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .collect::<Vec<_>>()
        };
        println!(
            "BENCH {} fetched_ms={:?} rebuilt_ms={:?}",
            a.name,
            ms("blob fetched and verified"),
            ms("blob rebuilt from a delta and verified")
        );
    }
    for a in &mut agents {
        a.stop();
    }
}
