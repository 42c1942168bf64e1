//! Rebooting (issue [reboots]): what this node owes a reboot — bundles
//! applied with `reboot = "required"`, the OS sentinel
//! (`/var/run/reboot-required`, its `.pkgs` list), a check command — its
//! boot ID, and carrying out a reboot request from the server with the
//! reboot command. The persisted state machine is [`state`]; this module is
//! its owner and the OS edge (files, commands), shared by the engine (which
//! records applied bundles) and the task that follows reboot requests
//! ([`follow`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lks_proto::fsutil::{self, FsError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::StateDir;

pub mod state;

pub use state::{Need, RebootFile, RebootReport, Stance, Take};

/// Where the kernel says which boot this is.
pub const DEFAULT_BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";
/// Read instead of [`DEFAULT_BOOT_ID_FILE`] when set: for sandboxes and
/// tests (`--root`), where a "reboot" is a new ID written there.
pub const BOOT_ID_FILE_ENV: &str = "LKS_AGENT_BOOT_ID_FILE";
/// Debian's and Ubuntu's sentinel; `<sentinel>.pkgs` lists the packages.
pub const DEFAULT_SENTINEL: &str = "/var/run/reboot-required";
pub const DEFAULT_REBOOT_COMMAND: &str = "systemctl reboot";
/// Longest a check command may run.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the reboot command may run before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// From the moment the reboot command is run, how long the node may take
/// to go down before the reboot counts as failed (boot ID unchanged); the
/// command itself has [`COMMAND_TIMEOUT`] of it.
pub const REBOOT_WAIT: Duration = Duration::from_secs(300);
/// Longest reason kept from a check command or a package list.
const MAX_REASON: usize = 512;

/// How this node reboots and learns it should (`run`'s flags and
/// `agent.toml`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebootSettings {
    /// `--reboot-sentinel`: a path on the node (inside `--root`).
    pub sentinel: PathBuf,
    /// `--reboot-check`: run by `/bin/sh -c`; exit 0 means required.
    pub check: Option<String>,
    /// `--reboot-command`: run by `/bin/sh -c`.
    pub command: String,
}

