//! Storm mode: the load generator owns the real server process (started
//! from the command after `--`), stops it under N connected agents
//! (SIGTERM, as systemd restarts it, or SIGKILL) and starts it again on the
//! same data dir and port; and the progress line printed while agents
//! enrol, connect or come back.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long a (re)started server may take to write admin.conf and listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The server under test, started from a command line.
pub struct ServerProc {
    cmd: Vec<String>,
    log: Option<PathBuf>,
    child: Option<Child>,
}

impl ServerProc {
    /// Starts `cmd`; output appended to `log`, or discarded.
    pub fn start(cmd: &[String], log: Option<&Path>) -> Result<ServerProc> {
        if cmd.is_empty() {
            bail!("storm mode needs the server command after `--`");
        }
        let mut p = ServerProc {
            cmd: cmd.to_vec(),
            log: log.map(Path::to_path_buf),
            child: None,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let out = || -> Result<Stdio> {
            Ok(match &self.log {
                Some(p) => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("open {}", p.display()))?
                    .into(),
                None => Stdio::null(),
            })
        };
        let child = Command::new(&self.cmd[0])
            .args(&self.cmd[1..])
            .stdin(Stdio::null())
            .stdout(out()?)
            .stderr(out()?)
            // The load generator must never leave a server behind.
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", self.cmd[0]))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the server has written `admin_conf`.
    pub async fn wait_ready(&mut self, admin_conf: &Path) -> Result<()> {
        let t = Instant::now();
        while !admin_conf.exists() {
            self.check_running()?;
            if t.elapsed() > START_TIMEOUT {
                bail!(
                    "the server wrote no {} within {START_TIMEOUT:?}",
                    admin_conf.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn check_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(st) = c.try_wait()?
        {
            bail!("the server exited at start: {st}");
        }
        Ok(())
    }

    /// Signals the server and waits for it to exit; `kill` sends SIGKILL.
    pub async fn stop(&mut self, kill_it: bool) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = c.id() {
            let sig = if kill_it { Signal::SIGKILL } else { Signal::SIGTERM };
            kill(Pid::from_raw(pid as i32), sig).context("signal the server")?;
        }
        c.wait().await.context("wait for the server to exit")?;
        Ok(())
    }

    /// Starts the same command again.
    pub fn restart(&mut self) -> Result<()> {
        self.spawn()
    }
}

/// Prints `LABEL done/total (rate/s), retries n` to stderr every second
/// until cancelled; stdout stays for the report.
pub fn progress(
    label: &'static str,
    total: usize,
    done: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
    retries: impl Fn() -> u64 + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let n = done.load(Ordering::Relaxed);
            eprintln!(
                "{label} {n}/{total} ({:.0}/s), retries {}",
                n as f64 / start.elapsed().as_secs_f64(),
                retries()
            );
        }
    })
}
