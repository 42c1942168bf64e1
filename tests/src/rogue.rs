//! A rogue control server: the real agent's `AgentService`, scripted by
//! the test and played in-process, on the address and with the TLS
//! identity (serving certificate, key and CA) of a real
//! `lks-control-server` that enrolled the agent and was then stopped. The
//! agent connects to it with its pinned CA and its node certificate as it
//! would to the real one: this is the server turned attacker, not a mock
//! of the agent.
//!
//! It sends the desired state the test sets (on every `Connect`, and again
//! whenever the test changes it), serves `FetchBlob` from an in-memory map
//! (optionally without end: the blob's bytes, then more, for as long as
//! the agent reads), and records every `Hello`, `StatusReport` and
//! `NodeEvent` so the test can wait for what the agent says. The calls an
//! agent makes only for features the script never turns on (enrolment,
//! certificate renewal and issuance, peer sharing) answer UNIMPLEMENTED.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lks_proto::pb::agent_message::Msg as In;
use lks_proto::pb::agent_service_server::{AgentService, AgentServiceServer};
use lks_proto::pb::server_message::Msg as Out;
use lks_proto::pb::{self, AgentMessage, ServerMessage};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// Bytes per `BlobChunk` the rogue server sends.
const CHUNK: usize = 64 << 10;

/// An endless blob stops after this many bytes if the agent is still
/// reading (it should have stopped at the declared size): the test
/// machine's memory and time are not the agent's to lose.
const ENDLESS_CAP: u64 = 1 << 30;

/// What the agent told the rogue server, in the order it arrived.
#[derive(Clone, Debug)]
pub enum Heard {
    Hello(Box<pb::Hello>),
    Status(pb::StatusReport),
    Event(pb::NodeEvent),
}

impl Heard {
    /// The node's trust status, if this message carries one.
    pub fn trust(&self) -> Option<&pb::TrustStatus> {
        match self {
            Heard::Hello(h) => h.trust.as_ref(),
            Heard::Status(s) => s.trust.as_ref(),
            Heard::Event(_) => None,
        }
    }

    /// The bundle statuses of a Hello or a status report.
    pub fn bundles(&self) -> &[pb::BundleStatus] {
        match self {
            Heard::Hello(h) => &h.bundles,
            Heard::Status(s) => &s.bundles,
            Heard::Event(_) => &[],
        }
    }

    /// The desired-state generation a Hello or status report answers.
    pub fn generation(&self) -> Option<u64> {
        match self {
            Heard::Hello(h) => Some(h.desired_generation),
            Heard::Status(s) => Some(s.generation),
            Heard::Event(_) => None,
        }
    }

    /// Every human-readable line in it: the trust message, each bundle's
    /// message (as `NAME@VERSION STATE: MESSAGE`), the event's message.
    pub fn messages(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(t) = self.trust()
            && !t.message.is_empty()
        {
            out.push(format!("trust {}: {}", t.state, t.message));
        }
        for b in self.bundles() {
            if !b.message.is_empty() {
                out.push(format!(
                    "{}@{} {}: {}",
                    b.name,
                    b.version,
                    state_name(b.state),
                    b.message
                ));
            }
        }
        if let Heard::Event(e) = self
            && !e.message.is_empty()
        {
            out.push(if e.bundle.is_empty() {
                format!("event {}: {}", e.kind, e.message)
            } else {
                format!("event {} {}@{}: {}", e.kind, e.bundle, e.version, e.message)
            });
        }
        out
    }
}

/// A bundle state as `lksctl` and the agent's status print it.
pub fn state_name(state: i32) -> &'static str {
    match pb::BundleState::try_from(state) {
        Ok(pb::BundleState::Pending) => "pending",
        Ok(pb::BundleState::Applying) => "applying",
        Ok(pb::BundleState::Applied) => "applied",
        Ok(pb::BundleState::Failed) => "failed",
        Ok(pb::BundleState::RolledBack) => "rolled_back",
        _ => "unknown",
    }
}

/// One recorded message and when it arrived.
#[derive(Clone, Debug)]
pub struct Record {
    pub at: Instant,
    pub heard: Heard,
}

/// A blob the rogue server serves.
#[derive(Clone)]
struct Blob {
    bytes: Arc<Vec<u8>>,
    /// After the bytes, keep sending (the total size still announced as
    /// the bytes' length) until the agent hangs up.
    endless: bool,
}

#[derive(Default)]
struct State {
    desired: Option<pb::DesiredState>,
    generation: u64,
    /// The sender of the newest `Connect` stream (older ones are dropped).
    stream: Option<mpsc::Sender<Result<ServerMessage, Status>>>,
    blobs: HashMap<String, Blob>,
    records: Vec<Record>,
    connects: usize,
    /// Bytes the endless blobs sent before the agent hung up, per request.
    endless_sent: Vec<u64>,
}

