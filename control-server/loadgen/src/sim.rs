//! One simulated agent: its mTLS channel and `Connect` stream (Hello,
//! heartbeats, pongs, a status report acknowledging each desired state),
//! reconnecting the way `lksadmin-agent` does: a new channel per attempt, the next server of its
//! list after a failure (`lks_proto::backoff::Rotation`, the one the agent
//! uses), the replica a server names when it asks the agent to move, the
//! shared backoff policy (`lks_proto::backoff`: 1 s, ×1.6, cap 120 s,
//! ±20 %, reset after a 30 s session) and at least the server's retry
//! hint. Every failed attempt and dropped stream is counted by error class.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use lks_proto::backoff::{Backoff, Rotation, reconnect_hint, retry_hint};
use lks_proto::pb::agent_service_client::AgentServiceClient;
use lks_proto::pb::{self, agent_message, server_message};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::args::Args;

/// `lksadmin-agent`'s `HEALTHY_SESSION` (connection.rs): a session that
/// lasted this long resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// Why an attempt failed or a stream ended, as the report counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The server said `unavailable` (shutting down, shedding load).
    Unavailable,
    ResourceExhausted,
    Unauthenticated,
    PermissionDenied,
    DeadlineExceeded,
    /// Nothing listening (the server is down or not yet up).
    Refused,
    /// No connection within the agent's 20 s connect timeout (TCP + TLS):
    /// the server is too busy to finish the handshake.
    ConnectTimeout,
    /// Any other failure below gRPC: reset, TLS, h2.
    Transport,
    /// The server ended the stream without a status.
    Closed,
    Other,
}

impl Class {
    pub const ALL: [Class; CLASSES] = [
        Class::Unavailable,
        Class::ResourceExhausted,
        Class::Unauthenticated,
        Class::PermissionDenied,
        Class::DeadlineExceeded,
        Class::Refused,
        Class::ConnectTimeout,
        Class::Transport,
        Class::Closed,
        Class::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Unavailable => "unavailable",
            Class::ResourceExhausted => "resource_exhausted",
            Class::Unauthenticated => "unauthenticated",
            Class::PermissionDenied => "permission_denied",
            Class::DeadlineExceeded => "deadline_exceeded",
            Class::Refused => "refused",
            Class::ConnectTimeout => "connect_timeout",
            Class::Transport => "transport",
            Class::Closed => "closed",
            Class::Other => "other",
        }
    }

    /// A status that wraps an error of the connection itself (h2, I/O)
    /// was made on this side; only one without a source came from the server.
    pub fn of(s: &tonic::Status) -> Class {
        if std::error::Error::source(s).is_some() {
            return Class::Transport;
        }
        match s.code() {
            tonic::Code::Unavailable => Class::Unavailable,
            tonic::Code::ResourceExhausted => Class::ResourceExhausted,
            tonic::Code::Unauthenticated => Class::Unauthenticated,
            tonic::Code::PermissionDenied => Class::PermissionDenied,
            tonic::Code::DeadlineExceeded => Class::DeadlineExceeded,
            _ => Class::Other,
        }
    }

    /// A channel that could not be opened.
    pub fn of_connect(e: &anyhow::Error) -> Class {
        for cause in e.chain() {
            if let Some(io) = cause.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return Class::Refused;
            }
            let text = cause.to_string();
            if text.contains("timed out") || text.contains("timeout expired") {
                return Class::ConnectTimeout;
            }
        }
        Class::Transport
    }

    fn index(self) -> usize {
        self as usize
    }
}

const CLASSES: usize = 10;

/// Before the storm, and from the storm on.
pub const PHASES: usize = 2;

/// Counters every simulated agent adds to.
#[derive(Default)]
pub struct Stats {
    /// 0 until the storm starts, then 1.
    pub phase: AtomicUsize,
    /// Attempts that never got a desired state, by phase and class.
    pub failed: [[AtomicU64; CLASSES]; PHASES],
    /// Streams that were up and ended, by phase and class.
    pub dropped: [[AtomicU64; CLASSES]; PHASES],
    /// Refusals that carried a retry hint, by phase.
    pub hinted: [AtomicU64; PHASES],
    /// Attempts refused `unavailable`/`resource_exhausted` without a hint.
    pub unhinted: [AtomicU64; PHASES],
    /// Longest hint seen, ms.
    pub max_hint_ms: [AtomicU64; PHASES],
    /// Moves to the replica a server named, by phase.
    pub moved: [AtomicU64; PHASES],
    /// The first failure has been printed.
    pub told: std::sync::atomic::AtomicBool,
}

