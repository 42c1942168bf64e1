//! The delta maker's heavy work (the estimate and the diff) on a thread of
//! its own at the lowest CPU priority, so that on a machine it shares it
//! yields to serving agents and driving rollouts, and still runs at full
//! speed on an idle CPU. The agent's `node::priority` does the same for its
//! own background work; here with rustix's safe `setpriority`.

use std::io;
use std::time::Duration;

/// The nice value of the maker's threads: the lowest priority there is.
pub const BACKGROUND_NICE: i32 = 19;

/// The work's thread ended without an answer (it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the delta maker's thread ended without an answer (it panicked)")]
pub struct Lost;

/// Runs `work` on a new thread at [`BACKGROUND_NICE`] and waits for it
/// without holding a runtime thread; its answer and the CPU time the
/// thread used. A thread of its own, not tokio's blocking pool: a lowered
/// priority cannot be raised again, and the pool reuses its threads for
/// the store's calls. Where the priority cannot be lowered, `work` runs at
/// the default one all the same.
pub async fn run<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<Result<(T, Duration), Lost>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("lks-delta".into())
        .spawn(move || {
            if let Err(e) = lower_this_thread() {
                tracing::debug!("delta maker at the default priority: {e}");
            }
            let answer = work();
            let _ = tx.send((answer, cpu_of_this_thread()));
        })?;
    Ok(rx.await.map_err(|_| Lost))
}

/// The CPU time this thread has used.
fn cpu_of_this_thread() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Sets the calling thread's nice value to [`BACKGROUND_NICE`] (on Linux a
/// per-thread attribute: `setpriority` on the thread's id).
fn lower_this_thread() -> io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    let pid =
        rustix::process::Pid::from_raw(tid).ok_or_else(|| io::Error::other(format!("thread id {tid}")))?;
    rustix::process::setpriority_process(Some(pid), BACKGROUND_NICE).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's nice value (field 19 of its stat, counted after the
    /// command name's closing `)`).
    fn nice_of_this_thread() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after = stat.rsplit_once(')').unwrap().1;
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn the_work_runs_at_the_lowest_priority_and_the_caller_keeps_its_own() {
        let before = nice_of_this_thread();
        let ((inside, thread), _) = run(|| (nice_of_this_thread(), std::thread::current().id()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(inside, BACKGROUND_NICE);
        assert_ne!(thread, std::thread::current().id());
        assert_eq!(nice_of_this_thread(), before);
    }

    #[tokio::test]
    async fn the_threads_cpu_time_is_measured() {
        // Spins until its own clock says 20 ms (or 30 s of wall time pass
        // on a machine too busy to give a nice-19 thread any).
        let (_, cpu) = run(|| {
            let start = std::time::Instant::now();
            let mut x = 0u64;
            while cpu_of_this_thread() < Duration::from_millis(20)
                && start.elapsed() < Duration::from_secs(30)
            {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .await
        .unwrap()
        .unwrap();
        assert!(cpu >= Duration::from_millis(20), "{cpu:?}");
    }

    #[tokio::test]
    async fn a_panic_is_an_answer_not_a_hang() {
        let r = run(|| -> u8 { panic!("boom") }).await.unwrap();
        assert!(r.is_err());
    }
}
