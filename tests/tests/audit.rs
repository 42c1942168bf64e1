//! The audit trail end to end (issue 30, item 4): real servers on SQLite
//! and on etcd, `lksctl` making every kind of state-changing call, then
//! `lksctl audit` answering who did what — in order, with the admin
//! certificate's fingerprint, CA keys redacted, refusals recorded with
//! their reason — and the retention sweep dropping old records.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lks_e2e::etcd::Etcd;
use lks_e2e::server::{Server, TestNode};
use lks_e2e::{one_line_error, wait_until};
use lks_proto::Digest;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

/// A CA certificate and key of the test's own making, as PEM.
fn ca_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "tenant-b CA");
    let cert = p.self_signed(&key).expect("self-sign");
    (cert.pem(), key.serialize_pem())
}

fn verbs(records: &Value) -> Vec<String> {
    records
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|r| r["verb"].as_str().expect("verb").to_string())
        .collect()
}

/// Makes one call of each kind through `lksctl`, then reads the trail
/// back. Returns how many records it checked.
async fn every_call_is_on_record(s: &Server, store: &str) -> usize {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_cert, ca_key) = ca_pair();
    let (cert_file, key_file) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&cert_file, &ca_cert).expect("write CA");
    std::fs::write(&key_file, &ca_key).expect("write key");

    s.create_cluster("a");
    s.lksctl_ok(&[
        "cluster",
        "create",
        "b",
        "--ca-cert",
        cert_file.to_str().expect("utf-8"),
        "--ca-key",
        key_file.to_str().expect("utf-8"),
    ]);
    let token = s.token("a", &[]);
    let _n1 = TestNode::enroll(s, &token, "n1", &[]).await;
    let b = s.write_bundle("app", "app", "1", &[("/etc/app.conf", b"x=1\n", "0644")]);
    assert_eq!(s.publish(&b), "app@1");
    let rollout = s.lksctl_json(&["rollout", "start", "--cluster", "a", "--bundle", "app@1"]);
    let id = rollout["id"].as_str().expect("rollout id").to_string();
    let paused = s.lksctl(&["rollout", "pause", &id]).status.success();
    s.lksctl_ok(&["node", "hold", "n1", "--reason", "disk check"]);
    s.lksctl_ok(&["node", "unhold", "n1"]);
    let refused = one_line_error(&s.lksctl(&["node", "hold", "ghost"]), "hold an unknown node");

    let all = s.lksctl_json(&["audit"]);
    assert_eq!(
        verbs(&all),
        [
            "CreateCluster",
            "CreateCluster",
            "CreateToken",
            "PublishBundle",
            "StartRollout",
            "PauseRollout",
            "HoldNode",
            "UnholdNode",
            "HoldNode"
        ],
        "{store}: every state-changing call, oldest first:\n{all:#}"
    );
    let records = all.as_array().expect("array");

    every_record_names_who_and_where_and_ids_increase(s, store, records);
    what_targets_and_arguments_the_ca_key_never(
        store,
        records,
        &all,
        (&ca_cert, &ca_key),
        &id,
        paused,
        &refused,
    );
    the_trail_filters_by_call_time_and_count(s);

    // Reading the trail is not itself a change: nothing was added.
    assert_eq!(s.lksctl_json(&["audit"]).as_array().map(Vec::len), Some(9));
    println!(
        "AUDIT store={store} records={} refused_recorded=1 key_redacted=1",
        records.len()
    );
    records.len()
}

/// Who: the admin certificate of admin.conf, by name and fingerprint;
/// where: this server; ids increase.
fn every_record_names_who_and_where_and_ids_increase(s: &Server, store: &str, records: &[Value]) {
    let der =
        CertificateDer::from_pem_slice(s.admin_conf().client_cert.as_bytes()).expect("admin certificate PEM");
    let fingerprint = Digest::of(der.as_ref()).to_string();
    for r in records {
        assert_eq!(r["caller_fingerprint"], fingerprint.as_str(), "{r:#}");
        assert!(!r["caller"].as_str().unwrap_or_default().is_empty(), "{r:#}");
        assert_eq!(r["server"], s.url().as_str(), "{r:#}");
        assert!(r["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{r:#}");
    }
    let ids: Vec<u64> = records.iter().map(|r| r["id"].as_u64().expect("id")).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{store}: ids increase: {ids:?}"
    );
}

