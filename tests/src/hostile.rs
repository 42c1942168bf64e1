//! Harness for hostile-input tests: requests made by hand on the wire (raw
//! gRPC frames over a real mTLS channel, chosen source addresses), forged
//! client certificates, and an HTTP mirror that never stops sending.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use lks_proto::pb::{self, agent_service_client::AgentServiceClient};
use prost::Message as _;
use prost::bytes::Bytes;
use tonic::Code;
use tonic::client::GrpcService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::server::{Server, TestNode};

/// Every RPC of package `lks.v1`, as `/lks.v1.Service/Method`, read from
/// the compiled descriptor so a new RPC is covered without editing here.
pub fn rpc_paths() -> Vec<(String, String)> {
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut out = Vec::new();
    for f in &set.file {
        for s in &f.service {
            for m in &s.method {
                out.push((
                    s.name().to_string(),
                    format!("/{}.{}/{}", f.package(), s.name(), m.name()),
                ));
            }
        }
    }
    out
}

/// One gRPC length-prefixed message: flag, big-endian length, bytes.
pub fn frame(flag: u8, declared_len: u32, body: &[u8]) -> Vec<u8> {
    let mut v = vec![flag];
    v.extend_from_slice(&declared_len.to_be_bytes());
    v.extend_from_slice(body);
    v
}

pub fn message(body: &[u8]) -> Vec<u8> {
    frame(0, body.len() as u32, body)
}

/// How the server answered a hand-made request.
#[derive(Debug)]
pub enum Answer {
    /// A gRPC status (OK included).
    Grpc(Code, String),
    /// An HTTP status without a gRPC one (the HTTP/2 layer refused).
    Http(u16),
    /// The connection or stream was cut.
    Transport(String),
}

/// Sends `body` as the raw request body of `path`, with `headers` added,
/// and reads the status from the headers or the trailers.
pub async fn raw_grpc(
    ch: &Channel,
    base: &str,
    path: &str,
    body: Vec<u8>,
    headers: &[(String, String)],
) -> Answer {
    let mut ch = ch.clone();
    if let Err(e) = std::future::poll_fn(|cx| GrpcService::<tonic::body::Body>::poll_ready(&mut ch, cx)).await
    {
        return Answer::Transport(e.to_string());
    }
    let mut req = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("{base}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(tonic::body::Body::new(http_body_util::Full::new(Bytes::from(
            body,
        ))))
        .expect("request");
    let resp = match tokio::time::timeout(Duration::from_secs(20), GrpcService::call(&mut ch, req)).await {
        Err(_) => return Answer::Transport("no answer within 20s".into()),
        Ok(Err(e)) => return Answer::Transport(format!("{e:?}")),
        Ok(Ok(r)) => r,
    };
    let (parts, body) = resp.into_parts();
    if let Some(st) = tonic::Status::from_header_map(&parts.headers) {
        return Answer::Grpc(st.code(), st.message().to_string());
    }
    let collected = match tokio::time::timeout(Duration::from_secs(20), body.collect()).await {
        Err(_) => return Answer::Transport("body did not end within 20s".into()),
        Ok(Err(e)) => return Answer::Transport(format!("{e:?}")),
        Ok(Ok(c)) => c,
    };
    match collected.trailers().and_then(tonic::Status::from_header_map) {
        Some(st) => Answer::Grpc(st.code(), st.message().to_string()),
        None => Answer::Http(parts.status.as_u16()),
    }
}

/// A TLS channel that may fail (a refused client certificate can end the
/// handshake or the first request).
pub async fn try_channel(url: &str, ca_pem: &str, identity: Option<(&str, &str)>) -> Result<Channel, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// A channel from `local` (a loopback address of the test's choosing),
/// with no client certificate: a peer of its own for the rate limiter.
pub async fn channel_from(server: &Server, local: IpAddr) -> Channel {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(server.admin_conf().ca_cert));
    Channel::from_shared(server.url())
        .expect("url")
        .local_address(Some(local))
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect from a chosen loopback address")
}

pub fn admin_identity(s: &Server) -> (String, String, String) {
    let c = s.admin_conf();
    (c.ca_cert, c.client_cert, c.client_key)
}

pub async fn admin_channel(s: &Server) -> Channel {
    let (ca, cert, key) = admin_identity(s);
    crate::server::channel(&s.url(), &ca, Some((&cert, &key))).await
}

/// A second node gets its desired state over a fresh stream, and the admin
/// API answers: the server still serves others.
pub async fn serves_others(s: &mut Server, pid: u32, other: &TestNode) -> bool {
    if !s.running() || s.pid() != pid {
        return false;
    }
    let Ok((_tx, mut st)) = other.connect(vec![]).await else {
        return false;
    };
    let got = tokio::time::timeout(Duration::from_secs(10), st.message()).await;
    let streamed = matches!(got, Ok(Ok(Some(_))));
    let mut admin = pb::admin_service_client::AdminServiceClient::new(admin_channel(s).await);
    streamed && admin.list_clusters(pb::ListClustersRequest {}).await.is_ok()
}

