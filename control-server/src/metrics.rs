//! Prometheus metrics (text exposition format) and the `/metrics` +
//! `/healthz` HTTP endpoint; `probe` checks the store and the blob store
//! for them.

mod delta;
mod fleetlock;
mod health;
mod plans;
mod reboots;
use health::Probed;
pub mod probe;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use lks_proto::sync::lock;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use lks_rollout::ages::RolloutAge;

const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

/// The server's counters, shared by every handler.
#[derive(Default)]
pub struct Metrics {
    connected: AtomicI64,
    pushes: AtomicU64,
    blob_bytes: AtomicU64,
    /// Of `blob_bytes`, patches (binary deltas), and the bytes those saved.
    delta_bytes: AtomicU64,
    delta_saved: AtomicU64,
    deltas_made: AtomicU64,
    deltas_skipped: AtomicU64,
    delta_maker: delta::MakerCounters,
    peer_bytes: AtomicU64,
    bad_peers: AtomicU64,
    audit_write_errors: AtomicU64,
    audit_pruned: AtomicU64,
    enrollments: Labelled,
    package_requests: Labelled,
    package_bytes: AtomicU64,
    /// The locks here (`rpc`, `gauges`, `rollouts`, `blob_store_held`,
    /// [`Labelled`]) each guard one push, one slot or one histogram's
    /// counts: whole after a panic (at worst one observation half
    /// counted), so they are locked with [`lock`], never dropped from then on.
    rpc: Mutex<BTreeMap<&'static str, Histogram>>,
    rollout_events: Labelled,
    active_rollouts: AtomicI64,
    tls_handshakes: Labelled,
    tls_queued: AtomicI64,
    connect_shed: AtomicU64,
    blob_stored_bytes: AtomicU64,
    agents_moved: AtomicU64,
    blob_reclaimed: AtomicU64,
    blob_reclaimed_bytes: AtomicU64,
    /// What the blob store held after the last collector pass (None: no
    /// pass on this replica yet).
    blob_store_held: Mutex<Option<(u64, u64)>>,
    /// Agents on this replica by the release trust they last reported
    /// (`TRUST_STATES` order).
    trust_states: [AtomicI64; TRUST_STATES.len()],
    /// Rollouts worth watching, as the controller last saw them (empty
    /// on a replica that does not drive rollouts).
    rollouts: Mutex<Vec<RolloutAge>>,
    /// The store answered the last probe (1) or not (0).
    store_up: Probed,
    /// Likewise for the blob store.
    blob_store_up: Probed,
    /// Nodes enrolled, at the last probe the store answered.
    enrolled_nodes: Probed,
    cert_renewals: Labelled,
    /// Reboot-lock holders not back within the reboot timeout, by cluster.
    reboots_lost: Labelled,
    /// Nodes of the tenant clusters cordoned by lksadmin at the last cordon
    /// repair: owned by an active rollout's turn, and stray (owned by none,
    /// and the repair could not lift them).
    cordoned: [AtomicI64; 2],
    /// Release plans by state, as the plan driver last saw them.
    plans: Mutex<plans::PlanCounts>,
    fleetlock: fleetlock::FleetlockCounts,
    /// Nodes waiting for a reboot slot, by cluster and why.
    reboot_waits: Mutex<reboots::RebootWaits>,
    /// Gauges read when rendered (`name`, help, read).
    gauges: Mutex<Vec<(&'static str, &'static str, Gauge)>>,
}

type Gauge = Box<dyn Fn() -> i64 + Send + Sync>;

/// The values of `lks_nodes_trust_state{state}`: "off" for an agent
/// without a release requirement, then the states of `TrustStatus.state`.
pub const TRUST_STATES: [&str; 6] = ["off", "ok", "stale-release", "no-release", "refused", "clock"];

/// The outcomes of `lks_certificate_renewals_total{outcome}`, each shown
/// from the start: `refused` (the caller or its CSR was not accepted),
/// `error` (the server could not do it: store unavailable, …).
pub const RENEWAL_OUTCOMES: [&str; 3] = ["ok", "refused", "error"];

impl Metrics {
    /// The rollouts worth watching now (the controller, each pass).
    pub fn set_rollouts(&self, ages: Vec<RolloutAge>) {
        *lock(&self.rollouts) = ages;
    }

