//! The agent API's `Connect` stream: the agent's `Hello`, its status
//! reports and events, pings, and the node's desired state pushed whenever
//! it (or the cluster's peer-sharing settings) changes, until the stream
//! ends — and the agent is always told why it ended.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use lks_proto::backoff::with_retry_hint;
use lks_proto::pb::agent_message::Msg as AgentMsg;
use lks_proto::pb::server_message::Msg as ServerMsg;
use lks_proto::pb::{self, AgentMessage, ServerMessage};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

mod push;

use lks_tracker::Tracker;

use super::BoxStream;
use crate::admission::OpenGate;
use crate::authz::{NodeCaller, require_node};
use crate::clock::now_ms;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::ops::OpError;
use crate::ops::desired::Sent;
use crate::ops::session::{self, Recorded};
use crate::peers::PeerCache;
use crate::releases::ReleaseCache;
use crate::store::{BundleStatusRow, NodeReboot, NodeTrust, Store, TrustHealth};

crate::context::shared_view! {
    /// What the `Connect` streams use: the store, the hub of open streams, the
    /// peer-sharing settings and tracker, the admission gate, the rollout
    /// controller's wake-up, and the tasks each stream runs in.
    pub(super) struct Deps {
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        peers: Arc<PeerCache>,
        releases: Arc<ReleaseCache>,
        tracker: Arc<Tracker>,
        metrics: Arc<Metrics>,
        opening: Arc<OpenGate>,
        rollouts_changed: Arc<tokio::sync::Notify>,
        ping_interval: Duration,
        cancel: tokio_util::sync::CancellationToken,
        tasks: tokio_util::task::TaskTracker,
    }
}

/// How long a new stream may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages queued towards one agent; beyond this the agent is slow and
/// pings are skipped while desired states wait (coalesced) for room.
const OUTBOUND_QUEUE: usize = 8;

/// `Connect`: admitted (or told when to retry), then served by a task of its own.
pub(super) async fn connect(
    s: &Arc<Deps>,
    req: Request<Streaming<AgentMessage>>,
) -> Result<Response<BoxStream<ServerMessage>>, Status> {
    // Held until the first desired state is sent: the store work of a
    // stream's opening. Over capacity the agent is told when to retry
    // rather than left to time out.
    let Some(opening) = s.opening.enter().await else {
        s.metrics.connect_shed();
        let wait = crate::admission::STREAM_OPEN_RETRY;
        return Err(with_retry_hint(
            Status::unavailable(format!(
                "control server is busy opening other streams; retry in {} s",
                wait.as_secs()
            )),
            wait,
        ));
    };
    let caller = require_node(&req, &*s.store).await?;
    let mut inbound = req.into_inner();
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
    let mut reg = s.hub.register(&caller.id.node);
    s.metrics.set_connected(s.hub.connected());
    let span = tracing::info_span!("stream", node = %caller.id.node, cluster = %caller.id.cluster);
    let tasks = &s.tasks;
    let s = s.clone();
    tasks.spawn(
        async move {
            let node = caller.id.node.clone();
            let id = reg.id;
            let mut session = Session {
                s: s.clone(),
                caller,
                tx,
                sent: Sent::default(),
                trust: None,
                reboot: None,
                reboot_feature: false,
                pushed_reboot: 0,
                unrecorded: None,
            };
            let ended = session.run(&mut inbound, &mut reg, opening).await;
            s.metrics
                .trust_state_moved(session.trust.as_ref().map(|t| t.label()), None);
            if s.hub.unregister(&node, id)
                && let Err(e) = Box::pin(s.store.node_disconnected(&node, now_ms())).await
            {
                tracing::warn!(error = %e, "record disconnect");
            }
            s.metrics.set_connected(s.hub.connected());
            tracing::info!(reason = %ended, "stream ended");
        }
        .instrument(span),
    );
    Ok(Response::new(Box::pin(ReceiverStream::new(rx).map(|m| *m))))
}

