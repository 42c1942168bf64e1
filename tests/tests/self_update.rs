//! The agent replacing its own binary, end to end outside a VM: a real
//! server, lksctl and agent; the agent runs from a copy of its binary inside
//! its root, and the test plays systemd — it restarts the agent whenever it
//! exits and runs the package's real `lksadmin-agent-guard` after each stop,
//! as `ExecStopPost=` does. (tests/vm/self-update.sh does the same under real
//! systemd.)

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, CONVERGE, node_bundle, write_bundle};
use lks_e2e::server::Server;
use lks_e2e::{bin, one_line_error, wait_until};

fn guard() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/lksadmin-agent-guard")
}

/// A node whose agent runs from `<root>/usr/bin/lksadmin-agent`.
struct Node {
    agent: Agent,
    exe: PathBuf,
}

impl Node {
    fn join(server: &Server) -> Node {
        Node::join_with(server, &[])
    }

    fn join_with(server: &Server, extra: &[&str]) -> Node {
        let mut agent = Agent::new("node-1");
        let exe = agent.root.join("usr/bin/lksadmin-agent");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        std::fs::copy(bin("lksadmin-agent"), &exe).unwrap();
        agent.exe = exe.clone();
        agent.join(server, "c1", extra);
        agent.start();
        agent.wait_connected();
        Node { agent, exe }
    }

    /// One round of systemd: if the agent stopped, run the guard as
    /// `ExecStopPost=` would and start the agent again. True if it had stopped.
    fn supervise(&mut self) -> bool {
        let Some(st) = self.agent.exited() else {
            return false;
        };
        let (code, status, result) = match (st.code(), st.signal()) {
            (Some(c), _) => (
                "exited",
                c.to_string(),
                if c == 0 { "success" } else { "exit-code" },
            ),
            (None, Some(s)) => ("killed", s.to_string(), "signal"),
            _ => ("exited", "0".into(), "success"),
        };
        self.guard(
            "stopped",
            &[
                ("EXIT_CODE", code),
                ("EXIT_STATUS", &status),
                ("SERVICE_RESULT", result),
            ],
        );
        self.agent.start();
        true
    }

