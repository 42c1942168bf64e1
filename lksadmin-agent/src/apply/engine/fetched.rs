//! The engine's side of writing a file's bytes once (issue [write-once]):
//! a verified download in `cache/fetched/` is moved beside its target
//! instead of copied; a rollback gives the new bytes back there; and after
//! the commit and its status report, off the rollout's path, each new blob
//! is copied from its target into the cache: by the kernel while the
//! target's inode is the one this process switched in, else hashed while
//! copying and kept only if it matches.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;

use lks_proto::fsutil;
use lks_proto::{Digest, FileSpec};

use super::{ApplyError, Engine, StageError, is_regular};
use crate::apply::inode::InodeMeta;
use crate::apply::journal::{PathPlan, Txn, Want};
use crate::apply::root::RootError;
use crate::fault;

impl Engine {
    /// Moves the verified download of `digest` (`cache/fetched/`) into the
    /// plan's temp entry and sets its mode: the bytes were written, hashed
    /// and fsynced once, as they arrived. False if there is no such
    /// download, or it is on another file system than the target (then it
    /// becomes the cache entry, copied from there).
    pub(super) fn stage_fetched(
        &self,
        plan: &PathPlan,
        digest: Digest,
        size: u64,
        mode: u32,
    ) -> Result<bool, ApplyError> {
        let stage = |error: StageError| ApplyError::Stage {
            path: plan.path.clone(),
            error,
        };
        let Some(src) = self
            .cache
            .verified_fetched(&digest, size)
            .map_err(|e| stage(e.into()))?
        else {
            return Ok(false);
        };
        // A staged entry is private until its mode is set (as
        // `create_entry` makes one); a download given back by a rollback
        // may carry another file's mode.
        fs::set_permissions(&src, fs::Permissions::from_mode(0o600)).map_err(|error| {
            stage(StageError::FetchedMode {
                file: src.clone(),
                error,
            })
        })?;
        let parent = self.root.parent(&plan.path, true)?;
        let temp: std::ffi::OsString = plan.temp.clone().into();
        // Peers may go on fetching these bytes from this node while they
        // are out of the cache, between this move and the cache copy.
        self.source.keep_serving_moved(digest, &src);
        match nix::fcntl::renameat(nix::fcntl::AT_FDCWD, &src, parent.as_fd(), temp.as_os_str()) {
            Ok(()) => {}
            Err(nix::errno::Errno::EXDEV) => {
                self.cache
                    .promote_fetched(&digest, size)
                    .map_err(|e| stage(e.into()))?;
                return Ok(false);
            }
            Err(error) => {
                return Err(stage(StageError::MoveFetched { file: src, error }));
            }
        }
        // The mode only now, on verified bytes; fsynced like a staged copy
        // (the data was fsynced when it was fetched).
        let set_mode = || -> Result<(), StageError> {
            let f = parent
                .open_entry(&temp)
                .map_err(StageError::OpenMoved)?
                .ok_or(StageError::MovedVanished)?;
            f.set_permissions(fs::Permissions::from_mode(mode))
                .and_then(|()| f.sync_all())
                .map_err(StageError::SyncMoved)
        };
        if let Err(e) = set_mode() {
            let _ = parent.remove_entry(&temp);
            return Err(stage(e));
        }
        self.stages_unhashed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// The temp entry an earlier plan of this transaction staged with the
    /// same blob (a bundle with two files of the same bytes: the download
    /// was moved to the first).
    pub(super) fn staged_earlier(
        &self,
        earlier: &[PathPlan],
        digest: &Digest,
    ) -> Result<Option<File>, RootError> {
        for p in earlier {
            if !matches!(p.want, Want::Blob { digest: d, .. } if d == *digest) {
                continue;
            }
            let Ok(parent) = self.root.parent(&p.path, false) else {
                continue;
            };
            if let Some(f) = parent.open_entry(&p.temp.clone().into())? {
                return Ok(Some(f));
            }
        }
        Ok(None)
    }

    /// Before a rollback removes or overwrites the new version's files,
    /// gives their bytes back to `cache/fetched/`, so that trying again
    /// (after a crash, on `lksctl node retry`) needs no new download: a
    /// staged temp entry is moved back, a switched-in target linked (the
    /// restore then replaces the target's name, not its inode). Best
    /// effort; such a file is hashed before it is used again, and what
    /// cannot be kept (another file system) is fetched again.
    pub(super) fn give_back(&self, txn: &Txn, touched: bool) {
        let Ok(dir) = self.cache.create_fetched_dir() else {
            return;
        };
        let sized = |st: Option<nix::sys::stat::FileStat>, size: u64| {
            st.is_some_and(|st| is_regular(&st) && st.st_size as u64 == size)
        };
        for plan in &txn.plans {
            let Want::Blob { digest, size, .. } = plan.want else {
                continue;
            };
            let dst = self.cache.fetched_path(&digest);
            if self.cache.contains(&digest) || dst.exists() {
                continue;
            }
            let Ok(parent) = self.root.parent(&plan.path, false) else {
                continue;
            };
            let temp: std::ffi::OsString = plan.temp.clone().into();
            let kept = if sized(parent.stat_entry(&temp).ok().flatten(), size) {
                nix::fcntl::renameat(parent.as_fd(), temp.as_os_str(), nix::fcntl::AT_FDCWD, &dst).is_ok()
            } else if touched && sized(parent.stat_target().ok().flatten(), size) {
                nix::unistd::linkat(
                    parent.as_fd(),
                    parent.name().as_os_str(),
                    nix::fcntl::AT_FDCWD,
                    &dst,
                    nix::fcntl::AtFlags::empty(),
                )
                .is_ok()
            } else {
                false
            };
            if kept {
                tracing::debug!(path = %plan.path, %digest, "kept the new bytes for the next try");
            }
        }
        let _ = fsutil::sync_dir(&dir);
    }

    /// Makes the cache entry of every installed file whose blob is not
    /// cached yet — the files an apply switched in from downloads it moved
    /// into place — from its target: hashed while copying, kept only if it
    /// matches the manifest (a target that drifted since is not cached;
    /// drift repair fetches it). Runs after the status report (the end of a
    /// reconcile) and at every heal pass (after a kill before the copy).
    pub fn fill_cache(&mut self) {
        let mut seen = BTreeSet::new();
        let files: Vec<FileSpec> = self
            .installed_files()
            // By path: of two paths with the same bytes, the second is
            // tried when the first drifted (else its blob is cached by then).
            .filter(|f| seen.insert(f.path.clone()))
            .cloned()
            .collect();
        for f in files {
            if self.cache.contains(&f.digest) {
                self.uncacheable.remove(&f.path);
                continue;
            }
            match self.cache_from_target(&f) {
                Ok(true) => {
                    self.uncacheable.remove(&f.path);
                    tracing::debug!(path = %f.path, digest = %f.digest, "blob copied into the cache");
                }
                Ok(false) => tracing::warn!(
                    path = %f.path,
                    digest = %f.digest,
                    "not cached: the file no longer holds the bytes that were switched in; drift repair fetches them"
                ),
                Err(e) => tracing::warn!(path = %f.path, "copy into the cache: {e}"),
            }
        }
        self.source.release_moved();
    }

    /// Before downloading `digest`: if an installed file holds those bytes
    /// but they are not cached yet (another bundle applied earlier in this
    /// reconcile, before its cache copy), copies them from there instead.
    pub(super) fn cache_from_installed(&mut self, digest: &Digest) {
        if self.cache.contains(digest) {
            return;
        }
        let holders: Vec<FileSpec> = self
            .installed_files()
            .filter(|f| f.digest == *digest)
            .cloned()
            .collect();
        for f in holders {
            if let Ok(true) = self.cache_from_target(&f) {
                return;
            }
        }
    }

    /// A base a binary delta for `f` may apply to besides the cache (issue
    /// [delta]): the file of the installed version of bundle `name` at the
    /// same path, other bytes, open for reading (its size as recorded; the
    /// rebuild hashes it whole, so a target that drifted is refused there).
    pub(super) fn delta_base(&self, name: &str, f: &FileSpec) -> Option<(Digest, File)> {
        let m = self.state.bundles.get(name)?.installed.as_ref()?;
        let old = m
            .files
            .iter()
            .find(|o| o.path == f.path && o.arch == f.arch && o.digest != f.digest && o.url.is_none())?;
        if self.cache.contains(&old.digest) {
            return None;
        }
        let parent = self.root.parent(&old.path, false).ok()?;
        match parent.stat_target().ok()?? {
            st if is_regular(&st) && st.st_size as u64 == old.size => {}
            _ => return None,
        }
        Some((old.digest, parent.open_target().ok()??))
    }

    /// The files of every installed bundle version but a self-update's
    /// (whose bytes are the cache's own).
    pub(super) fn installed_files(&self) -> impl Iterator<Item = &FileSpec> {
        self.state
            .bundles
            .values()
            .filter_map(|r| r.installed.as_ref())
            .filter(|m| !m.self_update)
            .flat_map(|m| m.all_files())
    }

    /// One blob of [`Engine::fill_cache`]: from `fetched/` if a download is
    /// still there, else copied from the target.
    fn cache_from_target(&mut self, f: &FileSpec) -> Result<bool, ApplyError> {
        if self.cache.promote_fetched(&f.digest, f.size)? {
            return Ok(true);
        }
        let Ok(parent) = self.root.parent(&f.path, false) else {
            return Ok(false);
        };
        let meta = match parent.stat_target()? {
            Some(st) if is_regular(&st) && st.st_size as u64 == f.size => InodeMeta::of(&st),
            _ => return Ok(false),
        };
        // A file whose copy did not match is not read again until it
        // changes (a repair): an offline node with a drifted 256 MiB file
        // would otherwise copy it at every heal pass.
        if self.uncacheable.get(&f.path) == Some(&meta) {
            return Ok(false);
        }
        let Some(src) = parent.open_target()? else {
            return Ok(false);
        };
        // The very inode that is read: when it is as it was when this
        // process switched it in from verified bytes (or a heal pass last
        // hashed it), its bytes are those; the trust a heal pass and a
        // backup give it (see `InodeMeta`). Else it is hashed while copied.
        let known = nix::sys::stat::fstat(&src)
            .is_ok_and(|st| self.unchanged_since_verified(&f.path, &st, &f.digest));
        fault::point("cache-copy");
        self.cache_copies += 1;
        let cached = self.cache.copy_in(src, &f.digest, f.size, known)?;
        if !cached {
            self.uncacheable.insert(f.path.clone(), meta);
        }
        Ok(cached)
    }
}
