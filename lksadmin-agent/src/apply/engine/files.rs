//! The file operations of a transaction, each beneath the node root:
//! stage the wanted bytes into a temp entry beside the target (verified,
//! with its mode, fsynced), back up what the target holds, switch by
//! rename, and restore a backup during a rollback.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use lks_proto::digest::{Hasher, Verifier};
use lks_proto::{BundlePath, Digest, Manifest};

use super::{ApplyError, Engine, WriteError, is_regular};
use crate::apply::flushwriter::FlushingWriter;
use crate::apply::inode::InodeMeta;
use crate::apply::journal::{PathPlan, Txn, Want};
use crate::apply::root::{ParentDir, RootError};
use crate::apply::state::Content;

impl Engine {
    /// Puts the wanted bytes into the plan's temp entry, verified, with its
    /// mode, durable: a verified download is moved there; other bytes are
    /// copied (from the cache, the originals store, or the temp entry of an
    /// `earlier` plan of the same blob) and verified while copied.
    pub(super) fn stage(&self, plan: &PathPlan, earlier: &[PathPlan]) -> Result<(), ApplyError> {
        let Some((digest, size, mode)) = plan.want.digest_mode() else {
            return Ok(());
        };
        if matches!(plan.want, Want::Blob { .. }) && self.stage_fetched(plan, digest, size, mode)? {
            return Ok(());
        }
        // A blob this process has just verified is not hashed again while
        // its inode is unchanged (`Cache::open_checked`); the rest is.
        let (src, known_good) = match &plan.want {
            Want::Original { stored, .. } => {
                let p = self.dirs.originals().join(stored);
                let f = File::open(&p).map_err(|error| ApplyError::StageOriginal {
                    path: plan.path.clone(),
                    stored: p.clone(),
                    error,
                })?;
                (f, false)
            }
            _ => match self.cache.open_checked(&digest)? {
                Some(found) => found,
                None => (
                    self.staged_earlier(earlier, &digest)?
                        .ok_or_else(|| ApplyError::StageNotCached {
                            path: plan.path.clone(),
                            digest,
                        })?,
                    false,
                ),
            },
        };
        if known_good {
            self.stages_unhashed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let parent = self.root.parent(&plan.path, true)?;
        let res = write_entry(&parent, &plan.temp, src, digest, size, mode, known_good);
        if res.is_err() {
            let _ = parent.remove_entry(&plan.temp.clone().into());
            if matches!(plan.want, Want::Blob { .. }) {
                // A corrupt cache entry is fetched again next time.
                let _ = self.cache.remove(&digest);
            }
        }
        res.map_err(|e| ApplyError::Stage {
            path: plan.path.clone(),
            error: e.into(),
        })
    }

    /// Copies what the target holds now into the backup directory.
    pub(super) fn backup(
        &mut self,
        dir: &Path,
        i: usize,
        plan: &PathPlan,
        from: Option<&Manifest>,
    ) -> Result<Content, ApplyError> {
        let parent = match self.root.parent(&plan.path, false) {
            Ok(p) => p,
            Err(RootError::MissingParent { .. }) => return Ok(Content::Absent),
            Err(e) => return Err(e.into()),
        };
        let Some(st) = parent.stat_target()? else {
            return Ok(Content::Absent);
        };
        if !is_regular(&st) {
            return Err(ApplyError::BackupNotRegular {
                path: plan.path.clone(),
            });
        }
        let vanished = || ApplyError::BackupVanished {
            path: plan.path.clone(),
        };
        // A file the installed version manages usually still holds that
        // version's blob, which the cache keeps (verified): then reading it
        // once to prove it is enough — no copy, no fsync of a second
        // 256 MiB — and a rollback restores the bytes from the cache. A
        // file that drifted is copied like any other, so a rollback still
        // puts back exactly what was there.
        if !plan.newly_owned
            && let Some(f) = from.and_then(|m| m.all_files().find(|f| f.path == plan.path))
            && f.size == st.st_size as u64
            && self.cache.contains(&f.digest)
        {
            // Not even read when its inode is as it was when the engine
            // wrote it or a heal pass last hashed it (the trust a heal pass
            // gives it; see `InodeMeta`).
            if self.unchanged_since_verified(&plan.path, &st, &f.digest) {
                return Ok(Content::Cached {
                    digest: f.digest,
                    size: f.size,
                    mode: st.st_mode & 0o7777,
                });
            }
            self.backups_read += 1;
            let mut src = parent.open_target()?.ok_or_else(vanished)?;
            let (digest, size) = Digest::of_reader(&mut src).map_err(|error| ApplyError::BackupRead {
                path: plan.path.clone(),
                error,
            })?;
            if digest == f.digest && size == f.size {
                return Ok(Content::Cached {
                    digest,
                    size,
                    mode: st.st_mode & 0o7777,
                });
            }
        }
        let mut src = parent.open_target()?.ok_or_else(vanished)?;
        let stored = i.to_string();
        let dst_path = dir.join(&stored);
        let mut copy = || -> io::Result<(Digest, u64)> {
            let mut dst = File::create(&dst_path)?;
            let mut h = Hasher::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = src.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                dst.write_all(&buf[..n])?;
            }
            dst.sync_all()?;
            Ok(h.finish())
        };
        let (digest, size) = copy().map_err(|error| ApplyError::Backup {
            path: plan.path.clone(),
            to: dst_path.clone(),
            error,
        })?;
        Ok(Content::File {
            digest,
            size,
            mode: st.st_mode & 0o7777,
            stored,
        })
    }

