//! Applying bundles with the real server, lksctl and agent: exact bytes and
//! modes, steps with their environment, a health-gated rollback to the exact
//! previous files, and drift repaired by self-heal (with the bundle's
//! `on_heal` steps, which an agent from before them is refused).

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lks_e2e::agent::{Agent, BundleFile, node_events, publish_and_roll_out, wait_node_bundle, write_bundle};
use lks_e2e::server::{Server, TestNode};
use lks_e2e::wait_until;

fn step_logging_env(name: &str) -> String {
    format!(
        "[[step]]\nname = \"{name}\"\nrun = [\"sh\", \"-c\", \"echo $LKS_BUNDLE $LKS_VERSION $LKS_NODE $LKS_ROOT >> $LKS_ROOT/steps.log\"]\n"
    )
}

#[test]
fn apply_then_health_gated_rollback_restores_exact_previous_files() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("worker-1");
    agent.join(&server, "c1", &[]);
    agent.start();

    let v1 = write_bundle(
        server.work_dir(),
        "kubelet",
        "1.0",
        &[
            BundleFile {
                path: "/etc/kubernetes/kubelet.conf",
                content: b"kubelet config v1\n",
                mode: "0600",
            },
            BundleFile {
                path: "/usr/local/bin/kubelet",
                content: b"\x7fELF kubelet v1",
                mode: "0755",
            },
        ],
        &format!(
            "{}\n[health]\nrun = [\"sh\", \"-c\", \"test -x $LKS_ROOT/usr/local/bin/kubelet\"]\nretries = 2\ninterval = \"100ms\"\n",
            step_logging_env("restart kubelet")
        ),
    );
    publish_and_roll_out(&server, "c1", &v1, None);
    agent.wait_bundle("kubelet", "1.0", "applied");
    wait_node_bundle(&server, "worker-1", "kubelet", "1.0", "applied");
    assert_eq!(
        agent.read("/etc/kubernetes/kubelet.conf"),
        Some((b"kubelet config v1\n".to_vec(), 0o600))
    );
    assert_eq!(
        agent.read("/usr/local/bin/kubelet"),
        Some((b"\x7fELF kubelet v1".to_vec(), 0o755))
    );
    let root = agent.root.display().to_string();
    let log = std::fs::read_to_string(agent.path("/steps.log")).unwrap();
    assert_eq!(log, format!("kubelet 1.0 worker-1 {root}\n"));

    // v2 changes a file, adds one, and fails its health check.
    let v2 = write_bundle(
        server.work_dir(),
        "kubelet",
        "2.0",
        &[
            BundleFile {
                path: "/etc/kubernetes/kubelet.conf",
                content: b"kubelet config v2 (broken)\n",
                mode: "0644",
            },
            BundleFile {
                path: "/usr/local/bin/kubelet",
                content: b"\x7fELF kubelet v2",
                mode: "0755",
            },
            BundleFile {
                path: "/etc/kubernetes/extra.conf",
                content: b"new in v2",
                mode: "0644",
            },
        ],
        &format!(
            "{}\n[health]\nrun = [\"sh\", \"-c\", \"echo kubelet is not ready >&2; exit 1\"]\nretries = 2\ninterval = \"100ms\"\n",
            step_logging_env("restart kubelet")
        ),
    );
    publish_and_roll_out(&server, "c1", &v2, None);
    let msg = wait_node_bundle(&server, "worker-1", "kubelet", "2.0", "rolled_back");
    assert!(msg.contains("health check failed"), "{msg}");
    assert!(msg.contains("kubelet is not ready"), "{msg}");
    assert_eq!(
        agent.read("/etc/kubernetes/kubelet.conf"),
        Some((b"kubelet config v1\n".to_vec(), 0o600)),
        "exact previous bytes and mode"
    );
    assert_eq!(
        agent.read("/usr/local/bin/kubelet"),
        Some((b"\x7fELF kubelet v1".to_vec(), 0o755))
    );
    assert_eq!(
        agent.read("/etc/kubernetes/extra.conf"),
        None,
        "file added by v2 removed"
    );
    let log = std::fs::read_to_string(agent.path("/steps.log")).unwrap();
    assert_eq!(
        log.lines()
            .map(|l| l.split(' ').nth(1).unwrap())
            .collect::<Vec<_>>(),
        ["1.0", "2.0", "1.0"],
        "v2's steps ran, then v1's again after the rollback"
    );
    let events = node_events(&server, "worker-1");
    assert!(events.iter().any(|(k, _)| k == "rolled_back"), "{events:?}");
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn drift_is_repaired_and_reported() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("worker-2");
    agent.heal_interval = "500ms".into();
    agent.join(&server, "c1", &[]);
    agent.start();
    let dir = write_bundle(
        server.work_dir(),
        "conf",
        "1",
        &[
            BundleFile {
                path: "/etc/app/a.conf",
                content: b"alpha\n",
                mode: "0640",
            },
            BundleFile {
                path: "/etc/app/b.conf",
                content: b"beta\n",
                mode: "0600",
            },
        ],
        "",
    );
    publish_and_roll_out(&server, "c1", &dir, None);
    agent.wait_bundle("conf", "1", "applied");

    std::fs::write(agent.path("/etc/app/a.conf"), b"edited by hand\n").unwrap();
    std::fs::remove_file(agent.path("/etc/app/b.conf")).unwrap();
    wait_until(lks_e2e::agent::CONVERGE, "drift repaired", || {
        agent.read("/etc/app/a.conf") == Some((b"alpha\n".to_vec(), 0o640))
            && agent.read("/etc/app/b.conf") == Some((b"beta\n".to_vec(), 0o600))
    });
    wait_until(lks_e2e::agent::CONVERGE, "repair reported", || {
        agent.status()["last_repair"]["outcome"] == "repaired"
    });
    wait_until(lks_e2e::agent::CONVERGE, "repair event on the server", || {
        node_events(&server, "worker-2")
            .iter()
            .any(|(k, _)| k == "repaired")
    });

    // Offline too: with the server gone the agent still repairs from its cache.
    drop(server);
    std::fs::write(agent.path("/etc/app/a.conf"), b"edited while offline\n").unwrap();
    wait_until(lks_e2e::agent::CONVERGE, "drift repaired offline", || {
        agent.read("/etc/app/a.conf") == Some((b"alpha\n".to_vec(), 0o640))
    });
    assert_eq!(agent.stop(), Some(0));
}