/// The part of an error chain that says why (TLS alerts are deep inside).
pub fn short(e: &str) -> String {
    [
        "UnknownCA",
        "CertificateExpired",
        "BadCertificate",
        "UnknownIssuer",
        "Expired",
        "alert",
    ]
    .iter()
    .find(|w| e.contains(*w))
    .map_or_else(|| e.chars().take(160).collect(), |w| format!("…{w}…"))
}

/// Bundles, clusters and nodes beyond the expected counts in the server's
/// store: what hostile requests managed to write there.
pub fn stored_beyond(s: &Server, bundles: usize, clusters: usize, nodes: usize) -> usize {
    let count = |what: &str| s.lksctl_json(&[what, "list"]).as_array().map_or(0, Vec::len);
    count("bundle").saturating_sub(bundles)
        + count("cluster").saturating_sub(clusters)
        + count("node").saturating_sub(nodes)
}

pub fn panics_in(log: &str) -> usize {
    log.matches("panicked at").count()
}

pub fn hello(hostname: String) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Hello(pb::Hello {
            agent_version: "rogue/0".into(),
            facts: Some(pb::NodeFacts {
                hostname,
                ..Default::default()
            }),
            ..Default::default()
        })),
    }
}

/// Opens `Connect` with `msgs` and returns how the stream ended.
pub async fn connect_with(node: &TestNode, msgs: Vec<pb::AgentMessage>) -> Result<(), tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(msgs.len().max(1));
    for m in msgs {
        tx.send(m).await.expect("queue");
    }
    let mut st = node
        .client()
        .await
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let end = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match st.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("the stream neither failed nor ended in 15s"))?;
    drop(tx);
    end
}

/// A certificate signed by a CA of the test's own making that claims
/// `urn:lks:node:CLUSTER:NODE` (self-signed unless `with_ca`).
pub fn forged_node_cert(cluster: &str, node: &str, with_ca: bool) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, node);
    p.subject_alt_names = vec![rcgen::SanType::URI(
        format!("urn:lks:node:{cluster}:{node}").try_into().unwrap(),
    )];
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = if with_ca {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "lks-ca");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        p.signed_by(&key, &issuer).unwrap()
    } else {
        p.self_signed(&key).unwrap()
    };
    (cert.pem(), key.serialize_pem())
}

/// Tries `Connect` and `FetchBlob` with a client identity; Ok if the
/// server let either through.
pub async fn try_node_calls(url: &str, ca: &str, cert: &str, key: &str, digest: &str) -> Result<(), String> {
    let ch = try_channel(url, ca, Some((cert, key))).await?;
    let mut c = AgentServiceClient::new(ch);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello("intruder".into())).await.unwrap();
    let connect = c.connect(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    let first = match connect {
        Ok(r) => r.into_inner().message().await.map(|m| m.is_some()),
        Err(e) => Err(e),
    };
    let fetch = c
        .fetch_blob(pb::FetchBlobRequest {
            length: 0,
            digest: digest.to_string(),
            offset: 0,
        })
        .await;
    let fetch = match fetch {
        Ok(r) => r.into_inner().message().await.map(|m| m.is_some()),
        Err(e) => Err(e),
    };
    match (first, fetch) {
        (Err(a), Err(b)) => Err(format!(
            "{:?} / {:?}: {}",
            a.code(),
            b.code(),
            short(&format!("{a} {b}"))
        )),
        (a, b) => {
            eprintln!("let through: connect {a:?}, fetch {b:?}");
            Ok(())
        }
    }
}

/// An HTTP mirror that streams zeros for ever on `/endless` (no length)
/// and on `/lying` (a 10 GiB Content-Length), counting what it sent.
/// Each connection stops at 256 MiB in any case: the test must never fill
/// the disk itself.
pub struct EndlessMirror {
    pub url: String,
    /// Bytes the mirror handed to the kernel, all connections together.
    pub sent: Arc<AtomicU64>,
    pub connections: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EndlessMirror {
    pub fn start() -> EndlessMirror {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let (sent, connections, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s2, c2, st2) = (sent.clone(), connections.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st2.load(Ordering::Relaxed) {
                let Ok((mut sock, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                c2.fetch_add(1, Ordering::Relaxed);
                let (sent, stop) = (s2.clone(), st2.clone());
                std::thread::spawn(move || {
                    let _ = sock.set_nonblocking(false);
                    let _ = sock.set_write_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 4096];
                    let n = sock.read(&mut buf).unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]);
                    let head = if req.contains(" /lying ") {
                        "HTTP/1.1 200 OK\r\nContent-Length: 10737418240\r\nConnection: close\r\n\r\n"
                    } else {
                        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
                    };
                    if sock.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                    let chunk = vec![0u8; 64 << 10];
                    let mut total = 0u64;
                    while !stop.load(Ordering::Relaxed) && total < 256 << 20 {
                        if sock.write_all(&chunk).is_err() {
                            break;
                        }
                        total += chunk.len() as u64;
                        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                });
            }
        });
        EndlessMirror {
            url,
            sent,
            connections,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EndlessMirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bytes of the largest file under `dir`.
pub fn largest_file(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.filter_map(Result::ok)
        .map(|e| {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                largest_file(&e.path())
            } else {
                m.len()
            }
        })
        .max()
        .unwrap_or(0)
}
