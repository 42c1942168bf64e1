//! A replica's local blobs, content-addressed: `DATA_DIR/blobs/sha256/ab/<hex>`;
//! and [`LocalDirStore`], the same directory as the durable store of a
//! single server (`--blob-store local`).
//!
//! A blob reaches its final name only after its bytes were verified against
//! the declared digest and size while streaming in, then fsynced, renamed
//! and the directory fsynced: a crash leaves a whole verified blob or none.

use std::path::{Path, PathBuf};

use lks_proto::Digest;
use lks_proto::digest::Verifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{BlobError, BlobStore, StoredBlob};
use lks_proto::fsutil::fsync_dir;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Clone, Debug)]
pub struct LocalBlobs {
    root: PathBuf,
}

impl LocalBlobs {
    /// Opens the store under `root`, removing temp files a crash left behind.
    pub fn open(root: &Path) -> Result<Self, BlobError> {
        let tmp = root.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        std::fs::create_dir_all(root.join("sha256")).map_err(io(root))?;
        Ok(LocalBlobs {
            root: root.to_path_buf(),
        })
    }

    /// The store under `root` as it is, for reading only: nothing is
    /// created or cleaned up (`migrate` reads another server's blobs).
    pub fn read_only(root: &Path) -> Self {
        LocalBlobs {
            root: root.to_path_buf(),
        }
    }

    /// Where the blob `d` lives.
    pub fn path(&self, d: &Digest) -> PathBuf {
        let hex = d.hex();
        self.root.join("sha256").join(&hex[..2]).join(hex)
    }

    pub fn contains(&self, d: &Digest) -> bool {
        self.path(d).is_file()
    }

