//! Harness for control-server end-to-end tests: a real `lks-control-server`
//! on loopback ports chosen at run time, real `lksctl` runs against it, and
//! a small gRPC client that plays an agent (enrol with a CSR, `Connect`,
//! `FetchBlob`) or a hand-crafted admin client, so the wire can be tested
//! before — and independently of — the real agent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use lks_proto::pb::admin_service_client::AdminServiceClient;
use lks_proto::pb::agent_service_client::AgentServiceClient;
use lks_proto::pb::{self, AgentMessage, ServerMessage};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::{Proc, bin, free_addr, ok_stdout, run};

/// How long a server may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running control server with its own temporary data dir.
pub struct Server {
    dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    args: Vec<String>,
    /// Extra environment variables of the server process (credentials the
    /// command line must not carry, say).
    env: Vec<(String, String)>,
    proc: Option<Proc>,
    starts: u32,
    /// The ports were picked by [`free_addr`] for this server and it has
    /// not run on them yet: a start that finds one taken (another test
    /// process bound it between the pick and the bind) may pick again.
    repick: bool,
    /// Prefix of every command this server runs (the daemon, `lksctl`,
    /// the port probe), e.g. `ip netns exec NS`; empty on the host.
    pub wrapper: Vec<String>,
    /// The server binary; `None`: this tree's `lks-control-server`.
    program: Option<PathBuf>,
}

/// Parsed `admin.conf`.
#[derive(serde::Deserialize)]
pub struct AdminConf {
    pub server: String,
    pub ca_cert: String,
    pub client_cert: String,
    pub client_key: String,
}

impl Server {
    /// Starts a server on fresh loopback ports and waits until it serves.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Like [`Server::start`], with extra command-line flags.
    pub fn start_with(args: &[&str]) -> Server {
        let mut s = Server::unstarted(args);
        s.spawn();
        s
    }

    /// Like [`Server::start_with`], the server process getting `env` on
    /// top of the test's environment.
    pub fn start_with_env(args: &[&str], env: &[(String, String)]) -> Server {
        let mut s = Server::unstarted(args);
        s.env = env.to_vec();
        s.spawn();
        s
    }