struct Shared {
    state: Mutex<State>,
    heard: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, heard: Heard) {
        self.lock().records.push(Record {
            at: Instant::now(),
            heard,
        });
        self.heard.notify_all();
    }
}

/// The serving certificate chain, key and CA of a real control server.
pub struct ServerTls {
    pub chain_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl ServerTls {
    /// Reads them from a server's data dir (`pki/server.crt` followed by
    /// `pki/ca.crt`, as the server presents them, and `pki/server.key`).
    pub fn from_data_dir(data_dir: &Path) -> ServerTls {
        let read = |f: &str| {
            let p = data_dir.join("pki").join(f);
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        };
        let ca_pem = read("ca.crt");
        let mut chain_pem = read("server.crt");
        if !chain_pem.ends_with('\n') {
            chain_pem.push('\n');
        }
        chain_pem.push_str(&ca_pem);
        ServerTls {
            chain_pem,
            key_pem: read("server.key"),
            ca_pem,
        }
    }
}

/// A running rogue server; stops when dropped.
pub struct RogueServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl RogueServer {
    /// Serves on `addr` (the stopped real server's) with its TLS identity,
    /// requiring a client certificate from its CA, as the real one does.
    pub fn start(addr: SocketAddr, tls: &ServerTls) -> RogueServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("build the rogue server's runtime");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                // Above anything a real server handed out in a test.
                generation: 1_000,
                ..State::default()
            }),
            heard: Condvar::new(),
        });
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&tls.chain_pem, &tls.key_pem))
            .client_ca_root(Certificate::from_pem(&tls.ca_pem));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .unwrap_or_else(|e| panic!("bind the rogue server to {addr}: {e}"));
        let (stop, stopped) = oneshot::channel::<()>();
        let service = AgentServiceServer::new(Rogue {
            shared: shared.clone(),
        })
        .max_decoding_message_size(lks_proto::wire::MAX_MESSAGE)
        .max_encoding_message_size(lks_proto::wire::MAX_MESSAGE);
        let serve = tonic::transport::Server::builder()
            .tls_config(config)
            .expect("rogue server TLS config")
            .add_service(service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            });
        runtime.spawn(async move {
            if let Err(e) = serve.await {
                eprintln!("rogue server: {e}");
            }
        });
        RogueServer {
            addr,
            shared,
            stop: Some(stop),
            runtime: Some(runtime),
        }
    }

    /// Serves `bytes` under their digest.
    pub fn add_blob(&self, bytes: &[u8]) {
        self.put_blob(bytes, false);
    }

    /// Serves `bytes` under their digest, then more bytes without end.
    pub fn add_endless_blob(&self, bytes: &[u8]) {
        self.put_blob(bytes, true);
    }

    fn put_blob(&self, bytes: &[u8], endless: bool) {
        let digest = lks_proto::Digest::of(bytes).to_string();
        self.shared.lock().blobs.insert(
            digest,
            Blob {
                bytes: Arc::new(bytes.to_vec()),
                endless,
            },
        );
    }

    /// Makes `d` (with the next generation, which it returns) the desired
    /// state: sent now on the open stream, and to every later `Connect`.
    pub fn send_desired(&self, mut d: pb::DesiredState) -> u64 {
        let mut st = self.shared.lock();
        st.generation += 1;
        d.generation = st.generation;
        st.desired = Some(d.clone());
        let g = st.generation;
        if let Some(tx) = &st.stream {
            let _ = tx.try_send(Ok(ServerMessage {
                msg: Some(Out::Desired(d)),
            }));
        }
        g
    }

    /// Asks the agent for a full status report now.
    pub fn request_report(&self) {
        let st = self.shared.lock();
        if let Some(tx) = &st.stream {
            let _ = tx.try_send(Ok(ServerMessage {
                msg: Some(Out::Command(pb::Command {
                    cmd: Some(pb::command::Cmd::ReportStatus(pb::ReportStatus {})),
                })),
            }));
        }
    }

    /// How many records there are: a mark to read or wait from.
    pub fn mark(&self) -> usize {
        self.shared.lock().records.len()
    }

    /// The records from `from` on.
    pub fn records_since(&self, from: usize) -> Vec<Record> {
        let st = self.shared.lock();
        st.records.get(from..).unwrap_or_default().to_vec()
    }

    /// How many `Connect` streams the agent opened.
    pub fn connects(&self) -> usize {
        self.shared.lock().connects
    }

    /// Bytes each endless blob request sent before the agent hung up.
    pub fn endless_sent(&self) -> Vec<u64> {
        self.shared.lock().endless_sent.clone()
    }

    /// Waits until `check` finds what it looks for in the records from
    /// `from` on (it is called on every new record), asking the agent for
    /// a status report every half second meanwhile; None after `timeout`.
    pub fn wait_for<T>(
        &self,
        from: usize,
        timeout: Duration,
        mut check: impl FnMut(&Record) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        let mut next = from;
        let mut asked = Instant::now();
        loop {
            {
                let st = self.shared.lock();
                while next < st.records.len() {
                    if let Some(found) = check(&st.records[next]) {
                        return Some(found);
                    }
                    next += 1;
                }
                let left = timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return None;
                }
                let slice = left.min(Duration::from_millis(100));
                let (guard, _) = self
                    .shared
                    .heard
                    .wait_timeout(st, slice)
                    .unwrap_or_else(|e| e.into_inner());
                drop(guard);
            }
            if asked.elapsed() >= Duration::from_millis(500) {
                self.request_report();
                asked = Instant::now();
            }
        }
    }
}

