//! The agent-package endpoint on the TLS port: a tower layer in front of
//! the gRPC routes that answers `GET`/`HEAD` of `/v1/agent-package/<arch>`
//! from the blob store — per-IP rate limit, a fixed number of downloads at
//! once, a deadline per download — and passes everything else on.

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use hyper::body::Frame;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::codegen::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{AgentPackage, AgentPackages, BURST, CHUNK, MAX_DOWNLOADS, PATH_PREFIX, RATE};
use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;

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
    use crate::packages::tests::deb;
    use crate::packages::{DOWNLOAD_DEADLINE, inspect_all};
    use lks_blobs::LocalBlobs;

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
