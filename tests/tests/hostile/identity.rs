//! Foreign, forged, expired and other nodes' certificates; an enrolment flood.

use super::*;

// ---- certificates: foreign, forged, expired, another node's -------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_forged_expired_and_other_nodes_certificates_are_refused() {
    let start = Instant::now();
    // Server A issues 2 s certificates until it restarts: one node keeps
    // such a certificate, signed by A's own CA, and lets it expire.
    let mut a = Server::start_with(&["--node-cert-ttl", "2s"]);
    a.create_cluster("tenant-a");
    let expiring = TestNode::enroll(&a, &a.token("tenant-a", &[]), "expiring", &[]).await;
    let enrolled_at = Instant::now();
    a.set_args(&[]);
    a.restart();
    let pid = a.pid();
    let b = Server::start();
    b.create_cluster("tenant-a");
    let ta = a.token("tenant-a", &[]);
    let a1 = TestNode::enroll(&a, &ta, "a1", &[("role", "web")]).await;
    let a2 = TestNode::enroll(&a, &ta, "a2", &[("role", "db")]).await;
    // The same cluster and node name enrolled on another control plane.
    let b_a1 = TestNode::enroll(&b, &b.token("tenant-a", &[]), "a1", &[]).await;

    let (rollout, secret) = a_bundle_only_a2_holds(&a, &a2).await;

    let mut outcomes: Vec<(&str, Result<(), String>)> = Vec::new();
    let left = Duration::from_millis(3500).saturating_sub(enrolled_at.elapsed());
    tokio::time::sleep(left).await;
    foreign_forged_and_expired_certificates_are_refused(&a, &b, &expiring, &b_a1, &secret, &mut outcomes)
        .await;
    let (desired, tx, st) = a1_fetches_and_claims_a2s_bundle(&a1, &secret, &mut outcomes).await;
    drop((tx, st));
    let r = a.lksctl_json(&["rollout", "status", &rollout]);
    let list = a.lksctl_json(&["node", "list"]);
    let a2_state = node_json(&list, "a2")["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "dbsecret")
        .map(|b| b["state"].as_str().unwrap_or_default().to_string());
    let claim_counted = r["updated"].as_u64() != Some(0) || a2_state.as_deref() == Some("applied");
    // What a1 said about itself is recorded as a1's word, on a1 only.
    let a1_claim_recorded = node_json(&list, "a1")["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["name"] == "dbsecret");
    let written = stored_beyond(&a, 1, 1, 3);

    let leaked: usize = desired
        .bundles
        .iter()
        .filter(|b| b.manifest.as_ref().is_some_and(|m| m.name == "dbsecret"))
        .count();
    let serving = serves_others(&mut a, pid, &a2).await;
    let panics = panics_in(&a.log()) + panics_in(&b.log());
    let refused = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    let accepted = outcomes.len() - refused;
    println!(
        "HOSTILE certificates: tried={} refused={refused} accepted={accepted} claim_counted={} \
         claim_recorded_on_a1={} leaked={leaked} written={written} panics={panics} server_serving_others={} \
         secs={:.1}",
        outcomes.len(),
        u8::from(claim_counted),
        u8::from(a1_claim_recorded),
        u8::from(serving),
        start.elapsed().as_secs_f64()
    );
    for (what, r) in &outcomes {
        eprintln!("  {what}: {r:?}");
    }
    assert_eq!(accepted, 0, "{outcomes:?}");
    assert_eq!(refused, 7);
    assert!(
        !claim_counted,
        "a1's claim moved a2's bundle or the rollout: {r} {list}"
    );
    assert_eq!(a2_state.as_deref(), Some("pending"), "{list}");
    // a1's word about itself stays on a1's record, where it grants nothing
    // (blobs follow assignments, rollouts count assigned nodes).
    assert!(a1_claim_recorded, "{list}");
    assert_eq!((leaked, written, panics), (0, 0, 0));
    assert!(serving);
}

/// A bundle only a2 holds (rolled out to role=db, offline nodes
/// waited for), whose blob a2 may fetch. Returns the rollout ID and the
/// blob's digest.
async fn a_bundle_only_a2_holds(a: &Server, a2: &TestNode) -> (String, String) {
    let dir = a.write_bundle(
        "db",
        "dbsecret",
        "1",
        &[("/etc/db/password", b"hunter2-for-a2-only", "0600")],
    );
    a.publish(&dir);
    let rollout = a.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "dbsecret@1",
        "--selector",
        "role=db",
        "--offline",
        "wait",
    ]);
    let rollout = rollout.trim().to_string();
    let secret = Digest::of(b"hunter2-for-a2-only").to_string();
    a2.fetch_blob(&secret, 0)
        .await
        .expect("a2 may fetch its own blob");
    (rollout, secret)
}