impl Drop for RogueServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Ends the open streams and endless blobs with the runtime.
        self.shared.lock().stream = None;
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

struct Rogue {
    shared: Arc<Shared>,
}

/// Sends `blob` from byte `start` (and on without end, up to
/// [`ENDLESS_CAP`], if it is endless) until done or the agent hangs up;
/// returns the bytes handed to the stream.
async fn send_blob(
    tx: &mpsc::Sender<Result<pb::BlobChunk, Status>>,
    blob: &Blob,
    start: usize,
    total_size: u64,
) -> u64 {
    let mut sent = 0u64;
    for piece in blob.bytes[start..].chunks(CHUNK) {
        let chunk = pb::BlobChunk {
            data: prost::bytes::Bytes::copy_from_slice(piece),
            total_size,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            return sent;
        }
        sent += piece.len() as u64;
    }
    if !blob.endless {
        return sent;
    }
    let more = crate::noise(CHUNK, total_size | 1);
    while sent < ENDLESS_CAP {
        let chunk = pb::BlobChunk {
            data: more.clone().into(),
            total_size,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            break;
        }
        sent += CHUNK as u64;
    }
    sent
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn not_played(what: &str) -> Status {
    Status::unimplemented(format!("the rogue server does not play {what}"))
}

#[tonic::async_trait]
impl AgentService for Rogue {
    async fn enroll(&self, _: Request<pb::EnrollRequest>) -> Result<Response<pb::EnrollResponse>, Status> {
        Err(not_played("Enroll"))
    }

    type ConnectStream = BoxStream<ServerMessage>;

    async fn connect(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        {
            let mut st = self.shared.lock();
            st.connects += 1;
            if let Some(d) = st.desired.clone() {
                let _ = tx.try_send(Ok(ServerMessage {
                    msg: Some(Out::Desired(d)),
                }));
            }
            st.stream = Some(tx);
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                match m.msg {
                    Some(In::Hello(h)) => shared.record(Heard::Hello(Box::new(h))),
                    Some(In::Status(s)) => shared.record(Heard::Status(s)),
                    Some(In::Event(e)) => shared.record(Heard::Event(e)),
                    Some(In::Heartbeat(_) | In::Pong(_)) | None => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn renew_certificate(
        &self,
        _: Request<pb::RenewCertificateRequest>,
    ) -> Result<Response<pb::RenewCertificateResponse>, Status> {
        Err(not_played("RenewCertificate"))
    }

    type FetchBlobStream = BoxStream<pb::BlobChunk>;

    async fn fetch_blob(
        &self,
        req: Request<pb::FetchBlobRequest>,
    ) -> Result<Response<Self::FetchBlobStream>, Status> {
        let req = req.into_inner();
        let blob = self
            .shared
            .lock()
            .blobs
            .get(&req.digest)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no blob {}", req.digest)))?;
        let total_size = blob.bytes.len() as u64;
        let (tx, rx) = mpsc::channel(4);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let start = (req.offset as usize).min(blob.bytes.len());
            let sent = send_blob(&tx, &blob, start, total_size).await;
            if blob.endless {
                shared.lock().endless_sent.push(sent);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn issue_certificate(
        &self,
        _: Request<pb::IssueCertificateRequest>,
    ) -> Result<Response<pb::IssueCertificateResponse>, Status> {
        Err(not_played("IssueCertificate"))
    }

    async fn find_peers(
        &self,
        _: Request<pb::FindPeersRequest>,
    ) -> Result<Response<pb::FindPeersResponse>, Status> {
        Err(not_played("FindPeers"))
    }

    async fn find_deltas(
        &self,
        _: Request<pb::FindDeltasRequest>,
    ) -> Result<Response<pb::FindDeltasResponse>, Status> {
        Err(not_played("FindDeltas"))
    }
}
