//! The agent packages the server offers to new VMs (`--agent-package FILE`).
//!
//! A VM being enrolled by `lksctl token create --cloud-init` user-data has
//! nothing yet but the token, the server's URL and its CA. Such a VM
//! downloads the agent `.deb` with `curl --cacert CA` from
//! `GET /v1/agent-package/<dpkg architecture>` on the gRPC port. That is the
//! same TLS listener with the same pinned CA, so the download needs no second
//! port and no second trust root, and no client certificate either.
//!
//! What is served, and what is not:
//! * Only the files given with `--agent-package`, one per architecture,
//!   matched by the exact path above. No other blob of the store can be
//!   reached this way: bundle files may hold secrets, and they go only to the
//!   nodes a rollout assigned them to, over `FetchBlob`.
//! * Each file is copied into the content-addressed blob store at start and
//!   served from there. What a VM downloads is therefore exactly the bytes
//!   (and SHA-256) `token create` reported, even if the file given on the
//!   command line is replaced while the server runs.
//! * The URL names an architecture, not a digest. A long-lived token's
//!   user-data (an autoscaling launch template, say) keeps working after the
//!   server is given a newer agent, and installs that newer agent.
//!   Authenticity comes from the pinned CA, as for the join itself.
//! * The endpoint is unauthenticated, so it is bounded. Each peer IP gets a
//!   token bucket, and a fixed number of downloads may run at once. Beyond
//!   either limit the answer is 429 or 503 with `Retry-After`, which
//!   `curl --retry` honours.
//!
//! The TLS listener negotiates HTTP/2 only (ALPN `h2`, as gRPC needs); curl
//! on Debian and Ubuntu speaks it.
//!
//! This file finds and imports the packages; `serve.rs` is the HTTP layer
//! that answers for them.

mod serve;

pub use serve::{PackageLayer, PackageService};

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lks_proto::{Digest, pb};
use tokio::io::AsyncReadExt as _;

use lks_blobs::{BlobError, LocalBlobs};

/// The path prefix; the rest of the path is a Debian architecture.
pub const PATH_PREFIX: &str = lks_proto::AGENT_PACKAGE_PATH;
/// The package name the files must carry, as `packaging/deb/build.sh` names them.
const PACKAGE: &str = "lksadmin-agent";
/// Downloads that may run at once.
const MAX_DOWNLOADS: usize = 64;
/// Package requests per second and burst, per peer IP.
const RATE: f64 = 5.0;
const BURST: f64 = 50.0;
/// Bytes per body frame.
const CHUNK: usize = 64 * 1024;
/// How long one download may take by default: a 20 MiB package in 10 min
/// needs 35 KB/s. A client slower than that (or one that stops reading)
/// would hold one of the [`MAX_DOWNLOADS`] slots for as long as it likes;
/// 64 of them would keep every new VM from its agent.
pub const DOWNLOAD_DEADLINE: Duration = Duration::from_secs(600);
/// `ar` archive magic, then the first member of every .deb.
const DEB_MAGIC: &[u8] = b"!<arch>\ndebian-binary";

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "--agent-package {path}: the file name must be {PACKAGE}_<version>_<arch>.deb, as packaging/deb/build.sh names it"
    )]
    Name { path: PathBuf },
    #[error("--agent-package {path}: architecture 'all' is not possible for the agent, a native binary")]
    ArchAll { path: PathBuf },
    #[error("--agent-package {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("--agent-package {path}: not a Debian package (no ar archive starting with debian-binary)")]
    NotDeb { path: PathBuf },
    #[error("--agent-package given twice for architecture {arch}: {first} and {second}")]
    DuplicateArch {
        arch: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("--agent-package {path}: copy into the blob store: {source}")]
    Import { path: PathBuf, source: Box<BlobError> },
}

/// One `--agent-package` file that passed [`inspect`], not yet imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    pub version: String,
    pub arch: String,
}

/// An agent package the server offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentPackage {
    /// Debian architecture (`dpkg --print-architecture`).
    pub arch: String,
    pub version: String,
    /// `lksadmin-agent_<version>_<arch>.deb`
    pub file_name: String,
    pub digest: Digest,
    pub size: u64,
}

impl AgentPackage {
    pub fn to_pb(&self, server_url: &str) -> pb::AgentPackage {
        pb::AgentPackage {
            arch: self.arch.clone(),
            version: self.version.clone(),
            url: url(server_url, &self.arch),
            digest: self.digest.to_string(),
            size: self.size,
            file_name: self.file_name.clone(),
        }
    }
}

/// Where the package for `arch` is downloaded from.
pub fn url(server_url: &str, arch: &str) -> String {
    format!("{}{PATH_PREFIX}{arch}", server_url.trim_end_matches('/'))
}

