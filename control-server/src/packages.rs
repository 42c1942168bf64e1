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

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use hyper::body::Frame;
use lks_proto::{Digest, pb};
use tokio::io::AsyncReadExt as _;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::codegen::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::blobs::{BlobError, LocalBlobs};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;

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

/// What a request on the TLS port is, as far as packages are concerned.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    /// Not under [`PATH_PREFIX`]: gRPC, for the inner service.
    Grpc,
    /// `GET` or `HEAD` of the package for this architecture.
    Package { arch: &'a str, head: bool },
    /// Under the prefix with another method.
    BadMethod,
}

fn route<'a>(method: &Method, path: &'a str) -> Route<'a> {
    let Some(arch) = path.strip_prefix(PATH_PREFIX) else {
        return Route::Grpc;
    };
    match *method {
        Method::GET => Route::Package { arch, head: false },
        Method::HEAD => Route::Package { arch, head: true },
        _ => Route::BadMethod,
    }
}

/// A tower layer in front of the gRPC routes that answers package requests
/// and passes everything else on.
#[derive(Clone)]
pub struct PackageLayer {
    state: Arc<State>,
}

struct State {
    packages: Arc<AgentPackages>,
    limiter: RateLimiter,
    slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    deadline: Duration,
}

impl PackageLayer {
    /// `deadline`: how long one download may take before it is cut.
    pub fn new(packages: Arc<AgentPackages>, metrics: Arc<Metrics>, deadline: Duration) -> Self {
        Self::with_limits(
            packages,
            metrics,
            RateLimiter::new(RATE, BURST),
            MAX_DOWNLOADS,
            deadline,
        )
    }

    fn with_limits(
        packages: Arc<AgentPackages>,
        metrics: Arc<Metrics>,
        limiter: RateLimiter,
        max_downloads: usize,
        deadline: Duration,
    ) -> Self {
        PackageLayer {
            state: Arc::new(State {
                packages,
                limiter,
                slots: Arc::new(Semaphore::new(max_downloads)),
                metrics,
                deadline,
            }),
        }
    }
}

impl<S> tower_layer::Layer<S> for PackageLayer {
    type Service = PackageService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PackageService {
            inner,
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct PackageService<S> {
    inner: S,
    state: Arc<State>,
}

impl<S> tower_service::Service<Request<Body>> for PackageService<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    // Readiness is the inner router's. A package request answered here
    // leaves that readiness unused, which is harmless for tonic's routes:
    // they are always ready and reserve nothing.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match route(req.method(), req.uri().path()) {
            Route::Grpc => Box::pin(self.inner.call(req)),
            Route::BadMethod => {
                self.state.metrics.agent_package_request("bad_method");
                let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                Box::pin(async move { Ok(resp) })
            }
            Route::Package { arch, head } => {
                let peer = req
                    .extensions()
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .and_then(|i| i.get_ref().remote_addr())
                    .map(|a| a.ip());
                let state = self.state.clone();
                let early = state.check(arch, head, peer);
                let arch = arch.to_string();
                Box::pin(async move {
                    Ok(match early {
                        Some(response) => response,
                        None => state.serve(&arch, peer).await,
                    })
                })
            }
        }
    }
}

impl State {
    /// The answer that needs no file: an error, or the headers for `HEAD`.
    /// `None`: serve the package.
    fn check(&self, arch: &str, head: bool, peer: Option<IpAddr>) -> Option<Response<Body>> {
        if let Some(ip) = peer
            && !self.limiter.allow(ip)
        {
            self.metrics.agent_package_request("rate_limited");
            return Some(retry_later(StatusCode::TOO_MANY_REQUESTS, 1));
        }
        let Some(pkg) = self.packages.get(arch) else {
            self.metrics.agent_package_request("not_found");
            let msg = if self.packages.list.is_empty() {
                "this server offers no agent package (lks-control-server --agent-package FILE)\n".to_string()
            } else {
                format!(
                    "no agent package for architecture {arch:?}; this server offers: {}\n",
                    self.packages.archs()
                )
            };
            return Some(text(StatusCode::NOT_FOUND, &msg));
        };
        if head {
            // Headers only: no file, no download slot.
            self.metrics.agent_package_request("ok");
            return Some(package_response(pkg, Body::empty()));
        }
        None
    }

