//! Resolving bundle paths under a node root without ever leaving it.
//!
//! The agent treats a directory (`--root`, `/` in production) as the node's
//! filesystem. Every target is reached through a directory file descriptor
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so a
//! symlink planted anywhere in the parent chain that points outside the root
//! (or `..` trickery) fails with an error instead of redirecting a write. On
//! kernels without `openat2` the walk falls back to one `openat(O_NOFOLLOW)`
//! per component, which refuses every symlink in the chain.
//!
//! The last component is never followed either: reads use `O_NOFOLLOW` and
//! writes replace the directory entry by `renameat`, which swaps a symlink
//! itself rather than writing through it.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;

use lks_proto::BundlePath;

/// Why a path could not be placed under the root.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("open node root {root}: {source}")]
    OpenRoot { root: PathBuf, source: io::Error },
    #[error(
        "{path}: resolving it would leave the node root (a symlink or \"..\" in its parent chain points outside)"
    )]
    Escape { path: String },
    #[error("{path}: parent {parent:?} is not a directory")]
    NotADirectory { path: String, parent: String },
    #[error("{path}: parent directory {parent:?} does not exist")]
    MissingParent { path: String, parent: String },
    #[error("{path}: {op}: {source}")]
    Io {
        path: String,
        op: &'static str,
        source: io::Error,
    },
}

/// An open node root.
#[derive(Debug)]
pub struct NodeRoot {
    fd: OwnedFd,
    path: PathBuf,
}

impl NodeRoot {
    /// Opens `path` as the node root. It must be an existing directory.
    pub fn open(path: &Path) -> Result<Self, RootError> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| RootError::OpenRoot {
            root: path.to_path_buf(),
            source: e.into(),
        })?;
        Ok(NodeRoot {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The root as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where `target` lives on the host filesystem, for messages and for
    /// tools that need a plain path (`LKS_ROOT` joins the same way).
    pub fn host_path(&self, target: &BundlePath) -> PathBuf {
        self.path.join(target.relative())
    }

    /// Opens the parent directory of `target`, beneath the root. With
    /// `create`, missing directories are made (mode 0755), each one again
    /// resolved beneath the root.
    pub fn parent(&self, target: &BundlePath, create: bool) -> Result<ParentDir, RootError> {
        let parent_rel = target.parent_relative();
        let fd = if parent_rel.is_empty() {
            self.fd.try_clone().map_err(|e| io_err(target, "open root", e))?
        } else {
            match open_dir_beneath(&self.fd, parent_rel) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if create => self.create_parents(target)?,
                Err(e) => return Err(resolve_error(target, parent_rel, e)),
            }
        };
        Ok(ParentDir {
            fd,
            name: target.file_name().into(),
            target: target.clone(),
        })
    }

    fn create_parents(&self, target: &BundlePath) -> Result<OwnedFd, RootError> {
        let parent_rel = target.parent_relative();
        let mut dir = self.fd.try_clone().map_err(|e| io_err(target, "open root", e))?;
        let mut prefix = String::new();
        for comp in parent_rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            // Resolve the whole prefix from the root each time so a symlink
            // that stays inside the root still works while one that leaves
            // it is refused.
            dir = match open_dir_beneath(&self.fd, &prefix) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    match nix::sys::stat::mkdirat(&dir, comp, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(io_err(target, "create parent directory", e.into())),
                    }
                    open_dir_beneath(&self.fd, &prefix).map_err(|e| resolve_error(target, &prefix, e))?
                }
                Err(e) => return Err(resolve_error(target, &prefix, e)),
            };
        }
        Ok(dir)
    }
}

/// The directory that holds one target, opened beneath the root, plus the
/// target's name in it. All operations are relative to the directory fd.
#[derive(Debug)]
pub struct ParentDir {
    fd: OwnedFd,
    name: OsString,
    target: BundlePath,
}

impl ParentDir {
    pub fn target(&self) -> &BundlePath {
        &self.target
    }

    /// The target's name in this directory.
    pub fn name(&self) -> &OsString {
        &self.name
    }

    /// Opens the target for reading without following a symlink.
    /// `Ok(None)` if it does not exist.
    pub fn open_target(&self) -> Result<Option<File>, RootError> {
        self.open_entry(&self.name.clone())
    }

