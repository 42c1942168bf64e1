//! The one outward stream to the control server (`Connect`): Hello with
//! facts and actual state, heartbeats, Pong for every Ping, a status report
//! after every state change, node events; desired state and commands flow
//! back to the engine (a desired state converted to the engine's terms
//! here, once, as it arrives). Reconnects with jittered exponential
//! backoff, failing over between the configured server URLs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lks_proto::fsutil::FsError;
use lks_proto::pb;
use lks_proto::pb::agent_message::Msg as Out;
use lks_proto::pb::server_message::Msg as In;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::apply::desired::Desired;
use crate::apply::engine::StatusSnapshot;
use crate::apply::report::{BundleStatus, NodeEvent, TrustReport};
use crate::clock::now_ms;
use crate::config::StateDir;
use crate::link::backoff::{self, Backoff, Rotation, retry_hint};
use crate::link::channel::SharedChannel;
use crate::link::client::{ClientError, NodeCredentials, connect_node};
use crate::link::status_file::ConnStatusFile;
use crate::node::facts;
use crate::node::notify;
use crate::node::reboot::RebootReport;

/// What the connection asks of the engine besides desired state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineCmd {
    /// The server asked for an immediate self-heal pass.
    HealNow,
    /// A connection came up: blobs may be fetchable again.
    Connected,
}

/// A desired state from the server, converted once on arrival: the engine
/// acts on its domain form; peer sharing reads the blobs to serve and its
/// settings from the message itself.
#[derive(Clone, Debug)]
pub struct Received {
    pub desired: Arc<Desired>,
    pub message: Arc<pb::DesiredState>,
}

impl From<pb::DesiredState> for Received {
    fn from(message: pb::DesiredState) -> Self {
        Received {
            desired: Arc::new(Desired::from(&message)),
            message: Arc::new(message),
        }
    }
}

/// Everything the connection task owns.
pub struct Connection {
    pub dirs: StateDir,
    pub servers: Vec<String>,
    pub channel: SharedChannel,
    pub status: watch::Receiver<StatusSnapshot>,
    pub events: mpsc::Receiver<NodeEvent>,
    pub desired: watch::Sender<Option<Received>>,
    pub commands: mpsc::Sender<EngineCmd>,
    pub conn_file: Arc<ConnStatusFile>,
    pub heartbeat: Duration,
    pub peer_listen: Option<std::net::SocketAddr>,
    /// The node's reboot state, reported with every status report and on
    /// its own when it changes; `None`: not reported.
    pub reboot: Option<watch::Receiver<RebootReport>>,
    /// Where the reboot request of each desired state goes (its id, 0
    /// for none).
    pub reboot_requests: watch::Sender<u64>,
}

enum End {
    Cancelled,
    Closed,
}

/// Why a session ended early, and how long the server asked us to stay
/// away (its `grpc-retry-pushback-ms` when it sheds load).
struct Failed {
    reason: String,
    retry_after: Option<Duration>,
    /// The replica a server that is rebalancing asked us to move to.
    reconnect_to: Option<String>,
}

impl From<String> for Failed {
    fn from(reason: String) -> Self {
        Failed {
            reason,
            retry_after: None,
            reconnect_to: None,
        }
    }
}

/// The line `conn.json`'s `last_error` and the log show: the error ends
/// here.
impl From<FsError> for Failed {
    fn from(e: FsError) -> Self {
        Failed::from(e.to_string())
    }
}

impl From<ClientError> for Failed {
    fn from(e: ClientError) -> Self {
        Failed::from(e.to_string())
    }
}

impl Failed {
    fn status(url: &str, what: &str, s: &tonic::Status) -> Self {
        Failed {
            reason: format!("{url}: {what}: {}", s.message()),
            retry_after: retry_hint(s),
            reconnect_to: lks_proto::backoff::reconnect_hint(s),
        }
    }
}

/// A connection that lasted this long resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

fn out(m: Out) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(m) }
}

impl Connection {
    /// Keeps a stream up until cancelled.
    pub async fn run(mut self, cancel: CancellationToken) {
        if self.servers.is_empty() {
            tracing::error!("no server URL configured: nothing to connect to");
            return;
        }
        let mut backoff = Backoff::default();
        let mut rotation = Rotation::new(self.servers.len());
        loop {
            let url = self.servers[rotation.current()].clone();
            tracing::debug!(server = %url, "connecting");
            let started = Instant::now();
            let mut connected = false;
            let res = self.session(&url, &cancel, &mut connected).await;
            self.channel.set(None);
            let (reason, hint, to) = match res {
                Ok(End::Cancelled) => break,
                Ok(End::Closed) => (format!("{url}: the server closed the stream"), None, None),
                Err(f) => (f.reason, f.retry_after, f.reconnect_to),
            };
            tracing::warn!("{reason}");
            self.conn_file.update(|c| {
                c.connected = false;
                c.last_error = reason.clone();
            });
            notify::status(&format!("disconnected: {reason}"));
            if connected && started.elapsed() >= HEALTHY_SESSION {
                backoff.reset();
            }
            // A server that shed us names the wait; the other replicas are
            // still worth a try at once. A replica that holds more than its
            // share may name the one to go to: if it is in our list, that
            // one is next (else the next in the list, as after any end).
            let due = match to.and_then(|u| self.servers.iter().position(|s| *s == u)) {
                Some(i) if connected => {
                    tracing::info!(server = %self.servers[i], "moving to another replica, as the server asked");
                    rotation.jump(i);
                    true
                }
                _ => rotation.advance(connected),
            };
            if due && !backoff::wait(&mut backoff, hint, &cancel).await {
                break;
            }
            if cancel.is_cancelled() {
                break;
            }
        }
        self.conn_file.update(|c| c.connected = false);
    }

