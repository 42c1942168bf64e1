//! Storm mode: the load generator owns the real server process (started
//! from the command after `--`), stops it under N connected agents
//! (SIGTERM, as systemd restarts it, or SIGKILL) and starts it again on the
//! same data dir and port; and the progress line printed while agents
//! enrol, connect or come back; and the restart measured: how soon every
//! agent has its desired state again, on a new stream.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::args::Args;
use crate::report::{StormReport, auth, summarise};
use crate::sim;

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

/// Stops the server under `n` connected agents, starts it again, and
/// waits until every agent has its desired state on a new stream.
pub async fn restart(
    args: &Args,
    srv: &mut ServerProc,
    stats: &Arc<sim::Stats>,
    back_rx: &mut mpsc::UnboundedReceiver<sim::Back>,
    n: usize,
) -> Result<StormReport> {
    while back_rx.try_recv().is_ok() {}
    stats.phase.store(1, Ordering::Relaxed);
    let t0 = Instant::now();
    srv.stop(args.storm_kill).await?;
    let exit_seconds = t0.elapsed().as_secs_f64();
    srv.restart()?;
    let back_n = Arc::new(AtomicU64::new(0));
    let progress_stop = tokio_util::sync::CancellationToken::new();
    let progress = progress("back", n, back_n.clone(), progress_stop.clone(), {
        let stats = stats.clone();
        move || stats.failed_total(1)
    });
    let mut back: Vec<Option<(f64, u32)>> = vec![None; n];
    let mut count = 0;
    let deadline = tokio::time::sleep(Duration::from_secs(args.storm_timeout));
    tokio::pin!(deadline);
    while count < n {
        tokio::select! {
            got = back_rx.recv() => match got {
                Some(b) if b.session_started >= t0 && back[b.agent].is_none() => {
                    back[b.agent] = Some((b.at.duration_since(t0).as_secs_f64() * 1e3, b.attempts));
                    count += 1;
                    back_n.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => {}
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
    progress_stop.cancel();
    let _ = progress.await;
    let ms: Vec<f64> = back.iter().flatten().map(|(ms, _)| *ms).collect();
    let mut attempts: Vec<u32> = back.iter().flatten().map(|(_, a)| *a).collect();
    attempts.sort_unstable();
    let at = |q: f64| {
        attempts
            .get(((attempts.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let first = ms.iter().copied().min_by(f64::total_cmp);
    let last = ms.iter().copied().max_by(f64::total_cmp);
    let (dropped, errors) = (stats.counts(1, true), stats.counts(1, false));
    Ok(StormReport {
        signal: if args.storm_kill { "SIGKILL" } else { "SIGTERM" },
        exit_seconds,
        first_back_seconds: first.map(|ms| ms / 1e3),
        all_back_seconds: if count == n { last.map(|ms| ms / 1e3) } else { None },
        back: count,
        back_after: summarise(ms),
        attempts_p50: at(0.5),
        attempts_p99: at(0.99),
        attempts_max: attempts.last().copied().unwrap_or(0),
        auth_errors: auth(&dropped) + auth(&errors),
        dropped,
        errors,
        retry_hints: stats.hinted[1].load(Ordering::Relaxed),
        refusals_without_hint: stats.unhinted[1].load(Ordering::Relaxed),
        max_retry_hint_ms: stats.max_hint_ms[1].load(Ordering::Relaxed),
    })
}
