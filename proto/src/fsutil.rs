//! Durable file writes, the one implementation for the workspace (agent
//! state dir, the server's PKI files, `admin.conf`, `lksctl`'s records):
//! temp file in the same directory → fsync → rename → fsync the directory,
//! so a reader (or a restart after a crash) sees either the old or the new
//! file, never a torn one. Also the JSON state files written that way, and
//! removals and directories made durable the same way.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// An I/O failure with the path it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct FsError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FsError {
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        FsError {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Writes `bytes` to `path` atomically and durably with permission `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    let dir = parent_dir(path);
    let tmp = temp_sibling(path);
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(nix::libc::O_CLOEXEC | nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        // The umask may have narrowed the mode at creation.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(FsError::new("write", &tmp, e));
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(FsError::new("rename into place", path, e));
    }
    sync_dir(dir)
}

/// Serialises `value` as pretty JSON and writes it with [`write_atomic`].
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T, mode: u32) -> Result<(), FsError> {
    write_atomic(path, &encode_json(path, value)?, mode)
}

/// Reads a JSON file; `Ok(None)` if it does not exist.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, FsError> {
    read_optional(path)?
        .map(|bytes| parse_json(path, &bytes))
        .transpose()
}

/// The bytes [`write_json`] writes for `value` (`path` names the file in
/// the error).
pub fn encode_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, FsError> {
    serde_json::to_vec_pretty(value).map_err(|e| FsError::new("encode", path, io::Error::other(e)))
}

/// Parses what [`read_json`] read from `path` (named in the error only), so
/// a fuzzer or test can feed the bytes without a file.
pub fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, FsError> {
    serde_json::from_slice(bytes)
        .map_err(|e| FsError::new("parse", path, io::Error::other(escape_controls(&e.to_string()))))
}

/// serde_json quotes the input in some errors (an unknown variant or field,
/// a wrong string): control characters in it would break the one-line error
/// into several, so they are shown escaped (`\n`, `\u{1b}`).
fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads a whole file; `Ok(None)` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::new("read", path, e)),
    }
}

/// fsync of a directory, so renames and removals in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    fsync_dir(dir).map_err(|e| FsError::new("fsync directory", dir, e))
}

/// [`sync_dir`] for callers that name the path in their own error.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file durably; a missing file is fine.
pub fn remove_file_durable(path: &Path) -> Result<(), FsError> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(parent_dir(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FsError::new("remove", path, e)),
    }
}

/// Removes a directory tree; a missing one is fine.
pub fn remove_dir_all(path: &Path) -> Result<(), FsError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FsError::new("remove directory", path, e)),
    }
}

/// Creates a directory (and parents) with `mode` for the last component.
pub fn create_dir(path: &Path, mode: u32) -> Result<(), FsError> {
    match fs::create_dir_all(path) {
        Ok(()) => fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| FsError::new("set mode of", path, e)),
        Err(e) => Err(FsError::new("create directory", path, e)),
    }
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_dir(path).join(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The fuzzer's find: an unknown variant quoted with a newline in it.
    #[test]
    fn a_parse_error_quoting_the_input_stays_on_one_line() {
        let path = Path::new("/var/lib/lksadmin/state.json");
        let err = parse_json::<serde_json::Value>(path, b"[1, 2").unwrap_err();
        assert!(err.to_string().contains("/var/lib/lksadmin/state.json"));
        #[derive(Debug, serde::Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum Kind {
            Absent,
        }
        let err = parse_json::<Kind>(path, br#""abs\nt\u001b""#)
            .unwrap_err()
            .to_string();
        assert!(!err.contains(['\n', '\r', '\x1b']), "{err:?}");
        assert!(err.contains("abs\\nt\\u{1b}"), "{err:?}");
        assert!(err.contains("/var/lib/lksadmin/state.json"), "{err:?}");
    }

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o640).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1, "no temp left");
    }

    #[test]
    fn replaces_content_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn json_round_trip_and_missing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        assert_eq!(read_json::<Vec<u32>>(&p).unwrap(), None);
        write_json(&p, &vec![1u32, 2], 0o600).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&p).unwrap(), Some(vec![1, 2]));
    }
}
