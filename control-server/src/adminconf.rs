//! `admin.conf`: what `lksctl` needs to reach the admin API (server URL, CA,
//! admin client certificate and key), written by the server on first start.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

/// The content of `admin.conf` (TOML).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConf {
    /// `https://HOST:PORT`
    pub server: String,
    /// PEM of the control server's CA.
    pub ca_cert: String,
    /// PEM of the admin client certificate.
    pub client_cert: String,
    /// PEM (PKCS#8) of the admin client key.
    pub client_key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminConfError {
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

impl AdminConf {
    pub fn load(path: &Path) -> Result<Self, AdminConfError> {
        let text = std::fs::read_to_string(path).map_err(|source| AdminConfError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| AdminConfError::Parse {
            path: path.to_path_buf(),
            message: e.message().trim().replace('\n', " "),
        })
    }

    /// Writes the file atomically with mode 0600 (it holds a private key).
    pub fn save(&self, path: &Path) -> Result<(), AdminConfError> {
        let err = |source| AdminConfError::Write {
            path: path.to_path_buf(),
            source,
        };
        let text = toml::to_string(self).map_err(|e| err(std::io::Error::other(e)))?;
        write_atomic(path, text.as_bytes(), 0o600).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.conf");
        let c = AdminConf {
            server: "https://127.0.0.1:7443".into(),
            ca_cert: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
            client_cert: "c".into(),
            client_key: "k".into(),
        };
        c.save(&p).unwrap();
        assert_eq!(AdminConf::load(&p).unwrap(), c);
        std::fs::write(&p, "server = 1").unwrap();
        assert!(matches!(AdminConf::load(&p), Err(AdminConfError::Parse { .. })));
    }
}