/// Splits `lksadmin-agent_<version>_<arch>.deb` into version and arch.
/// Versions are Debian's characters (an epoch is never part of a file name);
/// architectures are lowercase letters, digits and `-`.
fn parse_file_name(name: &str) -> Option<(&str, &str)> {
    let rest = name
        .strip_prefix(PACKAGE)?
        .strip_prefix('_')?
        .strip_suffix(".deb")?;
    let (version, arch) = rest.split_once('_')?;
    let version_ok = version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+~-".contains(c));
    let arch_ok = arch.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && arch
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (version_ok && arch_ok).then_some((version, arch))
}

/// Checks one `--agent-package` file: its name, and that it is a .deb.
pub fn inspect(path: &Path) -> Result<Candidate, PackageError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let (version, arch) = parse_file_name(name).ok_or_else(|| PackageError::Name {
        path: path.to_path_buf(),
    })?;
    if arch == "all" {
        return Err(PackageError::ArchAll {
            path: path.to_path_buf(),
        });
    }
    let io = |source| PackageError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = Vec::with_capacity(DEB_MAGIC.len());
    std::fs::File::open(path)
        .map_err(io)?
        .take(DEB_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    if head != DEB_MAGIC {
        return Err(PackageError::NotDeb {
            path: path.to_path_buf(),
        });
    }
    Ok(Candidate {
        path: path.to_path_buf(),
        version: version.to_string(),
        arch: arch.to_string(),
    })
}

/// Checks every `--agent-package` file, before the server creates anything.
pub fn inspect_all(paths: &[PathBuf]) -> Result<Vec<Candidate>, PackageError> {
    let mut by_arch: BTreeMap<String, Candidate> = BTreeMap::new();
    for p in paths {
        let c = inspect(p)?;
        if let Some(first) = by_arch.get(&c.arch) {
            return Err(PackageError::DuplicateArch {
                arch: c.arch,
                first: first.path.clone(),
                second: c.path,
            });
        }
        by_arch.insert(c.arch.clone(), c);
    }
    Ok(by_arch.into_values().collect())
}

/// The packages on offer, in the blob store.
#[derive(Clone, Debug)]
pub struct AgentPackages {
    /// Sorted by architecture.
    list: Vec<AgentPackage>,
    blobs: LocalBlobs,
}

impl AgentPackages {
    /// Copies each candidate into the blob store (unless its bytes are
    /// there already), verifying the copy against the digest of the file.
    pub async fn import(candidates: Vec<Candidate>, blobs: &LocalBlobs) -> Result<Self, PackageError> {
        let mut list = Vec::with_capacity(candidates.len());
        for c in candidates {
            let pkg = import_one(&c, blobs).await?;
            tracing::info!(
                arch = %pkg.arch, version = %pkg.version, digest = %pkg.digest, size = pkg.size,
                "offering the agent package at {PATH_PREFIX}{}", pkg.arch
            );
            list.push(pkg);
        }
        list.sort_by(|a, b| a.arch.cmp(&b.arch));
        Ok(AgentPackages {
            list,
            blobs: blobs.clone(),
        })
    }

    pub fn list(&self) -> &[AgentPackage] {
        &self.list
    }

    pub fn get(&self, arch: &str) -> Option<&AgentPackage> {
        self.list.iter().find(|p| p.arch == arch)
    }

