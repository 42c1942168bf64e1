//! A throwaway S3 server on loopback for the blob-store tests: `s3s-fs`
//! (crates.io; `scripts/setup.sh` installs it), one bucket, its data in a
//! temp dir, its port picked at run time, killed and removed when the test
//! ends. It can be stopped (kill -9) and started again on the same port and
//! data, to play an object store that goes away.
//!
//! The control server gets the credentials through its environment
//! ([`S3::env`]) or a mode-0600 shared-credentials file
//! ([`S3::credentials_file`]), never on its command line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{Proc, free_addr, wait_for_port};

/// The access key s3s-fs accepts.
pub const ACCESS_KEY: &str = "lks-e2e";
/// Its secret key.
pub const SECRET_KEY: &str = "lks-e2e-secret";

/// One s3s-fs process and its root dir.
pub struct S3 {
    dir: tempfile::TempDir,
    pub bucket: String,
    pub addr: SocketAddr,
    proc: Option<Proc>,
    starts: u32,
}

/// The s3s-fs binary: `$LKS_S3S_FS`, else `s3s-fs` on PATH, else
/// `~/.cargo/bin/s3s-fs`.
pub fn s3s_fs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LKS_S3S_FS") {
        return PathBuf::from(p);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
        .expect(
            "s3s-fs not found: bash scripts/setup.sh installs it (cargo install s3s-fs), \
             or set LKS_S3S_FS",
        )
}

impl S3 {
    /// Starts s3s-fs with one (empty) bucket, `bucket`.
    pub fn start(bucket: &str) -> S3 {
        let dir = tempfile::tempdir().expect("temp dir");
        // s3s-fs keeps a bucket as a directory under its root.
        std::fs::create_dir_all(dir.path().join("root").join(bucket)).expect("create the bucket dir");
        let mut s = S3 {
            dir,
            bucket: bucket.to_string(),
            addr: free_addr(),
            proc: None,
            starts: 0,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let mut cmd = Command::new(s3s_fs_bin());
        cmd.args(["--host", "127.0.0.1", "--port", &self.addr.port().to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.root())
            .env("RUST_LOG", "info");
        let p = Proc::spawn(&format!("s3s-fs-{}", self.starts), cmd, self.dir.path());
        self.proc = Some(p);
        wait_for_port(self.addr, Duration::from_secs(20));
    }

    /// SIGKILL: the object store gone without warning.
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
    }

    /// Starts it again on the same port and data.
    pub fn start_again(&mut self) {
        self.spawn();
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The root dir s3s-fs serves (its buckets and its internal files).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The bucket's directory.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root().join(&self.bucket)
    }

    /// Keys of the objects in the bucket, sorted. s3s-fs's own files
    /// (metadata, upload parts, temp files) are named `.…`; 0.14 keeps them
    /// beside the bucket dirs, and files so named are skipped in case a
    /// version keeps them inside. Dot directories are walked: the server's
    /// write probe (`PREFIX/.probe/<hex>`) counts if one is left behind.
    pub fn objects(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.bucket_dir()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if e.file_name().to_string_lossy().starts_with('.') && !p.is_dir() {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(self.bucket_dir()) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        out.sort();
        out
    }

    /// True once a multipart upload has begun (s3s-fs writes an upload
    /// record, `.upload-<id>.json`, when it is created, and
    /// `.upload_id-<id>.part-N` files as parts arrive).
    pub fn upload_started(&self) -> bool {
        std::fs::read_dir(self.root()).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(".upload"))
        })
    }

    /// The control server's flags for this bucket under `prefix` (empty:
    /// the bucket's root).
    pub fn server_args(&self, prefix: &str) -> Vec<String> {
        let url = if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, prefix.trim_matches('/'))
        };
        vec![
            "--blob-store".into(),
            url,
            "--s3-endpoint".into(),
            self.endpoint(),
        ]
    }

    /// The environment that hands the control server the credentials.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
        ]
    }

    /// Writes an AWS shared-credentials file (`[default]` profile) with
    /// these credentials at `path`, mode 0600.
    pub fn credentials_file(&self, path: &Path) {
        write_credentials(path, ACCESS_KEY, SECRET_KEY, 0o600);
    }

    /// Every s3s-fs log so far (every start).
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("s3s-fs-{i}.log"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Writes a shared-credentials file with `mode`.
pub fn write_credentials(path: &Path, access_key: &str, secret_key: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        format!("[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret_key}\n"),
    )
    .expect("write the credentials file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .expect("chmod the credentials file");
}

impl Drop for S3 {
    fn drop(&mut self) {
        // Killed (and its log printed if the test failed) before the temp
        // dir goes: fields drop in order, the dir first.
        drop(self.proc.take());
    }
}