/// The expired certificate, another control plane's node certificate, a
/// forged CA's and a self-signed one, and the other control plane's
/// admin certificate, each against server A.
async fn foreign_forged_and_expired_certificates_are_refused(
    a: &Server,
    b: &Server,
    expiring: &TestNode,
    b_a1: &TestNode,
    secret: &str,
    outcomes: &mut Vec<(&'static str, Result<(), String>)>,
) {
    let ca = a.admin_conf().ca_cert;
    let url = a.url();
    outcomes.push((
        "expired-node-cert",
        try_node_calls(&url, &ca, &expiring.cert_pem, &expiring.key_pem, secret).await,
    ));
    outcomes.push((
        "other-control-plane-node-cert",
        try_node_calls(&url, &ca, &b_a1.cert_pem, &b_a1.key_pem, secret).await,
    ));
    let (fc, fk) = forged_node_cert("tenant-a", "a2", true);
    outcomes.push((
        "forged-ca-node-cert",
        try_node_calls(&url, &ca, &fc, &fk, secret).await,
    ));
    let (sc, sk) = forged_node_cert("tenant-a", "a2", false);
    outcomes.push((
        "self-signed-node-cert",
        try_node_calls(&url, &ca, &sc, &sk, secret).await,
    ));
    // The other control plane's admin certificate against this one.
    let (_, bcert, bkey) = admin_identity(b);
    let b_admin = match try_channel(&url, &ca, Some((&bcert, &bkey))).await {
        Err(e) => Err(e),
        Ok(ch) => match pb::admin_service_client::AdminServiceClient::new(ch)
            .list_nodes(pb::ListNodesRequest::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("{:?}", e.code())),
        },
    };
    outcomes.push(("other-control-plane-admin-cert", b_admin));
}

/// a1's own, valid certificate used for a2's blob, then a1 claims a2's
/// bundle and fetches again. Returns what a1 was sent and its stream.
async fn a1_fetches_and_claims_a2s_bundle(
    a1: &TestNode,
    secret: &str,
    outcomes: &mut Vec<(&'static str, Result<(), String>)>,
) -> (
    pb::DesiredState,
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ServerMessage>,
) {
    let e = a1
        .fetch_blob(secret, 0)
        .await
        .map(drop)
        .map_err(|e| format!("{:?}", e.code()));
    outcomes.push(("a1-fetches-a2-blob", e));
    let claim = pb::BundleStatus {
        fetched_from_server: 0,
        fetched_from_peers: 0,
        fetched_as_delta: 0,
        name: "dbsecret".into(),
        version: "1".into(),
        state: pb::BundleState::Applied as i32,
        message: "a1 says it holds a2's bundle".into(),
        updated_at_ms: 0,
    };
    let (tx, mut st) = a1.connect(vec![claim.clone()]).await.expect("a1 connects");
    let desired = next_desired(&mut st).await;
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Status(pb::StatusReport {
            generation: desired.generation,
            bundles: vec![claim],
            trust: None,
            reboot: None,
        })),
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still_denied = a1
        .fetch_blob(secret, 0)
        .await
        .map(drop)
        .map_err(|e| format!("{:?}", e.code()));
    outcomes.push(("a1-claims-a2-bundle-then-fetches", still_denied));
    (desired, tx, st)
}

