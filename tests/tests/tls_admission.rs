//! The bound on TLS handshakes in progress (issue [perf] item 2), against
//! the real server binary with a small bound:
//!
//! - clients that open TCP and never send a byte hold a handshake slot each,
//!   yet many concurrent clients (anonymous `Enroll`, node `Connect` with
//!   its client certificate, admin calls) are all served meanwhile, and the
//!   silent ones are closed at the handshake timeout;
//! - with every slot held by a silent client, a connection that waits
//!   longer than the queue timeout is closed unhandshaken (`shed`), and once
//!   the slots are free again clients get in.
//!
//! The counters are read from /metrics.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use lks_e2e::server::{Server, TestNode, next_desired};
use lks_proto::pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn metric(s: &Server, series: &str) -> u64 {
    s.metric(series)
}

/// Waits (briefly) for `series` to read `want`, and asserts it does.
fn counted(s: &Server, series: &str, want: u64) {
    let t = Instant::now();
    while metric(s, series) != want && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(s, series), want, "{series}");
}

/// A TCP connection that never starts its TLS handshake.
fn silent(s: &Server) -> (TcpStream, Instant) {
    let c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    (c, Instant::now())
}

/// True while the server has not closed `c`.
fn still_open(c: &TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let open = matches!((&*c).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    c.set_nonblocking(false).unwrap();
    open
}

/// Blocks until the server closes `c`; how long after `since`.
fn closed_after(mut c: TcpStream, since: Instant) -> Duration {
    let mut b = [0u8; 64];
    match c.read(&mut b) {
        Ok(0) => {}
        Ok(n) => panic!("the server sent {n} bytes to a client that sent none"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the silent connection was not closed: {e}"),
    }
    since.elapsed()
}

async fn try_channel(s: &Server, identity: Option<(&str, &str)>) -> Result<Channel, tonic::transport::Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(s.admin_conf().ca_cert));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(s.url())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(30))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_clients_hold_a_slot_each_but_do_not_block_others_and_are_closed_at_the_timeout() {
    let s = Server::start_with(&["--max-tls-handshakes", "3", "--tls-handshake-timeout", "8s"]);
    s.create_cluster("c1");
    let token = s.token("c1", &["--uses", "16"]);
    let conf = s.admin_conf();

    // Two of the three slots held by clients that never handshake.
    let quiet: Vec<_> = (0..2).map(|_| silent(&s)).collect();

    // Meanwhile: 16 enrolments (no client certificate) and their 16
    // Connect streams (node certificates) as they come, and 48 admin calls
    // at once, each on its own connection.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        // Enrolments from one address are rate-limited; 16 stay within
        // the burst.
        let n = TestNode::enroll(&s, &token, &format!("n{i}"), &[]).await;
        tasks.spawn(async move {
            let (_tx, mut stream) = n.connect(Vec::new()).await.expect("Connect");
            // Authorised by its certificate: the first desired state comes.
            next_desired(&mut stream).await;
        });
    }
    for _ in 0..48 {
        let (url, ca, cert, key) = (
            s.url(),
            conf.ca_cert.clone(),
            conf.client_cert.clone(),
            conf.client_key.clone(),
        );
        tasks.spawn(async move {
            let ch = lks_e2e::server::channel(&url, &ca, Some((&cert, &key))).await;
            let r = pb::admin_service_client::AdminServiceClient::new(ch)
                .list_clusters(pb::ListClustersRequest {})
                .await
                .expect("an admin call over its own connection");
            assert_eq!(r.into_inner().clusters.len(), 1);
        });
    }
    let mut served = 0;
    while let Some(r) = tasks.join_next().await {
        r.expect("a client failed");
        served += 1;
    }
    assert_eq!(served, 64);
    for (c, _) in &quiet {
        assert!(
            still_open(c),
            "every client was served while the silent ones still held their slots"
        );
    }

    for (c, since) in quiet {
        let after = closed_after(c, since);
        assert!(
            after >= Duration::from_millis(7500),
            "closed after {after:?}, before the 8 s handshake timeout"
        );
    }
    assert!(
        metric(&s, "lks_tls_handshakes_total{result=\"ok\"}") >= 16 + 16 + 48,
        "{}",
        s.http_get("/metrics")
    );
    // The server closes a connection as its handshake times out and counts
    // it just after: the client may see the close first.
    counted(&s, "lks_tls_handshakes_total{result=\"timeout\"}", 2);
    assert_eq!(metric(&s, "lks_tls_handshakes_total{result=\"shed\"}"), 0);
    assert_eq!(metric(&s, "lks_tls_handshakes_queued"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_waited_longer_than_the_queue_timeout_is_closed_unhandshaken() {
    let s = Server::start_with(&[
        "--max-tls-handshakes",
        "1",
        "--tls-handshake-timeout",
        "10s",
        "--tls-handshake-queue-timeout",
        "2s",
    ]);
    let conf = s.admin_conf();
    // The harness's readiness probe (a TCP connect, then close) is a
    // connection too: let it finish (it fails its handshake at once) and be
    // counted before the hog arrives, and count only what comes after.
    // Nothing queued or in progress is not enough: the probe may still wait
    // in the accept backlog, and be shed behind the hog (seen once).
    lks_e2e::wait_until(
        Duration::from_secs(10),
        "the readiness probe's handshake to end",
        || {
            let ended: u64 = ["ok", "shed", "timeout", "failed"]
                .iter()
                .map(|r| metric(&s, &format!("lks_tls_handshakes_total{{result=\"{r}\"}}")))
                .sum();
            ended >= 1
                && metric(&s, "lks_tls_handshakes_queued") == 0
                && metric(&s, "lks_tls_handshakes_in_progress") == 0
        },
    );
    let shed_before = metric(&s, "lks_tls_handshakes_total{result=\"shed\"}");
    let (hog, hog_since) = silent(&s);
    // Give the server a moment to admit the silent connection first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let shed = try_channel(&s, Some((&conf.client_cert, &conf.client_key))).await;
    assert!(shed.is_err(), "the only slot is held: this one is shed");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "closed after {waited:?}, before the 2 s queue timeout"
    );
    assert!(still_open(&hog), "the silent client still holds the slot");
    assert_eq!(
        metric(&s, "lks_tls_handshakes_total{result=\"shed\"}"),
        shed_before + 1
    );
    assert_eq!(metric(&s, "lks_tls_handshakes_in_progress"), 1);

    let after = closed_after(hog, hog_since);
    assert!(after >= Duration::from_millis(9500), "closed after {after:?}");
    let ch = try_channel(&s, Some((&conf.client_cert, &conf.client_key)))
        .await
        .expect("the slot is free again");
    pb::admin_service_client::AdminServiceClient::new(ch)
        .list_clusters(pb::ListClustersRequest {})
        .await
        .expect("served");
    counted(&s, "lks_tls_handshakes_total{result=\"timeout\"}", 1);
    assert_eq!(metric(&s, "lks_tls_handshakes_in_progress"), 0);
}
