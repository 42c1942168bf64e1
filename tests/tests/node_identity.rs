//! Per-node certificates and kubeconfigs end to end: real server, real
//! agents, `lksctl`; the issued certificates checked with `openssl`, the
//! kubeconfig with `kubectl`, the keys looked for everywhere they must not
//! be, and a hostile node's CSRs refused.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lks_e2e::agent::{CONVERGE, node_events, wait_node_bundle, write_bundle};
use lks_e2e::rollout::Fleet;
use lks_e2e::server::{Server, TestNode, make_csr};
use lks_e2e::{one_line_error, wait_until};
use lks_proto::pb;
use tonic::Code;

const API: &str = "https://api.tenant-a.example:6443";

/// The identity bundle of `examples/bundles/kubelet-node-identity`, with a
/// step that logs each run and a short `ttl` when asked.
fn identity_toml(version: &str, ttl: Option<&str>, log: &Path) -> String {
    let ttl = ttl.map(|t| format!("ttl = \"{t}\"\n")).unwrap_or_default();
    format!(
        r#"
[[certificate]]
path = "/var/lib/kubelet/pki/kubelet-client.crt"
key_path = "/var/lib/kubelet/pki/kubelet-client.key"
profile = "kubelet-client"
ca_path = "/etc/kubernetes/pki/ca.crt"
{ttl}
[[certificate]]
path = "/var/lib/kubelet/pki/kubelet.crt"
key_path = "/var/lib/kubelet/pki/kubelet.key"
profile = "kubelet-serving"
ca_path = "/etc/kubernetes/pki/ca.crt"
{ttl}
[[kubeconfig]]
path = "/etc/kubernetes/kubelet.conf"
certificate = "/var/lib/kubelet/pki/kubelet-client.crt"

[[step]]
name = "restart kubelet"
run = ["sh", "-c", "echo \"$LKS_NODE {version}\" >> {log}"]

[health]
run = ["sh", "-c", "test ! -e \"$LKS_ROOT/unhealthy\""]
retries = 1
"#,
        log = log.display()
    )
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (needed by this test; scripts/setup.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The base64 body lines of a PEM key: what a leaked key would contain.
fn key_lines(pem: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(pem)
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 40)
        .map(String::from)
        .collect()
}

/// Every regular file under `dir` that contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => {
                    if let Ok(bytes) = std::fs::read(&p)
                        && String::from_utf8_lossy(&bytes).contains(needle)
                    {
                        hits.push(p.display().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    hits
}

/// `n` agents of cluster tenant-a (API server set) holding the identity
/// bundle with certificates of lifetime `ttl`.
fn identity_fleet(n: usize, ttl: &str) -> Fleet {
    let f = Fleet::start("tenant-a", n);
    let said = f
        .server
        .lksctl_ok(&["cluster", "set", "tenant-a", "--api-server", API]);
    assert!(said.contains(API), "{said}");
    let dir = write_bundle(
        f.server.work_dir(),
        "kubelet-identity",
        "1",
        &[],
        &identity_toml("1", Some(ttl), &f.log),
    );
    let b = f.server.publish(&dir);
    f.roll_out(&b, &[]);
    for a in &f.agents {
        wait_node_bundle(&f.server, &a.name, "kubelet-identity", "1", "applied");
    }
    f
}

#[test]
fn each_node_gets_its_own_certificates_and_kubeconfig_and_they_rotate() {
    let mut f = identity_fleet(2, "45s");
    let log = f.log.clone();

    // node-2's renewals will fail their health check.
    std::fs::write(f.agent("node-2").path("/unhealthy"), b"").unwrap();
    let kept = f
        .agent("node-2")
        .read("/var/lib/kubelet/pki/kubelet-client.key")
        .unwrap();
    let work = f.server.work_dir().to_path_buf();
    let ca = work.join("tenant-a-ca.crt");
    std::fs::write(&ca, f.server.lksctl_ok(&["cluster", "ca", "tenant-a"])).unwrap();
    for n in ["node-1", "node-2"] {
        a_node_holds_its_own_pair_and_kubeconfig_and_the_server_not_its_key(&f, n, &ca, &work);
    }
    let serial1 = the_keys_differ_and_what_was_issued_is_listed(&f);
    node_1_renews_at_two_thirds_and_reruns_the_step(&f, &log, &serial1);
    a_renewal_whose_health_check_fails_keeps_the_pair(&f, &kept);
    a_deleted_node_gets_no_certificate_any_more(&mut f);
}

/// Node `n`'s CA is the cluster's; its client and serving certificates
/// verify, name it and have the right usages; its key is its own (0600)
/// and nowhere on the server; kubectl reads its kubeconfig.
fn a_node_holds_its_own_pair_and_kubeconfig_and_the_server_not_its_key(
    f: &Fleet,
    n: &str,
    ca: &Path,
    work: &Path,
) {
    let ca_arg = ca.display().to_string();
    let a = f.agent(n);
    // The CA the node was given is the cluster's.
    assert_eq!(
        a.read("/etc/kubernetes/pki/ca.crt").unwrap().0,
        std::fs::read(ca).unwrap()
    );
    let client = a
        .path("/var/lib/kubelet/pki/kubelet-client.crt")
        .display()
        .to_string();
    let serving = a.path("/var/lib/kubelet/pki/kubelet.crt").display().to_string();
    for cert in [&client, &serving] {
        let out = run("openssl", &["verify", "-CAfile", &ca_arg, cert]);
        assert!(out.trim_end().ends_with(": OK"), "{out}");
    }
    let subject = run("openssl", &["x509", "-noout", "-subject", "-in", &client]);
    assert!(
        subject.contains(&format!("O = system:nodes, CN = system:node:{n}"))
            || subject.contains(&format!("CN = system:node:{n}, O = system:nodes")),
        "{subject}"
    );
    let text = run("openssl", &["x509", "-noout", "-text", "-in", &client]);
    assert!(text.contains("TLS Web Client Authentication"), "{text}");
    assert!(
        !text.contains("Subject Alternative Name"),
        "a kubelet client certificate has no SANs: {text}"
    );
    let text = run("openssl", &["x509", "-noout", "-text", "-in", &serving]);
    assert!(text.contains("TLS Web Server Authentication"), "{text}");
    assert!(text.contains(&format!("DNS:{n}")), "{text}");
    // Key and certificate belong together, and the key is the node's own.
    let key = a.read("/var/lib/kubelet/pki/kubelet-client.key").unwrap();
    assert_eq!(key.1, 0o600);
    let key_path = a
        .path("/var/lib/kubelet/pki/kubelet-client.key")
        .display()
        .to_string();
    assert_eq!(
        run("openssl", &["pkey", "-pubout", "-in", &key_path]),
        run("openssl", &["x509", "-noout", "-pubkey", "-in", &client])
    );
    // The key is nowhere on the server: not in its data dir, store or log.
    for line in key_lines(&key.0) {
        let hits = files_containing(work, &line);
        assert!(hits.is_empty(), "{n}'s key found in {hits:?}");
        assert!(!f.server.log().contains(&line), "{n}'s key in the server log");
    }
    // A kubeconfig kubectl reads, with the cluster's server and CA, for this node.
    let kc = a.path("/etc/kubernetes/kubelet.conf").display().to_string();
    let view = run(
        "kubectl",
        &["config", "view", "--kubeconfig", &kc, "--raw", "-o", "json"],
    );
    let v: serde_json::Value = serde_json::from_str(&view).unwrap();
    assert_eq!(v["clusters"][0]["cluster"]["server"], API);
    assert_eq!(v["users"][0]["name"], format!("system:node:{n}"));
    assert_eq!(
        v["users"][0]["user"]["client-certificate"],
        "/var/lib/kubelet/pki/kubelet-client.crt"
    );
    assert_eq!(a.read("/etc/kubernetes/kubelet.conf").unwrap().1, 0o600);
}

/// The two nodes' keys differ; `node get` and `cluster certs` list what
/// was issued. Returns node-1's client certificate serial.
fn the_keys_differ_and_what_was_issued_is_listed(f: &Fleet) -> String {
    // The two nodes' keys differ: nothing is shared.
    assert_ne!(
        f.agent("node-1").read("/var/lib/kubelet/pki/kubelet-client.key"),
        f.agent("node-2").read("/var/lib/kubelet/pki/kubelet-client.key")
    );

    // Visible: `node get` and `cluster certs` list what was issued.
    let node = f.server.lksctl_json(&["node", "get", "node-1"]);
    let certs = node["certificates"].as_array().unwrap();
    assert_eq!(certs.len(), 2, "{node}");
    assert_eq!(
        node["facts"]["features"],
        serde_json::json!([
            "certificates",
            "self-update",
            "multi-arch",
            "deltas",
            "heal-steps",
            "reboot"
        ]),
        "{node}"
    );
    let profiles: Vec<&str> = certs.iter().map(|c| c["profile"].as_str().unwrap()).collect();
    assert!(
        profiles.contains(&"kubelet-client") && profiles.contains(&"kubelet-serving"),
        "{profiles:?}"
    );
    let serial1 = certs.iter().find(|c| c["profile"] == "kubelet-client").unwrap()["serial"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = f.server.lksctl_json(&["cluster", "certs", "tenant-a"]);
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    assert!(
        node_events(&f.server, "node-1")
            .iter()
            .any(|(k, _)| k == "certificate_issued")
    );

    serial1
}

/// Rotation: a 45 s lifetime is renewed at about 2/3 of it, by the node,
/// with the bundle's steps run again for the new pair.
fn node_1_renews_at_two_thirds_and_reruns_the_step(f: &Fleet, log: &Path, serial1: &str) {
    let before = f
        .agent("node-1")
        .read("/var/lib/kubelet/pki/kubelet-client.key")
        .unwrap();
    wait_until(
        CONVERGE + Duration::from_secs(30),
        "node-1 renews its certificates",
        || f.agent("node-1").read("/var/lib/kubelet/pki/kubelet-client.key") != Some(before.clone()),
    );
    wait_until(CONVERGE, "the renewal is recorded", || {
        let node = f.server.lksctl_json(&["node", "get", "node-1"]);
        node["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["profile"] == "kubelet-client" && c["serial"] != serial1)
    });
    let a = f.agent("node-1");
    let client = a
        .path("/var/lib/kubelet/pki/kubelet-client.crt")
        .display()
        .to_string();
    let key_path = a
        .path("/var/lib/kubelet/pki/kubelet-client.key")
        .display()
        .to_string();
    wait_until(CONVERGE, "the new pair is installed whole", || {
        run("openssl", &["pkey", "-pubout", "-in", &key_path])
            == run("openssl", &["x509", "-noout", "-pubkey", "-in", &client])
    });
    wait_until(CONVERGE, "the step ran for the new pair", || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("node-1 "))
            .count()
            >= 2
    });
}

/// A renewal whose health check fails keeps the pair in use (the
/// marker was planted right after the first apply, and the pair read
/// then: read later, it could be the new one of a renewal that is
/// about to be rolled back).
fn a_renewal_whose_health_check_fails_keeps_the_pair(f: &Fleet, kept: &(Vec<u8>, u32)) {
    wait_until(
        CONVERGE + Duration::from_secs(30),
        "node-2's renewal is rolled back",
        || {
            node_events(&f.server, "node-2")
                .iter()
                .any(|(k, _)| k == "renewal_failed")
        },
    );
    assert_eq!(
        f.agent("node-2")
            .read("/var/lib/kubelet/pki/kubelet-client.key")
            .unwrap(),
        *kept
    );
    let (_, state, msg) = f.agent("node-2").bundle("kubelet-identity").unwrap();
    assert_eq!(state, "applied", "{msg}");
}

/// A deleted node gets no certificate any more.
fn a_deleted_node_gets_no_certificate_any_more(f: &mut Fleet) {
    f.agent_mut("node-1").stop();
    f.server.lksctl_ok(&["node", "delete", "node-1"]);
    let issued_before = f.server.lksctl_json(&["cluster", "certs", "tenant-a", "--all"]);
    f.agent_mut("node-1").start();
    std::thread::sleep(Duration::from_secs(3));
    let issued_after = f.server.lksctl_json(&["cluster", "certs", "tenant-a", "--all"]);
    let count = |v: &serde_json::Value| {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|c| c["node"] == "node-1")
            .count()
    };
    assert_eq!(count(&issued_before), count(&issued_after));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_have_another_nodes_name_or_extra_names_signed() {
    let s = Server::start();
    s.create_cluster("tenant-a");
    s.create_cluster("tenant-b");
    s.lksctl_ok(&["cluster", "set", "tenant-a", "--api-server", API]);
    let t = s.token("tenant-a", &[]);
    let w1 = TestNode::enroll(&s, &t, "w1", &[]).await;
    let w2 = TestNode::enroll(&s, &t, "w2", &[]).await;
    // w3 plays an agent from before [[certificate]]: it would drop them.
    let mut w3 = TestNode::enroll(&s, &t, "w3", &[]).await;
    w3.features.clear();
    let (_tx1, _rx1) = w1.connect(vec![]).await.expect("connect w1");
    let (_tx2, _rx2) = w2.connect(vec![]).await.expect("connect w2");
    let (_tx3, _rx3) = w3.connect(vec![]).await.expect("connect w3");
    wait_until(Duration::from_secs(15), "all connected", || {
        let list = s.lksctl_json(&["node", "list"]);
        list.as_array()
            .unwrap()
            .iter()
            .filter(|n| n["connected"] == true)
            .count()
            == 3
    });
    let log = s.work_dir().join("steps.log");
    let dir = write_bundle(
        s.work_dir(),
        "kubelet-identity",
        "1",
        &[],
        &identity_toml("1", None, &log),
    );
    let b = s.publish(&dir);
    let rollout = s.lksctl_ok(&[
        "rollout",
        "start",
        "--cluster",
        "tenant-a",
        "--bundle",
        &b,
        "--batch-size",
        "3",
    ]);
    let rollout = rollout.trim().to_string();

    let client = "/var/lib/kubelet/pki/kubelet-client.crt";
    own_client_certificate_signed_once_assigned(&w1, client).await;
    let before = s.lksctl_json(&["cluster", "certs", "tenant-a", "--all"]);
    another_nodes_name_extra_names_and_bad_csrs_are_refused(&w1, client).await;
    the_old_agent_failed_at_its_turn_and_got_nothing(&s, &w3, &rollout, client).await;

    // Nothing refused was recorded.
    assert_eq!(s.lksctl_json(&["cluster", "certs", "tenant-a", "--all"]), before);

    publish_and_rollout_refusals_are_one_line(&s, &b);
}

/// `node` asks for the certificate at `path` of `bundle`, with `csr`.
async fn issue(
    node: &TestNode,
    bundle: &str,
    path: &str,
    csr: String,
) -> Result<tonic::Response<pb::IssueCertificateResponse>, tonic::Status> {
    let ch = lks_e2e::server::channel(&node.url, &node.ca_pem, Some((&node.cert_pem, &node.key_pem))).await;
    pb::agent_service_client::AgentServiceClient::new(ch)
        .issue_certificate(pb::IssueCertificateRequest {
            bundle: bundle.to_string(),
            version: "1".into(),
            path: path.to_string(),
            csr_pem: csr,
        })
        .await
}

/// A CSR with common name `cn`, organisation `o` and DNS names `sans`.
fn csr_for(cn: &str, o: Option<&str>, sans: &[&str]) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    if let Some(o) = o {
        p.distinguished_name.push(rcgen::DnType::OrganizationName, o);
    }
    p.serialize_request(&key).unwrap().pem().unwrap()
}

/// The right request is signed once the rollout assigned the bundle (so
/// the refusals that follow are about names).
async fn own_client_certificate_signed_once_assigned(w1: &TestNode, client: &str) {
    let start = std::time::Instant::now();
    let ok = loop {
        match issue(
            w1,
            "kubelet-identity",
            client,
            csr_for("system:node:w1", Some("system:nodes"), &[]),
        )
        .await
        {
            Ok(r) => break r.into_inner(),
            Err(e) if e.code() == Code::PermissionDenied && start.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("w1's own kubelet client certificate: {e:?}"),
        }
    };
    assert!(ok.certificate_pem.contains("BEGIN CERTIFICATE"));
    assert_eq!(ok.api_server, API);
}

/// Another node's name, other organisations, extra DNS names, a path
/// that is no [[certificate]], an unassigned bundle and a broken CSR:
/// each refused with its reason, in one line.
async fn another_nodes_name_extra_names_and_bad_csrs_are_refused(w1: &TestNode, client: &str) {
    let cases: Vec<(String, String, String, Code, &str)> = vec![
        (
            "kubelet-identity".into(),
            client.into(),
            csr_for("system:node:w2", Some("system:nodes"), &[]),
            Code::PermissionDenied,
            "common name \"system:node:w2\"",
        ),
        (
            "kubelet-identity".into(),
            client.into(),
            csr_for("system:node:w1", Some("system:masters"), &[]),
            Code::PermissionDenied,
            "organizations",
        ),
        (
            "kubelet-identity".into(),
            "/var/lib/kubelet/pki/kubelet.crt".into(),
            csr_for(
                "system:node:w1",
                Some("system:nodes"),
                &["w1", "kubernetes.default"],
            ),
            Code::PermissionDenied,
            "DNS names",
        ),
        (
            "kubelet-identity".into(),
            "/etc/kubernetes/kubelet.conf".into(),
            csr_for("system:node:w1", Some("system:nodes"), &[]),
            Code::InvalidArgument,
            "is not a [[certificate]] of bundle kubelet-identity@1",
        ),
        (
            "other".into(),
            client.into(),
            csr_for("system:node:w1", Some("system:nodes"), &[]),
            Code::PermissionDenied,
            "bundle other@1 is not assigned to node w1",
        ),
        (
            "kubelet-identity".into(),
            client.into(),
            make_csr(&["w1"])
                .0
                .replace("REQUEST-----\n", "REQUEST-----\nAAAA"),
            Code::PermissionDenied,
            "CSR",
        ),
    ];
    for (bundle, path, csr, code, why) in cases {
        let e = issue(w1, &bundle, &path, csr).await.expect_err(why);
        assert_eq!(e.code(), code, "{why}: {}", e.message());
        assert!(e.message().contains(why), "expected {why:?} in {:?}", e.message());
        assert!(!e.message().contains('\n'), "one line: {:?}", e.message());
    }
}

/// The old agent got nothing; it failed at its turn, saying why.
async fn the_old_agent_failed_at_its_turn_and_got_nothing(
    s: &Server,
    w3: &TestNode,
    rollout: &str,
    client: &str,
) {
    let status = s.lksctl_json(&["rollout", "status", rollout]);
    let w3_state = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "w3")
        .cloned()
        .unwrap();
    assert_eq!(w3_state["state"], "failed", "{status}");
    assert!(
        w3_state["message"]
            .as_str()
            .unwrap()
            .contains("does not announce the \"certificates\" feature"),
        "{w3_state}"
    );
    let e = issue(
        w3,
        "kubelet-identity",
        client,
        csr_for("system:node:w3", Some("system:nodes"), &[]),
    )
    .await
    .expect_err("w3 was not assigned the bundle");
    assert_eq!(e.code(), Code::PermissionDenied);
}