impl Default for RebootSettings {
    fn default() -> Self {
        RebootSettings {
            sentinel: PathBuf::from(DEFAULT_SENTINEL),
            check: None,
            command: DEFAULT_REBOOT_COMMAND.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("reboot state: {0}")]
    State(#[from] FsError),
}

/// The node's boot ID: [`BOOT_ID_FILE_ENV`]'s file if set, else the
/// kernel's; empty if unreadable.
pub fn boot_id() -> String {
    let path = std::env::var_os(BOOT_ID_FILE_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_BOOT_ID_FILE), PathBuf::from);
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `path` (absolute, as on the node) under the node root `root`.
fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The OS sentinel's need, if the file exists: its package list as the
/// reason when there is one, else the sentinel's path; since its mtime.
pub fn sentinel_need(root: &Path, sentinel: &Path) -> Option<Need> {
    let file = under_root(root, sentinel);
    let meta = std::fs::metadata(&file).ok()?;
    let since_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    let mut pkgs_path = file.into_os_string();
    pkgs_path.push(".pkgs");
    let pkgs = std::fs::read_to_string(PathBuf::from(pkgs_path)).unwrap_or_default();
    Some(Need {
        reason: packages_reason(&pkgs).unwrap_or_else(|| sentinel.display().to_string()),
        since_ms,
    })
}

/// `packages: a, b` from a `.pkgs` file (one package a line, repeats
/// once); `None` when it names none.
pub fn packages_reason(text: &str) -> Option<String> {
    let mut pkgs: Vec<&str> = Vec::new();
    for p in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !pkgs.contains(&p) {
            pkgs.push(p);
        }
    }
    (!pkgs.is_empty()).then(|| clip(&format!("packages: {}", pkgs.join(", "))))
}

/// What a check command's exit and output say: exit 0 is required, with
/// its first non-empty output line as the reason.
pub fn check_verdict(success: bool, stdout: &str) -> Option<String> {
    if !success {
        return None;
    }
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    Some(clip(line.unwrap_or("the reboot check command says so")))
}

fn clip(s: &str) -> String {
    if s.len() <= MAX_REASON {
        return s.to_string();
    }
    let mut end = MAX_REASON;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The node's reboot state, shared by the engine thread and the task that
/// follows reboot requests; every change is persisted before it is
/// reported.
pub struct Reboots {
    path: PathBuf,
    root: PathBuf,
    settings: RebootSettings,
    inner: Mutex<Inner>,
    report: watch::Sender<RebootReport>,
}

struct Inner {
    file: RebootFile,
    /// The check command's need, from its last run.
    check: Option<Need>,
}

impl Reboots {
    /// Loads `STATE_DIR/reboot.json` and brings it to this boot.
    pub fn open(dirs: &StateDir, root: &Path, settings: RebootSettings) -> Result<Arc<Reboots>, RebootError> {
        let path = dirs.reboot();
        let mut file: RebootFile = fsutil::read_json(&path)?.unwrap_or_default();
        if file.on_boot(&boot_id()) {
            fsutil::write_json(&path, &file, 0o600)?;
        }
        let r = Reboots {
            path,
            root: root.to_path_buf(),
            settings,
            inner: Mutex::new(Inner { file, check: None }),
            report: watch::channel(RebootReport::default()).0,
        };
        r.publish();
        Ok(Arc::new(r))
    }

    pub fn settings(&self) -> &RebootSettings {
        &self.settings
    }

    /// Reports from now on (the current one first).
    pub fn subscribe(&self) -> watch::Receiver<RebootReport> {
        self.report.subscribe()
    }

    /// The report now.
    pub fn report(&self) -> RebootReport {
        self.report.borrow().clone()
    }

    /// Changes the file under the lock; persisted (then reported) when
    /// `f` says it changed it.
    fn change<T>(&self, f: impl FnOnce(&mut RebootFile) -> (bool, T)) -> Result<T, RebootError> {
        let out = {
            let Ok(mut inner) = self.inner.lock() else {
                return Err(RebootError::State(FsError::new(
                    "lock",
                    &self.path,
                    std::io::Error::other("poisoned"),
                )));
            };
            let mut next = inner.file.clone();
            let (changed, out) = f(&mut next);
            if changed {
                fsutil::write_json(&self.path, &next, 0o600)?;
                inner.file = next;
            }
            out
        };
        self.publish();
        Ok(out)
    }

    /// Recomputes the report (the sentinel is read again) and sends it if
    /// it changed.
    pub fn publish(&self) {
        let sentinel = sentinel_need(&self.root, &self.settings.sentinel);
        let Ok(inner) = self.inner.lock() else { return };
        let needs: Vec<Need> = sentinel.into_iter().chain(inner.check.clone()).collect();
        let report = inner.file.report(&needs);
        drop(inner);
        self.report.send_if_modified(|r| {
            let changed = *r != report;
            *r = report;
            changed
        });
    }

    /// A bundle version with `reboot = "required"` was applied.
    pub fn bundle_applied(&self, id: &str, now_ms: i64) {
        match self.change(|f| (f.bundle_applied(id, now_ms), ())) {
            Ok(()) => tracing::info!(bundle = id, "applied; the node needs a reboot for it"),
            Err(e) => tracing::error!(bundle = id, "record that the node needs a reboot: {e}"),
        }
    }

    /// Runs the check command, if there is one, and keeps its verdict (a
    /// command that cannot run or times out keeps the last one).
    pub async fn run_check(&self) {
        let Some(cmd) = self.settings.check.clone() else {
            return;
        };
        let out = tokio::time::timeout(CHECK_TIMEOUT, shell(&cmd).output()).await;
        let verdict = match out {
            Ok(Ok(o)) => check_verdict(o.status.success(), &String::from_utf8_lossy(&o.stdout)),
            Ok(Err(e)) => {
                tracing::warn!("reboot check `{cmd}`: {e}");
                return;
            }
            Err(_) => {
                tracing::warn!("reboot check `{cmd}` did not finish within {CHECK_TIMEOUT:?}");
                return;
            }
        };
        if let Ok(mut inner) = self.inner.lock() {
            let since = inner.check.as_ref().map(|n| n.since_ms);
            inner.check = verdict.map(|reason| Need {
                reason,
                since_ms: since.unwrap_or_else(crate::clock::now_ms),
            });
        }
        self.publish();
    }

    /// Carries out reboot request `id` once: persists "rebooting" with this
    /// boot's ID, runs the reboot command, and records a failure if it
    /// fails. Returns once the command returned (the node is going down).
    pub async fn take_request(&self, id: u64) {
        let boot = boot_id();
        let now = crate::clock::now_ms();
        let take = match self.change(|f| {
            let t = f.take(id, &boot, now);
            (t == Take::Run, t)
        }) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(request = id, "not rebooting: {e}");
                return;
            }
        };
        if take == Take::Done {
            return;
        }
        let cmd = self.settings.command.clone();
        tracing::warn!(request = id, command = %cmd, "rebooting the node, as the server asked");
        // A moment for the "rebooting" report to go out before the node does.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let failure = match tokio::time::timeout(COMMAND_TIMEOUT, shell(&cmd).output()).await {
            Ok(Ok(o)) if o.status.success() => None,
            Ok(Ok(o)) => Some(format!(
                "reboot command `{cmd}` failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
            )),
            Ok(Err(e)) => Some(format!("reboot command `{cmd}`: {e}")),
            Err(_) => Some(format!(
                "reboot command `{cmd}` did not return within {COMMAND_TIMEOUT:?}"
            )),
        };
        if let Some(why) = failure {
            self.fail(id, why);
        }
    }

    /// The reboot in progress has not happened by now: a failure.
    pub fn check_overdue(&self) {
        let now = crate::clock::now_ms();
        let cmd = self.settings.command.clone();
        let r = self.change(|f| match f.overdue_in(REBOOT_WAIT, now) {
            Some(d) if d.is_zero() => {
                let why = format!(
                    "the node did not reboot: its boot ID is unchanged {}s after `{cmd}` ran",
                    REBOOT_WAIT.as_secs()
                );
                f.fail(why, now);
                (true, ())
            }
            _ => (false, ()),
        });
        if let Err(e) = r {
            tracing::error!("record the failed reboot: {e}");
        }
    }

    fn fail(&self, id: u64, why: String) {
        tracing::error!(request = id, "{why}");
        let now = crate::clock::now_ms();
        if let Err(e) = self.change(|f| {
            f.fail(why, now);
            (true, ())
        }) {
            tracing::error!("record the failed reboot: {e}");
        }
    }

    /// When the reboot in progress counts as failed, from now.
    fn overdue_in(&self) -> Option<Duration> {
        let inner = self.inner.lock().ok()?;
        inner.file.overdue_in(REBOOT_WAIT, crate::clock::now_ms())
    }
}