    /// Streams the package for `arch` (known to exist) from the blob store.
    async fn serve(&self, arch: &str, peer: Option<IpAddr>) -> Response<Body> {
        let Some(pkg) = self.packages.get(arch).cloned() else {
            return text(StatusCode::NOT_FOUND, "no such package\n");
        };
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.metrics.agent_package_request("busy");
            return retry_later(StatusCode::SERVICE_UNAVAILABLE, 2);
        };
        let path = self.packages.blobs.path(&pkg.digest);
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) => {
                self.metrics.agent_package_request("error");
                tracing::error!(path = %path.display(), error = %e, "cannot open the agent package blob");
                return text(StatusCode::INTERNAL_SERVER_ERROR, "the package cannot be read\n");
            }
        };
        self.metrics.agent_package_request("ok");
        tracing::info!(arch = %pkg.arch, version = %pkg.version, peer = ?peer, "serving the agent package");
        // The slot is given back when the body is done or dropped, and at
        // the deadline at the latest: a client that stops reading is no
        // longer polled for its body (HTTP/2 flow control), so the body's
        // own deadline below would never fire for it.
        let slot = Arc::new(std::sync::Mutex::new(Some(permit)));
        let held = Arc::downgrade(&slot);
        let deadline = tokio::time::Instant::now() + self.deadline;
        let stalled_metrics = self.metrics.clone();
        // Dropped with the body: the timer ends with the download.
        let (body_alive, body_gone) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = body_gone => return,
            }
            if let Some(slot) = held.upgrade()
                && let Some(p) = slot.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                drop(p);
                stalled_metrics.agent_package_request("slot_reclaimed");
                tracing::warn!(peer = ?peer, "agent package download still running at its deadline: its slot is given back");
            }
        });
        let metrics = self.metrics.clone();
        // Past the deadline the body ends with an error: the client sees
        // the download broken off (HTTP/2 RST_STREAM, or the HTTP/1.1
        // connection closed short of Content-Length), never a short file
        // that looks whole, and the slot is free again.
        let (limit, cut_metrics) = (self.deadline, self.metrics.clone());
        let cut = futures::stream::once(async move {
            (tokio::time::Instant::now() >= deadline).then(|| {
                cut_metrics.agent_package_request("deadline");
                tracing::warn!(peer = ?peer, "agent package download cut: not done within {limit:?}");
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("download not done within {limit:?}"),
                ))
            })
        })
        .filter_map(std::future::ready);
        let file = tokio_util::io::ReaderStream::with_capacity(file, CHUNK)
            .take_until(tokio::time::sleep_until(deadline))
            .chain(cut);
        let stream = file.map(move |chunk| {
            // The download slot is held until the body is done or dropped.
            let _held = (&slot, &body_alive);
            chunk.map(|b| {
                metrics.agent_package_bytes(b.len() as u64);
                Frame::data(b)
            })
        });
        package_response(&pkg, Body::new(http_body_util::StreamBody::new(stream)))
    }
}

