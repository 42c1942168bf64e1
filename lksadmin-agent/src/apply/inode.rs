//! What a file's inode said when its bytes were last verified, and how long
//! that vouches for them: the trust heal passes, backups and staging give a
//! file they need not read again.

use std::fs;

/// How long an unchanged [`InodeMeta`] vouches for a file's bytes: after
/// that they are read again (bit rot, a change behind the file system's
/// back). The engine's full heal pass and the cache's just-stored blobs.
pub const INODE_TRUST: std::time::Duration = std::time::Duration::from_secs(3600);

/// What a file's inode said when its bytes were last hashed and matched
/// (or written from verified bytes): while all of it is the same, the
/// bytes are too (any write, truncate, rename over or chmod changes
/// `ctime`, which no user call can set back), so they need not be read
/// again. Heal passes and backups trust a managed file's, staging a blob
/// the cache just stored (`Cache::open_checked`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InodeMeta {
    dev: u64,
    ino: u64,
    size: i64,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl InodeMeta {
    // `stat` field types differ between architectures: the casts are no-ops
    // on x86_64 only.
    #[allow(clippy::unnecessary_cast)]
    pub fn of(st: &nix::sys::stat::FileStat) -> Self {
        InodeMeta {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as i64,
            mode: st.st_mode as u32,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }

    /// The same from `std`'s metadata of the file.
    pub fn of_metadata(m: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        InodeMeta {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size() as i64,
            mode: m.mode(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}
