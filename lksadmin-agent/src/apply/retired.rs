//! The files an upgrade replaced, kept open until the rollout's status is
//! reported (issue [upgrade-cost]).
//!
//! Renaming a new file over a target drops the old inode's last link, and
//! the kernel frees it inside that `rename`: its blocks, and every page of
//! it the page cache holds. For a 256 MiB file just written that is
//! ~130 ms measured on ext4 (BENCHMARKS.md, "Upgrades as cheap as
//! installs"), spent on the rollout's path between the switch and the
//! report, and only by an upgrade: a fresh install replaces nothing. Held
//! open, the old inode outlives its name, so the rename only swaps an
//! entry; [`Retired::release`] closes the files after the report, on a
//! thread of their own, where the kernel frees them.
//!
//! Nothing here is needed to roll back: a rollback restores from the
//! transaction's backups and the cache, never from these. A crash before
//! the release loses nothing either: the kernel closes a dead process's
//! files, and ext4's orphan list frees an inode left unlinked by a power
//! cut at the next mount.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use crate::apply::engine::is_regular;
use crate::apply::root::ParentDir;

/// Files smaller than this are freed in the rename at no cost worth a
/// file descriptor.
pub const MIN_SIZE: u64 = 1 << 20;

/// At most this many files are held at once (a bundle of many large
/// files holds its first ones; the rest are freed in their renames, as
/// before): a bound on the descriptors the agent keeps for this.
pub const MAX_HELD: usize = 32;

/// The replaced files of the transactions since the last report.
#[derive(Debug, Default)]
pub struct Retired {
    held: Vec<File>,
    /// Files released so far (tests).
    released: u64,
}

impl Retired {
    /// Before `parent`'s target is replaced or removed: keeps it open if it
    /// is a regular file of at least [`MIN_SIZE`] bytes and fewer than
    /// [`MAX_HELD`] are held. Never fails: a file that cannot be opened is
    /// freed in the rename, as without this.
    pub fn hold(&mut self, parent: &ParentDir) {
        if self.held.len() >= MAX_HELD {
            return;
        }
        // Looked at before it is opened: opening a device or a FIFO that
        // drifted into a managed path could have effects of its own.
        match parent.stat_target() {
            Ok(Some(st)) if is_regular(&st) && st.st_size as u64 >= MIN_SIZE => {}
            _ => return,
        }
        let Ok(Some(f)) = parent.open_target() else { return };
        // The entry may have changed between the stat and the open.
        if f.metadata().is_ok_and(|m| m.is_file() && m.size() >= MIN_SIZE) {
            self.held.push(f);
        }
    }

    /// How many files are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// How many files were released so far.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Closes the held files on a thread of their own (inline if none can
    /// be started), so that freeing them costs the caller nothing. Called
    /// once the status is reported.
    pub fn release(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let files = std::mem::take(&mut self.held);
        let n = files.len();
        self.released += n as u64;
        match std::thread::Builder::new()
            .name("lks-retired".into())
            .spawn(move || drop(files))
        {
            Ok(_) => tracing::debug!(files = n, "closing the files the last transactions replaced"),
            // The closure, and the files it owns, were dropped with the
            // error: closed here, as they would have been in the renames.
            Err(e) => tracing::debug!(files = n, "closing replaced files inline: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    use lks_proto::BundlePath;

    use super::*;
    use crate::apply::root::NodeRoot;

    fn setup(sizes: &[(&str, usize)]) -> (tempfile::TempDir, NodeRoot) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("opt")).unwrap();
        for (name, size) in sizes {
            fs::write(dir.path().join("opt").join(name), vec![7u8; *size]).unwrap();
        }
        let root = NodeRoot::open(dir.path()).unwrap();
        (dir, root)
    }

    fn parent(root: &NodeRoot, path: &str) -> ParentDir {
        root.parent(&BundlePath::new(path).unwrap(), false).unwrap()
    }

    #[test]
    fn a_replaced_large_file_outlives_its_name_until_released() {
        let big = MIN_SIZE as usize;
        let (dir, root) = setup(&[("kubelet", big), ("kubelet.new", 3)]);
        let p = parent(&root, "/opt/kubelet");
        let mut retired = Retired::default();
        retired.hold(&p);
        assert_eq!(retired.len(), 1);
        p.rename_entry(&"kubelet.new".into(), p.name()).unwrap();
        // The name holds the new bytes; the old inode is alive, unlinked,
        // with all its bytes.
        assert_eq!(fs::read(dir.path().join("opt/kubelet")).unwrap(), vec![7u8; 3]);
        let meta = retired.held[0].metadata().unwrap();
        assert_eq!((meta.nlink(), meta.size()), (0, big as u64));
        retired.release();
        assert!(retired.is_empty());
        assert_eq!(retired.released(), 1);
    }

    #[test]
    fn small_files_missing_targets_and_non_files_are_not_held() {
        let (dir, root) = setup(&[("small", MIN_SIZE as usize - 1)]);
        fs::create_dir(dir.path().join("opt/adir")).unwrap();
        std::os::unix::fs::symlink("small", dir.path().join("opt/link")).unwrap();
        let mut retired = Retired::default();
        for path in ["/opt/small", "/opt/missing", "/opt/adir", "/opt/link"] {
            retired.hold(&parent(&root, path));
        }
        assert!(retired.is_empty());
    }

    #[test]
    fn at_most_max_held_files_are_kept() {
        let names: Vec<String> = (0..MAX_HELD + 2).map(|i| format!("f{i}")).collect();
        let sizes: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), MIN_SIZE as usize)).collect();
        let (_dir, root) = setup(&sizes);
        let mut retired = Retired::default();
        for n in &names {
            retired.hold(&parent(&root, &format!("/opt/{n}")));
        }
        assert_eq!(retired.len(), MAX_HELD);
        retired.release();
        assert!(retired.is_empty());
    }
}
