//! Starting the disk write of bytes already written, without waiting for
//! it. A file fetched in pieces is fsynced once, when it is whole (DESIGN
//! §5); written back only then, its every byte waits for that fsync. When a
//! batch of nodes on one host finish together, their fsyncs all come at
//! once and the CPUs sit idle on the disk (BENCHMARKS.md, "Peer sharing").
//! Started as each piece is verified, the write runs beside the transfer
//! and the closing fsync has only the last piece and the metadata left.

use std::fs::File;
use std::io;

/// Asks the kernel to start writing `len` bytes of `file` from `offset` to
/// the disk, and returns without waiting for the write (Linux's
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which may still block while
/// the disk's queue is full: call it off the async runtime). Durability
/// still comes from an `fsync` later; this only makes that one quicker.
/// Elsewhere a no-op.
#[cfg(target_os = "linux")]
pub fn start_writeback(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    #[allow(unsafe_code)]
    // SAFETY: `file` is borrowed, so its descriptor stays open for the
    // call; the others are integers. The kernel reads and writes no memory
    // of this process.
    let r = unsafe {
        nix::libc::sync_file_range(file.as_raw_fd(), offset, len, nix::libc::SYNC_FILE_RANGE_WRITE)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn start_writeback(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A written file's range is accepted; what the call does is the
    /// kernel's (the benchmark shows the fsync burst it removes), what it
    /// refuses comes back as the error it is: a pipe has no pages to write.
    #[test]
    fn a_files_range_is_handed_on_and_a_pipe_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = File::create(dir.path().join("x")).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        start_writeback(&f, 0, 1 << 20).unwrap();
        f.sync_all().unwrap();
        let (r, _w) = nix::unistd::pipe().unwrap();
        let e = start_writeback(&File::from(r), 0, 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ESPIPE), "{e}");
    }

    #[test]
    fn a_range_past_what_an_offset_can_hold_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("x")).unwrap();
        let e = start_writeback(&f, u64::MAX, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
