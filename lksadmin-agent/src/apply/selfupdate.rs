//! The agent replacing its own binary (a `self_update = true` bundle).
//!
//! The running agent cannot safely replace the program it is, and a new
//! binary that does not start cannot be trusted to restore the old one. So
//! the work is split (DESIGN §5):
//!
//! 1. the running agent verifies the new binary (digest and signature as
//!    for any bundle, an ELF executable for this machine, and that it runs:
//!    `NEW version`), stages it as `self-update/new`, writes the hand-over
//!    record `self-update/pending` (`PHASE=handing_over`) and exits with
//!    [`HANDOVER_EXIT`];
//! 2. `lksadmin-agent-guard` — a shell script of the package, run by
//!    systemd after every stop of the service (`ExecStopPost=+`, outside
//!    the sandbox) — sees the hand-over, keeps the current binary as
//!    `self-update/fallback`, installs the new one atomically, sets
//!    `PHASE=trying` and arms a timer for the deadline;
//! 3. the new agent starts, loads the state, and once it has reconnected
//!    and reported, commits: the bundle is `applied`, the fallback and the
//!    record are removed;
//! 4. if the new agent exits, is killed (watchdog, start timeout) or misses
//!    the deadline before it commits, the guard puts the fallback back,
//!    writes why (`self-update/result`) and systemd starts the old binary,
//!    which reports the bundle `rolled_back` with that reason.
//!
//! The record is `KEY=VALUE` lines, read by the guard without `eval`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::Digest;
use lks_proto::fsutil::{self, FsError};

/// Exit status of an agent handing over to a new binary (`EX_TEMPFAIL`):
/// the guard switches binaries only after this one.
pub const HANDOVER_EXIT: u8 = 75;
/// How long the new agent has to start, reconnect and report.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
/// Overrides [`DEFAULT_DEADLINE`]: whole seconds, 5 to 3600, set in the
/// service's environment by a drop-in (`Environment=`). For tests that
/// cannot wait two minutes (tests/vm/self-update.sh); the agent that hands
/// over writes the deadline into the record (`DEADLINE_S`), the guard
/// arms its timer from there.
pub const DEADLINE_ENV: &str = "LKS_SELF_UPDATE_DEADLINE";
/// How long `NEW version` may take.
const TEST_RUN_TIMEOUT: Duration = Duration::from_secs(10);

/// Phases of a hand-over (`PHASE=`).
pub const HANDING_OVER: &str = "handing_over";
pub const TRYING: &str = "trying";
pub const ROLLED_BACK: &str = "rolled_back";

/// Files of a hand-over, in `<state dir>/self-update/`.
#[derive(Clone, Debug)]
pub struct Paths {
    pub dir: PathBuf,
}

impl Paths {
    pub fn new(state_dir: &Path) -> Self {
        Paths {
            dir: state_dir.join("self-update"),
        }
    }
    pub fn pending(&self) -> PathBuf {
        self.dir.join("pending")
    }
    pub fn new_binary(&self) -> PathBuf {
        self.dir.join("new")
    }
    pub fn fallback(&self) -> PathBuf {
        self.dir.join("fallback")
    }
    pub fn result(&self) -> PathBuf {
        self.dir.join("result")
    }
    pub fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    /// Removes every file of a finished hand-over.
    pub fn clear(&self) {
        for p in [
            self.pending(),
            self.new_binary(),
            self.fallback(),
            self.result(),
            self.manifest(),
        ] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The hand-over record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub fields: BTreeMap<String, String>,
}

impl Pending {
    pub fn get(&self, k: &str) -> &str {
        self.fields.get(k).map_or("", String::as_str)
    }

    pub fn set(&mut self, k: &str, v: impl Into<String>) {
        // One line per field: a newline in a value would start another.
        let v: String = v.into().replace(['\n', '\r'], " ");
        self.fields.insert(k.to_string(), v);
    }

    pub fn parse(text: &str) -> Pending {
        let mut p = Pending::default();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=')
                && !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_uppercase() || b == b'_' || b.is_ascii_digit())
            {
                p.fields.insert(k.to_string(), v.to_string());
            }
        }
        p
    }

    pub fn render(&self) -> String {
        self.fields.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
    }

    pub fn load(path: &Path) -> Result<Option<Pending>, FsError> {
        match std::fs::read_to_string(path) {
            Ok(t) => Ok(Some(Pending::parse(&t))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FsError::new("read", path, e)),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), FsError> {
        fsutil::write_atomic(path, self.render().as_bytes(), 0o600)
    }
}

/// A value of [`DEADLINE_ENV`] that is not a deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}={value:?} is not a number of seconds from 5 to 3600", DEADLINE_ENV)]
pub struct BadDeadline {
    pub value: String,
}

