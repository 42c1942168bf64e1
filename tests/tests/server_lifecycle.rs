//! The control server as a process: first start, restarts (graceful and
//! kill -9), its identity and files, health, reflection and metrics.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use lks_e2e::server::{RawCodec, Server, TestNode, bundle_ids, next_desired};
use lks_e2e::{bin, free_addr, run};
use tonic::Code;

fn ca_hash(s: &Server) -> String {
    s.lksctl_json(&["token", "create", "--cluster", "tenant-a"])["ca_cert_hash"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Sets up a cluster, a node, a bundle and a rollout; returns the node and rollout ID.
async fn populate(s: &Server) -> (TestNode, String) {
    s.create_cluster("tenant-a");
    let n = TestNode::enroll(s, &s.token("tenant-a", &[]), "w1", &[]).await;
    let b = s.write_bundle("b", "demo", "1", &[("/etc/demo", b"demo", "0644")]);
    s.publish(&b);
    // w1 has no stream open: it is assigned while offline (`wait`).
    let id = s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        "demo@1",
        "--offline",
        "wait",
    ]);
    (n, id.trim().to_string())
}

async fn assert_state_survived(s: &Server, n: &TestNode, id: &str, hash: &str) {
    assert_eq!(ca_hash(s), hash, "same CA after restart");
    let nodes = s.lksctl_json(&["node", "list"]);
    assert_eq!(nodes[0]["name"], "w1");
    assert_eq!(nodes[0]["bundles"][0]["version"], "1");
    assert_eq!(s.lksctl_json(&["bundle", "list"])[0]["name"], "demo");
    assert_eq!(s.lksctl_json(&["rollout", "status", id])["id"], id);
    let (_tx, mut st) = n.connect(vec![]).await.expect("node certificate still valid");
    assert_eq!(bundle_ids(&next_desired(&mut st).await), ["demo@1"]);
    let (data, _) = n
        .fetch_blob(&lks_proto::Digest::of(b"demo").to_string(), 0)
        .await
        .expect("blob survived");
    assert_eq!(data, b"demo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_keeps_everything() {
    let mut s = Server::start();
    let (n, id) = populate(&s).await;
    let hash = ca_hash(&s);
    let conf = std::fs::read_to_string(s.admin_conf_path()).unwrap();
    let (_tx, mut st) = n.connect(vec![]).await.unwrap();
    next_desired(&mut st).await;

    let code = s.restart();
    assert_eq!(code, Some(0), "SIGTERM exits cleanly and promptly:\n{}", s.log());
    // The connected agent was told to go away rather than left hanging.
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match st.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("stream ended at shutdown");
    if let Err(e) = end {
        assert!(
            matches!(e.code(), Code::Unavailable | Code::Unknown | Code::Cancelled),
            "{e:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(s.admin_conf_path()).unwrap(),
        conf,
        "admin.conf reused"
    );
    assert!(s.log().contains("ca_cert_hash"), "the CA hash is logged");
    assert_state_survived(&s, &n, &id, &hash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_committed() {
    let mut s = Server::start();
    let (n, id) = populate(&s).await;
    let hash = ca_hash(&s);
    s.kill9();
    s.start_again();
    assert_state_survived(&s, &n, &id, &hash).await;
    // Nodes are not shown connected by a server that just started.
    assert_eq!(s.lksctl_json(&["node", "list"])[0]["connected"], false);
}

#[test]
fn files_are_private_and_advertise_address_changes_only_the_serving_cert() {
    let mut s = Server::start_with(&["--advertise-address", "127.0.0.1"]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.admin_conf_path()), 0o600);
    assert_eq!(mode(&s.data_dir.join("pki/ca.key")), 0o600);
    assert_eq!(mode(&s.data_dir), 0o700);
    s.create_cluster("tenant-a");
    let hash = ca_hash(&s);
    assert_eq!(s.admin_conf().server, s.url());
    let server_crt = std::fs::read(s.data_dir.join("pki/server.crt")).unwrap();

    s.set_args(&["--advertise-address", "lks.test"]);
    s.restart();
    assert_eq!(
        s.admin_conf().server,
        format!("https://lks.test:{}", s.addr.port())
    );
    assert_ne!(
        std::fs::read(s.data_dir.join("pki/server.crt")).unwrap(),
        server_crt,
        "serving certificate re-issued for the new name"
    );
    // The new certificate still carries 127.0.0.1; dial that with a copy of
    // admin.conf (lks.test does not resolve here).
    let text = std::fs::read_to_string(s.admin_conf_path()).unwrap();
    let local = s.work_dir().join("local.conf");
    std::fs::write(&local, text.replace("https://lks.test:", "https://127.0.0.1:")).unwrap();
    let mut cmd = Command::new(bin("lksctl"));
    cmd.arg("--config")
        .arg(&local)
        .args(["token", "create", "--cluster", "tenant-a", "-o", "json"]);
    let out = run(cmd);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        j["ca_cert_hash"],
        hash.as_str(),
        "the CA and its pin did not change"
    );
    assert!(
        j["join_command"]
            .as_str()
            .unwrap()
            .contains("--server https://lks.test:"),
        "{j}"
    );
}

#[test]
fn bad_flags_and_busy_ports_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"])
        .arg(dir.path())
        .args(["--node-cert-ttl", "forever"]);
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));

    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"]).arg(dir.path()).args(["--store", "etcd"]);
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--store etcd needs --etcd-endpoints"));
    assert!(
        !dir.path().join("admin.conf").exists(),
        "nothing created for a refused start"
    );

    // An etcd nobody answers at: one line, non-zero exit, no credentials.
    let dead = lks_e2e::free_addr();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--store", "etcd", "--etcd-endpoints"])
        .arg(format!("http://{dead}"));
    let out = run(cmd);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: open store: store unavailable: etcd at http://127.0.0.1:"),
        "{err}"
    );
    assert!(!dir.path().join("admin.conf").exists());

    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"])
        .arg(dir.path())
        .args(["--etcd-endpoints", "http://127.0.0.1:2379"]);
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("need --store etcd"));

    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"])
        .arg(dir.path())
        .args(["--encryption-key-file", "/nonexistent"]);
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--encryption-key-file applies to keys kept in etcd")
    );

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"])
        .arg(dir.path())
        .args(["--listen", &busy.local_addr().unwrap().to_string()]);
    let out = run(cmd);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: listen on 127.0.0.1:"), "{err}");

    let mut cmd = Command::new(bin("lks-control-server"));
    cmd.args(["--data-dir"]).arg(dir.path().join("d2")).args([
        "--listen",
        &free_addr().to_string(),
        "--metrics-listen",
        &busy.local_addr().unwrap().to_string(),
    ]);
    let out = run(cmd);
    assert!(!out.status.success(), "a busy metrics port fails start-up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_and_metrics() {
    let s = Server::start();
    let h = s.http_get("/healthz");
    assert!(
        h.starts_with("HTTP/1.0 200") || h.starts_with("HTTP/1.1 200"),
        "{h}"
    );
    assert!(h.ends_with("ok\n"), "{h}");
    let m = s.http_get("/metrics");
    for family in [
        "lks_connected_agents",
        "lks_enrollments_total",
        "lks_desired_state_pushes_total",
        "lks_blob_bytes_served_total",
        "lks_rpc_duration_seconds",
    ] {
        assert!(m.contains(&format!("# TYPE {family} ")), "{family} missing:\n{m}");
    }
    assert!(s.http_get("/nope").contains(" 404 "));

    // gRPC health: HealthCheckRequest{} is the empty message; SERVING = field 1 value 1.
    let ch = s.anonymous_channel().await;
    let out = lks_e2e::server::raw_unary(ch.clone(), "/grpc.health.v1.Health/Check", vec![])
        .await
        .expect("health check");
    assert_eq!(out, vec![0x08, 0x01]);

    // Reflection lists our services: ServerReflectionRequest{list_services: ""}.
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    let req = tonic::Request::new(tokio_stream::iter(vec![vec![0x3a, 0x00]]));
    let mut resp = g
        .streaming(
            req,
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            ),
            RawCodec,
        )
        .await
        .expect("reflection")
        .into_inner();
    let bytes = resp.message().await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("lks.v1.AgentService") && text.contains("lks.v1.AdminService"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_pinged() {
    let s = Server::start_with(&["--ping-interval", "200ms"]);
    s.create_cluster("tenant-a");
    let n = TestNode::enroll(&s, &s.token("tenant-a", &[]), "w1", &[]).await;
    let (_tx, mut st) = n.connect(vec![]).await.unwrap();
    let ping = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = st.message().await.unwrap().unwrap();
            if let Some(lks_proto::pb::server_message::Msg::Ping(p)) = m.msg {
                return p;
            }
        }
    })
    .await
    .expect("a ping within 10s");
    assert!(ping.nonce > 0);
}