/// Publish and rollout refusals are one line each.
fn publish_and_rollout_refusals_are_one_line(s: &Server, b: &str) {
    let bad = write_bundle(
        s.work_dir(),
        "bad-identity",
        "1",
        &[],
        "[[certificate]]\npath = \"/a.crt\"\nkey_path = \"/a.key\"\nprofile = \"client\"\ncommon_name = \"{host}\"\n",
    );
    let e = one_line_error(
        &s.lksctl(&["bundle", "publish", &bad.display().to_string()]),
        "a placeholder that does not exist",
    );
    assert!(e.contains("the only placeholder is {node}"), "{e}");
    let e = one_line_error(
        &s.lksctl(&["rollout", "start", "--cluster", "tenant-b", "--bundle", b]),
        "kubeconfigs for a cluster without an API server",
    );
    assert!(e.contains("cluster tenant-b has no API server address"), "{e}");
}

#[test]
fn a_node_offline_past_the_lifetime_reports_expired_and_renews_when_back() {
    let mut f = identity_fleet(1, "30s");
    let local = f.agent("node-1").status();
    let certs = local["certificates"].as_array().unwrap();
    assert_eq!(certs.len(), 2, "{local}");
    assert!(certs.iter().all(|c| c["state"] == "valid"), "{local}");
    let listed = f.server.lksctl_json(&["node", "list"]);
    assert_eq!(listed[0]["certificates"].as_array().unwrap().len(), 2, "{listed}");

    // Offline for longer than the lifetime: both views say expired.
    f.agent_mut("node-1").stop();
    // What it holds once stopped (on a slow machine it may have renewed).
    let held = f.agent("node-1").status();
    let not_after = held["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["not_after_ms"].as_i64().unwrap())
        .max()
        .unwrap();
    let wait = not_after
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
        + 1000;
    std::thread::sleep(Duration::from_millis(wait.max(0) as u64));
    let local = f.agent("node-1").status();
    assert!(
        local["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "expired"),
        "{local}"
    );
    let listed = f.server.lksctl_json(&["node", "list"]);
    assert!(
        listed[0]["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "expired"),
        "{listed}"
    );
    let table = f.server.lksctl_ok(&["node", "list"]);
    assert!(table.lines().next().unwrap().contains("CERTS"), "{table}");
    assert!(table.contains("2 (2 expired)"), "{table}");

    // Back: it renews at once and says valid again.
    f.agent_mut("node-1").start();
    wait_until(CONVERGE, "node-1 renews its expired certificates", || {
        f.agent("node-1").status()["certificates"]
            .as_array()
            .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["state"] == "valid"))
    });
}
