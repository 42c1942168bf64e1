//! Reboots (issue [reboots], first part) with the real server, lksctl and a
//! sandboxed agent (`--root`, its boot ID in a file of the test's): a
//! bundle with `reboot = "required"` and the OS sentinel make the node
//! report that it needs a reboot, with the reason; `lksctl node reboot`
//! runs the agent's reboot command exactly once, and the node, back with a
//! new boot ID, reports the reboot done, and the server takes the request
//! out of its desired state (no second reboot for an agent whose
//! `reboot.json` is lost). An agent without the "reboot"
//! feature is refused such a bundle and a reboot request.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use lks_e2e::agent::{Agent, BundleFile, CONVERGE, node_events, publish_and_roll_out, write_bundle};
use lks_e2e::server::{Server, TestNode, next_desired};
use lks_e2e::wait_until;

/// A bundle `name@version` of one file that requires a reboot.
fn reboot_bundle(parent: &Path, name: &str, version: &str) -> std::path::PathBuf {
    let dir = write_bundle(
        parent,
        name,
        version,
        &[BundleFile {
            path: "/boot/vmlinuz-test",
            content: b"a kernel\n",
            mode: "0644",
        }],
        "",
    );
    let toml = dir.join("bundle.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(&toml, format!("reboot = \"required\"\n{text}")).unwrap();
    dir
}

/// `lksadmin-agent status -o json` in the agent's boot (its boot-ID file).
fn local_status(agent: &Agent, boot_id_file: &Path) -> serde_json::Value {
    let mut cmd = std::process::Command::new(lks_e2e::bin("lksadmin-agent"));
    cmd.args([
        "status",
        "--state-dir",
        agent.state_dir.to_str().unwrap(),
        "-o",
        "json",
    ])
    .env("LKS_AGENT_BOOT_ID_FILE", boot_id_file);
    let out = lks_e2e::ok_stdout(&lks_e2e::run(cmd), "lksadmin-agent status");
    serde_json::from_str(&out).unwrap()
}

/// The node as `node list -o json` shows it.
fn listed(server: &Server, node: &str) -> serde_json::Value {
    server
        .lksctl_json(&["node", "list"])
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == node).cloned())
        .unwrap_or_default()
}