    /// What the store answered a probe: the enrolled nodes, or nothing.
    pub fn store_probed(&self, enrolled: Option<u64>) {
        self.store_up.set(u64::from(enrolled.is_some()));
        if let Some(n) = enrolled {
            self.enrolled_nodes.set(n);
        }
    }

    /// Whether the blob store answered a probe.
    pub fn blob_store_probed(&self, up: bool) {
        self.blob_store_up.set(u64::from(up));
    }

    /// Counts `n` holders of `cluster`'s reboot lock that became
    /// `reboot-lost`.
    pub fn reboots_lost(&self, cluster: &str, n: u64) {
        for _ in 0..n {
            self.reboots_lost.inc(cluster);
        }
    }

    /// Counts one `RenewCertificate` by outcome ([`RENEWAL_OUTCOMES`]).
    pub fn certificate_renewal(&self, outcome: &'static str) {
        self.cert_renewals.inc(outcome);
    }

    /// Cordons lksadmin holds in the tenant clusters: `owned` by an active
    /// rollout's turn, `stray` (no active rollout owns them and the repair
    /// could not lift them).
    pub fn set_cordoned(&self, owned: u64, stray: u64) {
        for (g, n) in self.cordoned.iter().zip([owned, stray]) {
            g.store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
        }
    }

    pub fn set_connected(&self, n: usize) {
        self.connected.store(n as i64, Ordering::Relaxed);
    }

