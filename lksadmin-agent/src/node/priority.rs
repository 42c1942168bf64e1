//! Background work at the lowest CPU priority: what the agent does for
//! itself after an apply (the cache copy of a file it just switched in)
//! yields to everything else on the node — its workloads, and on a shared
//! host the other agents still fetching the same rollout — and still runs
//! at full speed on an idle CPU.

use std::io;

/// The nice value of background work: the lowest priority there is.
pub const BACKGROUND_NICE: i32 = 19;

/// Runs `work` on a thread of its own at [`BACKGROUND_NICE`] and waits for
/// it; the caller's own priority is untouched (on Linux the nice value is
/// a per-thread attribute). Where the priority cannot be lowered, `work`
/// runs at the default priority all the same. An error only if no thread
/// could be started (then `work` did not run). A panic in `work` is the
/// caller's.
pub fn in_background<T: Send>(work: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        let t = std::thread::Builder::new()
            .name("lks-background".into())
            .spawn_scoped(s, || {
                if let Err(e) = lower_this_thread() {
                    tracing::debug!("background work at the default priority: {e}");
                }
                work()
            })?;
        Ok(t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// Sets the calling thread's nice value to [`BACKGROUND_NICE`].
#[cfg(target_os = "linux")]
fn lower_this_thread() -> io::Result<()> {
    let tid = nix::unistd::gettid().as_raw() as nix::libc::id_t;
    #[allow(unsafe_code)]
    // SAFETY: `setpriority` takes integers only and changes the scheduling
    // attribute of the thread `tid` (this one) in the kernel; no memory of
    // this process is read or written.
    let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid, BACKGROUND_NICE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Elsewhere the nice value is the process's: left as it is.
#[cfg(not(target_os = "linux"))]
fn lower_this_thread() -> io::Result<()> {
    Ok(())
}

/// This thread's nice value.
#[cfg(all(test, target_os = "linux"))]
fn nice_of_this_thread() -> io::Result<i32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    // Field 19 (nice), counted after the command name's closing `)`, which
    // may itself hold spaces.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after
        .split_whitespace()
        .nth(16)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no nice value in /proc/thread-self/stat: {stat}")))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn background_work_runs_at_the_lowest_priority_and_the_caller_keeps_its_own() {
        let before = nice_of_this_thread().unwrap();
        let (inside, caller) =
            in_background(|| (nice_of_this_thread().unwrap(), std::thread::current().id())).unwrap();
        assert_eq!(inside, BACKGROUND_NICE);
        assert_ne!(caller, std::thread::current().id(), "ran on a thread of its own");
        assert_eq!(
            nice_of_this_thread().unwrap(),
            before,
            "the caller's priority is unchanged"
        );
    }

    #[test]
    fn what_the_work_returns_comes_back() {
        let v = in_background(|| vec![1u8, 2, 3]).unwrap();
        assert_eq!(v, [1, 2, 3]);
    }
}