/// Agents whose session is up (it has had its first desired state), per
/// server of the list.
pub struct Held {
    per_server: Vec<AtomicI64>,
    /// Agents a server asked to move that are not up on the next one yet.
    moving: AtomicI64,
    /// Agents whose stream ended without a request to move and that are not
    /// up again: agent → (the server it was on, when).
    down: std::sync::Mutex<std::collections::HashMap<usize, (usize, Instant)>>,
}

impl Held {
    pub fn new(servers: usize) -> Self {
        Held {
            per_server: (0..servers.max(1)).map(|_| AtomicI64::new(0)).collect(),
            moving: AtomicI64::new(0),
            down: Default::default(),
        }
    }

    pub fn snapshot(&self) -> Vec<i64> {
        self.per_server
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// What each server held at a kill that happened up to `slack` ago:
    /// those up now, and those whose stream ended within `slack` and are not
    /// up again (a process told of a kill by SIGUSR1 hears of it after its
    /// agents may have: they were held at the kill).
    pub fn snapshot_at_kill(&self, slack: Duration) -> Vec<i64> {
        let mut out = self.snapshot();
        if let Ok(down) = self.down.lock() {
            for (server, at) in down.values() {
                if at.elapsed() <= slack
                    && let Some(n) = out.get_mut(*server)
                {
                    *n += 1;
                }
            }
        }
        out
    }

    fn went_down(&self, agent: usize, server: usize) {
        if let Ok(mut d) = self.down.lock() {
            d.insert(agent, (server, Instant::now()));
        }
    }

    fn came_up(&self, agent: usize) {
        if let Ok(mut d) = self.down.lock() {
            d.remove(&agent);
        }
    }

    pub fn moving(&self) -> i64 {
        self.moving.load(Ordering::Relaxed)
    }

    pub fn total(&self) -> i64 {
        self.snapshot().iter().sum()
    }

    fn add(&self, server: usize, d: i64) {
        self.per_server[server].fetch_add(d, Ordering::Relaxed);
    }
}

/// A desired state a simulated agent received.
pub struct Desired {
    pub agent: usize,
    pub at: Instant,
    pub generation: u64,
    /// `NAME@VERSION` of each bundle in it.
    pub bundles: Vec<String>,
}

impl Stats {
    fn record(&self, up: bool, class: Class, hint: Option<Duration>) {
        let p = self.phase.load(Ordering::Relaxed).min(PHASES - 1);
        let table = if up { &self.dropped } else { &self.failed };
        table[p][class.index()].fetch_add(1, Ordering::Relaxed);
        match hint {
            Some(h) => {
                self.hinted[p].fetch_add(1, Ordering::Relaxed);
                self.max_hint_ms[p].fetch_max(h.as_millis() as u64, Ordering::Relaxed);
            }
            None if !up && matches!(class, Class::Unavailable | Class::ResourceExhausted) => {
                self.unhinted[p].fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        }
    }

    pub fn counts(&self, phase: usize, up: bool) -> std::collections::BTreeMap<&'static str, u64> {
        let table = if up { &self.dropped } else { &self.failed };
        Class::ALL
            .iter()
            .map(|c| (c.name(), table[phase][c.index()].load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub fn failed_total(&self, phase: usize) -> u64 {
        self.failed[phase].iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }
}

/// A session got its first desired state.
pub struct Back {
    pub agent: usize,
    pub session_started: Instant,
    pub at: Instant,
    /// Attempts it took since the previous session was up (1: at once).
    pub attempts: u32,
    /// The previous session ended because its server asked the agent to
    /// move (a rebalance), not because the server or the stream failed.
    pub after_move: bool,
}

/// What one simulated agent needs.
pub struct Agent {
    pub i: usize,
    /// The servers, in the order of the agent's list.
    pub urls: Arc<Vec<String>>,
    /// The one it tries first (mod n).
    pub first_server: usize,
    pub ca: String,
    pub cert: String,
    pub key: String,
    pub local: Option<IpAddr>,
    pub stats: Arc<Stats>,
    pub held: Arc<Held>,
    pub back: mpsc::UnboundedSender<Back>,
    pub desired: mpsc::Sender<Desired>,
    pub stop: CancellationToken,
    /// Report every bundle failed (`--fail-in`).
    pub fail: bool,
    /// Wait this long before reporting a desired state with bundles
    /// (`--slow-in`).
    pub slow: Duration,
}

enum End {
    Stopped,
    Failed {
        class: Class,
        hint: Option<Duration>,
        /// The replica the server asked the agent to go to.
        to: Option<String>,
        why: String,
    },
}

impl Agent {
    /// Runs sessions until `stop`; `permit` (the first connection's
    /// concurrency slot) is given back once the first one is up or failed.
    pub async fn run(self, permit: OwnedSemaphorePermit) -> anyhow::Result<()> {
        let mut permit = Some(permit);
        let mut backoff = Backoff::default();
        let mut rotation = Rotation::starting_at(self.urls.len(), self.first_server);
        let mut attempts = 0u32;
        let mut after_move = false;
        loop {
            attempts += 1;
            let started = Instant::now();
            let mut up = false;
            let server = rotation.current();
            let end = self
                .session(server, started, attempts, after_move, &mut up, &mut permit)
                .await;
            permit.take();
            if up {
                self.held.add(server, -1);
            }
            let (class, hint, to, why) = match end {
                End::Stopped => return Ok(()),
                End::Failed { class, hint, to, why } => (class, hint, to, why),
            };
            self.stats.record(up, class, hint);
            if !self.stats.told.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "agent {}: {why} (the first failure; agents reconnect, the report counts them)",
                    self.i
                );
            }
            if up {
                attempts = 0;
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
            }
            // As lksadmin-agent's connection loop: a replica that asks us
            // to move names the next one; else the next in the list, at
            // once unless the session was up or every server failed in turn.
            // A server that asks an up agent to move ends its session with
            // the trailer (`to`, named or not): until the agent is up again
            // it is moving, held by nobody, and its way back is not a
            // failover's. A session up since the move and then lost makes
            // it an agent like any other again.
            let asked_to_move = up && to.is_some();
            if asked_to_move && !after_move {
                self.held.moving.fetch_add(1, Ordering::Relaxed);
            }
            if up && !asked_to_move {
                self.held.went_down(self.i, server);
            }
            after_move = asked_to_move || (after_move && !up);
            let due = match to.and_then(|u| self.urls.iter().position(|s| *s == u)) {
                Some(j) if up => {
                    let p = self.stats.phase.load(Ordering::Relaxed).min(PHASES - 1);
                    self.stats.moved[p].fetch_add(1, Ordering::Relaxed);
                    rotation.jump(j);
                    true
                }
                _ => rotation.advance(up),
            };
            if !due {
                continue;
            }
            let delay = backoff.next_delay_with(hint);
            tokio::select! {
                _ = self.stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn session(
        &self,
        server: usize,
        started: Instant,
        attempts: u32,
        after_move: bool,
        up: &mut bool,
        permit: &mut Option<OwnedSemaphorePermit>,
    ) -> End {
        let failed = |s: tonic::Status| End::Failed {
            class: Class::of(&s),
            hint: retry_hint(&s),
            to: reconnect_hint(&s),
            why: format!("{:?}: {}", s.code(), s.message()),
        };
        let closed = || End::Failed {
            class: Class::Closed,
            hint: None,
            to: None,
            why: "stream closed".into(),
        };
        let ch = tokio::select! {
            _ = self.stop.cancelled() => return End::Stopped,
            r = tls_channel(&self.urls[server], &self.ca, Some((&self.cert, &self.key)), self.local) => r,
        };
        let ch = match ch {
            Ok(ch) => ch,
            Err(e) => {
                return End::Failed {
                    class: Class::of_connect(&e),
                    hint: None,
                    to: None,
                    why: format!("{e:#}"),
                };
            }
        };
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(8);
        let send = |m| pb::AgentMessage { msg: Some(m) };
        let _ = tx.try_send(send(agent_message::Msg::Hello(pb::Hello {
            agent_version: "lks-loadgen".into(),
            facts: Some(pb::NodeFacts {
                hostname: format!("loadgen-{}", self.i),
                ..Default::default()
            }),
            ..Default::default()
        })));
        let mut client = AgentServiceClient::new(ch);
        let resp = tokio::select! {
            _ = self.stop.cancelled() => return End::Stopped,
            r = client.connect(ReceiverStream::new(rx)) => r,
        };
        let mut inbound = match resp {
            Ok(r) => r.into_inner(),
            Err(s) => return failed(s),
        };
        let mut heartbeat = tokio::time::interval(Duration::from_secs(10));
        let mut seq = 0;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return End::Stopped,
                _ = heartbeat.tick() => {
                    seq += 1;
                    let _ = tx.try_send(send(agent_message::Msg::Heartbeat(pb::Heartbeat { seq })));
                }
                msg = inbound.message() => match msg {
                    Err(s) => return failed(s),
                    Ok(None) => return closed(),
                    Ok(Some(m)) => match m.msg {
                        Some(server_message::Msg::Desired(d)) => {
                            let at = Instant::now();
                            if !*up {
                                *up = true;
                                permit.take();
                                self.held.add(server, 1);
                                self.held.came_up(self.i);
                                if after_move {
                                    self.held.moving.fetch_sub(1, Ordering::Relaxed);
                                }
                                let _ = self.back.send(Back { agent: self.i, session_started: started, at, attempts, after_move });
                            }
                            let bundles = d.bundles.iter().filter_map(|b| b.manifest.as_ref().map(|m| format!("{}@{}", m.name, m.version))).collect();
                            if !self.slow.is_zero() && !d.bundles.is_empty() {
                                tokio::select! {
                                    _ = self.stop.cancelled() => return End::Stopped,
                                    _ = tokio::time::sleep(self.slow) => {}
                                }
                            }
                            let statuses = d.bundles.iter().filter_map(|b| b.manifest.as_ref()).map(|m| self.status_of(m)).collect();
                            let _ = self.desired.try_send(Desired { agent: self.i, at, generation: d.generation, bundles });
                            if tx.send(send(agent_message::Msg::Status(pb::StatusReport { generation: d.generation, bundles: statuses, trust: None, reboot: None }))).await.is_err() {
                                return closed();
                            }
                        }
                        Some(server_message::Msg::Ping(p)) => {
                            let _ = tx.try_send(send(agent_message::Msg::Pong(pb::Pong { nonce: p.nonce })));
                        }
                        Some(server_message::Msg::Command(_)) | None => {}
                    },
                },
            }
        }
    }
}

impl Agent {
    /// What this agent reports of a bundle of its desired state: applied,
    /// or failed with `--fail-in`.
    fn status_of(&self, m: &pb::Manifest) -> pb::BundleStatus {
        let (state, message) = if self.fail {
            (
                pb::BundleState::Failed,
                "lks-loadgen --fail-in: health check failed",
            )
        } else {
            (pb::BundleState::Applied, "")
        };
        pb::BundleStatus {
            name: m.name.clone(),
            version: m.version.clone(),
            state: state as i32,
            message: message.into(),
            ..Default::default()
        }
    }
}

/// True for a URL whose host is IPv4 loopback (or `localhost`): the only
/// servers the 127.x.y.z source addresses can reach.
fn on_loopback(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default();
    host == "localhost" || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether each agent gets its own 127.x.y.z source address: on by default
/// when every server is on loopback (`--spread-source-ips`,
/// `--no-spread-source-ips`).
pub fn spread(args: &Args, servers: &[String]) -> bool {
    !args.no_spread_source_ips && (args.spread_source_ips || servers.iter().all(|u| on_loopback(u)))
}

/// Agent `i`'s source address when `spread`.
pub fn source_ip(spread: bool, i: usize) -> Option<IpAddr> {
    // 127.1.0.0/16 upwards: avoids 127.0.0.1, which the server itself uses.
    spread.then(|| {
        IpAddr::V4(Ipv4Addr::new(
            127,
            1 + (i / 65_000) as u8,
            ((i / 250) % 260) as u8,
            (i % 250 + 2) as u8,
        ))
    })
}

/// An mTLS channel (TLS only with `id` `None`) to `url`, as
/// `lksadmin-agent` dials it, from `local` when given.
pub async fn tls_channel(
    url: &str,
    ca_pem: &str,
    id: Option<(&str, &str)>,
    local: Option<IpAddr>,
) -> Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = id {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(url.to_string())?
        .tls_config(tls)?
        .local_address(local)
        // lksadmin-agent's CONNECT_TIMEOUT (client.rs).
        .connect_timeout(Duration::from_secs(20))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("connect to {url}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_from_the_server_are_classed_by_code() {
        assert_eq!(Class::of(&tonic::Status::unavailable("busy")), Class::Unavailable);
        assert_eq!(
            Class::of(&tonic::Status::unauthenticated("revoked")),
            Class::Unauthenticated
        );
        assert_eq!(
            Class::of(&tonic::Status::resource_exhausted("slow down")),
            Class::ResourceExhausted
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(
            Class::of(&tonic::Status::from_error(Box::new(io))),
            Class::Transport
        );
        let refused = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            Class::of_connect(&refused.context("connect to x")),
            Class::Refused
        );
        assert_eq!(
            Class::of_connect(&anyhow::anyhow!("timeout expired").context("connect to x")),
            Class::ConnectTimeout
        );
    }

    #[test]
    fn counts_go_to_the_current_phase() {
        let s = Stats::default();
        s.record(false, Class::Transport, None);
        s.phase.store(1, Ordering::Relaxed);
        s.record(true, Class::Unavailable, None);
        s.record(false, Class::Unavailable, Some(Duration::from_millis(700)));
        s.record(false, Class::Unavailable, None);
        assert_eq!(s.failed_total(0), 1);
        assert_eq!(s.counts(1, true).get("unavailable"), Some(&1));
        assert_eq!(s.counts(1, false).get("unavailable"), Some(&2));
        assert_eq!(s.hinted[1].load(Ordering::Relaxed), 1);
        assert_eq!(s.unhinted[1].load(Ordering::Relaxed), 1);
        assert_eq!(s.max_hint_ms[1].load(Ordering::Relaxed), 700);
    }
}