    fn guard(&self, mode: &str, env: &[(&str, &str)]) {
        let mut cmd = Command::new("sh");
        cmd.arg(guard())
            .arg(mode)
            .env("LKS_STATE_DIR", &self.agent.state_dir)
            .env("LKS_AGENT_BIN", &self.exe)
            .env("LKS_GUARD_NO_SYSTEMD", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "guard {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Supervises until `cond` holds.
    fn until(&mut self, what: &str, mut cond: impl FnMut(&mut Node) -> bool) -> u32 {
        let start = Instant::now();
        let mut restarts = 0;
        while !cond(self) {
            assert!(
                start.elapsed() < CONVERGE * 2,
                "timed out waiting for {what}; agent log:\n{}",
                self.agent.log()
            );
            if self.supervise() {
                restarts += 1;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        restarts
    }

    fn self_update_dir(&self) -> PathBuf {
        self.agent.state_dir.join("self-update")
    }
}

/// A self-update bundle carrying `binary`.
fn publish(server: &Server, version: &str, binary: &Path) -> String {
    let dir = server.work_dir().join(format!("agent-{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(binary, dir.join("lksadmin-agent")).unwrap();
    std::fs::write(
        dir.join("bundle.toml"),
        format!(
            "name = \"lksadmin-agent\"\nversion = \"{version}\"\nself_update = true\n\n\
             [[file]]\npath = \"/usr/bin/lksadmin-agent\"\nsource = \"lksadmin-agent\"\nmode = \"0755\"\n"
        ),
    )
    .unwrap();
    server.publish(&dir)
}

fn roll_out(server: &Server, bundle: &str) -> String {
    server
        .lksctl_ok(&["rollout", "start", "--cluster", "c1", "--bundle", bundle])
        .trim()
        .to_string()
}

fn sha(path: &Path) -> lks_proto::Digest {
    lks_proto::Digest::of_file(path).unwrap().0
}

/// A copy of the agent binary with bytes appended: another digest, and it
/// runs the same (the loader ignores what follows the ELF segments).
fn variant(dir: &Path, tag: &str) -> PathBuf {
    let p = dir.join(format!("lksadmin-agent-{tag}"));
    let mut b = std::fs::read(bin("lksadmin-agent")).unwrap();
    b.extend_from_slice(format!("\nlks-variant-{tag}\n").as_bytes());
    std::fs::write(&p, b).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A C program that answers `version` like an agent and then misbehaves
/// on `run`: `exit` (status 1) or `hang` (never returns).
fn bad_agent(dir: &Path, how: &str) -> PathBuf {
    let src = dir.join(format!("bad-{how}.c"));
    let run = match how {
        "exit" => "fprintf(stderr, \"bad agent: cannot start\\n\"); return 1;",
        _ => "for (;;) pause();",
    };
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n\
             int main(int argc, char **argv) {{\n\
               if (argc > 1 && strcmp(argv[1], \"version\") == 0) {{ puts(\"lksadmin-agent 9.9.9-{how}\"); return 0; }}\n\
               {run}\n}}\n"
        ),
    )
    .unwrap();
    let out = dir.join(format!("bad-{how}"));
    let st = Command::new("cc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc (build-essential)");
    assert!(st.success());
    out
}

#[test]
fn a_good_self_update_is_committed_once_the_new_agent_reports() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut n = Node::join(&server);
    let new = variant(server.work_dir(), "v2");
    let b = publish(&server, "2", &new);
    let id = roll_out(&server, &b);
    let restarts = n.until("the self-update applied", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent").is_some_and(|(v, s, _)| v == "2" && s == "applied")
    });
    assert_eq!(restarts, 1, "one hand-over, one restart");
    assert_eq!(sha(&n.exe), sha(&new), "the node runs the new binary");
    assert!(
        !n.self_update_dir().join("pending").exists() && !n.self_update_dir().join("fallback").exists(),
        "a committed self-update leaves no record and no fallback"
    );
    wait_until(CONVERGE, "the rollout completes", || {
        server.lksctl_json(&["rollout", "status", &id])["state"] == "completed"
    });
    let log = n.agent.log();
    assert!(log.contains("handing over from agent"), "{log}");

    // The new agent keeps following rollouts and repairing drift.
    let dir = write_bundle(
        server.work_dir(),
        "hello",
        "1",
        &[lks_e2e::agent::BundleFile {
            path: "/etc/hello.conf",
            content: b"hello\n",
            mode: "0644",
        }],
        "",
    );
    let hello = server.publish(&dir);
    roll_out(&server, &hello);
    n.until("hello applied by the new agent", |n| {
        n.agent.read("/etc/hello.conf").is_some()
    });
    std::fs::write(n.agent.path("/etc/hello.conf"), b"drift").unwrap();
    n.until("drift repaired by the new agent", |n| {
        n.agent.read("/etc/hello.conf").map(|(b, _)| b) == Some(b"hello\n".to_vec())
    });
    // Leaving the desired state never deletes the agent's binary.
    assert_eq!(sha(&n.exe), sha(&new));
}

#[test]
fn a_new_agent_that_exits_or_never_reports_is_replaced_by_the_previous_one() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut n = Node::join(&server);
    let original = sha(&n.exe);

    // Exits with status 1 at start: the guard restores the fallback.
    let exits = bad_agent(server.work_dir(), "exit");
    let b = publish(&server, "bad-exit", &exits);
    roll_out(&server, &b);
    n.until("the self-update rolled back", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent").is_some_and(|(_, s, _)| s == "rolled_back")
    });
    let (_, _, msg) = node_bundle(&server, "node-1", "lksadmin-agent").unwrap();
    assert!(
        msg.contains("rolled back to")
            && msg.contains("stopped before it reconnected")
            && msg.contains("exited 1"),
        "{msg}"
    );
    assert_eq!(sha(&n.exe), original, "the previous binary is back");
    assert!(!n.self_update_dir().join("pending").exists());

    // Hangs (never reconnects): at the deadline the guard restores the
    // fallback and systemd restarts the service — here, the test does.
    let hangs = bad_agent(server.work_dir(), "hang");
    let b = publish(&server, "bad-hang", &hangs);
    roll_out(&server, &b);
    n.until("the hanging agent installed", |n| {
        sha(&n.exe) == sha(&hangs) && n.agent.running()
    });
    n.guard("deadline", &[]);
    // systemd's restart: the hanging agent is killed, the guard runs again
    // (nothing left to do), the service starts — the previous binary.
    n.agent.kill9();
    n.guard(
        "stopped",
        &[
            ("EXIT_CODE", "killed"),
            ("EXIT_STATUS", "9"),
            ("SERVICE_RESULT", "signal"),
        ],
    );
    n.agent.start();
    n.until("the previous agent back and reporting", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent").is_some_and(|(v, s, m)| {
            v == "bad-hang" && s == "rolled_back" && m.contains("did not reconnect and report")
        })
    });
    assert_eq!(sha(&n.exe), original);
}

#[test]
fn self_updates_for_another_machine_or_another_path_are_refused_on_the_node() {
    let server = Server::start();
    server.create_cluster("c1");
    let mut n = Node::join(&server);
    let original = sha(&n.exe);

    // An ELF executable for another architecture.
    let foreign = variant(server.work_dir(), "foreign");
    let mut b = std::fs::read(&foreign).unwrap();
    let machine: u16 = if std::env::consts::ARCH == "aarch64" {
        62
    } else {
        183
    };
    b[18..20].copy_from_slice(&machine.to_le_bytes());
    std::fs::write(&foreign, b).unwrap();
    let id = publish(&server, "foreign", &foreign);
    roll_out(&server, &id);
    n.until("refused", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent").is_some_and(|(_, s, _)| s == "failed")
    });
    let (_, _, msg) = node_bundle(&server, "node-1", "lksadmin-agent").unwrap();
    assert!(
        msg.contains("an executable for") && msg.contains("but this node is"),
        "{msg}"
    );
    assert_eq!(sha(&n.exe), original);
    assert!(n.agent.running(), "no hand-over was attempted");

    // A binary for another path than the one this agent runs from.
    let dir = server.work_dir().join("elsewhere");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        variant(server.work_dir(), "elsewhere"),
        dir.join("lksadmin-agent"),
    )
    .unwrap();
    std::fs::write(
        dir.join("bundle.toml"),
        "name = \"lksadmin-agent\"\nversion = \"elsewhere\"\nself_update = true\n\n\
         [[file]]\npath = \"/usr/local/bin/lksadmin-agent\"\nsource = \"lksadmin-agent\"\nmode = \"0755\"\n",
    )
    .unwrap();
    let id = server.publish(&dir);
    roll_out(&server, &id);
    n.until("refused", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent")
            .is_some_and(|(v, s, _)| v == "elsewhere" && s == "failed")
    });
    let (_, _, msg) = node_bundle(&server, "node-1", "lksadmin-agent").unwrap();
    assert!(
        msg.contains("would replace /usr/local/bin/lksadmin-agent but this agent runs from"),
        "{msg}"
    );
    assert!(n.agent.read("/usr/local/bin/lksadmin-agent").is_none());

    // Not an executable at all: refused at publish, one line.
    let dir = server.work_dir().join("script-agent");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lksadmin-agent"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(
        dir.join("bundle.toml"),
        "name = \"lksadmin-agent\"\nversion = \"script\"\nself_update = true\n\n\
         [[file]]\npath = \"/usr/bin/lksadmin-agent\"\nsource = \"lksadmin-agent\"\nmode = \"0755\"\n",
    )
    .unwrap();
    let e = one_line_error(
        &server.lksctl(&["bundle", "publish", &dir.display().to_string()]),
        "a script as self-update",
    );
    assert!(e.contains("no ELF header"), "{e}");
}

#[test]
fn an_unsigned_self_update_is_refused_where_publisher_keys_are_trusted() {
    let server = Server::start();
    server.create_cluster("c1");
    let prefix = server.work_dir().join("publisher");
    server.lksctl_ok(&["bundle", "keygen", "--out", prefix.to_str().unwrap()]);
    let public = prefix.with_extension("pub");
    let mut n = Node::join_with(&server, &["--trust-key", public.to_str().unwrap()]);
    let original = sha(&n.exe);
    let new = variant(server.work_dir(), "unsigned");
    let b = publish(&server, "unsigned", &new);
    roll_out(&server, &b);
    n.until("refused", |_| {
        node_bundle(&server, "node-1", "lksadmin-agent").is_some_and(|(_, s, _)| s == "failed")
    });
    let (_, _, msg) = node_bundle(&server, "node-1", "lksadmin-agent").unwrap();
    assert!(msg.contains("unsigned"), "{msg}");
    assert_eq!(sha(&n.exe), original, "nothing replaced");
    assert!(
        !n.self_update_dir().join("pending").exists(),
        "no hand-over staged"
    );
    assert!(n.agent.running());
}
