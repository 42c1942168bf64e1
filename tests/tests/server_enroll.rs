//! Enrolment against a real control server: tokens, CSRs, identities,
//! duplicate names, revocation by `node delete`, renewal, rate limiting.
//! Every refused enrolment must leave nothing behind.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lks_e2e::one_line_error;
use lks_e2e::server::{Server, TestNode, enroll_raw, labels_of, make_csr, node_json};
use lks_proto::identity::{Identity, NodeIdentity, cert_info, pem_certs};
use lks_proto::pb;
use tonic::Code;

fn node_names(s: &Server) -> Vec<String> {
    s.lksctl_json(&["node", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect()
}

/// A CSR whose subject and SANs claim other identities.
fn forged_csr() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
    for uri in ["urn:lks:admin:admin", "urn:lks:node:tenant-b:victim"] {
        p.subject_alt_names
            .push(rcgen::SanType::URI(uri.try_into().unwrap()));
    }
    p.distinguished_name.push(rcgen::DnType::CommonName, "admin");
    (
        p.serialize_request(&key).unwrap().pem().unwrap(),
        key.serialize_pem(),
    )
}

/// Flips one base64 character inside the signature of a PEM CSR.
fn break_signature(pem: &str) -> String {
    let lines: Vec<&str> = pem.lines().collect();
    let body_last = lines.len() - 2;
    let mut target = body_last;
    if lines[target].len() < 8 {
        target -= 1;
    }
    let mut line: Vec<u8> = lines[target].bytes().collect();
    let i = line.len() / 2;
    line[i] = if line[i] == b'A' { b'B' } else { b'A' };
    let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    out[target] = String::from_utf8(line).unwrap();
    out.join("\n") + "\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolment_issues_a_server_chosen_identity() {
    let s = Server::start_with(&["--node-cert-ttl", "2h"]);
    s.create_cluster("tenant-a");
    s.create_cluster("tenant-b");
    let token = s.token("tenant-a", &["--labels", "role=worker"]);
    let (csr, key) = forged_csr();
    let r = enroll_raw(&s, &token, "w1", &csr, &[("zone", "z1"), ("role", "admin")])
        .await
        .expect("enrol");
    assert_eq!((r.node_name.as_str(), r.cluster.as_str()), ("w1", "tenant-a"));
    assert_eq!(r.ca_pem.trim(), s.admin_conf().ca_cert.trim());
    let der = &pem_certs(&r.certificate_pem).unwrap()[0];
    // Names in the CSR are not trusted: the identity is the server's choice.
    assert_eq!(
        Identity::from_cert_der(der).unwrap(),
        Identity::Node(NodeIdentity::new("tenant-a", "w1").unwrap())
    );
    let info = cert_info(der).unwrap();
    assert!(!info.is_ca);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!(
        (info.not_after - now - 7200).abs() < 60,
        "--node-cert-ttl 2h honoured"
    );
    assert_eq!(r.expires_at, info.not_after);

    // Token labels win over the labels the node asked for.
    let list = s.lksctl_json(&["node", "list"]);
    let n = node_json(&list, "w1");
    assert_eq!(n["cluster"], "tenant-a");
    let labels = labels_of(n);
    assert_eq!(labels["role"], "worker");
    assert_eq!(labels["zone"], "z1");
    assert_eq!(n["connected"], false);
    assert!(n["last_seen"].is_null());
    assert_eq!(n["bundles"], serde_json::json!([]));
    assert_eq!(
        s.lksctl_json(&["node", "get", "w1"])["certificate_serial"],
        info.serial.as_str()
    );
    // The node landed in its token's cluster only.
    assert_eq!(
        s.lksctl_json(&["node", "list", "--cluster", "tenant-b"]),
        serde_json::json!([])
    );

    // The issued certificate works for the agent API and not for the admin API.
    let node = TestNode {
        name: "w1".into(),
        cluster: "tenant-a".into(),
        cert_pem: r.certificate_pem,
        key_pem: key,
        ca_pem: r.ca_pem,
        url: s.url(),
        features: Vec::new(),
        architecture: String::new(),
        trust: None,
    };
    node.connect(vec![]).await.expect("node certificate accepted");
    let mut admin = pb::admin_service_client::AdminServiceClient::new(node.channel().await);
    let e = admin
        .create_cluster(pb::CreateClusterRequest {
            name: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("admin"), "{e:?}");
    let e = admin
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(!s.lksctl_ok(&["cluster", "list"]).contains("\nx "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_and_store_nothing() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let (csr, _) = make_csr(&["n"]);

    let e = enroll_raw(&s, "not-a-token", "n1", &csr, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("invalid bootstrap token"), "{e:?}");

    let e = enroll_raw(&s, "abcdef.0123456789abcdef", "n1", &csr, &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("unknown"), "{e:?}");

    // The right id with a wrong secret looks exactly like an unknown token.
    let good = s.token("tenant-a", &[]);
    let (id, _) = good.split_once('.').unwrap();
    let e = enroll_raw(&s, &format!("{id}.0000000000000000"), "n1", &csr, &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("unknown"), "{e:?}");

    let short = s.token("tenant-a", &["--ttl", "1s"]);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let e = enroll_raw(&s, &short, "n1", &csr, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("expired"), "{e:?}");

    let once = s.token("tenant-a", &["--uses", "1"]);
    let e = enroll_raw(&s, &once, "Bad_Name", &csr, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "bad node name");
    let e = enroll_raw(&s, &once, "n1", &csr, &[("bad key!", "v")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "bad label");
    let e = enroll_raw(
        &s,
        &once,
        "n1",
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "garbage CSR");
    // A CSR whose signature does not verify (the key does not match it).
    let e = enroll_raw(&s, &once, "n1", &break_signature(&csr), &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("certificate signing request"), "{e:?}");
    assert!(node_names(&s).is_empty(), "refused joins store nothing");

    // None of the refusals used up the single use.
    enroll_raw(&s, &once, "n1", &csr, &[]).await.expect("first use");
    let (csr2, _) = make_csr(&["n2"]);
    let e = enroll_raw(&s, &once, "n2", &csr2, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("no uses left"), "{e:?}");
    assert_eq!(node_names(&s), ["n1"]);

    let m = s.http_get("/metrics");
    assert!(m.contains("lks_enrollments_total{result=\"ok\"} 1"), "{m}");
    assert!(
        m.contains("lks_enrollments_total{result=\"invalid_token\"}"),
        "{m}"
    );
    assert!(
        m.contains("lks_enrollments_total{result=\"expired_token\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_enrols_into_its_own_cluster_only() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    s.create_cluster("tenant-b");
    let ta = s.token("tenant-a", &[]);
    let tb = s.token("tenant-b", &[]);
    let a = TestNode::enroll(&s, &ta, "a1", &[]).await;
    let b = TestNode::enroll(&s, &tb, "b1", &[]).await;
    assert_eq!(a.cluster, "tenant-a");
    assert_eq!(b.cluster, "tenant-b");
    let in_a = s.lksctl_json(&["node", "list", "--cluster", "tenant-a"]);
    assert_eq!(in_a.as_array().unwrap().len(), 1);
    assert_eq!(in_a[0]["name"], "a1");
    let clusters = s.lksctl_ok(&["cluster", "list"]);
    assert!(
        clusters
            .lines()
            .any(|l| l.starts_with("tenant-a") && l.contains(" 1 ")),
        "{clusters}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_names_and_revocation_by_delete() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &[]);
    let old = TestNode::enroll(&s, &t, "w1", &[]).await;
    let (_tx, mut stream) = old.connect(vec![]).await.expect("connect");

    let (csr, _) = make_csr(&["w1"]);
    let e = enroll_raw(&s, &t, "w1", &csr, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    assert!(e.message().contains("lksctl node delete w1"), "{e:?}");

    let out = s.lksctl_ok(&["node", "delete", "w1"]);
    assert!(out.contains("w1 deleted"), "{out}");
    // The open stream ends, and the old certificate no longer works.
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("stream ends after delete");
    assert!(end.is_err() || matches!(end, Ok(None)));
    let e = old.connect(vec![]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = old
        .fetch_blob(&lks_proto::Digest::of(b"x").to_string(), 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // The name is free again.
    let new = TestNode::enroll(&s, &t, "w1", &[]).await;
    new.connect(vec![]).await.expect("new certificate works");
    let e = old.connect(vec![]).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unauthenticated,
        "the old certificate stays revoked"
    );
    let ev = s.lksctl_ok(&["event", "list", "--node", "w1"]);
    assert!(ev.contains("enrolled") && ev.contains("deleted"), "{ev}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_supersedes_the_old_certificate() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &[]);
    let mut node = TestNode::enroll(&s, &t, "w1", &[]).await;
    let (csr, key) = make_csr(&["anything"]);
    let r = node
        .client()
        .await
        .renew_certificate(pb::RenewCertificateRequest { csr_pem: csr })
        .await
        .expect("renew")
        .into_inner();
    let der = &pem_certs(&r.certificate_pem).unwrap()[0];
    assert_eq!(
        Identity::from_cert_der(der).unwrap(),
        Identity::Node(NodeIdentity::new("tenant-a", "w1").unwrap())
    );
    let serial = cert_info(der).unwrap().serial;
    assert_eq!(
        s.lksctl_json(&["node", "get", "w1"])["certificate_serial"],
        serial.as_str()
    );
    let e = node.connect(vec![]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "old certificate superseded");
    node.cert_pem = r.certificate_pem;
    node.key_pem = key;
    node.connect(vec![]).await.expect("renewed certificate works");

    // Renewal needs a node certificate.
    let mut anon = pb::agent_service_client::AgentServiceClient::new(s.anonymous_channel().await);
    let (csr, _) = make_csr(&["x"]);
    let e = anon
        .renew_certificate(pb::RenewCertificateRequest { csr_pem: csr })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolment_is_rate_limited_per_peer() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let (csr, _) = make_csr(&["n"]);
    // Concurrent attempts over one connection: far more than the burst
    // arrives before the bucket can refill, however slow the machine.
    let ch = s.anonymous_channel().await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..60 {
        let mut c = pb::agent_service_client::AgentServiceClient::new(ch.clone());
        let csr = csr.clone();
        set.spawn(async move {
            c.enroll(pb::EnrollRequest {
                token: "abcdef.0123456789abcdef".into(),
                node_name: "n1".into(),
                csr_pem: csr,
                labels: Default::default(),
            })
            .await
        });
    }
    let mut limited = 0;
    while let Some(r) = set.join_next().await {
        let e = r.unwrap().unwrap_err();
        if e.code() == Code::ResourceExhausted {
            assert!(e.message().contains("too many enrolment attempts"), "{e:?}");
            limited += 1;
        } else {
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        }
    }
    assert!(limited > 0, "60 concurrent attempts must hit the limit");
    assert!(
        s.http_get("/metrics")
            .contains("lks_enrollments_total{result=\"rate_limited\"}")
    );
}

#[test]
fn lksctl_node_commands_show_enrolled_nodes() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    let t = s.token("tenant-a", &["--labels", "role=worker"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(TestNode::enroll(&s, &t, "w1", &[]));
    let table = s.lksctl_ok(&["node", "list"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("w1") && table.contains("role=worker"), "{table}");
    let text = s.lksctl_ok(&["node", "get", "w1"]);
    assert!(text.contains("Cluster:") && text.contains("tenant-a"), "{text}");
    let e = one_line_error(&s.lksctl(&["node", "get", "Bad_Name"]), "bad name");
    assert!(e.contains("invalid"), "{e}");
}