    /// A server on ports picked now, with its own temp dir, not started.
    fn unstarted(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("create temp dir");
        Server {
            data_dir: dir.path().join("data"),
            dir,
            addr: free_addr(),
            metrics_addr: free_addr(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            proc: None,
            starts: 0,
            repick: true,
            wrapper: Vec::new(),
            program: None,
        }
    }

    /// Like [`Server::start_with_env`], running `program` (another
    /// release's lks-control-server, say: scripts/skew.sh).
    pub fn start_program(program: &Path, args: &[&str], env: &[(String, String)]) -> Server {
        let mut s = Server::unstarted(args);
        s.env = env.to_vec();
        s.program = Some(program.to_path_buf());
        s.spawn();
        s
    }

    /// Stops the server (SIGTERM) and starts `program` (`None`: this
    /// tree's) in its place, on the same ports and data dir: one step of a
    /// rolling upgrade.
    pub fn replace_program(&mut self, program: Option<&Path>) -> Option<i32> {
        let code = self.stop();
        self.program = program.map(Path::to_path_buf);
        self.spawn();
        code
    }

    /// Like [`Server::start_with`], calling `prepare` on the (created, empty)
    /// data dir first: a test mounts a small filesystem there, say.
    pub fn start_prepared(args: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let mut s = Server::unstarted(args);
        std::fs::create_dir_all(&s.data_dir).expect("create data dir");
        prepare(&s.data_dir);
        s.spawn();
        s
    }

    /// Starts a server on `addr` (one a stopped server used, say) with a
    /// fresh data dir and `args`: a replica taking over an old server's
    /// address, which its agents have stored.
    pub fn start_at(addr: SocketAddr, args: &[&str]) -> Server {
        let mut s = Server::unstarted(args);
        s.addr = addr;
        s.repick = false;
        s.spawn();
        s
    }

    /// Starts a server on `addr` (one a stopped server used, say) on a data
    /// dir `prepare` makes from the path it is given (which does not exist
    /// yet): a server restored from a backup, say, on the address its
    /// agents have stored.
    pub fn start_at_prepared(addr: SocketAddr, args: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let mut s = Server::unstarted(args);
        s.addr = addr;
        s.repick = false;
        prepare(&s.data_dir);
        s.spawn();
        s
    }

    /// Starts a server on `addr` with a copy of `from`'s data dir (same CA,
    /// admin identity, clusters and nodes), `from` being stopped: a stand-in
    /// for another replica of the same control plane, to test failover
    /// without a shared store. It rewrites its copy of `admin.conf` with its
    /// own URL.
    pub fn start_copy_of(from: &Server, addr: SocketAddr) -> Server {
        let mut s = Server::unstarted(&[]);
        s.addr = addr;
        s.repick = false;
        s.args = from.args.clone();
        s.env = from.env.clone();
        copy_dir(&from.data_dir, &s.data_dir);
        // The copied admin.conf names `from`: wait for this server's own.
        std::fs::remove_file(s.admin_conf_path()).expect("remove the copied admin.conf");
        s.spawn();
        s
    }

    /// Starts a server whose commands run under `wrapper` (say `ip netns
    /// exec NS`), listening on `addr` (an address inside that namespace).
    pub fn start_wrapped(
        wrapper: &[String],
        addr: SocketAddr,
        metrics_addr: SocketAddr,
        args: &[&str],
    ) -> Server {
        let mut s = Server::unstarted(args);
        (s.addr, s.metrics_addr, s.wrapper) = (addr, metrics_addr, wrapper.to_vec());
        s.repick = false;
        s.spawn();
        s
    }

    /// `program` under this server's wrapper.
    fn command(&self, program: &Path) -> Command {
        crate::wrapped(&self.wrapper, program)
    }

    fn spawn(&mut self) {
        // Ports picked by `free_addr` are free when picked, but another test
        // process may bind one before this server does: then the server
        // exits saying so, and a first start tries new ports (twice at most).
        for _ in 0..3 {
            self.start_process();
            if self.wait_up() {
                self.repick = false;
                return;
            }
            eprintln!("lks-control-server: a port was taken by another process; trying new ports");
            let _ = std::fs::remove_file(self.admin_conf_path());
            (self.addr, self.metrics_addr) = (free_addr(), free_addr());
        }
        panic!(
            "lks-control-server found its ports taken three times; log:\n{}",
            self.log()
        );
    }

    fn start_process(&mut self) {
        self.starts += 1;
        let program = self.program.clone().unwrap_or_else(|| bin("lks-control-server"));
        let mut cmd = self.command(&program);
        cmd.arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--metrics-listen")
            .arg(self.metrics_addr.to_string())
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,lks_control_server=debug,lks_blobs=debug");
        let name = format!("lks-control-server-{}", self.starts);
        let p = Proc::spawn(&name, cmd, self.dir.path());
        self.proc = Some(p);
    }

    /// Waits for admin.conf and both ports; false when the process exited
    /// because a port it was given is taken and the ports may be picked
    /// again.
    fn wait_up(&mut self) -> bool {
        let conf = self.admin_conf_path();
        let start = std::time::Instant::now();
        loop {
            if conf.exists() && self.accepts(self.addr) && self.accepts(self.metrics_addr) {
                return true;
            }
            if self.repick && !self.running() && self.log_of_this_start().contains("Address already in use") {
                return false;
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "timed out after {START_TIMEOUT:?} waiting for lks-control-server on {} and {}; log:\n{}",
                self.addr,
                self.metrics_addr,
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    fn accepts(&self, addr: SocketAddr) -> bool {
        if self.wrapper.is_empty() {
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)).is_ok()
        } else {
            crate::probe_tcp(&self.wrapper, addr)
        }
    }

    fn log_of_this_start(&self) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("lks-control-server-{}.log", self.starts)),
        )
        .unwrap_or_default()
    }

    /// Stops the server with SIGTERM (returns its exit code) and starts it
    /// again on the same ports and data dir.
    pub fn restart(&mut self) -> Option<i32> {
        let code = self.stop();
        self.spawn();
        code
    }

    /// SIGTERM and wait; the exit code, or None if it had to be killed.
    pub fn stop(&mut self) -> Option<i32> {
        self.proc
            .as_mut()
            .and_then(|p| p.terminate(Duration::from_secs(15)))
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
    }

    /// Starts the server again after [`Server::stop`] or [`Server::kill9`].
    pub fn start_again(&mut self) {
        self.spawn();
    }

    /// Changes the flags used by the next start.
    pub fn set_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
    }

    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::running)
    }

    /// The server process's id (0 when it is not running).
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map_or(0, Proc::pid)
    }

    /// All server logs so far (every start).
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("lks-control-server-{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A scratch directory removed with the server.
    pub fn work_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn admin_conf_path(&self) -> PathBuf {
        self.data_dir.join("admin.conf")
    }

    pub fn admin_conf(&self) -> AdminConf {
        let text = std::fs::read_to_string(self.admin_conf_path()).expect("read admin.conf");
        toml::from_str(&text).expect("parse admin.conf")
    }

    /// Agents this server (replica) holds: `lks_connected_agents` on its
    /// /metrics.
    pub fn connected_agents(&self) -> u64 {
        self.http_get("/metrics")
            .lines()
            .find_map(|l| l.strip_prefix("lks_connected_agents "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn url(&self) -> String {
        match self.addr.ip() {
            std::net::IpAddr::V6(ip) => format!("https://[{ip}]:{}", self.addr.port()),
            ip => format!("https://{ip}:{}", self.addr.port()),
        }
    }

    /// Runs `lksctl --config <admin.conf> ARGS`.
    pub fn lksctl(&self, args: &[&str]) -> Output {
        let mut cmd = self.command(&bin("lksctl"));
        cmd.arg("--config")
            .arg(self.admin_conf_path())
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("LKSCTL_CONFIG");
        run(cmd)
    }

    /// Runs lksctl, asserts success, returns stdout.
    pub fn lksctl_ok(&self, args: &[&str]) -> String {
        ok_stdout(&self.lksctl(args), &format!("lksctl {}", args.join(" ")))
    }

    /// Runs lksctl with `-o json` appended and parses stdout.
    pub fn lksctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.lksctl_ok(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lksctl {a:?}: bad JSON ({e}):\n{out}"))
    }

    /// Creates a cluster (ignoring "already exists" is not allowed: tests
    /// create each cluster once).
    pub fn create_cluster(&self, name: &str) {
        self.lksctl_ok(&["cluster", "create", name]);
    }

    /// A fresh bootstrap token for `cluster`; extra flags go to `token create`.
    pub fn token(&self, cluster: &str, extra: &[&str]) -> String {
        let mut a = vec!["token", "create", "--cluster", cluster];
        a.extend_from_slice(extra);
        let v = self.lksctl_json(&a);
        v["token"].as_str().expect("token field").to_string()
    }

    /// Writes a bundle directory under the work dir: `files` are
    /// (target path, content, mode) and become `f0`, `f1`, … sources.
    pub fn write_bundle(
        &self,
        dir: &str,
        name: &str,
        version: &str,
        files: &[(&str, &[u8], &str)],
    ) -> PathBuf {
        let d = self.dir.path().join(dir);
        std::fs::create_dir_all(&d).expect("create bundle dir");
        let mut toml = format!("name = \"{name}\"\nversion = \"{version}\"\n");
        for (i, (path, content, mode)) in files.iter().enumerate() {
            std::fs::write(d.join(format!("f{i}")), content).expect("write bundle file");
            toml.push_str(&format!(
                "\n[[file]]\npath = \"{path}\"\nsource = \"f{i}\"\nmode = \"{mode}\"\n"
            ));
        }
        std::fs::write(d.join("bundle.toml"), toml).expect("write bundle.toml");
        d
    }

    /// Publishes a bundle directory with lksctl; returns `NAME@VERSION`.
    pub fn publish(&self, dir: &Path) -> String {
        self.lksctl_ok(&["bundle", "publish", dir.to_str().expect("utf-8 path")])
            .trim()
            .to_string()
    }

    /// An admin API client built from admin.conf, for hand-made requests.
    pub async fn admin_client(&self) -> AdminServiceClient<Channel> {
        let c = self.admin_conf();
        AdminServiceClient::new(channel(&self.url(), &c.ca_cert, Some((&c.client_cert, &c.client_key))).await)
    }

    /// A channel that verifies the server but presents no client certificate.
    pub async fn anonymous_channel(&self) -> Channel {
        channel(&self.url(), &self.admin_conf().ca_cert, None).await
    }

    /// The value of one series of `/metrics` (name with its labels, e.g.
    /// `lks_blob_bytes_served_total{source="server"}`); 0 when absent.
    pub fn metric(&self, series: &str) -> u64 {
        let m = self.http_get("/metrics");
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
    }

    /// Fetches `/metrics` or `/healthz` (plain HTTP/1.0, read to end), from
    /// inside the server's network namespace if it runs in one.
    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let (addr, path) = (self.metrics_addr, path.to_string());
        let get = move || {
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("connect to the metrics port {addr}: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send request");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read response");
            out
        };
        match self.wrapper.as_slice() {
            [ip, netns, exec, ns] if [ip, netns, exec] == ["ip", "netns", "exec"] => {
                crate::netns::in_netns(ns, get)
            }
            _ => get(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Kill first, while the log files still exist for a failing test to print.
        drop(self.proc.take());
    }
}

/// Copies a directory tree (regular files and directories only).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())) {
        let entry = entry.expect("read dir entry");
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        }
    }
}

/// A TLS channel to `url` trusting `ca_pem`, optionally with a client identity.
pub async fn channel(url: &str, ca_pem: &str, identity: Option<(&str, &str)>) -> Channel {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(url.to_string())
        .expect("server URL")
        .tls_config(tls)
        .expect("TLS config")
        .connect()
        .await
        .expect("connect to the control server")
}

/// A PEM CSR for a fresh key; returns (csr, key PEM).
pub fn make_csr(sans: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("generate key");
    let mut p = rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("CSR params");
    p.distinguished_name
        .push(rcgen::DnType::CommonName, sans.first().copied().unwrap_or("node"));
    let csr = p
        .serialize_request(&key)
        .expect("serialize CSR")
        .pem()
        .expect("CSR PEM");
    (csr, key.serialize_pem())
}

/// Sends an `Enroll` request (no client certificate).
pub async fn enroll_raw(
    server: &Server,
    token: &str,
    node: &str,
    csr_pem: &str,
    labels: &[(&str, &str)],
) -> Result<pb::EnrollResponse, tonic::Status> {
    let mut c = AgentServiceClient::new(server.anonymous_channel().await);
    c.enroll(pb::EnrollRequest {
        token: token.to_string(),
        node_name: node.to_string(),
        csr_pem: csr_pem.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// A node enrolled by the test client: its key and certificate.
pub struct TestNode {
    pub name: String,
    pub cluster: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    pub url: String,
    /// `Hello.features` it announces (today's agent's by default; empty
    /// plays an agent older than them).
    pub features: Vec<String>,
    /// `NodeFacts.architecture` it reports (empty: none, as agents before
    /// multi-arch bundles).
    pub architecture: String,
    /// `Hello.trust` it reports (`None`: none, as agents before signed
    /// releases).
    pub trust: Option<pb::TrustStatus>,
}

impl TestNode {
    /// Enrols `node` with `token`; panics on failure.
    pub async fn enroll(server: &Server, token: &str, node: &str, labels: &[(&str, &str)]) -> TestNode {
        let (csr, key) = make_csr(&[node]);
        let r = enroll_raw(server, token, node, &csr, labels)
            .await
            .unwrap_or_else(|e| panic!("enrol {node}: {e:?}"));
        TestNode {
            name: r.node_name,
            cluster: r.cluster,
            cert_pem: r.certificate_pem,
            key_pem: key,
            ca_pem: r.ca_pem,
            url: server.url(),
            features: [
                lks_proto::manifest::FEATURE_CERTIFICATES,
                lks_proto::manifest::FEATURE_SELF_UPDATE,
            ]
            .map(String::from)
            .to_vec(),
            architecture: String::new(),
            trust: None,
        }
    }

    /// An mTLS channel with this node's certificate.
    pub async fn channel(&self) -> Channel {
        channel(&self.url, &self.ca_pem, Some((&self.cert_pem, &self.key_pem))).await
    }

    pub async fn client(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel().await)
    }

    /// Opens `Connect`, sends `Hello` with `held` bundles; returns the sender
    /// for further messages and the server's stream.
    pub async fn connect(
        &self,
        held: Vec<pb::BundleStatus>,
    ) -> Result<(mpsc::Sender<AgentMessage>, tonic::Streaming<ServerMessage>), tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(AgentMessage {
            msg: Some(pb::agent_message::Msg::Hello(pb::Hello {
                agent_version: "test-agent/0".into(),
                facts: Some(pb::NodeFacts {
                    hostname: format!("{}.test", self.name),
                    os: "TestOS".into(),
                    kernel: "6.1".into(),
                    arch: "x86_64".into(),
                    architecture: self.architecture.clone(),
                    cpus: 2,
                    memory_bytes: 1 << 30,
                    ..Default::default()
                }),
                bundles: held,
                desired_generation: 0,
                features: self.features.clone(),
                trust: self.trust.clone(),
                reboot: None,
            })),
        })
        .await
        .expect("queue Hello");
        let stream = self
            .client()
            .await
            .connect(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok((tx, stream))
    }

    /// Downloads a whole blob from `offset`; returns (bytes, total_size).
    pub async fn fetch_blob(&self, digest: &str, offset: u64) -> Result<(Vec<u8>, u64), tonic::Status> {
        let mut s = self
            .client()
            .await
            .fetch_blob(pb::FetchBlobRequest {
                length: 0,
                digest: digest.to_string(),
                offset,
            })
            .await?
            .into_inner();
        let mut out = Vec::new();
        let mut total = 0;
        while let Some(c) = s.message().await? {
            total = c.total_size;
            out.extend_from_slice(&c.data);
        }
        Ok((out, total))
    }
}

/// Waits for the next `DesiredState` on a Connect stream (skipping pings).
pub async fn next_desired(stream: &mut tonic::Streaming<ServerMessage>) -> pb::DesiredState {
    let deadline = Duration::from_secs(10);
    loop {
        let m = tokio::time::timeout(deadline, stream.message())
            .await
            .expect("desired state within 10s")
            .expect("stream healthy")
            .expect("stream open");
        if let Some(pb::server_message::Msg::Desired(d)) = m.msg {
            return d;
        }
    }
}

/// A status report for one bundle.
pub fn status_msg(
    generation: u64,
    bundle: &str,
    version: &str,
    state: pb::BundleState,
    message: &str,
) -> AgentMessage {
    AgentMessage {
        msg: Some(pb::agent_message::Msg::Status(pb::StatusReport {
            generation,
            bundles: vec![pb::BundleStatus {
                fetched_from_server: 0,
                fetched_from_peers: 0,
                fetched_as_delta: 0,
                name: bundle.into(),
                version: version.into(),
                state: state as i32,
                message: message.into(),
                updated_at_ms: 0,
            }],
            trust: None,
            reboot: None,
        })),
    }
}

/// Bundle names and versions of a desired state.
pub fn bundle_ids(d: &pb::DesiredState) -> Vec<String> {
    d.bundles
        .iter()
        .map(|b| {
            let m = b.manifest.as_ref().expect("manifest");
            format!("{}@{}", m.name, m.version)
        })
        .collect()
}

/// `node list -o json` entry for `name`.
pub fn node_json<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list.as_array()
        .expect("node list is an array")
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("node {name} not in {list}"))
}

/// The labels object of a node as a map.
pub fn labels_of(node: &serde_json::Value) -> HashMap<String, String> {
    node["labels"]
        .as_object()
        .expect("labels object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// A gRPC codec that sends raw bytes, to put malformed protobuf on the wire.
#[derive(Clone, Default)]
pub struct RawCodec;

pub struct RawEncoder;
pub struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let mut v = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// Sends `body` as the request message of unary method `path`
/// (e.g. `/lks.v1.AdminService/CreateCluster`).
pub async fn raw_unary(ch: Channel, path: &'static str, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut g = tonic::client::Grpc::new(ch);
    g.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    g.unary(
        tonic::Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another process binding a picked port before the server does (the
    /// race of `free_addr`) costs a second start on new ports, not a test.
    #[test]
    fn a_port_taken_before_the_first_start_is_picked_again() {
        let taken = std::net::TcpListener::bind(free_addr()).expect("bind a port");
        let taken_addr = taken.local_addr().expect("its address");
        let mut s = Server::unstarted(&[]);
        s.addr = taken_addr;
        s.spawn();
        assert_ne!(s.addr, taken_addr, "new ports");
        assert_eq!(s.starts, 2, "{}", s.log());
        assert!(s.log().contains("Address already in use"), "{}", s.log());
        let out = s.lksctl(&["cluster", "list"]);
        assert!(out.status.success(), "{out:?}");
        // A restart keeps the ports its agents know.
        let addr = s.addr;
        s.restart();
        assert_eq!(s.addr, addr);
    }
}
