use super::*;

type Round = Result<u32, Result<BusyRound, JoinError>>;

fn busy(reason: &str, retry_after: Option<Duration>) -> BusyRound {
    BusyRound {
        reasons: vec![reason.to_string()],
        retry_after,
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_limited_round_is_retried_until_it_passes() {
    let mut n = 0;
    let r = retry_while_busy(
        Duration::from_secs(300),
        Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
        || {
            n += 1;
            let out: Round = if n < 4 { Err(Ok(busy("busy", None))) } else { Ok(n) };
            async move { out }
        },
    )
    .await;
    assert_eq!(r.unwrap(), 4, "three busy rounds, then the fourth passes");
}

#[tokio::test(start_paused = true)]
async fn a_busy_servers_retry_hint_is_waited_at_least() {
    let hinted = lks_proto::backoff::with_retry_hint(
        tonic::Status::resource_exhausted("too many enrolment attempts"),
        Duration::from_secs(7),
    );
    let Attempt::Busy(_, hint) = enrol_failed("https://a:1", &hinted) else {
        panic!("rate limiting is retried");
    };
    assert_eq!(hint, Some(Duration::from_secs(7)));
    let mut at = Vec::new();
    let started = tokio::time::Instant::now();
    let r = retry_while_busy(
        Duration::from_secs(300),
        Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
        || {
            at.push(started.elapsed());
            let out: Round = if at.len() < 3 {
                Err(Ok(busy("busy", hint)))
            } else {
                Ok(0)
            };
            async move { out }
        },
    )
    .await;
    assert!(r.is_ok());
    for w in at.windows(2) {
        let gap = w[1] - w[0];
        // The backoff alone would be 1 s and 1.6 s (±20 %).
        assert!(
            gap >= Duration::from_secs(7) && gap <= Duration::from_secs(9),
            "waited {gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn rate_limiting_ends_at_the_deadline_and_refusals_at_once() {
    let started = tokio::time::Instant::now();
    let r = retry_while_busy(
        Duration::from_secs(60),
        Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
        || async { Err::<u32, _>(Ok(busy("https://a:1: too many enrolment attempts", None))) },
    )
    .await;
    let e = r.unwrap_err().to_string();
    assert!(e.starts_with("no enrolment after"), "{e}");
    assert!(e.contains("too many enrolment attempts"), "{e}");
    assert!(started.elapsed() <= Duration::from_secs(60));

    let mut n = 0;
    let r = retry_while_busy(
        Duration::from_secs(60),
        Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
        || {
            n += 1;
            async { Err::<u32, _>(Err(JoinError::BadToken(lks_proto::token::MalformedToken))) }
        },
    )
    .await;
    assert!(matches!(r, Err(JoinError::BadToken(_))));
    assert_eq!(n, 1, "a refusal is not retried");
}

#[test]
fn an_enrolment_without_an_answer_is_retried_and_a_refusal_is_not() {
    let retried = |s: tonic::Status| matches!(enrol_failed("https://a:1", &s), Attempt::Busy(..));
    // The server killed mid-call: tonic makes the status from the
    // transport error, so it has a source.
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
    assert!(retried(tonic::Status::from_error(Box::new(io))));
    for code in [
        tonic::Code::Unavailable,
        tonic::Code::Unknown,
        tonic::Code::Internal,
        tonic::Code::DeadlineExceeded,
        tonic::Code::ResourceExhausted,
    ] {
        assert!(retried(tonic::Status::new(code, "x")), "{code:?}");
    }
    for code in [
        tonic::Code::InvalidArgument,
        tonic::Code::PermissionDenied,
        tonic::Code::Unauthenticated,
        tonic::Code::AlreadyExists,
        tonic::Code::FailedPrecondition,
    ] {
        assert!(
            matches!(
                enrol_failed("https://a:1", &tonic::Status::new(code, "no")),
                Attempt::Final(JoinError::Refused { .. })
            ),
            "{code:?}"
        );
    }
}

#[test]
fn one_url_or_a_list_in_order() {
    assert_eq!(parse_servers("https://a:7443").unwrap(), ["https://a:7443"]);
    assert_eq!(
        parse_servers(" https://b:7443/ , a:7443,https://[::1]:7443").unwrap(),
        ["https://b:7443", "https://a:7443", "https://[::1]:7443"]
    );
}

#[test]
fn empty_items_duplicates_and_other_schemes_are_refused() {
    for (arg, want) in [
        ("", "no URL given"),
        (" ", "no URL given"),
        ("https://a:1,", "item 2 of \"https://a:1,\" is empty"),
        (",https://a:1", "item 1 of"),
        ("https://a:1,,https://b:1", "item 2 of"),
        ("https://a:1,https://b:1,a:1", "https://a:1 is listed twice"),
        ("https://a:1,https://a:1/", "https://a:1 is listed twice"),
        (
            "https://a:1,http://b:1",
            "http://b:1: invalid server URL: expected https://HOST[:PORT]",
        ),
    ] {
        let err = parse_servers(arg).unwrap_err().to_string();
        assert!(err.starts_with("invalid --server: "), "{arg:?}: {err}");
        assert!(err.contains(want), "{arg:?}: {err} lacks {want:?}");
        assert!(!err.contains('\n'), "{arg:?}: {err}");
    }
}

fn request(servers: &str, state: &Path, root: &Path) -> JoinRequest {
    JoinRequest {
        servers: servers.into(),
        token: "abcdef.0123456789abcdef".into(),
        ca_cert_hash: format!("sha256:{}", "ab".repeat(32)),
        node_name: Some("node-1".into()),
        labels: None,
        state_dir: state.to_path_buf(),
        root: root.to_path_buf(),
        trust_keys: Vec::new(),
        trust_threshold: None,
    }
}

/// A loopback URL nothing listens on (the port was free a moment ago).
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("https://{}", l.local_addr().unwrap())
}

#[tokio::test]
async fn a_bad_list_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let err = join(&request("https://a:1,https://a:1", &state, d.path()))
        .await
        .unwrap_err();
    assert!(matches!(err, JoinError::BadServer(_)), "{err}");
    assert!(!state.exists());
}

#[tokio::test]
async fn a_trust_threshold_beyond_the_distinct_keys_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let key = lks_proto::sign::SigningKey::generate().public().to_pem();
    let (a, b) = (d.path().join("a.pub"), d.path().join("b.pub"));
    std::fs::write(&a, &key).unwrap();
    std::fs::write(&b, &key).unwrap();
    for (keys, n, distinct) in [
        (vec![a.clone(), b.clone()], 2, 1),
        (vec![a.clone()], 0, 1),
        (vec![], 1, 0),
    ] {
        let mut req = request("https://a:1", &state, d.path());
        req.trust_keys = keys;
        req.trust_threshold = Some(n);
        let err = join(&req).await.unwrap_err();
        assert!(
            matches!(err, JoinError::BadTrustThreshold { threshold, keys } if threshold == n && keys == distinct),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'), "{err}");
        assert!(!state.exists());
    }
}

#[tokio::test]
async fn every_server_unreachable_is_one_error_naming_each() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state");
    let (a, b) = (dead_url(), dead_url());
    let err = join(&request(&format!("{a},{b}"), &state, d.path()))
        .await
        .unwrap_err();
    assert!(matches!(err, JoinError::Unreachable(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&a) && msg.contains(&b), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(!state.exists());
}