    /// Opens an entry of this directory for reading without following a symlink.
    pub fn open_entry(&self, name: &OsString) -> Result<Option<File>, RootError> {
        match nix::fcntl::openat(
            &self.fd,
            name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ELOOP) => Err(RootError::Io {
                path: self.target.to_string(),
                op: "open",
                source: io::Error::other("is a symlink; refusing to follow it"),
            }),
            Err(e) => Err(io_err(&self.target, "open", e.into())),
        }
    }

    /// `lstat` of an entry; `Ok(None)` if it does not exist.
    pub fn stat_entry(&self, name: &OsString) -> Result<Option<FileStat>, RootError> {
        match nix::sys::stat::fstatat(&self.fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io_err(&self.target, "stat", e.into())),
        }
    }

    /// `lstat` of the target.
    pub fn stat_target(&self) -> Result<Option<FileStat>, RootError> {
        self.stat_entry(&self.name.clone())
    }

    /// Creates a fresh, empty file `name` in this directory (mode 0600,
    /// exclusive). A leftover of the same name from an interrupted run is
    /// removed first.
    pub fn create_entry(&self, name: &OsString) -> Result<File, RootError> {
        self.remove_entry(name)?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| io_err(&self.target, "create", e.into()))?;
        Ok(File::from(fd))
    }

    /// Atomically replaces entry `to` with entry `from` (both in this directory).
    pub fn rename_entry(&self, from: &OsString, to: &OsString) -> Result<(), RootError> {
        nix::fcntl::renameat(&self.fd, from.as_os_str(), &self.fd, to.as_os_str())
            .map_err(|e| io_err(&self.target, "rename", e.into()))
    }

    /// Atomically swaps two entries of this directory (`RENAME_EXCHANGE`).
    pub fn exchange_entries(&self, a: &OsString, b: &OsString) -> Result<(), RootError> {
        nix::fcntl::renameat2(
            &self.fd,
            a.as_os_str(),
            &self.fd,
            b.as_os_str(),
            RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(|e| io_err(&self.target, "exchange", e.into()))
    }

    /// Removes entry `name` (not a directory); a missing entry is fine.
    pub fn remove_entry(&self, name: &OsString) -> Result<(), RootError> {
        match nix::unistd::unlinkat(&self.fd, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io_err(&self.target, "remove", e.into())),
        }
    }

    /// fsync of the directory, so renames and removals in it are durable.
    pub fn sync(&self) -> Result<(), RootError> {
        nix::unistd::fsync(&self.fd).map_err(|e| io_err(&self.target, "fsync directory", e.into()))
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn open_dir_beneath(root: &OwnedFd, rel: &str) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match nix::fcntl::openat2(root, rel, how) {
        Err(Errno::ENOSYS) | Err(Errno::EPERM) => walk_nofollow(root, rel),
        // openat2 reports a retry-worthy race with EAGAIN; one retry, then
        // the conservative walk.
        Err(Errno::EAGAIN) => nix::fcntl::openat2(root, rel, how).or_else(|_| walk_nofollow(root, rel)),
        other => other,
    }
}

/// Fallback for kernels before 5.6: one `openat(O_NOFOLLOW)` per component.
/// Stricter than `RESOLVE_BENEATH`: every symlink in the chain is refused.
fn walk_nofollow(root: &OwnedFd, rel: &str) -> Result<OwnedFd, Errno> {
    let mut dir = root.try_clone().map_err(|_| Errno::EMFILE)?;
    for comp in rel.split('/') {
        if comp == ".." || comp == "." || comp.is_empty() {
            return Err(Errno::EXDEV);
        }
        dir = nix::fcntl::openat(
            &dir,
            comp,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP => Errno::EXDEV,
            // With O_DIRECTORY a symlink reports ENOTDIR; tell the two apart.
            Errno::ENOTDIR => match nix::sys::stat::fstatat(&dir, comp, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK => Errno::EXDEV,
                _ => Errno::ENOTDIR,
            },
            e => e,
        })?;
    }
    Ok(dir)
}

