//! Running step and health-check commands: argv (never a shell), a clean
//! working directory, the `LKS_*` environment, its own process group, and a
//! timeout that kills the whole group.

use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

/// How much of a failing command's stderr is kept for the report.
const STDERR_KEEP: usize = 2048;
/// Lines of stderr quoted in a failure reason.
const STDERR_LINES: usize = 5;

/// A command to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Exited { code: i32, stderr: String },
    Signalled { signal: i32, stderr: String },
    TimedOut { after: Duration, stderr: String },
    SpawnFailed { reason: String },
}

impl Outcome {
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited { code: 0, .. })
    }

    /// One line for a failure reason: what happened plus the last lines of
    /// stderr.
    pub fn describe(&self) -> String {
        let (what, stderr) = match self {
            Outcome::Exited { code, stderr } => (format!("exited with status {code}"), stderr.as_str()),
            Outcome::Signalled { signal, stderr } => {
                (format!("was killed by signal {signal}"), stderr.as_str())
            }
            Outcome::TimedOut { after, stderr } => (format!("timed out after {after:?}"), stderr.as_str()),
            Outcome::SpawnFailed { reason } => (format!("could not start: {reason}"), ""),
        };
        let tail = tail_lines(stderr, STDERR_LINES);
        if tail.is_empty() {
            what
        } else {
            format!("{what}: {tail}")
        }
    }
}

/// The last `n` non-empty lines of `s`, joined with " | ".
pub fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Runs commands. The real one spawns processes; tests may script outcomes.
pub trait CommandRunner: Send + Sync {
    fn run<'a>(&'a self, spec: &'a CommandSpec) -> BoxFuture<'a, Outcome>;
}

/// Spawns real processes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessRunner;

impl CommandRunner for ProcessRunner {
    fn run<'a>(&'a self, spec: &'a CommandSpec) -> BoxFuture<'a, Outcome> {
        Box::pin(run_process(spec))
    }
}

/// Variables the agent's unit sets for the agent alone, not for the
/// programs its steps run: `MALLOC_ARENA_MAX=1` keeps the mostly idle agent
/// small, and would slow a multi-threaded step (kubeadm, a container
/// runtime's restart) for nothing.
const AGENT_ONLY_ENV: &[&str] = &["MALLOC_ARENA_MAX"];

/// The step's environment on top of the agent's: the agent-only variables
/// removed, then the spec's own (`LKS_*`; a spec naming an agent-only one
/// sets it).
fn set_step_env(cmd: &mut tokio::process::Command, spec: &CommandSpec) {
    for k in AGENT_ONLY_ENV {
        cmd.env_remove(k);
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
}

async fn run_process(spec: &CommandSpec) -> Outcome {
    let Some((prog, args)) = spec.argv.split_first() else {
        return Outcome::SpawnFailed {
            reason: "empty command".into(),
        };
    };
    let mut cmd = tokio::process::Command::new(prog);
    set_step_env(&mut cmd, spec);
    cmd.args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::SpawnFailed {
                reason: format!("{prog}: {e}"),
            };
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let stderr = child.stderr.take();
    let reader = tokio::spawn(async move {
        let mut kept: Vec<u8> = Vec::new();
        if let Some(mut s) = stderr {
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * STDERR_KEEP {
                    kept.drain(..kept.len() - STDERR_KEEP);
                }
            }
        }
        let start = kept.len().saturating_sub(STDERR_KEEP);
        String::from_utf8_lossy(&kept[start..]).into_owned()
    });
    let waited = tokio::time::timeout(spec.timeout, child.wait()).await;
    let timed_out = waited.is_err();
    if timed_out && let Some(pgid) = pgid {
        // The whole group: a step's children must not outlive its timeout.
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    let status = match waited {
        Ok(s) => s,
        Err(_) => child.wait().await,
    };
    // A background child that kept stderr open must not hang the report.
    let stderr = match tokio::time::timeout(Duration::from_secs(2), reader).await {
        Ok(Ok(s)) => s,
        _ => String::new(),
    };
    if timed_out {
        return Outcome::TimedOut {
            after: spec.timeout,
            stderr,
        };
    }
    match status {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            match (st.code(), st.signal()) {
                (Some(code), _) => Outcome::Exited { code, stderr },
                (None, Some(signal)) => Outcome::Signalled { signal, stderr },
                (None, None) => Outcome::Exited { code: -1, stderr },
            }
        }
        Err(e) => Outcome::SpawnFailed {
            reason: format!("wait for {prog}: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout_ms: u64) -> CommandSpec {
        CommandSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec![("LKS_TEST".into(), "yes".into())],
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn steps_do_not_inherit_the_agents_malloc_setting_unless_they_ask() {
        let envs = |spec: &CommandSpec| {
            let mut cmd = tokio::process::Command::new("true");
            set_step_env(&mut cmd, spec);
            cmd.as_std()
                .get_envs()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.map(|v| v.to_string_lossy().into_owned()),
                    )
                })
                .collect::<Vec<_>>()
        };
        let got = envs(&sh("true", 1000));
        assert!(got.contains(&("MALLOC_ARENA_MAX".into(), None)), "{got:?}");
        assert!(got.contains(&("LKS_TEST".into(), Some("yes".into()))), "{got:?}");
        let mut spec = sh("true", 1000);
        spec.env.push(("MALLOC_ARENA_MAX".into(), "4".into()));
        let got = envs(&spec);
        assert!(
            got.contains(&("MALLOC_ARENA_MAX".into(), Some("4".into()))),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn exit_codes_env_cwd_and_stderr() {
        let r = ProcessRunner;
        assert!(
            r.run(&sh("test \"$LKS_TEST\" = yes && test \"$(pwd)\" = /", 5000))
                .await
                .success()
        );
        let out = r.run(&sh("echo one >&2; echo two >&2; exit 3", 5000)).await;
        assert_eq!(out.describe(), "exited with status 3: one | two");
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("survived");
        let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let start = std::time::Instant::now();
        let out = ProcessRunner.run(&sh(&script, 300)).await;
        assert!(matches!(out, Outcome::TimedOut { .. }), "{out:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!marker.exists(), "background child outlived the timeout");
    }

    #[tokio::test]
    async fn missing_program() {
        let out = ProcessRunner
            .run(&CommandSpec {
                argv: vec!["/nonexistent/prog".into()],
                env: vec![],
                timeout: Duration::from_secs(1),
            })
            .await;
        assert!(
            out.describe().starts_with("could not start: /nonexistent/prog"),
            "{out:?}"
        );
    }
}
