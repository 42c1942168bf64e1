//! The console's HTTP edge: routing, the embedded assets, and the checks
//! every request passes (Host, and for a POST the token and Origin).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::anyhow;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use subtle::ConstantTimeEq;

use super::api::{Api, ApiError};

/// The header a POST carries the page's token in.
pub const TOKEN_HEADER: &str = "x-console-token";
/// Where the served page carries the token (`<meta name=… content=…>`).
const TOKEN_SLOT: &str = "__LKS_CONSOLE_TOKEN__";
/// Largest request body accepted (the start form is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const PLANS_JS: &str = include_str!("assets/plans.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

/// Everything one console process serves with.
pub struct Console {
    api: Api,
    local: SocketAddr,
    token: String,
    /// `Host` values a request may carry; empty: any (listening on every address).
    hosts: Vec<String>,
    index: String,
}

impl Console {
    pub fn new(config: PathBuf, local: SocketAddr) -> anyhow::Result<Console> {
        let mut raw = [0u8; 32];
        // getrandom's error is no `std::error::Error` without its `std`
        // feature: its text is all there is to keep.
        getrandom::getrandom(&mut raw).map_err(|e| anyhow!("make the console's request token: {e}"))?;
        let token = hex::encode(raw);
        let index = INDEX_HTML.replace(TOKEN_SLOT, &token);
        Ok(Console {
            api: Api::new(config),
            local,
            hosts: allowed_hosts(local),
            token,
            index,
        })
    }

    pub fn url(&self) -> String {
        let host = if self.local.ip().is_unspecified() {
            // The URL printed must be one a browser can open.
            let ip = if self.local.is_ipv4() {
                "127.0.0.1"
            } else {
                "[::1]"
            };
            format!("{ip}:{}", self.local.port())
        } else {
            host_of(self.local)
        };
        format!("http://{host}/")
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let mut resp = self.route(req).await;
        secure_headers(resp.headers_mut());
        resp
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !self.hosts.is_empty() && !self.hosts.contains(&host) {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                &format!("this console serves {}, not host {host:?}", host_of(self.local)),
            );
        }
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        match (req.method(), path.as_str()) {
            (&Method::GET | &Method::HEAD, "/" | "/index.html") => {
                asset("text/html; charset=utf-8", &self.index)
            }
            (&Method::GET | &Method::HEAD, "/assets/console.js") => {
                asset("text/javascript; charset=utf-8", CONSOLE_JS)
            }
            (&Method::GET | &Method::HEAD, "/assets/plans.js") => {
                asset("text/javascript; charset=utf-8", PLANS_JS)
            }
            (&Method::GET | &Method::HEAD, "/assets/console.css") => {
                asset("text/css; charset=utf-8", CONSOLE_CSS)
            }
            (&Method::GET | &Method::HEAD, "/favicon.svg") => asset("image/svg+xml", FAVICON_SVG),
            (&Method::GET, p) if p.starts_with("/api/") => {
                json_result(self.api.get(&p["/api/".len()..], &query).await)
            }
            (&Method::POST, p) if p.starts_with("/api/") => {
                if let Err(why) = self.check_post(req.headers(), &host) {
                    return refuse(StatusCode::FORBIDDEN, &why.to_string());
                }
                let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("read request body: {e}")),
                };
                json_result(self.api.post(&p["/api/".len()..], &body).await)
            }
            (_, p) if p.starts_with("/api/") || matches!(p, "/" | "/index.html") => {
                refuse(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => refuse(StatusCode::NOT_FOUND, &format!("no page {path}")),
        }
    }

    /// A state-changing request must carry the page's token, and come from
    /// a page of this console when the browser says where it came from.
    fn check_post(&self, h: &HeaderMap, host: &str) -> Result<(), PostRefused> {
        let given = h.get(TOKEN_HEADER).map(HeaderValue::as_bytes).unwrap_or_default();
        if given.is_empty() {
            return Err(PostRefused::NoToken);
        }
        if !bool::from(given.ct_eq(self.token.as_bytes())) {
            return Err(PostRefused::WrongToken);
        }
        if let Some(origin) = h.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default().to_ascii_lowercase();
            if origin != format!("http://{host}") {
                return Err(PostRefused::Origin { origin });
            }
        }
        if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok())
            && !matches!(site, "same-origin" | "none")
        {
            return Err(PostRefused::Site { site: site.into() });
        }
        Ok(())
    }
}