    async fn session(
        &mut self,
        url: &str,
        cancel: &CancellationToken,
        connected: &mut bool,
    ) -> Result<End, Failed> {
        let creds = NodeCredentials::load(&self.dirs)?;
        let channel = tokio::select! {
            _ = cancel.cancelled() => return Ok(End::Cancelled),
            r = connect_node(url, &creds) => r?,
        };
        let mut client = pb::agent_service_client::AgentServiceClient::new(channel.clone());
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(64);
        let snap = self.status.borrow_and_update().clone();
        let hello = pb::Hello {
            agent_version: facts::AGENT_VERSION.into(),
            facts: Some(pb::NodeFacts {
                peer_listen: self.peer_listen.map(|a| a.to_string()).unwrap_or_default(),
                ..facts::collect()
            }),
            bundles: wire_statuses(snap.bundles),
            desired_generation: snap.generation,
            features: facts::FEATURES.iter().map(|f| f.to_string()).collect(),
            trust: Some(wire_trust(snap.trust)),
            reboot: self.reboot_now(),
        };
        tx.send(out(Out::Hello(hello)))
            .await
            .map_err(|_| format!("{url}: stream closed"))?;
        let resp = tokio::select! {
            _ = cancel.cancelled() => return Ok(End::Cancelled),
            r = client.connect(ReceiverStream::new(rx)) => r.map_err(|s| Failed::status(url, "Connect", &s))?,
        };
        let mut inbound = resp.into_inner();
        *connected = true;
        self.channel.set(Some(channel));
        let now = now_ms();
        self.conn_file.update(|c| {
            c.connected = true;
            c.server = url.to_string();
            c.since_ms = now;
            c.last_contact_ms = now;
            c.last_error.clear();
        });
        tracing::info!(server = url, "connected");
        notify::status(&format!("connected to {url}"));
        let _ = self.commands.try_send(EngineCmd::Connected);

        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.tick().await;
        let mut seq = 0u64;
        let closed = |_| Failed::from(format!("{url}: stream closed"));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(End::Cancelled),
                m = inbound.message() => match m {
                    Ok(Some(m)) => {
                        let now = now_ms();
                        self.conn_file.update(|c| c.last_contact_ms = now);
                        self.handle(m, &tx).await.map_err(closed)?;
                    }
                    Ok(None) => return Ok(End::Closed),
                    Err(s) => return Err(Failed::status(url, "stream", &s)),
                },
                _ = heartbeat.tick() => {
                    seq += 1;
                    tx.send(out(Out::Heartbeat(pb::Heartbeat { seq }))).await.map_err(closed)?;
                }
                r = self.status.changed() => {
                    if r.is_err() {
                        return Ok(End::Cancelled);
                    }
                    let snap = self.status.borrow_and_update().clone();
                    tx.send(report(snap, self.reboot_now())).await.map_err(closed)?;
                }
                r = reboot_changed(&mut self.reboot) => {
                    if r.is_err() {
                        self.reboot = None;
                        continue;
                    }
                    let snap = self.status.borrow().clone();
                    tx.send(report(snap, self.reboot_now())).await.map_err(closed)?;
                }
                Some(ev) = self.events.recv() => {
                    tx.send(out(Out::Event(wire_event(ev)))).await.map_err(closed)?;
                }
            }
        }
    }

    async fn handle(
        &mut self,
        m: pb::ServerMessage,
        tx: &mpsc::Sender<pb::AgentMessage>,
    ) -> Result<(), mpsc::error::SendError<pb::AgentMessage>> {
        match m.msg {
            Some(In::Desired(d)) => {
                tracing::info!(
                    generation = d.generation,
                    bundles = d.bundles.len(),
                    "desired state received"
                );
                let request = d.reboot.as_ref().map_or(0, |r| r.id);
                self.reboot_requests
                    .send_if_modified(|r| std::mem::replace(r, request) != request);
                self.desired.send_replace(Some(Received::from(d)));
            }
            Some(In::Ping(p)) => tx.send(out(Out::Pong(pb::Pong { nonce: p.nonce }))).await?,
            Some(In::Command(c)) => match c.cmd {
                Some(pb::command::Cmd::HealNow(_)) => {
                    let _ = self.commands.try_send(EngineCmd::HealNow);
                }
                Some(pb::command::Cmd::ReportStatus(_)) => {
                    let snap = self.status.borrow().clone();
                    tx.send(report(snap, self.reboot_now())).await?;
                }
                None => {}
            },
            None => {}
        }
        Ok(())
    }
}