/// Why a staged agent binary failed its test run (`binary version`).
#[derive(Debug, thiserror::Error)]
pub enum TestRunError {
    #[error("could not start it: {0}")]
    Start(std::io::Error),
    #[error("could not run it: {0}")]
    Run(std::io::Error),
    #[error("`version` did not answer within {0:?}")]
    Timeout(Duration),
    /// It exited unsuccessfully; `stderr` is the last lines it wrote.
    #[error("`version` failed ({status}): {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`version` printed {line:?}, not \"lksadmin-agent VERSION\"")]
    NotAVersion { line: String },
}

/// The deadline for a value of [`DEADLINE_ENV`]: the default when unset.
pub fn deadline_from(value: Option<&str>) -> Result<Duration, BadDeadline> {
    let Some(v) = value else {
        return Ok(DEFAULT_DEADLINE);
    };
    match v.trim().parse::<u64>() {
        Ok(s) if (5..=3600).contains(&s) => Ok(Duration::from_secs(s)),
        _ => Err(BadDeadline { value: v.to_string() }),
    }
}

/// The deadline of a hand-over this process starts (see [`DEADLINE_ENV`]).
pub fn deadline() -> Duration {
    let v = std::env::var(DEADLINE_ENV).ok();
    deadline_from(v.as_deref()).unwrap_or_else(|e| {
        tracing::warn!("{e}; using {}s", DEFAULT_DEADLINE.as_secs());
        DEFAULT_DEADLINE
    })
}

/// SHA-256 of a file.
pub fn file_digest(path: &Path) -> std::io::Result<Digest> {
    Ok(Digest::of_reader(std::fs::File::open(path)?)?.0)
}

/// The executable this process runs, resolved.
pub fn own_exe() -> std::io::Result<PathBuf> {
    std::env::current_exe()?.canonicalize()
}

/// The first bytes of a file.
pub fn head(path: &Path, n: u64) -> std::io::Result<Vec<u8>> {
    let mut b = Vec::new();
    std::fs::File::open(path)?.take(n).read_to_end(&mut b)?;
    Ok(b)
}

/// Runs `binary version` and returns the version it prints
/// (`lksadmin-agent 0.2.0` → `0.2.0`).
pub async fn test_run(binary: &Path) -> Result<String, TestRunError> {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg("version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(TestRunError::Start)?;
    let out = match tokio::time::timeout(TEST_RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(TestRunError::Run(e)),
        Err(_) => return Err(TestRunError::Timeout(TEST_RUN_TIMEOUT)),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(TestRunError::Failed {
            status: out.status,
            stderr: crate::apply::runner::tail_lines(&err, 2),
        });
    }
    let line = stdout.lines().next().unwrap_or_default().trim();
    match line.strip_prefix("lksadmin-agent ") {
        Some(v) if !v.is_empty() && v.len() <= 128 && !v.contains(char::is_whitespace) => Ok(v.to_string()),
        _ => Err(TestRunError::NotAVersion {
            line: line.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_ignores_junk() {
        let mut p = Pending::default();
        p.set("PHASE", HANDING_OVER);
        p.set("TARGET", "/usr/bin/lksadmin-agent");
        p.set("REASON", "two\nlines");
        let text = p.render();
        assert!(text.contains("REASON=two lines\n"), "{text}");
        assert_eq!(Pending::parse(&text), p);
        let junk = Pending::parse("no equals\nlower=x\nPHASE=trying\n=x\n");
        assert_eq!(junk.get("PHASE"), TRYING);
        assert_eq!(junk.fields.len(), 1);
    }

    #[test]
    fn deadline_defaults_and_accepts_only_sane_seconds() {
        assert_eq!(deadline_from(None), Ok(DEFAULT_DEADLINE));
        assert_eq!(deadline_from(Some("15")), Ok(Duration::from_secs(15)));
        assert_eq!(deadline_from(Some(" 3600 ")), Ok(Duration::from_secs(3600)));
        for bad in ["", "0", "4", "3601", "15s", "-1", "abc"] {
            let e = deadline_from(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(DEADLINE_ENV) && e.contains("5 to 3600"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn test_run_wants_a_version_line() {
        let d = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = d.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::os::unix::fs::PermissionsExt::set_mode(
                &mut std::fs::metadata(&p).unwrap().permissions(),
                0o755,
            );
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            p
        };
        assert_eq!(
            test_run(&script("good", "echo \"lksadmin-agent 9.9.9\""))
                .await
                .unwrap(),
            "9.9.9"
        );
        let e = test_run(&script("bad", "echo boom >&2; exit 3"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("failed") && e.contains("boom"), "{e}");
        let e = test_run(&script("odd", "echo hello"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not \"lksadmin-agent VERSION\""), "{e}");
        let e = test_run(&d.path().join("missing")).await.unwrap_err().to_string();
        assert!(e.contains("could not start"), "{e}");
    }
}
