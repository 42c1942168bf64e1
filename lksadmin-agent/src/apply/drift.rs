//! Drift notification by inotify: heal within a second of a managed file
//! being written, replaced, removed or chmodded, instead of at the next
//! periodic pass.
//!
//! The watches are on the managed files' parent directories, not on the
//! files: an editor or `cp` that replaces a file by rename gives it a new
//! inode, which a watch on the old one would never see. Events are filtered
//! to the managed names in each directory, so a busy directory such as
//! `/usr/local/bin` wakes the agent only for its own files. Some events stand
//! for "anything may have changed": the directory itself removed or moved, or
//! the kernel's queue overflowing. They wake it too.
//!
//! This only decides *when* to heal. What is repaired is still decided by
//! [`crate::apply::engine::Engine::heal`], which hashes every managed file; the
//! periodic pass still runs, and it covers what inotify cannot see. That
//! includes directories that do not exist yet, filesystems without inotify
//! and a watch limit reached. The agent's own writes wake the watcher too;
//! the pass that follows finds everything intact, so it converges. A watch
//! that is new (a directory that appeared, or that a heal recreated) signals
//! once too: an edit made before the watch existed has no event, so one
//! more pass looks after the watch is in place.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::mpsc;

/// How often the reader thread looks whether it should stop.
const STOP_CHECK_MS: u16 = 250;

/// Directory events that may concern a managed file.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// Events about the watched directory itself.
fn wholesale() -> AddWatchFlags {
    AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_IGNORED
        | AddWatchFlags::IN_UNMOUNT
}

/// The watches: managed names per watch descriptor, and the descriptor of
/// each directory.
#[derive(Default)]
struct Watches {
    by_wd: BTreeMap<WatchDescriptor, BTreeSet<OsString>>,
    by_dir: BTreeMap<PathBuf, WatchDescriptor>,
}

impl Watches {
    fn relevant(&self, wd: WatchDescriptor, mask: AddWatchFlags, name: Option<&OsStr>) -> bool {
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return true;
        }
        // Events of a watch removed since (its IN_IGNORED above all) are
        // stale; a watched directory going away is not.
        let Some(names) = self.by_wd.get(&wd) else {
            return false;
        };
        mask.intersects(wholesale()) || name.is_some_and(|n| names.contains(n))
    }
}

struct Shared {
    inotify: Inotify,
    watches: Mutex<Watches>,
    stop: AtomicBool,
}

/// Watches the parent directories of a set of files. A thread of its own
/// blocks on the inotify descriptor (with a timeout, to notice [`Drop`]) and
/// signals relevant events over a channel of one: a burst of events leaves
/// one signal.
pub struct DriftWatcher {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<()>,
    /// The channel's own sender, to signal a watch that was (re)made.
    tx: mpsc::Sender<()>,
}

impl DriftWatcher {
    /// A watcher with no watches; an error where inotify is unavailable.
    pub fn new() -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let shared = Arc::new(Shared {
            inotify,
            watches: Mutex::new(Watches::default()),
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(1);
        let own = tx.clone();
        let reader = shared.clone();
        std::thread::Builder::new()
            .name("lks-drift".into())
            .spawn(move || read_loop(&reader, &tx))?;
        Ok(DriftWatcher { shared, rx, tx: own })
    }

    /// Watches exactly the parent directories of `files`, for their names.
    /// Returns the directories that could not be watched (missing, or the
    /// watch limit reached), for the caller to log; the periodic heal
    /// covers them.
    pub fn set_files<I>(&mut self, files: I) -> Vec<(PathBuf, Errno)>
    where
        I: IntoIterator<Item = PathBuf>,
    {
        let mut want: BTreeMap<PathBuf, BTreeSet<OsString>> = BTreeMap::new();
        for f in files {
            if let (Some(dir), Some(name)) = (f.parent(), f.file_name()) {
                want.entry(dir.to_path_buf())
                    .or_default()
                    .insert(name.to_os_string());
            }
        }
        let ino = &self.shared.inotify;
        let mut w = self.shared.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<PathBuf> = w
            .by_dir
            .keys()
            .filter(|d| !want.contains_key(*d))
            .cloned()
            .collect();
        for dir in gone {
            if let Some(wd) = w.by_dir.remove(&dir) {
                w.by_wd.remove(&wd);
                // EINVAL: the kernel dropped it already (directory removed).
                let _ = ino.rm_watch(wd);
            }
        }
        let mut failed = Vec::new();
        for (dir, names) in want {
            // Adding again refreshes a watch the kernel may have dropped and
            // returns the same descriptor for the same inode.
            match ino.add_watch(&dir, mask()) {
                Ok(wd) => {
                    let old = w.by_dir.insert(dir, wd);
                    if let Some(old) = old
                        && old != wd
                    {
                        w.by_wd.remove(&old);
                        let _ = ino.rm_watch(old);
                    }
                    if old != Some(wd) {
                        // A new watch (a directory that appeared or was
                        // recreated, e.g. by a heal): a change made before
                        // the watch existed has no event, so one more heal
                        // looks now that it does.
                        let _ = self.tx.try_send(());
                    }
                    w.by_wd.insert(wd, names);
                }
                Err(e) => {
                    if let Some(old) = w.by_dir.remove(&dir) {
                        w.by_wd.remove(&old);
                    }
                    failed.push((dir, e));
                }
            }
        }
        failed
    }

    /// How many directories are watched.
    pub fn watched_dirs(&self) -> usize {
        self.shared
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_wd
            .len()
    }

    /// Waits until a watched file may have changed. Cancel-safe. An error
    /// means the reader thread stopped (inotify failed): no more signals.
    pub async fn changed(&mut self) -> io::Result<()> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::other("the inotify reader stopped"))
    }

    /// Forgets a signal already sent, so that a burst of writes that ended
    /// leads to one heal.
    pub fn drain(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }
}

