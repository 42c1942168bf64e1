//! The FleetLock listener (issue [reboots], `--fleetlock-listen`): Zincati
//! on Fedora CoreOS / Flatcar nodes takes its reboot slots from the
//! cluster's reboot lock. One base URL per cluster, `http://ADDR/c/CLUSTER/`:
//! `POST v1/pre-reboot` and `POST v1/steady-state`, the header
//! `fleet-lock-protocol: true`, the body `{"client_params": {"id", "group"}}`;
//! 200 on success, else a 4xx/5xx with `{"kind", "value"}`. The decision is
//! `lks_rollout::fleetlock`'s; the lock is written only if it is still the
//! revision read, so any replica answers. Plain HTTP, or TLS with the
//! server's own certificate (`--fleetlock-tls`); Zincati sends no
//! credential either way, so what protects it is the network it is
//! reachable from.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use lks_rollout::fleetlock;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::rebootgates::Gates;
use crate::reboots::{clock_of, view_of};
use crate::store::{EventRow, Store, StoreError};

/// The largest request body read.
pub const MAX_BODY: usize = 16 * 1024;
/// How long one connection may take, from accept to its last answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections served at once; more wait in the kernel's
/// backlog until one ends (each ends within [`CONNECTION_TIMEOUT`]), so
/// clients that open connections and send nothing cost a bounded number
/// of tasks and sockets, never the server's descriptors.
pub const MAX_CONNECTIONS: usize = 256;
/// Tries of a lock write that lost a race.
const ATTEMPTS: usize = 5;
/// The longest client id accepted.
const MAX_ID: usize = 253;

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    PreReboot,
    SteadyState,
}

/// A well-formed FleetLock request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub cluster: String,
    pub op: Op,
    pub id: String,
    pub group: String,
}

/// An answer that is not 200: its status and the protocol's error body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub status: StatusCode,
    pub kind: &'static str,
    pub value: String,
}

fn fail(status: StatusCode, kind: &'static str, value: impl Into<String>) -> Failure {
    Failure {
        status,
        kind,
        value: value.into(),
    }
}

#[derive(serde::Deserialize)]
struct Body {
    client_params: ClientParams,
}

#[derive(serde::Deserialize)]
struct ClientParams {
    id: String,
    group: String,
}

/// Parses a request: its method, path, header and body.
pub fn parse(method: &Method, path: &str, header: Option<&[u8]>, body: &[u8]) -> Result<Ask, Failure> {
    let rest = path.strip_prefix("/c/").ok_or_else(|| {
        fail(
            StatusCode::NOT_FOUND,
            "not_found",
            "not found; the base URL is /c/CLUSTER/",
        )
    })?;
    let (cluster, op) = match rest.split_once("/v1/") {
        Some((c, "pre-reboot")) => (c, Op::PreReboot),
        Some((c, "steady-state")) => (c, Op::SteadyState),
        _ => {
            return Err(fail(
                StatusCode::NOT_FOUND,
                "not_found",
                "not found; the endpoints are v1/pre-reboot and v1/steady-state",
            ));
        }
    };
    if cluster.is_empty() || cluster.contains('/') {
        return Err(fail(
            StatusCode::NOT_FOUND,
            "not_found",
            "not found; the base URL is /c/CLUSTER/",
        ));
    }
    if method != Method::POST {
        return Err(fail(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "FleetLock requests are POST",
        ));
    }
    if header != Some(b"true".as_slice()) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "missing_fleet_lock_header",
            "the header fleet-lock-protocol: true is missing",
        ));
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the body is not {{\"client_params\": {{\"id\", \"group\"}}}}: {e}"),
        )
    })?;
    let ClientParams { id, group } = b.client_params;
    if id.is_empty() || id.len() > MAX_ID || id.chars().any(char::is_control) {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("client_params.id must be 1 to {MAX_ID} printable characters"),
        ));
    }
    if group.is_empty()
        || !group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    {
        return Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "client_params.group must match ^[a-zA-Z0-9.-]+$",
        ));
    }
    Ok(Ask {
        cluster: cluster.to_string(),
        op,
        id,
        group,
    })
}

fn store_failure(e: StoreError) -> Failure {
    tracing::warn!(error = %e, "fleetlock: store");
    fail(
        StatusCode::INTERNAL_SERVER_ERROR,
        "store_error",
        "the store did not answer; try again",
    )
}

fn event(ask: &Ask, kind: &str, message: String, at_ms: i64) -> EventRow {
    EventRow::about(&ask.cluster, &ask.id, kind, at_ms, message)
}