#[test]
fn a_required_reboot_is_reported_and_a_reboot_request_runs_once() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut agent = Agent::new("worker-r");
    agent.heal_interval = "500ms".into();
    let boot_id_file = agent.work_dir().join("boot_id");
    std::fs::write(&boot_id_file, "boot-1\n").unwrap();
    let marker = agent.work_dir().join("rebooted");
    let script = agent.work_dir().join("reboot.sh");
    // What a real reboot does to the agent's world: a new boot ID, /var/run
    // emptied. The test restarts the agent, as the boot would.
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho rebooted >> '{}'\necho boot-2 > '{}'\nrm -f '{}'/var/run/reboot-required*\n",
            marker.display(),
            boot_id_file.display(),
            agent.root.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent.run_env.push((
        "LKS_AGENT_BOOT_ID_FILE".into(),
        boot_id_file.display().to_string(),
    ));
    agent.run_args = vec!["--reboot-command".into(), script.display().to_string()];
    agent.join(&server, "c1", &[]);
    agent.start();
    agent.wait_connected();
    wait_until(CONVERGE, "the node reports its boot and no reboot", || {
        let n = listed(&server, "worker-r");
        n["boot_id"] == "boot-1" && n["reboot"]["state"] == "none"
    });

    // A bundle that requires a reboot.
    let dir = reboot_bundle(server.work_dir(), "kernel", "1");
    publish_and_roll_out(&server, "c1", &dir, None);
    let shown = server.lksctl_json(&["bundle", "get", "kernel@1"]);
    assert_eq!(shown["reboot"], "required", "{shown}");
    assert!(
        server
            .lksctl_ok(&["bundle", "get", "kernel@1"])
            .contains("Reboot:     required\n")
    );
    agent.wait_bundle("kernel", "1", "applied");
    wait_until(CONVERGE, "required, for the bundle", || {
        let r = &listed(&server, "worker-r")["reboot"];
        r["state"] == "required" && r["reason"] == "bundle kernel@1" && r["since"].is_string()
    });
    let local = local_status(&agent, &boot_id_file);
    assert_eq!(
        (
            &local["reboot"]["state"],
            &local["reboot"]["reason"],
            &local["reboot"]["boot_id"]
        ),
        (
            &serde_json::json!("required"),
            &serde_json::json!("bundle kernel@1"),
            &serde_json::json!("boot-1")
        ),
        "{local}"
    );

    // The OS sentinel, with Debian's package list.
    std::fs::create_dir_all(agent.path("/var/run")).unwrap();
    std::fs::write(agent.path("/var/run/reboot-required.pkgs"), "linux-image-test\n").unwrap();
    std::fs::write(
        agent.path("/var/run/reboot-required"),
        "*** System restart required ***\n",
    )
    .unwrap();
    wait_until(CONVERGE, "the sentinel's packages are a reason too", || {
        listed(&server, "worker-r")["reboot"]["reason"] == "bundle kernel@1; packages: linux-image-test"
    });
    let table = server.lksctl_ok(&["node", "list"]);
    assert!(table.lines().next().unwrap().ends_with("REBOOT"), "{table}");
    assert!(
        table.contains("required: bundle kernel@1; packages: linux-image-t…"),
        "{table}"
    );

    // The reboot: the command runs once; the restarted agent, in a new boot,
    // reports it done.
    let out = server.lksctl_ok(&["node", "reboot", "worker-r"]);
    assert!(
        out.starts_with("node worker-r: reboot requested (request "),
        "{out}"
    );
    let requested = listed(&server, "worker-r")["reboot"]["requested"]
        .as_u64()
        .unwrap();
    assert!(requested > 0);
    wait_until(CONVERGE, "the reboot command ran", || marker.exists());
    wait_until(CONVERGE, "the node reports rebooting", || {
        let r = &listed(&server, "worker-r")["reboot"];
        r["state"] == "rebooting" && r["request"] == requested
    });
    assert_eq!(agent.stop(), Some(0));
    agent.start();
    wait_until(CONVERGE, "back with a new boot ID, nothing owed", || {
        let n = listed(&server, "worker-r");
        n["boot_id"] == "boot-2" && n["reboot"]["state"] == "none" && n["reboot"]["request"] == requested
    });
    // Connected again with the request still in its desired state: not run again.
    agent.wait_connected();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "rebooted\n",
        "exactly once"
    );
    let local = local_status(&agent, &boot_id_file);
    assert_eq!(
        (&local["reboot"]["state"], &local["reboot"]["request"]),
        (&serde_json::json!("none"), &serde_json::json!(requested)),
        "{local}"
    );
    // Carried out, the request leaves the desired state: an agent whose
    // reboot.json is deleted by hand does not reboot again.
    wait_until(CONVERGE, "the request is cleared", || {
        listed(&server, "worker-r")["reboot"]["requested"] == 0
    });
    assert_eq!(agent.stop(), Some(0));
    std::fs::remove_file(agent.state_dir.join("reboot.json")).unwrap();
    agent.start();
    agent.wait_connected();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "rebooted\n",
        "not again without its record"
    );
    assert!(
        node_events(&server, "worker-r")
            .iter()
            .any(|(k, m)| k == "reboot_requested" && m.starts_with("reboot requested by ")),
        "{:?}",
        node_events(&server, "worker-r")
    );
    assert_eq!(agent.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_the_reboot_feature_is_refused_the_bundle_and_the_request() {
    let s = Server::start();
    s.create_cluster("c1");
    let t = s.token("c1", &["--uses", "3"]);
    let old = TestNode::enroll(&s, &t, "old", &[]).await;
    let offline = TestNode::enroll(&s, &t, "offline", &[]).await;
    let mut downgraded = TestNode::enroll(&s, &t, "downgraded", &[]).await;

    // A request reaches an agent with the feature in its desired state, and
    // never one without it (the same node on an older agent).
    downgraded.features = vec!["reboot".into()];
    let (tx, mut rx) = downgraded.connect(vec![]).await.expect("connect");
    assert_eq!(next_desired(&mut rx).await.reboot, None);
    wait_until(CONVERGE, "connected", || {
        listed(&s, "downgraded")["connected"] == true
    });
    let out = s.lksctl_ok(&["node", "reboot", "downgraded"]);
    assert!(out.starts_with("node downgraded: reboot requested"), "{out}");
    let id = next_desired(&mut rx).await.reboot.expect("a reboot request").id;
    assert!(id > 0);
    drop((tx, rx));
    downgraded.features.clear();
    let (_tx, mut rx) = downgraded.connect(vec![]).await.expect("reconnect");
    assert_eq!(next_desired(&mut rx).await.reboot, None, "not to an older agent");
    let (_tx, _rx) = old.connect(vec![]).await.expect("connect old");
    wait_until(CONVERGE, "connected", || listed(&s, "old")["connected"] == true);

    // A reboot value other than "required": one line at publish.
    let bad = reboot_bundle(s.work_dir(), "bad", "1");
    let toml = bad.join("bundle.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        text.replace("reboot = \"required\"", "reboot = \"always\""),
    )
    .unwrap();
    let out = s.lksctl(&["bundle", "publish", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reboot: \"always\" is not a reboot policy") && err.trim().lines().count() == 1,
        "{err}"
    );

    let refused = s.lksctl(&["node", "reboot", "old"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("the agent of node old (test-agent/0) does not announce the \"reboot\" feature"),
        "{err}"
    );
    let refused = s.lksctl(&["node", "reboot", "offline"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("node offline is not connected"),
        "{err}"
    );
    drop(offline);

    let dir = reboot_bundle(s.work_dir(), "kernel", "1");
    let id = publish_and_roll_out(&s, "c1", &dir, None);
    let mut msg = String::new();
    wait_until(CONVERGE, "the old agent fails at its turn", || {
        let st = s.lksctl_json(&["rollout", "status", &id]);
        let n = st["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["name"] == "old").cloned())
            .unwrap_or_default();
        msg = n["message"].as_str().unwrap_or_default().to_string();
        n["state"] == "failed"
    });
    assert!(
        msg.starts_with("its agent does not announce the \"reboot\" feature kernel@1 needs"),
        "{msg}"
    );
}