fn resolve_error(target: &BundlePath, parent: &str, e: Errno) -> RootError {
    let path = target.to_string();
    let parent = format!("/{parent}");
    match e {
        Errno::EXDEV | Errno::ELOOP => RootError::Escape { path },
        Errno::ENOTDIR => RootError::NotADirectory { path, parent },
        Errno::ENOENT => RootError::MissingParent { path, parent },
        e => RootError::Io {
            path,
            op: "open parent directory",
            source: e.into(),
        },
    }
}

fn io_err(target: &BundlePath, op: &'static str, source: io::Error) -> RootError {
    RootError::Io {
        path: target.to_string(),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::symlink;

    fn p(s: &str) -> BundlePath {
        BundlePath::new(s).unwrap()
    }

    #[test]
    fn creates_parents_and_writes_inside_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let parent = root.parent(&p("/etc/kubernetes/kubelet.conf"), true).unwrap();
        let tmp: OsString = ".kubelet.conf.tmp".into();
        let mut f = parent.create_entry(&tmp).unwrap();
        f.write_all(b"hello").unwrap();
        parent.rename_entry(&tmp, parent.name()).unwrap();
        parent.sync().unwrap();
        let mut s = String::new();
        parent
            .open_target()
            .unwrap()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "hello");
        assert_eq!(
            std::fs::read(dir.path().join("etc/kubernetes/kubelet.conf")).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn missing_parent_without_create() {
        let dir = tempfile::tempdir().unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let err = root.parent(&p("/nope/x"), false).unwrap_err();
        assert!(matches!(err, RootError::MissingParent { .. }), "{err}");
    }

    #[test]
    fn symlinked_parent_pointing_outside_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        symlink(outside.path(), dir.path().join("etc/kubernetes")).unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        for create in [false, true] {
            let err = root
                .parent(&p("/etc/kubernetes/kubelet.conf"), create)
                .unwrap_err();
            assert!(matches!(err, RootError::Escape { .. }), "{err}");
            assert!(err.to_string().contains("leave the node root"));
        }
        // Deeper below the planted link, with directories still to create.
        let err = root
            .parent(&p("/etc/kubernetes/pki/new/ca.crt"), true)
            .unwrap_err();
        assert!(matches!(err, RootError::Escape { .. }), "{err}");
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing written outside"
        );
    }

    #[test]
    fn relative_symlink_escaping_with_dotdot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        symlink("../../../../../../tmp", dir.path().join("etc/sneaky")).unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let err = root.parent(&p("/etc/sneaky/x"), true).unwrap_err();
        assert!(matches!(err, RootError::Escape { .. }), "{err}");
    }

    #[test]
    fn symlink_staying_inside_root_is_followed() {
        // Debian's merged /usr: /bin -> usr/bin must keep working.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        symlink("usr/bin", dir.path().join("bin")).unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let parent = root.parent(&p("/bin/tool"), false).unwrap();
        let name: OsString = "tool".into();
        parent.create_entry(&name).unwrap();
        assert!(dir.path().join("usr/bin/tool").exists());
    }

    #[test]
    fn final_symlink_is_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let parent = root.parent(&p("/link"), false).unwrap();
        assert!(
            parent.open_target().is_err(),
            "reading through a final symlink is refused"
        );
        // Replacing it swaps the link itself; the outside file is untouched.
        let tmp: OsString = ".link.tmp".into();
        parent.create_entry(&tmp).unwrap().write_all(b"new").unwrap();
        parent.rename_entry(&tmp, parent.name()).unwrap();
        assert_eq!(std::fs::read(outside.path().join("secret")).unwrap(), b"s");
        assert_eq!(std::fs::read(dir.path().join("link")).unwrap(), b"new");
    }

    #[test]
    fn file_in_parent_chain_is_not_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etc"), b"").unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        let err = root.parent(&p("/etc/x"), true).unwrap_err();
        assert!(matches!(err, RootError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn nofollow_walk_refuses_any_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        symlink("usr", dir.path().join("u")).unwrap();
        let root = NodeRoot::open(dir.path()).unwrap();
        assert!(walk_nofollow(&root.fd, "usr/bin").is_ok());
        assert_eq!(walk_nofollow(&root.fd, "u/bin").unwrap_err(), Errno::EXDEV);
    }
}
