//! Giving freed heap memory back to the kernel once a burst of work is over.
//!
//! An apply or a heal pass allocates and frees buffers of up to a few MiB
//! (downloads, cache copies, hashing). glibc keeps freed memory in its heap
//! and returns only what sits at the top, so a buffer freed below a later,
//! long-lived allocation stays resident: on an idle node that was most of
//! the agent's anonymous memory, and what moved its RSS by a MiB from one
//! run to the next (BENCHMARKS.md, "Agent footprint"). `malloc_trim(0)`
//! hands every free page inside the heap back (`madvise(MADV_DONTNEED)`),
//! keeping the allocations in place. It costs a walk of the allocator's
//! free lists: microseconds on the agent's heap, after work that took
//! milliseconds at least.

/// Free space glibc may keep at the top of a heap (an arena) instead of
/// handing it back at once. Its default (128 KiB, raised with the largest
/// buffer freed so far) gave back the space of every few 256 KiB messages of
/// a transfer as it was freed, to fault it in again for the next ones:
/// with peer sharing that `madvise` and those page faults were a sixth of a
/// node's CPU per byte (BENCHMARKS.md, "Peer sharing"). Kept, it is reused;
/// [`trim`] after each apply and heal pass still gives it all back.
pub const KEEP_FREE: usize = 16 << 20;

/// Allocations from this size get their own mapping. Setting the trim
/// threshold fixes this one too (glibc stops adjusting both): above a
/// transfer's 256 KiB messages and 4 MiB pieces.
pub const MAP_FROM: usize = (4 << 20) + 1;

/// Has glibc keep freed memory for reuse during a burst of work
/// ([`KEEP_FREE`], [`MAP_FROM`]). Called once at the start; a no-op on
/// other C libraries.
pub fn keep_freed_memory_for_reuse() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `mallopt` takes integers only and changes the allocator's
    // own parameters under its own lock (mallopt(3): MT-Safe).
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, MAP_FROM as i32);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, KEEP_FREE as i32);
    }
}

/// Returns the heap's free pages to the kernel (glibc); a no-op on other C
/// libraries, which have no such call.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` takes no pointers, touches only the
    // allocator's own state under the allocator's own locks, and is
    // MT-Safe (glibc manual, "Memory Allocation Tunables" / malloc_trim(3)):
    // calling it while other threads allocate is allowed.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    /// What is still allocated stays intact across a trim.
    #[test]
    fn a_trim_keeps_live_allocations() {
        let keep: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 64 << 10]).collect();
        drop((0..32).map(|_| vec![0u8; 1 << 20]).collect::<Vec<_>>());
        super::trim();
        for (i, v) in keep.iter().enumerate() {
            assert!(v.iter().all(|b| usize::from(*b) == i));
        }
    }
}