// ---- a flood of enrolments ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrolment_flood_is_rate_limited_and_stores_nothing() {
    let start = Instant::now();
    let mut s = Server::start();
    let pid = s.pid();
    s.create_cluster("tenant-a");
    let steady = TestNode::enroll(&s, &s.token("tenant-a", &[]), "steady", &[]).await;
    let dir = s.write_bundle("keep", "keep", "1", &[("/etc/keep", b"kept", "0644")]);
    s.publish(&dir);
    s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "keep@1",
        "--offline",
        "wait",
    ]);
    let (_steady_tx, mut steady_stream) = steady.connect(vec![]).await.expect("steady connects");
    next_desired(&mut steady_stream).await;
    let valid = s.token("tenant-a", &["--uses", "3"]);

    let mut set = a_flood_of_400_enrolments_from_one_address(&s, &valid).await;
    // Meanwhile: another peer enrols, the steady node downloads and keeps its stream.
    let elsewhere = channel_from(&s, "127.0.0.3".parse().unwrap()).await;
    let (csr3, _) = make_csr(&["n"]);
    let other_enrol = AgentServiceClient::new(elsewhere)
        .enroll(pb::EnrollRequest {
            token: s.token("tenant-a", &[]),
            node_name: "other-peer".into(),
            csr_pem: csr3,
            labels: Default::default(),
        })
        .await;
    let fetched = steady.fetch_blob(&Digest::of(b"kept").to_string(), 0).await;

    let Flood {
        ok,
        limited,
        refused_token,
        hinted,
        other_codes,
    } = count_the_flood_answers(&mut set).await;
    let Nat {
        tries: nat_tries,
        limited: nat_limited,
        retried: nat_retried,
        joined: nat_joined,
        stderr: nat_stderr,
    } = a_join_behind_a_flooding_nat_address(&s).await;

    let stream_alive = tokio::time::timeout(Duration::from_millis(200), steady_stream.message())
        .await
        .map_or(true, |m| matches!(m, Ok(Some(_))));
    let nodes = s.lksctl_json(&["node", "list"]);
    let stored = nodes.as_array().unwrap().len();
    let flood_nodes = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["name"].as_str().unwrap_or_default().starts_with("flood-"))
        .count();
    let serving = serves_others(&mut s, pid, &steady).await;
    let metrics = s.http_get("/metrics");
    let panics = panics_in(&s.log());
    println!(
        "HOSTILE enrolment-flood: tried=400 refused={} rate_limited={limited} retry_hint={hinted} \
         bad_token={refused_token} enrolled_within_token_uses={ok} token_uses=3 written={} other_peer_enrolled={} \
         nat_flood_tries={nat_tries} nat_flood_limited={nat_limited} nat_join_waits={nat_retried} \
         nat_join_ok={} steady_stream_kept={} steady_fetch_ok={} panics={panics} server_serving_others={} \
         secs={:.1}",
        limited + refused_token,
        flood_nodes.saturating_sub(ok),
        u8::from(other_enrol.is_ok()),
        u8::from(nat_joined),
        u8::from(stream_alive),
        u8::from(fetched.is_ok()),
        u8::from(serving),
        start.elapsed().as_secs_f64()
    );
    assert!(other_codes.is_empty(), "{other_codes:?}");
    assert!(
        limited >= 300,
        "a burst of 20 and 5/s cannot let most of 400 through: {limited}"
    );
    assert_eq!(hinted, limited, "every rate-limited answer says when to retry");
    assert_eq!(ok + limited + refused_token, 400);
    assert!(ok <= 3, "the valid token has 3 uses");
    assert_eq!(flood_nodes, ok, "only accepted enrolments are stored");
    assert_eq!(stored, 3 + ok, "{nodes}");
    assert!(
        nat_limited > 0 && nat_limited < nat_tries,
        "{nat_limited} of {nat_tries}"
    );
    assert!(
        nat_retried >= 1,
        "the join behind the flood was rate-limited: {nat_stderr}"
    );
    assert!(
        nat_joined,
        "the join behind the flood waited and joined: {nat_stderr}"
    );
    assert!(other_enrol.is_ok(), "another peer still enrols: {other_enrol:?}");
    assert!(fetched.is_ok() && stream_alive && serving);
    assert_eq!(panics, 0);
    assert!(
        metrics.contains("lks_enrollments_total{result=\"rate_limited\"}"),
        "{metrics}"
    );
}