    /// Records the inode of every file just switched in from a verified
    /// blob, as a heal pass does after hashing it: the bytes were verified
    /// as they were staged, and an unchanged inode means unchanged bytes.
    /// A path it cannot stat is simply read by the next heal or backup.
    pub(super) fn remember_written(&mut self, txn: &Txn) {
        for plan in &txn.plans {
            let Want::Blob { digest, size, .. } = plan.want else {
                self.verified.remove(&plan.path);
                continue;
            };
            let st = match self.root.parent(&plan.path, false) {
                Ok(parent) => parent.stat_target().ok().flatten(),
                Err(_) => None,
            };
            match st {
                Some(st) if is_regular(&st) && st.st_size as u64 == size => {
                    self.verified
                        .insert(plan.path.clone(), (InodeMeta::of(&st), digest));
                }
                _ => {
                    self.verified.remove(&plan.path);
                }
            }
        }
    }

    /// Puts the staged entry in place (or removes the target), durably.
    /// A large file it replaces is kept open until the report
    /// ([`crate::apply::retired`]), so that the rename does not free it.
    pub(super) fn switch(&mut self, plan: &PathPlan) -> Result<(), ApplyError> {
        let switched = match self.root.parent(&plan.path, false) {
            Ok(parent) => {
                self.retired.hold(&parent);
                let name = parent.name().clone();
                match plan.want {
                    Want::Absent => parent.remove_entry(&name),
                    _ => parent.rename_entry(&plan.temp.clone().into(), &name),
                }
                .and_then(|()| parent.sync())
            }
            Err(RootError::MissingParent { .. }) if plan.want == Want::Absent => Ok(()),
            Err(e) => Err(e),
        };
        switched.map_err(|error| ApplyError::Switch {
            path: plan.path.clone(),
            error,
        })
    }

    /// Why `path` can no longer be reached inside the root, if its parent
    /// chain now leaves it or holds a non-directory.
    pub(super) fn unreachable(&self, path: &BundlePath) -> Option<RootError> {
        match self.root.parent(path, false) {
            Err(e @ (RootError::Escape { .. } | RootError::NotADirectory { .. })) => Some(e),
            _ => None,
        }
    }