/// What: targets and arguments; the CA key never, the certificate by
/// digest; the pause's outcome as lksctl said; a refusal with its code
/// and the server's reason.
fn what_targets_and_arguments_the_ca_key_never(
    store: &str,
    records: &[Value],
    all: &Value,
    (ca_cert, ca_key): (&str, &str),
    id: &str,
    paused: bool,
    refused: &str,
) {
    let on = |i: usize| &records[i];
    assert_eq!(
        (on(0)["target"].as_str(), on(0)["outcome"].as_str()),
        (Some("a"), Some("ok"))
    );
    assert_eq!(on(1)["args"]["ca_key"], "<redacted>");
    assert_eq!(
        on(1)["args"]["ca_cert"],
        Digest::of(ca_cert.as_bytes()).to_string().as_str()
    );
    let text = all.to_string();
    let key_body: String = ca_key.lines().nth(1).expect("a PEM body line").to_string();
    assert!(
        !text.contains(&key_body),
        "{store}: the CA key is in the audit trail"
    );
    assert_eq!(on(2)["target"], "a");
    assert_eq!(on(3)["target"], "app@1");
    assert_eq!(on(4)["target"], format!("{id} app@1").as_str());
    assert_eq!(on(4)["args"]["cluster"], "a");
    assert_eq!(on(5)["target"], id);
    assert_eq!(
        on(5)["outcome"] == "ok",
        paused,
        "{store}: the pause's outcome is what lksctl said"
    );
    assert_eq!(on(6)["args"]["reason"], "disk check");
    assert_eq!(on(7)["target"], "n1");
    // A refusal, with its code and the server's reason.
    let outcome = on(8)["outcome"].as_str().expect("outcome");
    assert!(outcome.starts_with("NotFound: "), "{store}: {outcome}");
    assert!(
        refused.contains("ghost") && outcome.contains("ghost"),
        "{refused} / {outcome}"
    );
}

/// Filters: by call, by time (a duration back or an RFC 3339 time),
/// newest N; a bad filter is one line.
fn the_trail_filters_by_call_time_and_count(s: &Server) {
    assert_eq!(
        verbs(&s.lksctl_json(&["audit", "--verb", "HoldNode"])),
        ["HoldNode", "HoldNode"]
    );
    assert_eq!(
        s.lksctl_json(&["audit", "--since", "1h"])
            .as_array()
            .map(Vec::len),
        Some(9)
    );
    assert_eq!(
        s.lksctl_json(&["audit", "--since", "2099-01-01T00:00:00Z"])
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    assert_eq!(
        verbs(&s.lksctl_json(&["audit", "--limit", "2"])),
        ["UnholdNode", "HoldNode"]
    );
    let table = s.lksctl_ok(&["audit", "--verb", "CreateToken"]);
    assert!(
        table.starts_with("TIME") && table.contains("CreateToken"),
        "{table}"
    );
    let bad = one_line_error(
        &s.lksctl(&["audit", "--since", "yesterday"]),
        "audit --since yesterday",
    );
    assert!(bad.contains("--since \"yesterday\""), "{bad}");
    let bad = one_line_error(
        &s.lksctl(&["audit", "--verb", "Start Rollout"]),
        "audit --verb with a space",
    );
    assert!(bad.contains("verb"), "{bad}");
}

#[tokio::test]
async fn every_admin_change_is_on_record_on_sqlite() {
    let s = Server::start();
    assert_eq!(every_call_is_on_record(&s, "sqlite").await, 9);
}

#[tokio::test]
async fn every_admin_change_is_on_record_on_etcd() {
    let etcd = Etcd::start();
    let s = etcd.replica("/audit-e2e/", &[]);
    assert_eq!(every_call_is_on_record(&s, "etcd").await, 9);
}

#[test]
fn records_past_the_retention_are_dropped() {
    let s = Server::start_with(&["--audit-retention", "2s"]);
    s.create_cluster("old");
    // The first sweep runs a few seconds after start; a record older than
    // 2 s then goes.
    wait_until(Duration::from_secs(30), "the old record to be dropped", || {
        s.lksctl_json(&["audit"]).as_array().is_some_and(Vec::is_empty)
    });
    assert!(s.metric("lks_audit_pruned_total") >= 1);
    s.create_cluster("new");
    let left = s.lksctl_json(&["audit"]);
    assert_eq!(verbs(&left), ["CreateCluster"]);
    assert_eq!(left[0]["target"], "new");

    let dir = tempfile::tempdir().expect("temp dir");
    for bad in ["0s", "soon"] {
        let mut cmd = std::process::Command::new(lks_e2e::bin("lks-control-server"));
        cmd.arg("--data-dir")
            .arg(dir.path())
            .args(["--audit-retention", bad]);
        let out = lks_e2e::run(cmd);
        let err = one_line_error(&out, &format!("--audit-retention {bad}"));
        assert!(
            err.contains("--audit-retention") && err.contains("forever"),
            "{err}"
        );
        assert!(
            !dir.path().join("admin.conf").exists(),
            "nothing created for a refused start"
        );
    }
}