/// The enrolment answers of the flood.
type Answers = tokio::task::JoinSet<Result<tonic::Response<pb::EnrollResponse>, tonic::Status>>;

/// 400 attempts from 127.0.0.2: bad tokens, malformed ones and (1 in 10)
/// the valid 3-use token with a fresh name each.
async fn a_flood_of_400_enrolments_from_one_address(s: &Server, valid: &str) -> Answers {
    let flood = channel_from(s, "127.0.0.2".parse().unwrap()).await;
    let (csr, _) = make_csr(&["n"]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..400 {
        let mut c = AgentServiceClient::new(flood.clone());
        let token = match i % 10 {
            0 => valid.to_string(),
            1 => "not-a-token".to_string(),
            _ => format!("{:06}.0123456789abcdef", i),
        };
        let csr = csr.clone();
        set.spawn(async move {
            c.enroll(pb::EnrollRequest {
                token,
                node_name: format!("flood-{i}"),
                csr_pem: csr,
                labels: Default::default(),
            })
            .await
        });
    }
    set
}

/// The flood's answers, counted.
struct Flood {
    ok: usize,
    limited: usize,
    refused_token: usize,
    hinted: usize,
    /// Answers other than OK, rate-limited or a refused token.
    other_codes: Vec<String>,
}

/// Counts the flood's answers as they come in.
async fn count_the_flood_answers(set: &mut Answers) -> Flood {
    let (mut ok, mut limited, mut refused_token, mut hinted) = (0, 0, 0, 0);
    let mut other_codes = Vec::new();
    while let Some(r) = set.join_next().await {
        match r.expect("task") {
            Ok(_) => ok += 1,
            Err(e) if e.code() == Code::ResourceExhausted => {
                limited += 1;
                if e.message().contains("retry in") {
                    hinted += 1;
                }
            }
            Err(e) if matches!(e.code(), Code::Unauthenticated | Code::InvalidArgument) => refused_token += 1,
            Err(e) => other_codes.push(format!("{e:?}")),
        }
    }
    Flood {
        ok,
        limited,
        refused_token,
        hinted,
        other_codes,
    }
}

/// What the join behind a flooding NAT address saw.
struct Nat {
    tries: u32,
    limited: u32,
    retried: usize,
    joined: bool,
    stderr: String,
}

/// A real `lksadmin-agent join` from an address that keeps flooding, as
/// the VMs of a tenant network behind one NAT address share it: it is
/// rate-limited, waits and tries again once the flood is over.
async fn a_join_behind_a_flooding_nat_address(s: &Server) -> Nat {
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = stop.clone();
    let mut nat = AgentServiceClient::new(channel_from(s, "127.0.0.1".parse().unwrap()).await);
    let (csr_nat, _) = make_csr(&["n"]);
    let flooder = tokio::spawn(async move {
        let (mut tries, mut limited) = (0u32, 0u32);
        while !flooding.load(Ordering::Relaxed) {
            let r = nat
                .enroll(pb::EnrollRequest {
                    token: "abcdef.0123456789abcdef".into(),
                    node_name: "nat-flood".into(),
                    csr_pem: csr_nat.clone(),
                    labels: Default::default(),
                })
                .await;
            tries += 1;
            limited += u32::from(r.is_err_and(|e| e.code() == Code::ResourceExhausted));
        }
        (tries, limited)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let j = join_info(s, "tenant-a", &[]);
    let joining = tokio::task::spawn_blocking(move || {
        let agent = Agent::new("behind-nat");
        let out = agent.join_raw(&j.server, &j.token, &j.ca_cert_hash, &[]);
        (agent, out)
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (nat_tries, nat_limited) = flooder.await.expect("flooder");
    let (nat_agent, nat_out) = joining.await.expect("join");
    let nat_stderr = String::from_utf8_lossy(&nat_out.stderr).into_owned();
    let nat_retried = nat_stderr.matches("too many enrolment attempts").count();
    let nat_joined = nat_out.status.success() && nat_agent.has_identity();

    Nat {
        tries: nat_tries,
        limited: nat_limited,
        retried: nat_retried,
        joined: nat_joined,
        stderr: nat_stderr,
    }
}