/// With the periodic pass an hour away, drift is still repaired within
/// seconds: inotify on the managed files' directories wakes the agent for
/// an in-place edit, a replacement by rename, a chmod, and the removal of
/// the whole directory.
#[test]
fn drift_is_repaired_at_once_on_inotify() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("worker-3");
    agent.heal_interval = "1h".into();
    agent.join(&server, "c1", &[]);
    agent.start();
    let dir = write_bundle(
        server.work_dir(),
        "watched",
        "1",
        &[BundleFile {
            path: "/etc/watched/app.conf",
            content: b"managed\n",
            mode: "0644",
        }],
        "",
    );
    publish_and_roll_out(&server, "c1", &dir, None);
    agent.wait_bundle("watched", "1", "applied");
    let conf = agent.path("/etc/watched/app.conf");
    let intact = || agent.read("/etc/watched/app.conf") == Some((b"managed\n".to_vec(), 0o644));
    let soon = std::time::Duration::from_secs(10);

    std::fs::write(&conf, b"edited in place\n").unwrap();
    wait_until(soon, "an in-place edit repaired", intact);

    let tmp = agent.path("/etc/watched/app.conf.dpkg-new");
    std::fs::write(&tmp, b"replaced by rename\n").unwrap();
    std::fs::rename(&tmp, &conf).unwrap();
    wait_until(soon, "a replacement by rename repaired", intact);

    std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    wait_until(soon, "a chmod repaired", intact);

    std::fs::remove_dir_all(agent.path("/etc/watched")).unwrap();
    wait_until(soon, "the removed directory and file restored", intact);
    // Watched again after the directory came back.
    std::fs::write(&conf, b"edited again\n").unwrap();
    wait_until(soon, "an edit after the restore repaired", intact);
    assert_eq!(agent.stop(), Some(0));
}