fn shell(cmd: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("/bin/sh");
    c.arg("-c")
        .arg(cmd)
        .kill_on_drop(true)
        .stdin(std::process::Stdio::null());
    c
}

/// Follows the reboot requests of the desired states (`requests`: the
/// latest request id, 0 for none), runs the check command every
/// `interval` and reads the sentinel again, and turns a reboot that never
/// happened into a failure.
pub async fn follow(
    reboots: Arc<Reboots>,
    mut requests: watch::Receiver<u64>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        let overdue = reboots.overdue_in();
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = requests.changed() => {
                if r.is_err() {
                    return;
                }
                let id = *requests.borrow_and_update();
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = reboots.take_request(id) => {}
                }
            }
            _ = tick.tick() => {
                reboots.run_check().await;
                reboots.publish();
            }
            _ = async {
                match overdue {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => reboots.check_overdue(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentinel_names_its_packages_or_itself() {
        let root = tempfile::tempdir().unwrap();
        let sentinel = Path::new("/var/run/reboot-required");
        assert_eq!(sentinel_need(root.path(), sentinel), None);
        let file = root.path().join("var/run/reboot-required");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "*** System restart required ***\n").unwrap();
        let n = sentinel_need(root.path(), sentinel).unwrap();
        assert_eq!(n.reason, "/var/run/reboot-required");
        assert!(n.since_ms > 0);
        std::fs::write(
            root.path().join("var/run/reboot-required.pkgs"),
            "linux-image-6.1.0-13-amd64\nlibc6\nlibc6\n\n",
        )
        .unwrap();
        assert_eq!(
            sentinel_need(root.path(), sentinel).unwrap().reason,
            "packages: linux-image-6.1.0-13-amd64, libc6"
        );
        assert_eq!(packages_reason("\n \n"), None);
    }

    #[test]
    fn a_check_command_says_required_by_exit_zero_with_its_first_line() {
        assert_eq!(check_verdict(false, "kernel 6.2 installed\n"), None);
        assert_eq!(
            check_verdict(true, "\nkernel 6.2 installed\nmore\n").as_deref(),
            Some("kernel 6.2 installed")
        );
        assert_eq!(
            check_verdict(true, "").as_deref(),
            Some("the reboot check command says so")
        );
        let long = "x".repeat(2000);
        assert!(check_verdict(true, &long).unwrap().len() <= MAX_REASON + '…'.len_utf8());
    }

    #[tokio::test]
    async fn the_check_command_sets_and_clears_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let flag = dir.path().join("needed");
        let settings = RebootSettings {
            check: Some(format!("test -e {0} && cat {0}", flag.display())),
            ..RebootSettings::default()
        };
        let r = Reboots::open(&StateDir::new(dir.path()), root.path(), settings).unwrap();
        r.run_check().await;
        assert_eq!(r.report().state, Stance::None);
        std::fs::write(&flag, "kernel 6.2 installed\n").unwrap();
        r.run_check().await;
        let rep = r.report();
        assert_eq!(
            (rep.state, rep.reason.as_str()),
            (Stance::Required, "kernel 6.2 installed")
        );
        let since = rep.since_ms;
        r.run_check().await;
        assert_eq!(r.report().since_ms, since, "since the first time it said so");
        std::fs::remove_file(&flag).unwrap();
        r.run_check().await;
        assert_eq!(r.report().state, Stance::None);
    }

    #[tokio::test]
    async fn a_request_runs_the_command_once_and_a_failing_command_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let dirs = StateDir::new(dir.path());
        let settings = RebootSettings {
            command: format!("echo x >> {}", marker.display()),
            ..RebootSettings::default()
        };
        let r = Reboots::open(&dirs, root.path(), settings.clone()).unwrap();
        r.bundle_applied("kernel@1", 5);
        assert_eq!(r.report().state, Stance::Required);
        assert_eq!(r.report().reason, "bundle kernel@1");
        r.take_request(4).await;
        assert_eq!(r.report().state, Stance::Rebooting);
        assert_eq!(r.report().request, 4);
        r.take_request(4).await;
        // Restarted in the same boot: the file says it was taken on.
        let again = Reboots::open(&dirs, root.path(), settings).unwrap();
        again.take_request(4).await;
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap(),
            "x\n",
            "ran exactly once"
        );
        assert_eq!(again.report().state, Stance::Rebooting);

        let failing = RebootSettings {
            command: "echo 'no such unit' >&2; exit 3".into(),
            ..RebootSettings::default()
        };
        let f = Reboots::open(&dirs, root.path(), failing).unwrap();
        f.take_request(5).await;
        let rep = f.report();
        assert_eq!(rep.state, Stance::Failed);
        assert!(
            rep.reason.starts_with(
                "reboot command `echo 'no such unit' >&2; exit 3` failed (exit status: 3): no such unit"
            ),
            "{}",
            rep.reason
        );
    }
}