/// Carries out `ask` on its cluster's lock: `granted`, `held` (a slot
/// already) or `released` (also when there was none).
pub async fn answer(store: &dyn Store, gates: &Gates, ask: &Ask) -> Result<&'static str, Failure> {
    let Some(c) = store.get_cluster(&ask.cluster).await.map_err(store_failure)? else {
        return Err(fail(
            StatusCode::NOT_FOUND,
            "unknown_cluster",
            format!("cluster {} does not exist", ask.cluster),
        ));
    };
    let mut node = match store.get_node(&ask.id).await.map_err(store_failure)? {
        Some(n) if n.cluster == c.name => Some(view_of(&n, n.connected)),
        _ => None,
    };
    for _ in 0..ATTEMPTS {
        let at = store.reboot_lock(&c.name).await.map_err(store_failure)?;
        let mut clock = clock_of(&c, now_ms());
        let (next, kind, message) = match ask.op {
            Op::PreReboot => {
                // The gates' answers (kept a few seconds, shared with the lock).
                let id = ask.id.as_str();
                gates
                    .fill_one(&c, node.as_mut().map(|v| (id, v)), &mut clock)
                    .await;
                let next = fleetlock::take(&c.reboots, &at.lock, &ask.id, &ask.group, node.as_ref(), &clock)
                    .map_err(|r| fail(StatusCode::CONFLICT, r.kind(), r.message(&c.name, &ask.id)))?;
                let n = at.lock.slots.len() + 1;
                let m = format!(
                    "took reboot slot {n} of {} (FleetLock client {}, group {})",
                    c.reboots.max_concurrent, ask.id, ask.group
                );
                (next, "reboot_slot_taken", m)
            }
            Op::SteadyState => {
                let m = format!(
                    "FleetLock client {} released its reboot slot (steady-state)",
                    ask.id
                );
                (
                    fleetlock::release(&at.lock, &ask.id, clock.now_ms),
                    "reboot_released",
                    m,
                )
            }
        };
        let Some(next) = next else {
            return Ok(if ask.op == Op::PreReboot {
                "held"
            } else {
                "released"
            });
        };
        let ev = vec![event(ask, kind, message.clone(), clock.now_ms)];
        match store.put_reboot_lock(&c.name, &next, at.revision, ev).await {
            Ok(Some(_)) => {
                tracing::info!(cluster = %c.name, id = %ask.id, kind, message = %message, "fleetlock");
                return Ok(if ask.op == Op::PreReboot {
                    "granted"
                } else {
                    "released"
                });
            }
            Ok(None) => continue,
            Err(e) => return Err(store_failure(e)),
        }
    }
    Err(fail(
        StatusCode::SERVICE_UNAVAILABLE,
        "lock_contended",
        "the reboot lock kept changing under this request; try again",
    ))
}

/// The result `lks_fleetlock_requests_total` counts a failure as.
fn result_of(f: &Failure) -> &'static str {
    if f.status == StatusCode::CONFLICT {
        "refused"
    } else if f.status.is_client_error() {
        "bad_request"
    } else {
        "error"
    }
}

fn reply(r: Result<&'static str, Failure>) -> Response<Full<Bytes>> {
    let (status, body) = match r {
        Ok(_) => (StatusCode::OK, Bytes::new()),
        Err(f) => {
            let body = serde_json::json!({"kind": f.kind, "value": f.value}).to_string();
            (f.status, Bytes::from(body))
        }
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if status != StatusCode::OK {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
    }
    resp
}

async fn handle(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    gates: Arc<Gates>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let header = req
        .headers()
        .get("fleet-lock-protocol")
        .map(|v| v.as_bytes().to_vec());
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            metrics.fleetlock_request("other", "bad_request");
            return reply(Err(fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad_request",
                format!("the body is over {MAX_BODY} bytes, or was cut"),
            )));
        }
    };
    let (op, r) = match parse(&method, &path, header.as_deref(), &body) {
        Ok(ask) => {
            let op = match ask.op {
                Op::PreReboot => "pre-reboot",
                Op::SteadyState => "steady-state",
            };
            (op, answer(store.as_ref(), &gates, &ask).await)
        }
        Err(f) => ("other", Err(f)),
    };
    metrics.fleetlock_request(op, r.as_ref().map_or_else(result_of, |ok| *ok));
    reply(r)
}