impl Drop for DriftWatcher {
    fn drop(&mut self) {
        // The thread notices within STOP_CHECK_MS; nothing waits for it.
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn read_loop(s: &Shared, tx: &mpsc::Sender<()>) {
    while !s.stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(s.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(STOP_CHECK_MS)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("inotify: poll: {e}");
                return;
            }
        }
        let events = match s.inotify.read_events() {
            Ok(ev) => ev,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("inotify: read: {e}");
                return;
            }
        };
        let relevant = {
            let w = s.watches.lock().unwrap_or_else(PoisonError::into_inner);
            events.iter().any(|e| w.relevant(e.wd, e.mask, e.name.as_deref()))
        };
        if relevant {
            match tx.try_send(()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                Err(mpsc::error::TrySendError::Closed(())) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;

    /// Whether `changed` fires within a short time.
    async fn fires(w: &mut DriftWatcher) -> bool {
        tokio::time::timeout(Duration::from_millis(500), w.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn managed_names_wake_it_and_other_names_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let managed = etc.join("kubelet.conf");
        std::fs::write(&managed, "v1").unwrap();
        let mut w = DriftWatcher::new().unwrap();
        assert!(w.set_files([managed.clone()]).is_empty());
        assert_eq!(w.watched_dirs(), 1);
        // A new watch asks for one look: a change made before it existed
        // has no event of its own.
        assert!(fires(&mut w).await, "a new watch");
        w.drain();
        assert!(w.set_files([managed.clone()]).is_empty());
        assert!(!fires(&mut w).await, "the same watch again: nothing happened");

        std::fs::write(etc.join("unrelated"), "x").unwrap();
        assert!(!fires(&mut w).await, "another file in the same directory");

        std::fs::write(&managed, "edited").unwrap();
        assert!(fires(&mut w).await, "an in-place write");
        w.drain();

        let tmp = etc.join("kubelet.conf.new");
        std::fs::write(&tmp, "replaced").unwrap();
        w.drain();
        std::fs::rename(&tmp, &managed).unwrap();
        assert!(fires(&mut w).await, "a replacement by rename");
        w.drain();

        std::fs::set_permissions(&managed, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(fires(&mut w).await, "a chmod");
        w.drain();

        std::fs::remove_file(&managed).unwrap();
        assert!(fires(&mut w).await, "a removal");
        w.drain();

        // Not watched any more: silence.
        w.set_files(Vec::new());
        assert_eq!(w.watched_dirs(), 0);
        std::fs::write(&managed, "back").unwrap();
        assert!(!fires(&mut w).await, "no watches left");
    }

    #[tokio::test]
    async fn a_removed_directory_wakes_it_and_missing_ones_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("opt");
        std::fs::create_dir(&d).unwrap();
        let missing = dir.path().join("nope").join("file");
        let mut w = DriftWatcher::new().unwrap();
        let failed = w.set_files([d.join("a"), missing.clone()]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, dir.path().join("nope"));
        assert_eq!(failed[0].1, Errno::ENOENT);
        std::fs::remove_dir(&d).unwrap();
        assert!(fires(&mut w).await, "the directory went away");
        w.drain();
        // Watching again once it exists.
        std::fs::create_dir(&d).unwrap();
        assert!(w.set_files([d.join("a")]).is_empty());
        std::fs::write(d.join("a"), "x").unwrap();
        assert!(fires(&mut w).await);
    }
}