/// A drifted drop-in is restored and the bundle's `on_heal` step (a
/// service restart) runs again, then its health check; the other step does
/// not. `bundle get` shows which step runs on heal.
#[test]
fn drift_repair_runs_the_on_heal_steps() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("worker-4");
    agent.heal_interval = "500ms".into();
    agent.join(&server, "c1", &[]);
    agent.start();
    let log = |line: &str| format!("[\"sh\", \"-c\", \"echo {line} >> $LKS_ROOT/steps.log\"]");
    let dir = write_bundle(
        server.work_dir(),
        "svc",
        "1",
        &[BundleFile {
            path: "/etc/svc/dropin.conf",
            content: b"ExecStart=/usr/bin/svc\n",
            mode: "0644",
        }],
        &format!(
            "[[step]]\nname = \"daemon-reload\"\nrun = {}\n\n\
             [[step]]\nname = \"restart svc\"\nrun = {}\non_heal = true\n\n\
             [health]\nrun = {}\n",
            log("reload"),
            log("restart-$LKS_VERSION"),
            log("healthy"),
        ),
    );
    publish_and_roll_out(&server, "c1", &dir, None);
    agent.wait_bundle("svc", "1", "applied");
    let lines = || {
        std::fs::read_to_string(agent.path("/steps.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(lines(), ["reload", "restart-1", "healthy"]);
    let steps = &server.lksctl_json(&["bundle", "get", "svc@1"])["manifest"]["steps"];
    assert_eq!(
        (&steps[0]["on_heal"], &steps[1]["on_heal"]),
        (&serde_json::json!(false), &serde_json::json!(true)),
        "{steps}"
    );
    assert!(
        server.lksctl_ok(&["bundle", "get", "svc@1"]).contains("ON HEAL"),
        "the human view has the column"
    );

    std::fs::write(agent.path("/etc/svc/dropin.conf"), b"ExecStart=/tmp/evil\n").unwrap();
    wait_until(
        lks_e2e::agent::CONVERGE,
        "drift repaired, step and check run",
        || lines().len() >= 5,
    );
    assert_eq!(
        agent.read("/etc/svc/dropin.conf"),
        Some((b"ExecStart=/usr/bin/svc\n".to_vec(), 0o644))
    );
    assert_eq!(lines()[3..], ["restart-1".to_string(), "healthy".to_string()]);
    let expected = "restored /etc/svc/dropin.conf (content changed); ran step \"restart svc\"; \
                    health check passed";
    wait_until(lks_e2e::agent::CONVERGE, "repair reported", || {
        agent.status()["last_repair"]["message"] == expected
    });
    wait_until(lks_e2e::agent::CONVERGE, "repair event on the server", || {
        node_events(&server, "worker-4")
            .iter()
            .any(|(k, m)| k == "repaired" && m == expected)
    });
    assert_eq!(lines().len(), 5, "one repair, one run: {:?}", lines());
    assert_eq!(agent.stop(), Some(0));
}

/// A bundle with an `on_heal` step fails a node whose agent does not
/// announce `heal-steps` at its turn, with the reason; one that does is
/// assigned it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_heal_steps_is_refused_a_bundle_that_has_them() {
    let s = Server::start();
    s.create_cluster("c1");
    let t = s.token("c1", &["--uses", "2"]);
    let old = TestNode::enroll(&s, &t, "old", &[]).await;
    let mut new = TestNode::enroll(&s, &t, "new", &[]).await;
    new.features.push("heal-steps".into());
    let (_t1, _r1) = old.connect(vec![]).await.expect("connect old");
    let (_t2, _r2) = new.connect(vec![]).await.expect("connect new");
    wait_until(lks_e2e::agent::CONVERGE, "both connected", || {
        let list = s.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .filter(|n| n["connected"] == true)
            .count()
            == 2
    });
    let dir = write_bundle(
        s.work_dir(),
        "svc",
        "1",
        &[BundleFile {
            path: "/etc/svc/dropin.conf",
            content: b"x\n",
            mode: "0644",
        }],
        "[[step]]\nname = \"restart svc\"\nrun = [\"true\"]\non_heal = true\n",
    );
    let b = s.publish(&dir);
    let id = s
        .lksctl_ok(&[
            "rollout",
            "start",
            "--cluster",
            "c1",
            "--bundle",
            &b,
            "--failure-threshold",
            "2",
            "--batch-size",
            "2",
        ])
        .trim()
        .to_string();
    let node = |st: &serde_json::Value, name: &str| {
        st["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == name).cloned())
            .unwrap_or_default()
    };
    let mut st = serde_json::Value::Null;
    wait_until(lks_e2e::agent::CONVERGE, "old failed, new assigned", || {
        st = s.lksctl_json(&["rollout", "status", &id]);
        node(&st, "old")["state"] == "failed" && node(&st, "new")["state"] == "applying"
    });
    let msg = node(&st, "old")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.starts_with("its agent does not announce the \"heal-steps\" feature svc@1 needs")
            && msg.ends_with("update the agent first"),
        "{msg}"
    );
}