    fn archs(&self) -> String {
        self.list
            .iter()
            .map(|p| p.arch.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

async fn import_one(c: &Candidate, blobs: &LocalBlobs) -> Result<AgentPackage, PackageError> {
    let io = |source| PackageError::Io {
        path: c.path.clone(),
        source,
    };
    let path = c.path.clone();
    let (digest, size) = tokio::task::spawn_blocking(move || Digest::of_file(&path))
        .await
        .map_err(|e| io(std::io::Error::other(e)))?
        .map_err(io)?;
    if !blobs.contains(&digest) {
        // The writer checks the bytes against the digest just computed: a
        // file changed in between is refused, not half-imported.
        let import = |source| PackageError::Import {
            path: c.path.clone(),
            source: Box::new(source),
        };
        let mut w = blobs.writer(digest, size).await.map_err(import)?;
        let mut f = tokio::fs::File::open(&c.path).await.map_err(io)?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                break;
            }
            w.write(&buf[..n]).await.map_err(import)?;
        }
        w.finish().await.map_err(import)?;
    }
    Ok(AgentPackage {
        arch: c.arch.clone(),
        version: c.version.clone(),
        file_name: format!("{PACKAGE}_{}_{}.deb", c.version, c.arch),
        digest,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn deb(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
        let p = dir.join(name);
        let mut bytes = DEB_MAGIC.to_vec();
        bytes.extend_from_slice(body);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn file_names_give_version_and_arch() {
        assert_eq!(
            parse_file_name("lksadmin-agent_0.1.0-1_amd64.deb"),
            Some(("0.1.0-1", "amd64"))
        );
        assert_eq!(
            parse_file_name("lksadmin-agent_1.2~rc1+b2_ppc64el.deb"),
            Some(("1.2~rc1+b2", "ppc64el"))
        );
        for bad in [
            "lksadmin-agent_0.1.0-1_amd64",
            "lksadmin-agent_0.1.0-1.deb",
            "lks-control-server_0.1.0-1_amd64.deb",
            "lksadmin-agent_v1_amd64.deb",
            "lksadmin-agent__amd64.deb",
            "lksadmin-agent_0.1_.deb",
            "lksadmin-agent_0.1_AMD64.deb",
            "lksadmin-agent_0.1_amd64_x.deb",
            "lksadmin-agent_0.1_amd 64.deb",
            "lksadmin-agent_1:0.1_amd64.deb",
        ] {
            assert_eq!(parse_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn inspect_refuses_what_is_not_an_agent_deb() {
        let dir = tempfile::tempdir().unwrap();
        let good = deb(dir.path(), "lksadmin-agent_0.1.0-1_amd64.deb", b"rest");
        assert_eq!(
            inspect(&good).unwrap(),
            Candidate {
                path: good.clone(),
                version: "0.1.0-1".into(),
                arch: "amd64".into()
            }
        );

        let text = dir.path().join("lksadmin-agent_0.1.0-1_arm64.deb");
        std::fs::write(&text, "#!/bin/sh\necho not a package\n").unwrap();
        let short = dir.path().join("lksadmin-agent_0.1.0-1_armhf.deb");
        std::fs::write(&short, "!<arch>\n").unwrap();
        let renamed = deb(dir.path(), "agent.deb", b"");
        let all = deb(dir.path(), "lksadmin-agent_0.1.0-1_all.deb", b"");
        let missing = dir.path().join("lksadmin-agent_0.1.0-1_riscv64.deb");

        let err = |p: &Path| inspect(p).unwrap_err();
        assert!(matches!(err(&text), PackageError::NotDeb { .. }));
        assert!(matches!(err(&short), PackageError::NotDeb { .. }));
        assert!(matches!(err(&renamed), PackageError::Name { .. }));
        assert!(matches!(err(&all), PackageError::ArchAll { .. }));
        assert!(matches!(err(&missing), PackageError::Io { .. }));
        for p in [&text, &renamed, &all, &missing] {
            let msg = err(p).to_string();
            assert!(
                !msg.contains('\n') && msg.starts_with("--agent-package "),
                "{msg}"
            );
            assert!(msg.contains(&p.display().to_string()), "{msg}");
        }
    }

    #[test]
    fn one_package_per_architecture() {
        let dir = tempfile::tempdir().unwrap();
        let a = deb(dir.path(), "lksadmin-agent_0.1.0-1_amd64.deb", b"a");
        let b = deb(dir.path(), "lksadmin-agent_0.2.0-1_amd64.deb", b"b");
        let c = deb(dir.path(), "lksadmin-agent_0.1.0-1_arm64.deb", b"c");
        let got = inspect_all(&[c.clone(), a.clone()]).unwrap();
        assert_eq!(
            got.iter().map(|c| c.arch.as_str()).collect::<Vec<_>>(),
            ["amd64", "arm64"],
            "sorted by architecture"
        );
        let e = inspect_all(&[a.clone(), c, b.clone()]).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "--agent-package given twice for architecture amd64: {} and {}",
                a.display(),
                b.display()
            )
        );
        assert!(inspect_all(&[]).unwrap().is_empty());
    }

    #[tokio::test]
    async fn import_copies_into_the_blob_store_once() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(&dir.path().join("blobs")).unwrap();
        let p = deb(dir.path(), "lksadmin-agent_0.1.0-1_amd64.deb", &[7u8; 200_000]);
        let (digest, size) = Digest::of_file(&p).unwrap();
        let pkgs = AgentPackages::import(inspect_all(std::slice::from_ref(&p)).unwrap(), &blobs)
            .await
            .unwrap();
        let pkg = pkgs.get("amd64").unwrap();
        assert_eq!((pkg.digest, pkg.size), (digest, size));
        assert_eq!(pkg.file_name, "lksadmin-agent_0.1.0-1_amd64.deb");
        assert_eq!(
            std::fs::read(blobs.path(&digest)).unwrap(),
            std::fs::read(&p).unwrap()
        );
        // The served bytes are the imported ones, whatever becomes of the file.
        std::fs::remove_file(&p).unwrap();
        assert!(blobs.contains(&digest));
        assert!(pkgs.get("arm64").is_none());
        assert_eq!(
            pkg.to_pb("https://kube0.example:7443/").url,
            "https://kube0.example:7443/v1/agent-package/amd64"
        );
    }
}