/// What woke a `Connect` stream's task.
enum Step {
    ShuttingDown,
    Replaced,
    HubClosed,
    Changed,
    Ping,
    AgentGone,
    Received(Box<Result<Option<AgentMessage>, Status>>),
}

/// What the agent is told when the hub ends its registration: asked to
/// move (this replica holds more than its share), with a spread-out retry
/// hint and the replica to go to; or replaced (the node was deleted or
/// opened a newer stream).
fn ended_by_hub(reg: &crate::hub::Registration) -> Status {
    let Some(to) = reg.moved_to() else {
        return Status::unauthenticated(
            "stream closed by the control server: the node was deleted or opened a newer stream",
        );
    };
    let status =
        Status::unavailable("this replica holds more than its share of agents; reconnect to another replica");
    // Spread over two seconds, so the movers do not all arrive at one
    // instant.
    let wait = Duration::from_millis((lks_proto::backoff::unit_random() * 2000.0) as u64);
    let status = lks_proto::backoff::with_retry_hint(status, wait);
    if to.is_empty() {
        status
    } else {
        lks_proto::backoff::with_reconnect_hint(status, &to)
    }
}

/// One agent's `Connect` stream.
struct Session {
    s: Arc<Deps>,
    caller: NodeCaller,
    /// Boxed: a tokio channel allocates its slots 32 at a time, and
    /// `Result<ServerMessage, Status>` is ~200 bytes, held for as long as
    /// the node is connected.
    tx: mpsc::Sender<Box<Result<ServerMessage, Status>>>,
    /// The desired state last sent, so it is not sent twice.
    sent: Sent,
    /// The release trust the agent last reported (and was stored).
    trust: Option<Box<NodeTrust>>,
    /// The reboot state the agent last reported (and was stored).
    reboot: Option<Box<NodeReboot>>,
    /// Its Hello announced the "reboot" feature: only then does its desired
    /// state carry a reboot request (an older agent would drop it).
    reboot_feature: bool,
    /// The reboot request in the desired state last sent (0: none), taken
    /// out of the store once the agent reports it carried out.
    pushed_reboot: u64,
    /// A status report the store could not take (etcd unreachable), kept
    /// and stored with the next message instead of ending the stream.
    unrecorded: Option<Vec<BundleStatusRow>>,
}

impl Session {
    /// Serves the stream until it ends; returns why.
    ///
    /// The task is as large as the largest state of its future, and it is
    /// held for as long as the node is connected, mostly waiting in
    /// `serve`'s `select!`. So the opening is a boxed future, gone once it
    /// is done, the stream and registration stay in the spawned block
    /// (an `async fn` keeps a second copy of arguments taken by value), and
    /// `serve` keeps only a small `Step` across its awaits. Together: the
    /// task's future from 2.5 to 1.2 KiB (`-Zprint-type-sizes`).
    async fn run(
        &mut self,
        inbound: &mut Streaming<AgentMessage>,
        reg: &mut crate::hub::Registration,
        opening: tokio::sync::OwnedSemaphorePermit,
    ) -> String {
        let opened = Box::pin(self.open(inbound, reg)).await;
        drop(opening);
        if let ControlFlow::Break(why) = opened {
            return why;
        }
        reg.serving();
        self.serve(inbound, reg).await
    }