    /// An agent's reported trust state moved from `from` to `to` (values
    /// of [`TRUST_STATES`]; `None`: not reported, or the stream ended).
    pub fn trust_state_moved(&self, from: Option<&str>, to: Option<&str>) {
        let at = |s: Option<&str>| s.and_then(|s| TRUST_STATES.iter().position(|t| *t == s));
        if let Some(i) = at(from) {
            self.trust_states[i].fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(i) = at(to) {
            self.trust_states[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn desired_state_pushed(&self) {
        self.pushes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn blob_bytes_served(&self, n: u64) {
        self.blob_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes of a patch sent (also counted by [`Self::blob_bytes_served`]),
    /// and how many bytes of its file that spared.
    pub fn delta_bytes_served(&self, n: u64, saved: u64) {
        self.delta_bytes.fetch_add(n, Ordering::Relaxed);
        self.delta_saved.fetch_add(saved, Ordering::Relaxed);
    }

    /// One delta-maker pass: patches kept, and patches made and not kept
    /// (abandoned).
    pub fn deltas_made(&self, made: u64, skipped: u64) {
        self.deltas_made.fetch_add(made, Ordering::Relaxed);
        self.deltas_skipped.fetch_add(skipped, Ordering::Relaxed);
    }

    /// Bytes a node reports it took from its peers for a version it applied.
    pub fn blob_bytes_from_peers(&self, n: u64) {
        self.peer_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn bad_peer_reported(&self) {
        self.bad_peers.fetch_add(1, Ordering::Relaxed);
    }

    /// An admin call whose audit record the store did not take.
    pub fn audit_write_failed(&self) {
        self.audit_write_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Audit records the retention sweep dropped.
    pub fn audit_pruned(&self, n: u64) {
        self.audit_pruned.fetch_add(n, Ordering::Relaxed);
    }

    /// Agents this replica asked to reconnect elsewhere (rebalancing).
    pub fn agents_moved(&self, n: u64) {
        self.agents_moved.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes a publish uploaded into the blob store.
    pub fn blob_bytes_stored(&self, n: u64) {
        self.blob_stored_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// One collector pass: what it reclaimed and what the store holds.
    pub fn blob_collected(&self, pass: &lks_blobs::gc::Pass) {
        self.blob_reclaimed.fetch_add(pass.reclaimed, Ordering::Relaxed);
        self.blob_reclaimed_bytes
            .fetch_add(pass.reclaimed_bytes, Ordering::Relaxed);
        *lock(&self.blob_store_held) = Some((pass.held, pass.held_bytes));
    }

    /// Counts one enrolment attempt by outcome (`ok`, `invalid_token`, …).
    pub fn enrollment(&self, result: &'static str) {
        self.enrollments.inc(result);
    }

    /// Counts one request for an agent package by outcome (`ok`,
    /// `not_found`, `rate_limited`, `busy`, `bad_method`, `error`).
    pub fn agent_package_request(&self, result: &'static str) {
        self.package_requests.inc(result);
    }

    pub fn agent_package_bytes(&self, n: u64) {
        self.package_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one rollout event (`node_started`, `applied`, `rollout_failed`, …).
    pub fn rollout_event(&self, kind: &str) {
        self.rollout_events.inc(kind);
    }

    /// Rollouts running, paused or rolling back.
    pub fn set_active_rollouts(&self, n: usize) {
        self.active_rollouts.store(n as i64, Ordering::Relaxed);
    }

    /// Counts one accepted connection's TLS handshake by outcome (`ok`,
    /// `shed`, `timeout`, `failed`).
    pub fn tls_handshake(&self, result: &'static str) {
        self.tls_handshakes.inc(result);
    }

    /// A connection starts (`true`) or stops waiting for a handshake slot.
    pub fn tls_handshake_queued(&self, waiting: bool) {
        self.tls_queued
            .fetch_add(if waiting { 1 } else { -1 }, Ordering::Relaxed);
    }

    /// Counts one `Connect` refused with `unavailable` and a retry hint
    /// because too many streams were being opened.
    pub fn connect_shed(&self) {
        self.connect_shed.fetch_add(1, Ordering::Relaxed);
    }

    /// The admission counters so far, for the log line at shutdown:
    /// handshakes by result, then Connects shed.
    pub fn admission_totals(&self) -> ([u64; 4], u64) {
        let tls = ["ok", "shed", "timeout", "failed"].map(|r| self.tls_handshakes.get(r));
        (tls, self.connect_shed.load(Ordering::Relaxed))
    }

    /// Adds a gauge whose value is read from `read` at every scrape.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        read: impl Fn() -> i64 + Send + Sync + 'static,
    ) {
        lock(&self.gauges).push((name, help, Box::new(read)));
    }

    pub fn observe_rpc(&self, method: &'static str, secs: f64) {
        {
            let mut m = lock(&self.rpc);
            let h = m.entry(method).or_default();
            for (i, b) in BUCKETS.iter().enumerate() {
                if secs <= *b {
                    h.counts[i] += 1;
                }
            }
            h.sum += secs;
            h.count += 1;
        }
    }

    /// Observes the time until the returned guard is dropped.
    pub fn timer(self: &Arc<Self>, method: &'static str) -> RpcTimer {
        RpcTimer {
            metrics: self.clone(),
            method,
            start: Instant::now(),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut s = String::new();
        self.render_agents(&mut s);
        self.render_transfers(&mut s);
        self.render_delta_maker(&mut s);
        self.render_upkeep(&mut s);
        self.render_blob_store(&mut s);
        self.render_rollout_counts(&mut s);
        self.render_plans(&mut s);
        self.render_fleetlock(&mut s);
        self.render_reboot_waits(&mut s);
        self.render_health(&mut s);
        self.render_admission(&mut s);
        self.render_rpc(&mut s);
        self.render_etcd_reads(&mut s);
        s
    }

    /// Agents: connected, by trust state, enrolments and the agent package, pushes.
    fn render_agents(&self, s: &mut String) {
        scalar(
            s,
            "lks_connected_agents",
            "gauge",
            "Agents with an open Connect stream.",
            self.connected.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            s,
            "# HELP lks_nodes_trust_state Agents connected to this server by the release trust they last reported (off: no release requirement)."
        );
        let _ = writeln!(s, "# TYPE lks_nodes_trust_state gauge");
        for (state, n) in TRUST_STATES.iter().zip(&self.trust_states) {
            let _ = writeln!(
                s,
                "lks_nodes_trust_state{{state=\"{state}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        self.enrollments.render(
            s,
            "lks_enrollments_total",
            "Enrolment attempts by result.",
            "result",
        );
        self.package_requests.render(
            s,
            "lks_agent_package_requests_total",
            "Requests for the agent package by result.",
            "result",
        );
        scalar(
            s,
            "lks_agent_package_bytes_served_total",
            "counter",
            "Agent package bytes sent.",
            load(&self.package_bytes),
        );
        scalar(
            s,
            "lks_desired_state_pushes_total",
            "counter",
            "Desired states sent to agents.",
            load(&self.pushes),
        );
    }

    /// Blob bytes sent to nodes, by source and by kind, and the binary deltas.
    fn render_transfers(&self, s: &mut String) {
        // Labelled by who sent the bytes: this server (counted as it sends
        // them) or the nodes' peers (as the nodes report for each version
        // they applied, peer sharing).
        let _ = writeln!(
            s,
            "# HELP lks_blob_bytes_served_total Blob bytes nodes received, by source: this server, or their peers (as the nodes report)."
        );
        let _ = writeln!(s, "# TYPE lks_blob_bytes_served_total counter");
        let _ = writeln!(
            s,
            "lks_blob_bytes_served_total{{source=\"server\"}} {}",
            load(&self.blob_bytes)
        );
        let _ = writeln!(
            s,
            "lks_blob_bytes_served_total{{source=\"peer\"}} {}",
            load(&self.peer_bytes)
        );
        // Of the server's bytes, by kind: patches (binary deltas) or whole
        // files; and what the patches spared.
        let whole = load(&self.blob_bytes).saturating_sub(load(&self.delta_bytes));
        let _ = writeln!(
            s,
            "# HELP lks_blob_bytes_served_by_kind_total Blob bytes this server sent, by kind: binary-delta patches or whole files."
        );
        let _ = writeln!(s, "# TYPE lks_blob_bytes_served_by_kind_total counter");
        let _ = writeln!(
            s,
            "lks_blob_bytes_served_by_kind_total{{kind=\"delta\"}} {}",
            load(&self.delta_bytes)
        );
        let _ = writeln!(s, "lks_blob_bytes_served_by_kind_total{{kind=\"whole\"}} {whole}");
        scalar(
            s,
            "lks_blob_delta_bytes_saved_total",
            "counter",
            "File bytes not sent because a patch was sent instead (file size minus patch size, per patch sent whole).",
            load(&self.delta_saved),
        );
        scalar(
            s,
            "lks_deltas_made_total",
            "counter",
            "Binary deltas the maker kept as blobs.",
            load(&self.deltas_made),
        );
        scalar(
            s,
            "lks_deltas_skipped_total",
            "counter",
            "Binary deltas the maker made and did not keep (a patch over half its file).",
            load(&self.deltas_skipped),
        );
        scalar(
            s,
            "lks_bad_peers_reported_total",
            "counter",
            "Reports of a peer that served a chunk not matching its digest (peer sharing).",
            load(&self.bad_peers),
        );
    }

    /// The audit trail and agents moved to another replica.
    fn render_upkeep(&self, s: &mut String) {
        scalar(
            s,
            "lks_audit_write_errors_total",
            "counter",
            "Admin calls whose audit record the store did not take (the call's own answer stood).",
            load(&self.audit_write_errors),
        );
        scalar(
            s,
            "lks_audit_pruned_total",
            "counter",
            "Audit records older than --audit-retention that this replica dropped.",
            load(&self.audit_pruned),
        );
        scalar(
            s,
            "lks_agents_moved_total",
            "counter",
            "Agents this replica asked to reconnect to another replica (it held more than its share).",
            load(&self.agents_moved),
        );
    }

    /// The blob store: bytes stored, what the collector reclaimed and held.
    fn render_blob_store(&self, s: &mut String) {
        scalar(
            s,
            "lks_blob_store_bytes_stored_total",
            "counter",
            "Bytes publishes uploaded into the blob store.",
            load(&self.blob_stored_bytes),
        );
        scalar(
            s,
            "lks_blob_store_reclaimed_total",
            "counter",
            "Blobs the garbage collector deleted (no bundle version referenced them).",
            load(&self.blob_reclaimed),
        );
        scalar(
            s,
            "lks_blob_store_reclaimed_bytes_total",
            "counter",
            "Bytes the garbage collector deleted.",
            load(&self.blob_reclaimed_bytes),
        );
        let held = *lock(&self.blob_store_held);
        if let Some((blobs, bytes)) = held {
            scalar(
                s,
                "lks_blob_store_blobs",
                "gauge",
                "Blobs in the blob store at this replica's last collector pass.",
                blobs,
            );
            scalar(
                s,
                "lks_blob_store_bytes",
                "gauge",
                "Bytes in the blob store at this replica's last collector pass.",
                bytes,
            );
        }
    }

    /// Rollouts: how many are active, their events, and their ages by state.
    fn render_rollout_counts(&self, s: &mut String) {
        scalar(
            s,
            "lks_active_rollouts",
            "gauge",
            "Rollouts running, paused or rolling back.",
            self.active_rollouts.load(Ordering::Relaxed),
        );
        self.rollout_events
            .render(s, "lks_rollout_events_total", "Rollout events by kind.", "kind");
        self.reboots_lost.render(
            s,
            "lks_reboot_lost_total",
            "Nodes of a cluster's reboot lock not back Ready within the reboot timeout (reboot-lost), by cluster.",
            "cluster",
        );
        self.render_rollouts(s);
    }

    /// Connection admission: TLS handshakes, Connect sheds, and the gauges read when rendered.
    fn render_admission(&self, s: &mut String) {
        self.tls_handshakes.render(
            s,
            "lks_tls_handshakes_total",
            "TLS handshakes of accepted connections by result (shed: closed unhandshaken after waiting too long for a slot).",
            "result",
        );
        scalar(
            s,
            "lks_tls_handshakes_queued",
            "gauge",
            "Accepted connections waiting for a TLS handshake slot.",
            self.tls_queued.load(Ordering::Relaxed),
        );
        scalar(
            s,
            "lks_connect_shed_total",
            "counter",
            "Connect calls refused with unavailable and a retry hint: too many streams being opened.",
            load(&self.connect_shed),
        );
        for (name, help, read) in lock(&self.gauges).iter() {
            scalar(s, name, "gauge", help, read());
        }
    }

    /// The gRPC handler duration histogram.
    fn render_rpc(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP lks_rpc_duration_seconds gRPC handler duration by method."
        );
        let _ = writeln!(s, "# TYPE lks_rpc_duration_seconds histogram");
        {
            let m = lock(&self.rpc);
            for (method, h) in m.iter() {
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "lks_rpc_duration_seconds_bucket{{method=\"{method}\",le=\"{b}\"}} {}",
                        h.counts[i]
                    );
                }
                let _ = writeln!(
                    s,
                    "lks_rpc_duration_seconds_bucket{{method=\"{method}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(s, "lks_rpc_duration_seconds_sum{{method=\"{method}\"}} {}", h.sum);
                let _ = writeln!(
                    s,
                    "lks_rpc_duration_seconds_count{{method=\"{method}\"}} {}",
                    h.count
                );
            }
        }
    }

    /// What this replica read from etcd (nothing on SQLite).
    fn render_etcd_reads(&self, s: &mut String) {
        let reads = crate::store::etcd::reads::snapshot();
        if !reads.is_empty() {
            let _ = writeln!(
                s,
                "# HELP lks_etcd_reads_total Reads from etcd by kind (get, range, watch event) and key prefix."
            );
            let _ = writeln!(s, "# TYPE lks_etcd_reads_total counter");
            for (read, prefix, n, _) in &reads {
                let _ = writeln!(
                    s,
                    "lks_etcd_reads_total{{read=\"{read}\",prefix=\"{prefix}\"}} {n}"
                );
            }
            let _ = writeln!(
                s,
                "# HELP lks_etcd_read_bytes_total Bytes of values read from etcd by kind and key prefix."
            );
            let _ = writeln!(s, "# TYPE lks_etcd_read_bytes_total counter");
            for (read, prefix, _, b) in &reads {
                let _ = writeln!(
                    s,
                    "lks_etcd_read_bytes_total{{read=\"{read}\",prefix=\"{prefix}\"}} {b}"
                );
            }
        }
    }
}

/// A counter with one label, one series per label value.
#[derive(Default)]
struct Labelled(Mutex<BTreeMap<String, u64>>);

impl Labelled {
    fn inc(&self, value: &str) {
        *lock(&self.0).entry(value.to_string()).or_default() += 1;
    }

    fn get(&self, value: &str) -> u64 {
        lock(&self.0).get(value).copied().unwrap_or(0)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, label: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (value, n) in lock(&self.0).iter() {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
        }
    }
}

/// The value of a counter or gauge.
fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One unlabelled counter or gauge.
fn scalar(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

/// Records an RPC's duration when dropped.
pub struct RpcTimer {
    metrics: Arc<Metrics>,
    method: &'static str,
    start: Instant,
}

impl Drop for RpcTimer {
    fn drop(&mut self) {
        self.metrics
            .observe_rpc(self.method, self.start.elapsed().as_secs_f64());
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `cancel` fires.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, cancel: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let m = metrics.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let m = m.clone();
                async move { Ok::<_, Infallible>(respond(req.uri().path(), &m)) }
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = conn => if let Err(e) = r {
                    tracing::debug!(error = %e, "metrics connection ended");
                },
            }
        });
    }
}

fn respond(path: &str, m: &Metrics) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match path {
        "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", m.render()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".to_string()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Binds the metrics listener (done before serving so a bad address fails start-up).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trust_state_has_a_series() {
        assert_eq!(TRUST_STATES[0], "off");
        let states: Vec<&str> = crate::store::TrustHealth::ALL
            .iter()
            .map(|h| h.as_str())
            .collect();
        assert_eq!(TRUST_STATES[1..], states[..]);
    }

    #[test]
    fn renders_every_family() {
        let m = Metrics::default();
        m.set_connected(3);
        m.enrollment("ok");
        m.enrollment("ok");
        m.enrollment("invalid_token");
        m.desired_state_pushed();
        m.blob_bytes_served(10);
        m.observe_rpc("Enroll", 0.02);
        m.rollout_event("applied");
        m.rollout_event("applied");
        m.set_active_rollouts(2);
        m.tls_handshake("ok");
        m.tls_handshake("shed");
        m.tls_handshake("shed");
        m.tls_handshake_queued(true);
        m.tls_handshake_queued(true);
        m.tls_handshake_queued(false);
        m.connect_shed();
        m.trust_state_moved(None, Some("ok"));
        m.trust_state_moved(None, Some("ok"));
        m.trust_state_moved(Some("ok"), Some("stale-release"));
        m.gauge("lks_tls_handshakes_in_progress", "Handshakes running.", || 4);
        assert_eq!(m.admission_totals(), ([1, 2, 0, 0], 1));
        let t = m.render();
        assert!(t.contains("lks_tls_handshakes_total{result=\"shed\"} 2"));
        assert!(t.contains("lks_tls_handshakes_total{result=\"ok\"} 1"));
        assert!(t.contains("lks_tls_handshakes_queued 1"));
        assert!(t.contains("lks_connect_shed_total 1"));
        assert!(t.contains("# TYPE lks_tls_handshakes_in_progress gauge\nlks_tls_handshakes_in_progress 4"));
        assert!(t.contains("lks_rollout_events_total{kind=\"applied\"} 2"));
        assert!(t.contains("lks_active_rollouts 2"));
        assert!(t.contains("lks_connected_agents 3"));
        assert!(t.contains("lks_nodes_trust_state{state=\"ok\"} 1"), "{t}");
        assert!(t.contains("lks_nodes_trust_state{state=\"stale-release\"} 1"));
        assert!(t.contains("lks_nodes_trust_state{state=\"clock\"} 0"));
        assert!(t.contains("lks_enrollments_total{result=\"ok\"} 2"));
        assert!(t.contains("lks_desired_state_pushes_total 1"));
        assert!(
            t.contains("lks_blob_bytes_served_total{source=\"server\"} 10"),
            "{t}"
        );
        assert!(
            t.contains("lks_blob_bytes_served_total{source=\"peer\"} 0"),
            "{t}"
        );
        assert!(t.contains("lks_rpc_duration_seconds_bucket{method=\"Enroll\",le=\"0.025\"} 1"));
        assert!(t.contains("lks_rpc_duration_seconds_bucket{method=\"Enroll\",le=\"0.01\"} 0"));
        assert!(t.contains("lks_rpc_duration_seconds_count{method=\"Enroll\"} 1"));
    }
}