/// The TLS configuration of `--fleetlock-tls`: the server's own serving
/// certificate (the one agents pin), HTTP/1.1, no client certificate asked
/// (Zincati sends none; one sent must chain to the CA).
pub fn tls_config(
    chain_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, lks_proto::tls::TlsSetupError> {
    let base =
        lks_proto::tls::server_config(chain_pem, key_pem, ca_pem, lks_proto::tls::ClientCerts::Optional)?;
    let mut cfg = (*base).clone();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves one connection (plain or TLS) until it ends, `cancel` fires or
/// [`CONNECTION_TIMEOUT`] passes.
async fn serve_conn<IO>(
    io: IO,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    gates: Arc<Gates>,
    cancel: CancellationToken,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let store = store.clone();
        let metrics = metrics.clone();
        let gates = gates.clone();
        async move { Ok::<_, Infallible>(handle(store, metrics, gates, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(CONNECTION_TIMEOUT) => {
            tracing::debug!("fleetlock connection cut after {CONNECTION_TIMEOUT:?}");
        }
        r = conn => if let Err(e) = r {
            tracing::debug!(error = %e, "fleetlock connection ended");
        },
    }
}

/// Serves FleetLock on `listener` (over TLS with `tls`) until `cancel`
/// fires, at most `max_connections` ([`MAX_CONNECTIONS`] in the server)
/// at once.
pub async fn serve(
    listener: TcpListener,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    gates: Arc<Gates>,
    tls: Option<Arc<rustls::ServerConfig>>,
    cancel: CancellationToken,
    max_connections: usize,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        // A slot first: while every one is taken, nothing is accepted.
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "fleetlock listener accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let store = store.clone();
        let metrics = metrics.clone();
        let gates = gates.clone();
        let cancel = cancel.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Some(acceptor) = acceptor else {
                return serve_conn(stream, store, metrics, gates, cancel).await;
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_conn(tls, store, metrics, gates, cancel).await,
                Ok(Err(e)) => tracing::debug!(error = %e, "fleetlock TLS handshake failed"),
                Err(_) => tracing::debug!("fleetlock TLS handshake timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"client_params": {"id": "w1", "group": "default"}}"#;

    #[test]
    fn a_well_formed_request_parses() {
        let ask = parse(&Method::POST, "/c/tenant-a/v1/pre-reboot", Some(b"true"), BODY).unwrap();
        assert_eq!(
            ask,
            Ask {
                cluster: "tenant-a".into(),
                op: Op::PreReboot,
                id: "w1".into(),
                group: "default".into(),
            }
        );
        let ask = parse(&Method::POST, "/c/tenant-a/v1/steady-state", Some(b"true"), BODY).unwrap();
        assert_eq!(ask.op, Op::SteadyState);
    }

    #[test]
    fn bad_requests_are_refused_with_the_protocols_error() {
        let header = parse(&Method::POST, "/c/a/v1/pre-reboot", None, BODY).unwrap_err();
        assert_eq!(header.status, StatusCode::BAD_REQUEST);
        assert_eq!(header.kind, "missing_fleet_lock_header");
        let r = parse(&Method::POST, "/c/a/v1/pre-reboot", Some(b"false"), BODY).unwrap_err();
        assert_eq!(r.kind, "missing_fleet_lock_header");
        let get = parse(&Method::GET, "/c/a/v1/pre-reboot", Some(b"true"), BODY).unwrap_err();
        assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
        for path in [
            "/v1/pre-reboot",
            "/c//v1/pre-reboot",
            "/c/a/v1/reboot",
            "/c/a/b/v1/pre-reboot",
        ] {
            let r = parse(&Method::POST, path, Some(b"true"), BODY).unwrap_err();
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        }
        for body in [
            &b"{}"[..],
            br#"{"client_params": {"id": "", "group": "default"}}"#,
            br#"{"client_params": {"id": "w1", "group": "a b"}}"#,
            br#"{"client_params": {"id": "w1"}}"#,
            b"not json",
        ] {
            let r = parse(&Method::POST, "/c/a/v1/pre-reboot", Some(b"true"), body).unwrap_err();
            assert_eq!((r.status, r.kind), (StatusCode::BAD_REQUEST, "bad_request"));
        }
    }

    #[test]
    fn a_failure_is_answered_as_kind_and_value() {
        let r = reply(Err(fail(
            StatusCode::CONFLICT,
            "failed_lock_semaphore_full",
            "full",
        )));
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(reply(Ok("granted")).status(), StatusCode::OK);
    }

    /// Writes one request on a new connection and reads the status line
    /// of its answer, or `None` if none comes within `wait`.
    async fn ask(addr: std::net::SocketAddr, wait: Duration) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST /nowhere HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        match tokio::time::timeout(wait, c.read_to_end(&mut buf)).await {
            Ok(Ok(_)) => String::from_utf8_lossy(&buf).lines().next().map(str::to_string),
            _ => None,
        }
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_until_one_ends() {
        // As the server does first thing (the gates' HTTP client needs it).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store: Arc<dyn Store> = Arc::new(lks_store_sqlite::SqliteStore::open_in_memory().unwrap());
        let tenants = Arc::new(lks_kube::tenant::TenantApis::new(store.clone(), None));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve(
            listener,
            store,
            Arc::new(Metrics::default()),
            Arc::new(Gates::new(tenants)),
            None,
            cancel.clone(),
            1,
        ));
        let answered = ask(addr, Duration::from_secs(5)).await.unwrap();
        assert!(answered.starts_with("HTTP/1.1 404"), "{answered}");
        // One idle connection takes the only slot: the next is not served...
        let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(ask(addr, Duration::from_millis(500)).await, None);
        // ...until it ends.
        drop(idle);
        let answered = ask(addr, Duration::from_secs(5)).await.unwrap();
        assert!(answered.starts_with("HTTP/1.1 404"), "{answered}");
        cancel.cancel();
        task.await.unwrap();
    }
}