/// Why a state-changing request was refused (answered 403 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum PostRefused {
    #[error("missing {TOKEN_HEADER} header: use the console's own page")]
    NoToken,
    #[error("wrong {TOKEN_HEADER}: reload the console's page")]
    WrongToken,
    #[error("requests from {origin} are refused")]
    Origin { origin: String },
    #[error("requests from a {site} page are refused")]
    Site { site: String },
}

/// `ip:port` as a browser writes it in `Host` (IPv6 in brackets).
fn host_of(a: SocketAddr) -> String {
    match a {
        SocketAddr::V4(v) => format!("{}:{}", v.ip(), v.port()),
        SocketAddr::V6(v) => format!("[{}]:{}", v.ip(), v.port()),
    }
}

fn allowed_hosts(local: SocketAddr) -> Vec<String> {
    if local.ip().is_unspecified() {
        return Vec::new();
    }
    let mut hosts = vec![host_of(local)];
    if local.ip().is_loopback() {
        hosts.push(format!("localhost:{}", local.port()));
    }
    if local.port() == 80 {
        let bare: Vec<String> = hosts
            .iter()
            .filter_map(|h| h.strip_suffix(":80").map(str::to_string))
            .collect();
        hosts.extend(bare);
    }
    hosts
}

fn secure_headers(h: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    );
    set(h, "x-content-type-options", "nosniff");
    set(h, "x-frame-options", "DENY");
    set(h, "referrer-policy", "no-referrer");
    set(h, "cache-control", "no-store");
}

fn response(code: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn asset(content_type: &'static str, body: &str) -> Response<Full<Bytes>> {
    response(StatusCode::OK, content_type, body.to_string())
}

fn json(code: StatusCode, v: &serde_json::Value) -> Response<Full<Bytes>> {
    response(code, "application/json", v.to_string())
}

fn refuse(code: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    json(code, &serde_json::json!({ "error": msg }))
}

fn json_result(r: Result<serde_json::Value, ApiError>) -> Response<Full<Bytes>> {
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => json(e.http_status(), &e.to_json()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_the_listen_address() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(allowed_hosts(a), ["127.0.0.1:8080", "localhost:8080"]);
        let a: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(
            allowed_hosts(a),
            ["[::1]:80", "localhost:80", "[::1]", "localhost"]
        );
        let a: SocketAddr = "192.0.2.1:9000".parse().unwrap();
        assert_eq!(allowed_hosts(a), ["192.0.2.1:9000"]);
        assert!(allowed_hosts("0.0.0.0:9000".parse().unwrap()).is_empty());
    }

    #[test]
    fn a_post_needs_the_token_and_a_matching_origin() {
        let c = Console::new("admin.conf".into(), "127.0.0.1:8080".parse().unwrap()).unwrap();
        assert!(c.index.contains(&c.token) && !c.index.contains(TOKEN_SLOT));
        let host = "127.0.0.1:8080";
        let mut h = HeaderMap::new();
        assert!(
            c.check_post(&h, host)
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
        h.insert(TOKEN_HEADER, HeaderValue::from_static("nope"));
        assert!(c.check_post(&h, host).unwrap_err().to_string().contains("wrong"));
        h.insert(TOKEN_HEADER, HeaderValue::from_str(&c.token).unwrap());
        assert_eq!(c.check_post(&h, host), Ok(()));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert_eq!(
            c.check_post(&h, host),
            Err(PostRefused::Origin {
                origin: "http://evil.example".into()
            })
        );
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert_eq!(c.check_post(&h, host), Ok(()));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(c.check_post(&h, host).is_err());
    }
}
