//! Writing a large file durably without a long fsync at the end.
//!
//! The kernel keeps a freshly written file in dirty pages until writeback
//! starts (30 s, or a tenth of memory), so `write` all, then `fsync` pays
//! for the whole disk write after the last byte: for a 256 MiB blob that
//! was as long as hashing it. [`FlushingWriter`] hands the writes to a
//! thread that calls `fdatasync` every [`FLUSH_EVERY`] bytes, so the disk
//! works while the caller reads and hashes the next bytes (staging a file
//! from the cache), and the closing `fsync` only has the tail left. The
//! caller never blocks on the disk unless the queue of [`QUEUE_BYTES`] is
//! full. Not used for downloads: there the disk measured slower competing
//! with the transfer than one fsync at the end.

use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Bytes written between two `fdatasync` calls of the writer thread.
/// Every `fdatasync` costs ~25 ms on the bench VM's disk whatever its size,
/// so 8 MiB was slower than one fsync at the end; 64 MiB is not.
pub const FLUSH_EVERY: u64 = 64 << 20;
/// Bytes the caller may be ahead of the writer thread, for writes of the
/// size given to [`FlushingWriter::new`].
pub const QUEUE_BYTES: usize = 8 << 20;

enum Msg {
    Data(Vec<u8>),
    /// Every byte is sent: set the permissions (if any), fsync and hand
    /// the file back. A writer dropped without it (a failed verify) is
    /// abandoned with no fsync.
    Finish(Option<Permissions>),
}

/// A file being written by a background thread; see the module docs.
pub struct FlushingWriter {
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<io::Result<File>>>,
}

impl FlushingWriter {
    /// `chunk` is the usual size of one write, which sizes the queue.
    pub fn new(file: File, chunk: usize) -> io::Result<Self> {
        Self::flushing_every(file, chunk, FLUSH_EVERY)
    }

    fn flushing_every(file: File, chunk: usize, every: u64) -> io::Result<Self> {
        let (tx, rx) = sync_channel((QUEUE_BYTES / chunk.max(1)).max(2));
        let thread = std::thread::Builder::new()
            .name("lks-flush-writer".into())
            .spawn(move || write_loop(file, rx, every))?;
        Ok(FlushingWriter {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `buf`; an error is the writer thread's (a full disk, say).
    pub fn write(&mut self, buf: Vec<u8>) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let sent = self.tx.as_ref().map(|tx| tx.send(Msg::Data(buf)).is_ok());
        if sent == Some(true) {
            return Ok(());
        }
        // The thread stopped early: its error says why.
        Err(self
            .join()
            .err()
            .unwrap_or_else(|| io::Error::other("the writer thread stopped")))
    }

    /// Waits until every byte is written, `perm` set (only now: a file's
    /// mode, setuid say, never applies to unverified bytes) and the file
    /// fsynced (data and metadata, `sync_all`), and returns the file.
    pub fn finish(mut self, perm: Option<Permissions>) -> io::Result<File> {
        if let Some(tx) = &self.tx {
            // A failed send means the thread already ended: join says why.
            let _ = tx.send(Msg::Finish(perm));
        }
        self.join()
    }

    fn join(&mut self) -> io::Result<File> {
        self.tx = None;
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked"))),
            None => Err(io::Error::other("the writer thread already ended")),
        }
    }
}

impl Drop for FlushingWriter {
    fn drop(&mut self) {
        // Abandoned (no finish): the thread sees the channel close and ends
        // without an fsync; waiting for it keeps the file closed when the
        // caller then removes it.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(mut file: File, rx: Receiver<Msg>, every: u64) -> io::Result<File> {
    let mut unflushed = 0u64;
    for msg in rx {
        match msg {
            Msg::Data(buf) => {
                file.write_all(&buf)?;
                unflushed += buf.len() as u64;
                if unflushed >= every {
                    nix::unistd::fdatasync(&file).map_err(io::Error::from)?;
                    unflushed = 0;
                }
            }
            Msg::Finish(perm) => {
                if let Some(perm) = perm {
                    file.set_permissions(perm)?;
                }
                file.sync_all()?;
                return Ok(file);
            }
        }
    }
    Err(io::Error::other("abandoned before the last byte"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_every_byte_in_order() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        // Flushing every 1 MB, in uneven pieces, so the thread flushes.
        let mut w = FlushingWriter::flushing_every(File::create(&p).unwrap(), 40_000, 1 << 20).unwrap();
        let mut want = Vec::new();
        for i in 0..300u32 {
            let chunk: Vec<u8> = (0..(40_000 + i)).map(|j| (i ^ j) as u8).collect();
            want.extend_from_slice(&chunk);
            w.write(chunk).unwrap();
        }
        w.write(Vec::new()).unwrap();
        let f = w.finish(Some(Permissions::from_mode(0o751))).unwrap();
        assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o7777, 0o751);
        assert_eq!(std::fs::read(&p).unwrap(), want);
    }

    #[test]
    fn a_write_error_comes_back_to_the_caller() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        // Read-only: the thread's first write fails.
        let mut w = FlushingWriter::new(File::open(&p).unwrap(), 1024).unwrap();
        let mut err = None;
        for _ in 0..1000 {
            if let Err(e) = w.write(vec![1; 1024]) {
                err = Some(e);
                break;
            }
        }
        let err = match err {
            Some(e) => e,
            None => w.finish(None).unwrap_err(),
        };
        assert_eq!(err.raw_os_error(), Some(nix::libc::EBADF), "{err}");
    }

    #[test]
    fn dropped_without_finish_ends_the_thread() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut w = FlushingWriter::new(File::create(&p).unwrap(), 40_000).unwrap();
        w.write(vec![7; 1000]).unwrap();
        drop(w);
        // The thread is joined: the bytes it had are in the file.
        assert_eq!(std::fs::read(&p).unwrap(), vec![7; 1000]);
    }
}
