//! A rolling upgrade of the replicas across releases (issue [ops] item 2;
//! control-server/README.md, "Version skew"), run by `bash scripts/skew.sh
//! REV`, which builds REV's binaries into `LKS_SKEW_OLD_BIN`:
//! three replicas of REV on a three-member etcd hold 120 simulated agents
//! (this tree's lks-loadgen) and drive a rollout in small batches; mid-way
//! they are replaced one by one, highest first as a StatefulSet's rolling
//! update does, by this tree's build on the same data dirs and ports.
//! While the region is mixed, what needs every replica upgraded (a rollout
//! that drains) is refused by a new replica, naming the old one; once all
//! are new it is accepted. The rollout completes, every node has the
//! version applied, no agent was sent it in two generations, nothing
//! stored before the upgrade is lost.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lks_e2e::etcd::EtcdCluster;
use lks_e2e::server::Server;
use lks_e2e::{KillOnDrop, bin, wait_until};

const AGENTS: usize = 120;

fn rollout(s: &Server, id: &str) -> serde_json::Value {
    s.lksctl_json(&["rollout", "status", id])
}

fn connected(s: &Server) -> usize {
    s.lksctl_json(&["node", "list"])
        .as_array()
        .map_or(0, |a| a.iter().filter(|n| n["connected"] == true).count())
}

#[test]
#[ignore = "bash scripts/skew.sh REV runs it with REV's binaries in LKS_SKEW_OLD_BIN"]
fn replicas_of_the_release_before_are_replaced_one_by_one_mid_rollout() {
    let old_bin = PathBuf::from(
        std::env::var_os("LKS_SKEW_OLD_BIN").expect("LKS_SKEW_OLD_BIN: run bash scripts/skew.sh REV"),
    );
    let old = old_bin.join("lks-control-server");
    let rev = std::env::var("LKS_SKEW_OLD_REV").unwrap_or_else(|_| "the release before".into());
    let etcd = EtcdCluster::start(3);
    let prefix = "/lks-skew/";
    let (mut r, mut lg) = three_old_replicas_holding_the_loadgen_agents(&etcd, &old, prefix);
    let id = a_rollout_in_small_batches_is_a_fifth_done(&r[0]);
    replace_the_replicas_one_by_one_highest_first(&mut r, &id, &rev);
    the_rollout_completes_and_a_drain_is_accepted_once_all_are_new(&r, &id);
    nothing_stored_before_the_upgrade_is_lost(&r, &id);
    the_loadgen_saw_no_auth_error_nor_a_version_sent_twice(&mut lg, &r);
}

/// Three replicas of the old release on `etcd` (r0 elected first) and
/// lks-loadgen's AGENTS agents, all connected, spread over them.
fn three_old_replicas_holding_the_loadgen_agents(
    etcd: &EtcdCluster,
    old: &Path,
    prefix: &str,
) -> (Vec<Server>, KillOnDrop) {
    let mut r = vec![etcd.replica_of(old, prefix, &[])];
    wait_until(Duration::from_secs(15), "r0 elected", || {
        r[0].log().contains("elected: this replica drives rollouts")
    });
    r.push(etcd.replica_of(old, prefix, &[]));
    r.push(etcd.replica_of(old, prefix, &[]));
    let servers = r.iter().map(Server::url).collect::<Vec<_>>().join(",");

    let mut lg = Command::new(bin("lks-loadgen"));
    lg.arg("--config")
        .arg(r[0].admin_conf_path())
        .args(["--cluster", "skew", "--agents", &AGENTS.to_string()])
        .args([
            "--servers",
            &servers,
            "--hold",
            "900",
            "--keep-nodes",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let lg = KillOnDrop(Some(lg.spawn().expect("start lks-loadgen")));
    wait_until(Duration::from_secs(120), "every agent connected", || {
        connected(&r[0]) == AGENTS
    });

    (r, lg)
}

/// app@1 rolled out in batches of 5 every 2 s, until a fifth of the
/// nodes are updated. Returns the rollout's ID.
fn a_rollout_in_small_batches_is_a_fifth_done(r0: &Server) -> String {
    let dir = r0.write_bundle("b", "app", "1", &[("/etc/app.conf", b"a=1\n", "0644")]);
    r0.publish(&dir);
    let id = r0
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "skew",
            "--bundle",
            "app@1",
            "--batch-size",
            "5",
            "--batch-interval",
            "2s",
        ])
        .trim()
        .to_string();
    wait_until(Duration::from_secs(60), "a fifth of the nodes updated", || {
        rollout(r0, &id)["updated"].as_u64() >= Some(AGENTS as u64 / 5)
    });

    id
}