    /// Puts a backed-up content back at the plan's path.
    pub(super) fn restore(&self, dir: &Path, plan: &PathPlan, content: &Content) -> Result<(), ApplyError> {
        match content {
            Content::Absent => {
                let parent = match self.root.parent(&plan.path, false) {
                    Ok(p) => p,
                    Err(RootError::MissingParent { .. }) => return Ok(()),
                    Err(e) => return Err(e.into()),
                };
                let name = parent.name().clone();
                Ok(parent.remove_entry(&name).and_then(|()| parent.sync())?)
            }
            Content::File { .. } | Content::Cached { .. } => {
                let (src, digest, size, mode) = match content {
                    Content::File {
                        digest,
                        size,
                        mode,
                        stored,
                    } => {
                        let src_path = dir.join(stored);
                        let src = File::open(&src_path).map_err(|error| ApplyError::RestoreOpenBackup {
                            path: plan.path.clone(),
                            file: src_path.clone(),
                            error,
                        })?;
                        (src, digest, size, mode)
                    }
                    Content::Cached { digest, size, mode } => {
                        let src = self
                            .cache
                            .open(digest)
                            .map_err(|error| ApplyError::RestoreOpenCached {
                                path: plan.path.clone(),
                                digest: *digest,
                                error,
                            })?
                            .ok_or_else(|| ApplyError::RestoreUncached {
                                path: plan.path.clone(),
                                digest: *digest,
                            })?;
                        (src, digest, size, mode)
                    }
                    Content::Absent => return Ok(()),
                };
                let parent = self.root.parent(&plan.path, true)?;
                let temp: std::ffi::OsString = format!("{}.restore", plan.temp).into();
                write_entry(
                    &parent,
                    &format!("{}.restore", plan.temp),
                    src,
                    *digest,
                    *size,
                    *mode,
                    false,
                )
                .map_err(|error| ApplyError::RestoreStage {
                    path: plan.path.clone(),
                    error,
                })?;
                let name = parent.name().clone();
                Ok(parent.rename_entry(&temp, &name).and_then(|()| parent.sync())?)
            }
        }
    }

    pub(super) fn remove_temps(&self, txn: &Txn) {
        for plan in &txn.plans {
            if let Ok(parent) = self.root.parent(&plan.path, false) {
                let _ = parent.remove_entry(&plan.temp.clone().into());
                let _ = parent.remove_entry(&format!("{}.restore", plan.temp).into());
            }
        }
    }
}

/// Copies `src` into a new entry `name` of `parent` with `mode`, fsynced,
/// verifying its size and digest as it reads; `known_good` (a blob this
/// process just verified, its inode unchanged: [`crate::apply::cache::Cache::open_checked`])
/// checks only the size.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_entry(
    parent: &ParentDir,
    name: &str,
    mut src: File,
    digest: Digest,
    size: u64,
    mode: u32,
    known_good: bool,
) -> Result<(), WriteError> {
    const CHUNK: usize = 1 << 20;
    let dst = parent.create_entry(&name.into())?;
    // Hashing here overlaps with the disk write on the writer's thread.
    let mut dst = FlushingWriter::new(dst, CHUNK).map_err(WriteError::Write)?;
    let mut v = (!known_good).then(|| Verifier::new(digest, size));
    let mut copied = 0u64;
    loop {
        let mut buf = Vec::with_capacity(CHUNK);
        let n = (&mut src)
            .take(CHUNK as u64)
            .read_to_end(&mut buf)
            .map_err(WriteError::Read)?;
        if n == 0 {
            break;
        }
        copied += n as u64;
        if let Some(v) = v.as_mut() {
            v.update(&buf)?;
        } else if copied > size {
            return Err(WriteError::TooLong { size });
        }
        dst.write(buf).map_err(WriteError::Write)?;
    }
    match v {
        Some(v) => v.finish()?,
        None if copied != size => return Err(WriteError::Short { copied, size }),
        None => {}
    }
    dst.finish(Some(fs::Permissions::from_mode(mode)))
        .map(drop)
        .map_err(WriteError::Finish)
}