fn package_response(pkg: &AgentPackage, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.debian.binary-package"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(pkg.size));
    // The name is checked to be plain ASCII (parse_file_name), so these
    // header values cannot fail; a failure would only drop the header.
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", pkg.digest)) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{}\"", pkg.file_name)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    // The URL names an architecture; its package changes when the server is
    // given another, so caches must ask again.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(Body::new(http_body_util::Full::new(hyper::body::Bytes::from(
        msg.to_string(),
    ))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn retry_later(status: StatusCode, secs: u32) -> Response<Body> {
    let mut r = text(status, "too many package downloads; retry later\n");
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deb(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
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

    #[test]
    fn only_the_package_prefix_is_routed_here() {
        assert_eq!(route(&Method::POST, "/lks.v1.AgentService/Connect"), Route::Grpc);
        assert_eq!(route(&Method::GET, "/v1/agent-packages/amd64"), Route::Grpc);
        assert_eq!(
            route(&Method::GET, "/v1/agent-package/amd64"),
            Route::Package {
                arch: "amd64",
                head: false
            }
        );
        assert_eq!(
            route(&Method::HEAD, "/v1/agent-package/arm64"),
            Route::Package {
                arch: "arm64",
                head: true
            }
        );
        assert_eq!(route(&Method::PUT, "/v1/agent-package/amd64"), Route::BadMethod);
    }

    #[tokio::test]
    async fn answers_without_the_file_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(&dir.path().join("blobs")).unwrap();
        let p = deb(dir.path(), "lksadmin-agent_0.1.0-1_amd64.deb", b"payload");
        let pkgs = Arc::new(
            AgentPackages::import(inspect_all(&[p]).unwrap(), &blobs)
                .await
                .unwrap(),
        );
        let metrics = Arc::new(Metrics::default());
        let layer = PackageLayer::with_limits(
            pkgs.clone(),
            metrics.clone(),
            RateLimiter::new(0.0, 2.0),
            1,
            DOWNLOAD_DEADLINE,
        );
        let s = &layer.state;
        let ip: IpAddr = "192.0.2.1".parse().unwrap();

        let head = s.check("amd64", true, Some(ip)).expect("HEAD is answered here");
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(
            head.headers()[header::CONTENT_LENGTH],
            pkgs.list()[0].size.to_string()
        );
        let missing = s.check("arm64", false, Some(ip)).expect("unknown arch");
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        // The bucket of two is empty now; another peer still has its own.
        let limited = s.check("amd64", false, Some(ip)).expect("rate limited");
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.headers()[header::RETRY_AFTER], "1");
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(s.check("amd64", false, Some(other)).is_none(), "to be served");

        // One download slot: a second download while the first body is alive
        // is told to retry; once the first body is dropped, the slot is free.
        let first = s.serve("amd64", Some(other)).await;
        assert_eq!(first.status(), StatusCode::OK);
        let busy = s.serve("amd64", Some(other)).await;
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "2");
        drop(first);
        assert_eq!(s.serve("amd64", Some(other)).await.status(), StatusCode::OK);

        let m = metrics.render();
        for line in [
            "lks_agent_package_requests_total{result=\"ok\"} 3",
            "lks_agent_package_requests_total{result=\"not_found\"} 1",
            "lks_agent_package_requests_total{result=\"rate_limited\"} 1",
            "lks_agent_package_requests_total{result=\"busy\"} 1",
        ] {
            assert!(m.contains(line), "{line} in\n{m}");
        }
    }

    async fn one_slot_layer(deadline: Duration) -> (tempfile::TempDir, PackageLayer, Arc<Metrics>) {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(&dir.path().join("blobs")).unwrap();
        let body = vec![7u8; 4 * CHUNK];
        let p = deb(dir.path(), "lksadmin-agent_0.1.0-1_amd64.deb", &body);
        let pkgs = Arc::new(
            AgentPackages::import(inspect_all(&[p]).unwrap(), &blobs)
                .await
                .unwrap(),
        );
        let metrics = Arc::new(Metrics::default());
        let layer =
            PackageLayer::with_limits(pkgs, metrics.clone(), RateLimiter::new(0.0, 100.0), 1, deadline);
        (dir, layer, metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_gives_its_slot_back_at_the_deadline() {
        let (_dir, layer, metrics) = one_slot_layer(Duration::from_secs(5)).await;
        let s = &layer.state;
        // Served, and then never read: the body is alive and never polled.
        let stalled = s.serve("amd64", None).await;
        assert_eq!(stalled.status(), StatusCode::OK);
        assert_eq!(
            s.serve("amd64", None).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            s.serve("amd64", None).await.status(),
            StatusCode::OK,
            "the stalled client's slot is free again"
        );
        assert!(
            metrics
                .render()
                .contains("lks_agent_package_requests_total{result=\"slot_reclaimed\"} 1")
        );
        drop(stalled);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_cut_at_the_deadline_with_an_error_not_a_short_file() {
        use http_body_util::BodyExt as _;
        let (_dir, layer, metrics) = one_slot_layer(Duration::from_secs(5)).await;
        let s = &layer.state;
        let mut body = s.serve("amd64", None).await.into_body();
        let mut got = 0;
        let end = loop {
            match body.frame().await {
                Some(Ok(f)) => {
                    got += f.into_data().map(|d| d.len()).unwrap_or(0);
                    // One 64 KiB frame every 2 s: the file needs 8 s.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Some(Err(e)) => break Some(e.to_string()),
                None => break None,
            }
        };
        let e = end.expect("the download ends with an error, not a clean end");
        assert!(e.contains("not done within"), "{e}");
        assert!(got < 4 * CHUNK, "cut before the end: {got} bytes");
        assert!(
            metrics
                .render()
                .contains("lks_agent_package_requests_total{result=\"deadline\"} 1")
        );
        // A reader at full speed gets the whole file.
        drop(body);
        let mut body = s.serve("amd64", None).await.into_body();
        let mut n = 0;
        while let Some(f) = body.frame().await {
            n += f.unwrap().into_data().map(|d| d.len()).unwrap_or(0);
        }
        assert!(n >= 4 * CHUNK, "{n}");
    }
}