/// Each replica replaced by this tree's build, highest first; the
/// rollout goes on after each.
fn replace_the_replicas_one_by_one_highest_first(r: &mut [Server], id: &str, rev: &str) {
    for i in (0..3).rev() {
        let before = rollout(&r[(i + 1) % 3], id)["updated"].as_u64().unwrap_or(0);
        eprintln!("skew: replacing replica {i} ({rev} -> this tree) at {before} updated");
        r[i].replace_program(None);
        wait_until(Duration::from_secs(30), "the new replica registered", || {
            r[i].log().contains("registered this replica")
        });
        if i == 2 {
            a_drain_is_refused_by_a_new_replica_while_mixed(&r[2]);
        }
        wait_until(Duration::from_secs(60), "the rollout goes on", || {
            let ro = rollout(&r[i], id);
            ro["state"] == "completed" || ro["updated"].as_u64() > Some(before)
        });
    }
}

/// Mixed: a rollout that drains needs every replica upgraded; a new
/// replica refuses it in one line naming the old one.
fn a_drain_is_refused_by_a_new_replica_while_mixed(r2: &Server) {
    r2.lksctl_ok(&["cluster", "create", "drained"]);
    let kubeconfig = r2.work_dir().join("tenant.kubeconfig");
    std::fs::write(&kubeconfig, tenant_kubeconfig()).unwrap();
    r2.lksctl_ok(&[
        "cluster",
        "set",
        "drained",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    let out = r2.lksctl(&[
        "rollout",
        "start",
        "--cluster",
        "drained",
        "--bundle",
        "app@1",
        "--drain",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused while mixed: {err}");
    assert!(
        err.contains("waits until every replica is upgraded") && err.contains("replica "),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Agents of a replica being replaced are offline for a moment: those
/// whose turn came then were deferred (`--offline defer`, the default)
/// and catch up once back, the completed rollout still driven for them.
/// All new, a rollout that drains is accepted.
fn the_rollout_completes_and_a_drain_is_accepted_once_all_are_new(r: &[Server], id: &str) {
    wait_until(
        Duration::from_secs(180),
        "the rollout completed, every node updated",
        || {
            let ro = rollout(&r[0], id);
            ro["state"] == "completed" && ro["updated"] == AGENTS as u64
        },
    );
    let ro = rollout(&r[1], id);
    assert_eq!(ro["updated"], AGENTS as u64, "{ro}");
    assert_eq!(ro["failed"], 0, "{ro}");

    // All new: the drain is accepted now (the cluster has no node: it ends
    // at once).
    let drained = r[0]
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "drained",
            "--bundle",
            "app@1",
            "--drain",
        ])
        .trim()
        .to_string();
    let d = rollout(&r[0], &drained);
    assert!(d["drain"].is_object(), "a rollout that drains: {d}");
}

/// Nothing lost: every node listed with app@1 applied, the bundle and
/// the old release's StartRollout audit record still there.
fn nothing_stored_before_the_upgrade_is_lost(r: &[Server], id: &str) {
    let nodes = r[2].lksctl_json(&["node", "list"]);
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), AGENTS);
    for n in nodes {
        let b = &n["bundles"][0];
        assert_eq!(
            (&b["version"], &b["state"]),
            (&"1".into(), &"applied".into()),
            "{n}"
        );
    }
    let bundles = r[1].lksctl_json(&["bundle", "list"]);
    assert!(bundles.to_string().contains("\"app\""), "{bundles}");
    let audit = r[1].lksctl_json(&["audit"]);
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["verb"] == "StartRollout" && a["target"].as_str().is_some_and(|t| t.starts_with(id))),
        "the start made by the old release is still in the audit trail"
    );
}

/// lks-loadgen, stopped, reports no auth error and no agent sent the
/// version twice; no replica panicked or read something unreadable.
fn the_loadgen_saw_no_auth_error_nor_a_version_sent_twice(lg: &mut KillOnDrop, r: &[Server]) {
    let pid = lg.0.as_ref().unwrap().id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = lg.0.take().unwrap().wait_with_output().unwrap();
    assert!(out.status.success(), "lks-loadgen: {:?}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("loadgen JSON");
    eprintln!("skew: loadgen report {report}");
    assert_eq!(report["auth_errors"], 0, "{report}");
    assert_eq!(
        report["assigned_twice"], 0,
        "no agent was sent the version twice: {report}"
    );
    for (i, s) in r.iter().enumerate() {
        let log = s.log();
        for bad in ["panicked", "unreadable"] {
            assert!(!log.contains(bad), "replica {i} logged {bad:?}:\n{log}");
        }
    }
}

/// A tenant kubeconfig whose API is nowhere (loopback port 9, discard):
/// stored, never reached.
fn tenant_kubeconfig() -> String {
    use base64::Engine as _;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(cert.pem());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:9\n    \
         certificate-authority-data: {ca}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: u\n\
         current-context: t\nusers:\n- name: u\n  user:\n    token: abc\n"
    )
}