    /// Removes the blob `d`, durably; an absent blob is not an error.
    pub async fn remove(&self, d: &Digest) -> Result<(), BlobError> {
        let path = self.path(d);
        tokio::task::spawn_blocking(move || -> Result<(), BlobError> {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(BlobError::Io { path, source: e }),
            }
            let dir = path.parent().unwrap_or(Path::new("."));
            fsync_dir(dir).map_err(io(dir))
        })
        .await
        .map_err(|e| BlobError::Io {
            path: self.path(d),
            source: std::io::Error::other(e),
        })?
    }

    /// Every blob under its final name, with its size.
    pub fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        self.list_older_than(std::time::Duration::ZERO)
    }

    /// The blobs last written more than `age` ago.
    pub fn list_older_than(&self, age: std::time::Duration) -> Result<Vec<StoredBlob>, BlobError> {
        let now = std::time::SystemTime::now();
        let top = self.root.join("sha256");
        let mut out = Vec::new();
        let dirs = match std::fs::read_dir(&top) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(BlobError::Io { path: top, source: e }),
        };
        for dir in dirs {
            let dir = dir.map_err(io(&top))?.path();
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).map_err(io(&dir))? {
                let f = f.map_err(io(&dir))?;
                let Some(digest) = f.file_name().to_str().and_then(|n| Digest::from_hex(n).ok()) else {
                    continue;
                };
                let meta = f.metadata().map_err(io(&dir))?;
                let old_enough = age.is_zero()
                    || meta
                        .modified()
                        .ok()
                        .and_then(|m| now.duration_since(m).ok())
                        .is_some_and(|a| a >= age);
                if meta.is_file() && old_enough {
                    out.push(StoredBlob {
                        digest,
                        size: meta.len(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Starts writing a blob that must match `digest` and `size`.
    pub async fn writer(&self, digest: Digest, size: u64) -> Result<BlobWriter, BlobError> {
        let mut nonce = [0u8; 8];
        let _ = getrandom::getrandom(&mut nonce);
        let tmp = self
            .root
            .join("tmp")
            .join(format!("{}.{}", digest.hex(), hex_nonce(&nonce)));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .await
            .map_err(io(&tmp))?;
        Ok(BlobWriter {
            file: Some(file),
            tmp,
            dest: self.path(&digest),
            digest,
            verifier: Verifier::new(digest, size),
        })
    }
}

fn hex_nonce(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A blob being written. Dropping it unfinished removes the temp file.
pub struct BlobWriter {
    file: Option<tokio::fs::File>,
    tmp: PathBuf,
    dest: PathBuf,
    digest: Digest,
    verifier: Verifier,
}

impl BlobWriter {
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Appends bytes; fails as soon as the stream passes the declared size.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.verifier.update(bytes).map_err(|source| BlobError::Verify {
            digest: self.digest,
            source,
        })?;
        if let Some(f) = self.file.as_mut() {
            f.write_all(bytes).await.map_err(io(&self.tmp))?;
        }
        Ok(())
    }

    /// Verifies the whole blob and makes its bytes durable under the temp
    /// name. Nothing is visible in the store until [`StagedBlob::commit`].
    pub async fn stage(mut self) -> Result<StagedBlob, BlobError> {
        let verifier = self.verifier.clone();
        verifier.finish().map_err(|source| BlobError::Verify {
            digest: self.digest,
            source,
        })?;
        if let Some(mut file) = self.file.take() {
            file.flush().await.map_err(io(&self.tmp))?;
            file.sync_all().await.map_err(io(&self.tmp))?;
        }
        // The temp file now belongs to the staged blob.
        let tmp = std::mem::take(&mut self.tmp);
        Ok(StagedBlob {
            tmp,
            dest: self.dest.clone(),
        })
    }

    /// [`BlobWriter::stage`] then [`StagedBlob::commit`].
    pub async fn finish(self) -> Result<(), BlobError> {
        self.stage().await?.commit().await
    }
}

/// A verified, fsynced blob not yet in the store. Dropping it uncommitted
/// removes it, so a publish that fails halfway leaves no blob behind.
pub struct StagedBlob {
    tmp: PathBuf,
    dest: PathBuf,
}

impl StagedBlob {
    /// Moves the blob to its content-addressed name, durably.
    pub async fn commit(mut self) -> Result<(), BlobError> {
        let (tmp, dest) = (std::mem::take(&mut self.tmp), self.dest.clone());
        let result = tokio::task::spawn_blocking(move || -> Result<(), BlobError> {
            let dir = dest.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            if let Err(e) = std::fs::rename(&tmp, &dest) {
                let _ = std::fs::remove_file(&tmp);
                return Err(BlobError::Io {
                    path: dest,
                    source: e,
                });
            }
            fsync_dir(dir).map_err(io(dir))
        })
        .await;
        result.map_err(|e| BlobError::Io {
            path: self.dest.clone(),
            source: std::io::Error::other(e),
        })?
    }
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The data dir as the durable store of a single server: a blob is durable
/// once it has its local name, so `put` only copies what is not already
/// this directory's own file.
#[derive(Clone, Debug)]
pub struct LocalDirStore {
    dir: LocalBlobs,
}

impl LocalDirStore {
    pub fn new(dir: LocalBlobs) -> Self {
        LocalDirStore { dir }
    }
}

/// Copies `from` into `to` through a verifying writer.
async fn copy_verified(from: &Path, to: &LocalBlobs, d: &Digest, size: u64) -> Result<(), BlobError> {
    let mut file = tokio::fs::File::open(from).await.map_err(io(from))?;
    let mut w = to.writer(*d, size).await?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).await.map_err(io(from))?;
        if n == 0 {
            break;
        }
        w.write(&buf[..n]).await?;
    }
    w.finish().await
}

#[async_trait::async_trait]
impl BlobStore for LocalDirStore {
    fn describe(&self) -> String {
        "local".into()
    }

    async fn check(&self) -> Result<(), BlobError> {
        Ok(())
    }

    async fn contains(&self, d: &Digest) -> Result<bool, BlobError> {
        Ok(self.dir.contains(d))
    }

    async fn put(&self, d: &Digest, size: u64, from: &Path) -> Result<(), BlobError> {
        if from == self.dir.path(d) {
            // Its own file: durable already, if it is there.
            return match tokio::fs::metadata(from).await {
                Ok(_) => Ok(()),
                Err(e) => Err(BlobError::Io {
                    path: from.to_path_buf(),
                    source: e,
                }),
            };
        }
        copy_verified(from, &self.dir, d, size).await
    }

    async fn fetch(&self, d: &Digest, into: &LocalBlobs) -> Result<bool, BlobError> {
        let path = self.dir.path(d);
        let size = match tokio::fs::metadata(&path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(BlobError::Io { path, source: e }),
        };
        if into.path(d) != path {
            copy_verified(&path, into, d, size).await?;
        }
        Ok(true)
    }

    async fn delete(&self, d: &Digest) -> Result<(), BlobError> {
        self.dir.remove(d).await
    }

    async fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || dir.list())
            .await
            .map_err(|e| BlobError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other(e),
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verified_blobs_land_and_bad_ones_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobs::open(dir.path()).unwrap();
        let data = b"hello blob";
        let d = Digest::of(data);
        let mut w = store.writer(d, data.len() as u64).await.unwrap();
        w.write(&data[..4]).await.unwrap();
        w.write(&data[4..]).await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(std::fs::read(store.path(&d)).unwrap(), data);

        let bad = Digest::of(b"other");
        let mut w = store.writer(bad, data.len() as u64).await.unwrap();
        w.write(data).await.unwrap();
        assert!(matches!(w.finish().await, Err(BlobError::Verify { .. })));
        assert!(!store.contains(&bad));

        let mut w = store.writer(d, 3).await.unwrap();
        assert!(w.write(data).await.is_err(), "longer than declared fails at once");
        drop(w);

        let other = b"staged";
        let od = Digest::of(other);
        let mut w = store.writer(od, other.len() as u64).await.unwrap();
        w.write(other).await.unwrap();
        let staged = w.stage().await.unwrap();
        assert!(!store.contains(&od), "invisible until committed");
        drop(staged);
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }
}