    /// Takes the Hello, records it and sends the first desired state;
    /// `Break(why)` if the session ended there (`why` is how `run` ends).
    async fn open(
        &mut self,
        inbound: &mut Streaming<AgentMessage>,
        reg: &crate::hub::Registration,
    ) -> ControlFlow<String> {
        let hello = tokio::select! {
            biased;
            _ = self.s.cancel.cancelled() => {
                return ControlFlow::Break(self
                    .fail(Status::unavailable("control server is shutting down; reconnect"))
                    .await);
            }
            // Ended before its Hello arrived (the node deleted, a newer
            // stream of it; a rebalance moves only open streams): the
            // agent hears why, as in `serve`, not a clean end of stream it
            // would count a failure.
            _ = reg.cancel.cancelled() => return ControlFlow::Break(self.fail(ended_by_hub(reg)).await),
            r = tokio::time::timeout(HELLO_TIMEOUT, inbound.message()) => r,
        };
        let hello = match hello {
            Err(_) => {
                return ControlFlow::Break(
                    self.fail(Status::deadline_exceeded(
                        "no Hello within 30s of opening the stream",
                    ))
                    .await,
                );
            }
            Ok(Err(st)) => return ControlFlow::Break(self.receive_failed(st)),
            Ok(Ok(None)) => return ControlFlow::Break("closed by agent before Hello".into()),
            Ok(Ok(Some(AgentMessage {
                msg: Some(AgentMsg::Hello(h)),
            }))) => h,
            Ok(Ok(Some(_))) => {
                return ControlFlow::Break(
                    self.fail(Status::invalid_argument(
                        "the first message on a Connect stream must be Hello",
                    ))
                    .await,
                );
            }
        };
        // The desired state is read while the Hello is written: neither
        // depends on the other, and a replica taking over a dead one's
        // agents admits them at the pace of these two store calls. Not
        // older than what the agent has (its Hello says which generation):
        // that one the store may take from its copy.
        let have = hello.desired_generation;
        let read = {
            let (s, node) = (self.s.clone(), self.caller.id.node.clone());
            async move {
                let after = have.checked_sub(1).filter(|_| have > 0);
                s.store.desired_state_after(&node, after).await
            }
        };
        let (hello, read) = tokio::join!(Box::pin(self.hello(hello)), Box::pin(read));
        if let Err(st) = hello {
            return ControlFlow::Break(self.fail(st).await);
        }
        match Box::pin(self.push_desired_read(reg, read)).await {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e.to_string()),
        }
    }

    /// Answers the agent and follows the hub until the stream ends; returns
    /// why. The store calls are boxed for the same reason as `open`.
    async fn serve(
        &mut self,
        inbound: &mut Streaming<AgentMessage>,
        reg: &mut crate::hub::Registration,
    ) -> String {
        let mut ping = tokio::time::interval_at(
            tokio::time::Instant::now() + self.s.ping_interval,
            self.s.ping_interval,
        );
        let mut nonce = 0u64;
        loop {
            // What woke the stream, small: the select's own output (a
            // received message or status, ~300 bytes) would otherwise stay
            // in the future for the stream's life, next to the awaits below.
            //
            // Biased: shutdown, and a registration the hub replaced or
            // kicked, cancel their token before the hub drops the change
            // channel's sender, so when both are ready the cancellation
            // wins and the agent hears why (a random pick of `HubClosed`
            // ended ~17 % of streams on SIGTERM without a status).
            let step = tokio::select! {
                biased;
                _ = self.s.cancel.cancelled() => Step::ShuttingDown,
                _ = reg.cancel.cancelled() => Step::Replaced,
                r = reg.changed.changed() => if r.is_err() { Step::HubClosed } else { Step::Changed },
                _ = ping.tick() => Step::Ping,
                _ = self.tx.closed() => Step::AgentGone,
                m = inbound.message() => Step::Received(Box::new(m)),
            };
            match step {
                Step::ShuttingDown => {
                    return self
                        .fail(Status::unavailable("control server is shutting down; reconnect"))
                        .await;
                }
                // Shutdown ends every registration too, but it cancels
                // `self.s.cancel` first, which the biased select! sees first.
                Step::Replaced => return self.fail(ended_by_hub(reg)).await,
                // Not reached while the hub cancels before it drops (see
                // above); if it is, the agent still gets a status to act
                // on, not a clean end of stream.
                Step::HubClosed => {
                    return self
                        .fail(Status::unavailable("control server closed the stream; reconnect"))
                        .await;
                }
                Step::Changed => {
                    if let Err(why) = Box::pin(self.push_desired(reg)).await {
                        return why.to_string();
                    }
                }
                Step::Ping => {
                    nonce += 1;
                    // A full queue means the agent is behind; a skipped ping is harmless.
                    let _ = self.tx.try_send(Box::new(Ok(ServerMessage {
                        msg: Some(ServerMsg::Ping(pb::Ping { nonce })),
                    })));
                }
                Step::AgentGone => return "agent went away".into(),
                Step::Received(m) => match *m {
                    Ok(Some(m)) => {
                        if let Err(st) = Box::pin(self.handle(m)).await {
                            return Box::pin(self.fail(st)).await;
                        }
                    }
                    Ok(None) => return "closed by agent".into(),
                    Err(st) => return self.receive_failed(st),
                },
            }
        }
    }

    /// The agent's side of the stream failed: a message over the size
    /// limit or one that does not decode is answered with its status
    /// (`invalid_argument` for garbage), not with a clean end of stream
    /// the agent would take for success. A vanished agent reads nothing.
    fn receive_failed(&self, st: Status) -> String {
        let why = format!("receive: {}", st.message());
        let _ = self.tx.try_send(Box::new(Err(lks_proto::wire::bounded(
            lks_proto::wire::client_status(st),
        ))));
        why
    }

    async fn fail(&self, st: Status) -> String {
        let why = st.message().to_string();
        let _ = self.tx.try_send(Box::new(Err(lks_proto::wire::bounded(st))));
        why
    }

    async fn hello(&mut self, h: pb::Hello) -> Result<(), Status> {
        let checked = session::hello(&h).map_err(OpError::from)?;
        self.reboot_feature = h
            .features
            .iter()
            .any(|f| f == lks_proto::manifest::FEATURE_REBOOT);
        let now = now_ms();
        self.s.hub.heard(&self.caller.id.node, now);
        let (trust, reboot) =
            session::record_hello(&*self.s.store, &self.caller.id.node, checked, now).await?;
        self.s.rollouts_changed.notify_one();
        self.trust_recorded(trust);
        // With the Hello's own write (a reconnect may be the end of a
        // reboot), not one more per connect.
        if let Some(r) = reboot
            .as_ref()
            .filter(|r| r.state != crate::store::RebootState::None)
        {
            tracing::info!(state = r.state.as_str(), reason = %r.reason, "reboot state");
        }
        self.reboot = reboot.map(Box::new);
        tracing::info!(agent_version = %h.agent_version, have_generation = h.desired_generation, "agent connected");
        Ok(())
    }

    async fn handle(&mut self, m: AgentMessage) -> Result<(), Status> {
        let node = &self.caller.id.node;
        self.s.hub.heard(node, now_ms());
        if let Some(rows) = self.unrecorded.take() {
            self.record(rows).await?;
        }
        match m.msg {
            None | Some(AgentMsg::Heartbeat(_)) | Some(AgentMsg::Pong(_)) => Ok(()),
            Some(AgentMsg::Hello(h)) => self.hello(h).await,
            Some(AgentMsg::Status(r)) => {
                let session::Report { rows, trust, reboot } = session::report(r).map_err(OpError::from)?;
                if let Some(t) = trust {
                    self.record_trust(t).await?;
                }
                if let Some(r) = reboot {
                    self.record_reboot(r).await?;
                }
                for row in &rows {
                    tracing::debug!(bundle = %row.name, version = %row.version, state = %row.state, "status");
                }
                self.record(rows).await
            }
            Some(AgentMsg::Event(e)) => {
                let s = &self.s;
                session::node_event(&*s.store, &s.tracker, &s.metrics, &self.caller.id, e).await;
                Ok(())
            }
        }
    }

    /// Stores the node's release trust if it changed since it was last
    /// stored from this stream, and counts it in the metrics.
    async fn record_trust(&mut self, t: NodeTrust) -> Result<(), Status> {
        if self.trust.as_deref() == Some(&t) {
            return Ok(());
        }
        if session::record_trust(&*self.s.store, &self.caller.id.node, t.clone()).await? {
            self.trust_recorded(Some(t));
        }
        Ok(())
    }

    /// Stores the node's reboot state if it changed since it was last
    /// stored from this stream.
    async fn record_reboot(&mut self, r: NodeReboot) -> Result<(), Status> {
        if self.reboot.as_deref() == Some(&r) {
            return Ok(());
        }
        if r.state != crate::store::RebootState::None {
            tracing::info!(state = r.state.as_str(), reason = %r.reason, "reboot state");
        }
        if session::record_reboot(&*self.s.store, &self.caller.id.node, r.clone()).await? {
            self.reboot = Some(Box::new(r));
            self.settle_reboot_request().await;
        }
        Ok(())
    }

    /// Takes the reboot request this stream sent out of the node's desired
    /// state once the agent reports it carried out (it took it on and is
    /// no longer rebooting: back in a new boot, or failed), so an agent
    /// that lost its `reboot.json` does not take it on again. A store
    /// failure is tried again with the next report.
    async fn settle_reboot_request(&mut self) {
        let id = self.pushed_reboot;
        let done = self
            .reboot
            .as_deref()
            .is_some_and(|r| r.request >= id && r.state != crate::store::RebootState::Rebooting);
        if id == 0 || !done {
            return;
        }
        let node = &self.caller.id.node;
        match self.s.store.clear_reboot_request(node, id).await {
            Ok(cleared) => {
                self.pushed_reboot = 0;
                if cleared {
                    tracing::info!(request = id, "reboot request carried out; cleared");
                    self.s.hub.notify(node);
                }
            }
            Err(e) => tracing::warn!(request = id, error = %e, "clear the reboot request"),
        }
    }

    /// The trust now stored for the node: kept to compare the next report
    /// with, and counted in the metrics.
    fn trust_recorded(&mut self, t: Option<NodeTrust>) {
        if let Some(t) = &t
            && t.state == Some(TrustHealth::StaleRelease)
        {
            tracing::warn!(release = t.release_version, "node reports a stale release");
        }
        self.s.metrics.trust_state_moved(
            self.trust.as_ref().map(|o| o.label()),
            t.as_ref().map(NodeTrust::label),
        );
        self.trust = t.map(Box::new);
    }

    /// Stores a status report (`ops::session::record_status`), or keeps
    /// it for the next message while the store is unavailable.
    async fn record(&mut self, rows: Vec<BundleStatusRow>) -> Result<(), Status> {
        match session::record_status(&*self.s.store, &self.caller.id.node, rows).await? {
            Recorded::Stored => self.s.rollouts_changed.notify_one(),
            Recorded::Deferred(rows) => self.unrecorded = Some(session::defer(self.unrecorded.take(), rows)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream the hub ends hears why, whether it is still waiting for
    /// its Hello (`open`) or serving (`serve`): both answer with this. A
    /// clean end of stream instead was counted a failure by the agent and
    /// lost the replica to move to (loadgen_replicas, 1 in ~10 runs).
    #[test]
    fn a_stream_the_hub_ends_is_told_why() {
        let hub = crate::hub::Hub::default();
        let moved = hub.register("a");
        assert!(hub.ask_to_move("a", "https://r2:7443"));
        let st = ended_by_hub(&moved);
        assert_eq!(st.code(), tonic::Code::Unavailable);
        assert_eq!(
            lks_proto::backoff::reconnect_hint(&st).as_deref(),
            Some("https://r2:7443")
        );
        let hint = lks_proto::backoff::retry_hint(&st).expect("a retry hint");
        assert!(hint <= Duration::from_secs(2), "{hint:?}");

        let anywhere = hub.register("b");
        assert!(hub.ask_to_move("b", ""));
        let st = ended_by_hub(&anywhere);
        assert_eq!(st.code(), tonic::Code::Unavailable);
        assert_eq!(lks_proto::backoff::reconnect_hint(&st), None);

        let kicked = hub.register("c");
        hub.kick("c");
        let st = ended_by_hub(&kicked);
        assert_eq!(st.code(), tonic::Code::Unauthenticated);
        assert_eq!(lks_proto::backoff::reconnect_hint(&st), None);
    }
}
