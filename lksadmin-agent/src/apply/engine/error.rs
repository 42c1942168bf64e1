//! Why one step of an apply, a rollback or a drift repair failed:
//! [`ApplyError`], a variant per step and what went wrong there, carrying
//! the path. It is rendered once, where it becomes a bundle's status
//! message, the journal's rollback reason or a repair event; those lines
//! are what the operator reads (and what the end-to-end tests match), so
//! each `#[error]` is that line word for word. An inner error is part of
//! that one line (`error`, not `source`): nothing walking a cause chain
//! prints it a second time.

use std::io;
use std::path::PathBuf;

use lks_proto::arch::Arch;
use lks_proto::digest::VerifyError;
use lks_proto::fsutil::FsError;
use lks_proto::{BundlePath, Digest};

use crate::apply::cache::FetchError;
use crate::apply::root::RootError;
use crate::apply::runner::Outcome;

/// A failed step of an apply (arch check, precheck, stage, backup, switch,
/// steps, health check), of a rollback's restore, or of a drift check and
/// repair.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The node root refused the path (its text names it).
    #[error("{0}")]
    Root(RootError),
    /// The state dir or the cache (its text names the host path).
    #[error("{0}")]
    Fs(FsError),
    /// Fetching a blob again to repair a file.
    #[error("{0}")]
    Fetch(FetchError),
    /// Arch check: an ELF file of a multi-arch bundle is built for another
    /// architecture than the node's.
    #[error("refused: {path} is {why}, and this node is {arch}")]
    ForeignElf {
        path: BundlePath,
        why: lks_proto::arch::ForeignExecutable,
        arch: Arch,
    },
    /// Precheck: the target is there and not a regular file.
    #[error("{path}: the target exists and is not a regular file; refusing to replace it")]
    PrecheckNotRegular { path: BundlePath },
    /// Stage: the originals store has no copy of what a removal puts back.
    #[error("{path}: open original copy {}: {error}", .stored.display())]
    StageOriginal {
        path: BundlePath,
        stored: PathBuf,
        error: io::Error,
    },
    /// Stage: neither the cache nor an earlier plan of the transaction
    /// holds the blob.
    #[error("{path}: blob {digest} is not in the cache")]
    StageNotCached { path: BundlePath, digest: Digest },
    /// Stage: writing the temp entry beside the target.
    #[error("{path}: stage: {error}")]
    Stage { path: BundlePath, error: StageError },
    /// Backup: the target is there and not a regular file.
    #[error("{path}: not a regular file; refusing to replace it")]
    BackupNotRegular { path: BundlePath },
    /// Backup: the target went away between its `stat` and its `open`.
    #[error("{path}: vanished while backing it up")]
    BackupVanished { path: BundlePath },
    /// Backup: reading the target to prove it holds the installed blob.
    #[error("{path}: read to back it up: {error}")]
    BackupRead { path: BundlePath, error: io::Error },
    /// Backup: copying the target into the transaction's backup dir.
    #[error("{path}: back up to {}: {error}", .to.display())]
    Backup {
        path: BundlePath,
        to: PathBuf,
        error: io::Error,
    },
    /// Switch: the rename (or removal) of the target, or the directory's
    /// fsync (the root error names the path).
    #[error("{error}")]
    Switch { path: BundlePath, error: RootError },
    /// Restore: opening the transaction's copy of the old file.
    #[error("open backup {}: {error}", .file.display())]
    RestoreOpenBackup {
        path: BundlePath,
        file: PathBuf,
        error: io::Error,
    },
    /// Restore: opening the cached blob the old file held.
    #[error("open cached blob {digest}: {error}")]
    RestoreOpenCached {
        path: BundlePath,
        digest: Digest,
        error: FsError,
    },
    /// Restore: the cached blob the old file held is gone.
    #[error("blob {digest} left the cache; cannot restore it")]
    RestoreUncached { path: BundlePath, digest: Digest },
    /// Restore: writing the old bytes beside the target.
    #[error("stage backup: {error}")]
    RestoreStage { path: BundlePath, error: WriteError },
    /// Steps: a step of the bundle failed.
    #[error("step {name:?} {}", .outcome.describe())]
    Step { name: String, outcome: Outcome },
    /// Health check: it failed every try.
    #[error("health check failed {tries} time(s); last try {}", .last.describe())]
    HealthCheck { tries: u32, last: Outcome },
    /// Drift check: `fstat` of the opened file.
    #[error("stat: {error}")]
    CheckStat {
        path: BundlePath,
        error: nix::errno::Errno,
    },
    /// Drift check: reading the file to hash it.
    #[error("read: {error}")]
    CheckRead { path: BundlePath, error: io::Error },
    /// Repair: the blob is not in the cache after fetching it.
    #[error("blob not in the cache")]
    RepairNotCached { path: BundlePath },
    /// Repair: writing the blob beside the target.
    #[error("{error}")]
    Repair { path: BundlePath, error: WriteError },
}

/// What went wrong staging a file's bytes beside its target.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The verified download in `cache/fetched/`, or making it the cache
    /// entry.
    #[error("{0}")]
    Fetched(FsError),
    /// Making the download private before it is moved.
    #[error("set mode of {}: {error}", .file.display())]
    FetchedMode { file: PathBuf, error: io::Error },
    /// Moving the download beside the target.
    #[error("move the fetched blob {} beside it: {error}", .file.display())]
    MoveFetched { file: PathBuf, error: nix::errno::Errno },
    /// Opening the moved download to set its mode.
    #[error("set mode and fsync: {0}")]
    OpenMoved(RootError),
    /// The moved download vanished before its mode was set.
    #[error("set mode and fsync: vanished")]
    MovedVanished,
    /// Setting the moved download's mode, or its fsync.
    #[error("set mode and fsync: {0}")]
    SyncMoved(io::Error),
    /// Copying the bytes in.
    #[error("{0}")]
    Write(WriteError),
}

/// What went wrong copying verified bytes into a new entry
/// ([`super::files::write_entry`]).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Create(RootError),
    #[error("write: {0}")]
    Write(io::Error),
    #[error("read: {0}")]
    Read(io::Error),
    #[error("{0}")]
    Verify(VerifyError),
    #[error("read more than the blob's {size} bytes")]
    TooLong { size: u64 },
    #[error("read {copied} of the blob's {size} bytes")]
    Short { copied: u64, size: u64 },
    #[error("write, set mode and fsync: {0}")]
    Finish(io::Error),
}

/// `From` for `?` without making the inner error a `source`.
macro_rules! from {
    ($($inner:ty => $outer:ident :: $variant:ident),* $(,)?) => {$(
        impl From<$inner> for $outer {
            fn from(e: $inner) -> Self {
                $outer::$variant(e)
            }
        }
    )*};
}

from! {
    RootError => ApplyError::Root,
    FsError => ApplyError::Fs,
    FetchError => ApplyError::Fetch,
    FsError => StageError::Fetched,
    WriteError => StageError::Write,
    RootError => WriteError::Create,
    VerifyError => WriteError::Verify,
}
