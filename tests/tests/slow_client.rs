//! Slow and stalled clients of the agent package endpoint (issue
//! [reliability] item 4): the server offers at most 64 downloads at once,
//! so clients that read slowly or stop reading must not keep new VMs from
//! their agent. With `--agent-package-deadline 8s`:
//!
//! - 64 clients (each from its own 127.0.1.x address, as VMs behind their
//!   own addresses) start a download and never read it: every slot taken,
//!   a 65th VM is told to retry (503); at the deadline the slots are given
//!   back and the 65th downloads the whole package;
//! - a client reading a frame every 0.5 s (the package needs a minute that way)
//!   is cut at the deadline with an error, never handed a short file that
//!   ends cleanly.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use lks_e2e::server::Server;

const SLOTS: usize = 64;
const SIZE: usize = 2 << 20;

fn client(ca_pem: &str, local: IpAddr) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .https_only(true)
        .local_address(local)
        // HTTP/2 flow control as a slow VM's would be: the server can be
        // at most 64 KiB ahead of what the client read (hyper's client
        // default lets 2 MiB, the whole package here, go out at once).
        .http2_initial_stream_window_size(65_535)
        .http2_initial_connection_window_size(65_535)
        .build()
        .unwrap()
}

fn metric(s: &Server, result: &str) -> u64 {
    s.metric(&format!(
        "lks_agent_package_requests_total{{result=\"{result}\"}}"
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_stalled_package_downloads_are_cut_at_the_deadline_and_free_their_slots() {
    let files = tempfile::tempdir().unwrap();
    let mut bytes = b"!<arch>\ndebian-binary   ".to_vec();
    bytes.extend((0..SIZE).map(|i| (i as u8).wrapping_mul(13)));
    let deb = files.path().join("lksadmin-agent_1.0.0-1_amd64.deb");
    std::fs::write(&deb, &bytes).unwrap();
    let s = Server::start_with(&[
        "--agent-package",
        deb.to_str().unwrap(),
        "--agent-package-deadline",
        "8s",
    ]);
    let ca = s.admin_conf().ca_cert;
    let url = format!("{}/v1/agent-package/amd64", s.url());
    let ip = |i: usize| -> IpAddr { format!("127.0.1.{}", i + 1).parse().unwrap() };
    let t0 = Instant::now();

    // Every slot taken by a client that reads nothing.
    let mut stalled = Vec::new();
    for i in 0..SLOTS {
        let r = client(&ca, ip(i)).get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "stalled client {i}");
        stalled.push(r);
    }
    let late = client(&ca, ip(SLOTS));
    let busy = late.get(&url).send().await.unwrap();
    assert_eq!(busy.status(), 503, "every slot is taken");
    assert!(
        t0.elapsed() < Duration::from_secs(7),
        "taking the 64 slots took longer than the deadline: nothing proved"
    );

    // A slow reader, from its own address.
    let slow_started = Instant::now();
    let slow = tokio::spawn({
        let c = client(&ca, ip(SLOTS + 1));
        let url = url.clone();
        async move {
            // Its request waits for a slot: retried until one is free.
            let mut r = loop {
                let r = c.get(&url).send().await.unwrap();
                if r.status() == 200 {
                    break r;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let mut got = 0;
            loop {
                match r.chunk().await {
                    Ok(Some(c)) => got += c.len(),
                    Ok(None) => return (got, None),
                    Err(e) => return (got, Some(e.to_string())),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });

    // At the deadline the stalled clients' slots come back.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let r = late.get(&url).send().await.unwrap();
        if r.status() == 200 {
            break r.bytes().await.unwrap();
        }
        assert!(Instant::now() < deadline, "the slots never came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let freed_after = t0.elapsed();
    assert_eq!(
        body.as_ref(),
        bytes.as_slice(),
        "the late VM got the whole package"
    );

    let (slow_got, slow_err) = slow.await.unwrap();
    let slow_secs = slow_started.elapsed().as_secs_f64();
    let err = slow_err.expect("the slow download ends with an error, not a clean short end");
    assert!(slow_got < bytes.len(), "cut before the end: {slow_got}");
    assert!(
        slow_secs < 30.0,
        "cut near its deadline, not after {slow_secs:.1}s"
    );
    drop(stalled);

    let reclaimed = metric(&s, "slot_reclaimed");
    let cut = metric(&s, "deadline");
    assert!(reclaimed >= SLOTS as u64, "{reclaimed}");
    assert!(cut >= 1, "{cut}");
    println!(
        "RESFAULT package-download-slow-and-stalled-clients: stalled_clients={SLOTS} slots={SLOTS} \
         late_vm_refused_while_full=1 slots_back_after_s={:.1} late_vm_whole_file=1 slow_reader_cut=1 \
         slow_reader_bytes={slow_got}/{} short_file_ended_clean=0 slot_reclaimed={reclaimed} deadline_cuts={cut} \
         error=\"{}\"",
        freed_after.as_secs_f64(),
        bytes.len(),
        err.replace('"', "'")
    );
}
