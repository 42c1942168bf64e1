//! `admin.conf`: what `lksctl` needs to reach the admin API (server URL, CA,
//! admin client certificate and key), written by the server on first start.
//!
//! With several replicas the file may also list every one of them
//! (`servers = ["https://…", …]`), so `lksctl` can fail over; `server` stays
//! the first one tried, and a file without `servers` means just `server`.
//! [`AdminConf`] is the credentials and the primary URL; [`AdminConfFile`]
//! adds the replica list.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

/// The credentials in `admin.conf` and the primary server URL.
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

/// The whole of `admin.conf`: the credentials and every replica's URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfFile {
    pub conf: AdminConf,
    /// `servers = [...]`: every replica (empty: only `conf.server`).
    pub servers: Vec<String>,
}

/// The file's TOML, field by field: one struct, so that an unknown key is
/// still refused.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdminConf {
    server: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    servers: Vec<String>,
    ca_cert: String,
    client_cert: String,
    client_key: String,
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
    /// Reads the credentials; a `servers` list in the file is accepted and
    /// not returned (see [`AdminConfFile::load`]).
    pub fn load(path: &Path) -> Result<Self, AdminConfError> {
        AdminConfFile::load(path).map(|f| f.conf)
    }

    /// Writes the file atomically with mode 0600 (it holds a private key),
    /// with no replica list.
    pub fn save(&self, path: &Path) -> Result<(), AdminConfError> {
        AdminConfFile {
            conf: self.clone(),
            servers: Vec::new(),
        }
        .save(path)
    }
}

impl AdminConfFile {
    pub fn load(path: &Path) -> Result<Self, AdminConfError> {
        let text = std::fs::read_to_string(path).map_err(|source| AdminConfError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let raw: RawAdminConf = toml::from_str(&text).map_err(|e| AdminConfError::Parse {
            path: path.to_path_buf(),
            message: e.message().trim().replace('\n', " "),
        })?;
        Ok(AdminConfFile {
            conf: AdminConf {
                server: raw.server,
                ca_cert: raw.ca_cert,
                client_cert: raw.client_cert,
                client_key: raw.client_key,
            },
            servers: raw.servers,
        })
    }

    /// Writes the file atomically with mode 0600 (it holds a private key).
    pub fn save(&self, path: &Path) -> Result<(), AdminConfError> {
        let err = |source| AdminConfError::Write {
            path: path.to_path_buf(),
            source,
        };
        let raw = RawAdminConf {
            server: self.conf.server.clone(),
            servers: self.servers.clone(),
            ca_cert: self.conf.ca_cert.clone(),
            client_cert: self.conf.client_cert.clone(),
            client_key: self.conf.client_key.clone(),
        };
        let text = toml::to_string(&raw).map_err(|e| err(std::io::Error::other(e)))?;
        write_atomic(path, text.as_bytes(), 0o600).map_err(|e| err(e.source))
    }

    /// The URLs to try, in order: `server`, then each of `servers` not
    /// already listed (a trailing `/` does not make a URL different).
    pub fn endpoints(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for url in std::iter::once(&self.conf.server).chain(&self.servers) {
            let url = url.trim().trim_end_matches('/');
            if !url.is_empty() && !out.iter().any(|u| u == url) {
                out.push(url.to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf() -> AdminConf {
        AdminConf {
            server: "https://127.0.0.1:7443".into(),
            ca_cert: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".into(),
            client_cert: "c".into(),
            client_key: "k".into(),
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.conf");
        let c = conf();
        c.save(&p).unwrap();
        assert_eq!(AdminConf::load(&p).unwrap(), c);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("servers"), "no empty list written: {text}");
        std::fs::write(&p, "server = 1").unwrap();
        assert!(matches!(AdminConf::load(&p), Err(AdminConfError::Parse { .. })));
    }

    #[test]
    fn a_replica_list_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.conf");
        let f = AdminConfFile {
            conf: conf(),
            servers: vec!["https://127.0.0.1:7443".into(), "https://10.0.0.2:7443".into()],
        };
        f.save(&p).unwrap();
        assert_eq!(AdminConfFile::load(&p).unwrap(), f);
        // Readers that want only the credentials still load the file.
        assert_eq!(AdminConf::load(&p).unwrap(), conf());
    }

    #[test]
    fn an_old_file_loads_with_no_list() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.conf");
        std::fs::write(
            &p,
            "server = \"https://a:7443\"\nca_cert = \"CA\"\nclient_cert = \"c\"\nclient_key = \"k\"\n",
        )
        .unwrap();
        let f = AdminConfFile::load(&p).unwrap();
        assert!(f.servers.is_empty());
        assert_eq!(f.endpoints(), ["https://a:7443"]);
    }

    #[test]
    fn unknown_keys_are_still_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.conf");
        std::fs::write(
            &p,
            "server = \"https://a:7443\"\nserver_list = [\"https://b:7443\"]\nca_cert = \"CA\"\nclient_cert = \"c\"\nclient_key = \"k\"\n",
        )
        .unwrap();
        let err = AdminConfFile::load(&p).unwrap_err().to_string();
        assert!(err.contains("unknown field `server_list`"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn endpoints_start_with_server_and_skip_repeats() {
        let f = AdminConfFile {
            conf: AdminConf {
                server: "https://b:7443".into(),
                ..conf()
            },
            servers: vec![
                "https://a:7443".into(),
                "https://b:7443/".into(),
                " https://c:7443 ".into(),
                "https://a:7443".into(),
                String::new(),
            ],
        };
        assert_eq!(
            f.endpoints(),
            ["https://b:7443", "https://a:7443", "https://c:7443"]
        );
    }
}