impl Connection {
    /// The reboot state now, as the wire carries it (marked seen).
    fn reboot_now(&mut self) -> Option<pb::RebootStatus> {
        self.reboot
            .as_mut()
            .map(|r| wire_reboot(r.borrow_and_update().clone()))
    }
}

/// Never resolves without a reboot state.
async fn reboot_changed(
    r: &mut Option<watch::Receiver<RebootReport>>,
) -> Result<(), watch::error::RecvError> {
    match r {
        Some(r) => r.changed().await,
        None => std::future::pending().await,
    }
}

fn report(snap: StatusSnapshot, reboot: Option<pb::RebootStatus>) -> pb::AgentMessage {
    out(Out::Status(pb::StatusReport {
        generation: snap.generation,
        bundles: wire_statuses(snap.bundles),
        trust: Some(wire_trust(snap.trust)),
        reboot,
    }))
}

/// The node's reboot state as the wire carries it.
fn wire_reboot(r: RebootReport) -> pb::RebootStatus {
    pb::RebootStatus {
        state: r.state.as_str().into(),
        reason: r.reason,
        since_ms: r.since_ms,
        boot_id: r.boot_id,
        request: r.request,
    }
}

/// The node's release trust as the wire carries it (also when off:
/// `enabled` false tells the server this agent knows of releases).
fn wire_trust(t: TrustReport) -> pb::TrustStatus {
    pb::TrustStatus {
        enabled: t.enabled,
        state: t.state,
        message: t.message,
        release_version: t.release_version,
        release_expires_at_ms: t.release_expires_at_ms,
        root_version: t.root_version,
    }
}

/// The bundle states as the wire carries them.
fn wire_statuses(bundles: Vec<BundleStatus>) -> Vec<pb::BundleStatus> {
    bundles
        .into_iter()
        .map(|s| pb::BundleStatus {
            name: s.name,
            version: s.version,
            state: pb::BundleState::from(s.state) as i32,
            message: s.message,
            updated_at_ms: s.updated_at_ms,
            fetched_from_server: s.fetched_from_server,
            fetched_from_peers: s.fetched_from_peers,
            fetched_as_delta: s.fetched_as_delta,
        })
        .collect()
}

/// A node event as the wire carries it.
fn wire_event(e: NodeEvent) -> pb::NodeEvent {
    pb::NodeEvent {
        kind: e.kind,
        bundle: e.bundle,
        version: e.version,
        message: e.message,
        at_ms: e.at_ms,
        peer: e.peer,
        fetched_from_server: e.fetched_from_server,
        fetched_from_peers: e.fetched_from_peers,
    }
}

#[cfg(test)]
mod tests {
    use lks_proto::BundleState;

    use super::*;

    #[test]
    fn statuses_and_events_reach_the_wire_field_for_field() {
        let s = BundleStatus {
            name: "app".into(),
            version: "2".into(),
            state: BundleState::RolledBack,
            message: "health check failed".into(),
            updated_at_ms: 5,
            fetched_from_server: 7,
            fetched_from_peers: 11,
            fetched_as_delta: 3,
        };
        assert_eq!(
            wire_statuses(vec![s]),
            [pb::BundleStatus {
                name: "app".into(),
                version: "2".into(),
                state: pb::BundleState::RolledBack as i32,
                message: "health check failed".into(),
                updated_at_ms: 5,
                fetched_from_server: 7,
                fetched_from_peers: 11,
                fetched_as_delta: 3,
            }]
        );
        let t = TrustReport {
            enabled: true,
            state: "stale-release".into(),
            message: "release 3 of c1 expired".into(),
            release_version: 3,
            release_expires_at_ms: 12,
            root_version: 2,
        };
        assert_eq!(
            wire_trust(t),
            pb::TrustStatus {
                enabled: true,
                state: "stale-release".into(),
                message: "release 3 of c1 expired".into(),
                release_version: 3,
                release_expires_at_ms: 12,
                root_version: 2,
            }
        );
        let r = RebootReport {
            state: crate::node::reboot::Stance::Required,
            reason: "bundle kernel@6.1".into(),
            since_ms: 4,
            boot_id: "b-1".into(),
            request: 2,
        };
        assert_eq!(
            wire_reboot(r),
            pb::RebootStatus {
                state: "required".into(),
                reason: "bundle kernel@6.1".into(),
                since_ms: 4,
                boot_id: "b-1".into(),
                request: 2,
            }
        );
        let e = NodeEvent {
            kind: "bad_peer".into(),
            bundle: "app".into(),
            version: "2".into(),
            message: "piece 0 does not match".into(),
            at_ms: 9,
            peer: "node-2".into(),
            fetched_from_server: 1,
            fetched_from_peers: 2,
        };
        assert_eq!(
            wire_event(e),
            pb::NodeEvent {
                kind: "bad_peer".into(),
                bundle: "app".into(),
                version: "2".into(),
                message: "piece 0 does not match".into(),
                at_ms: 9,
                peer: "node-2".into(),
                fetched_from_server: 1,
                fetched_from_peers: 2,
            }
        );
    }
}
