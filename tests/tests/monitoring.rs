//! The shipped alerts and dashboard against a real server (issue [ops]):
//! a replica on a throwaway etcd, exercised a little — a cluster, a token,
//! a real agent and a node enrolled by the test client, publishes, a
//! rollout completed, one failed, one paused, certificate renewals ok and
//! refused — then every `lks_*` metric that
//! `packaging/kubernetes/monitoring/dashboard.json`'s queries and
//! `rules.yaml` name must be in its `/metrics`, and the gauges the alerts
//! rest on must say what happened; etcd killed, the store probes say so.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use lks_e2e::agent::{BundleFile, join_info};
use lks_e2e::etcd::Etcd;
use lks_e2e::rollout::{Fleet, first_line};
use lks_e2e::server::{TestNode, make_csr};
use lks_e2e::{one_line_error, wait_until};
use lks_proto::pb;

const CONF: &str = "/etc/app/app.conf";
/// The store probe runs every 15 s and gives a store 10 s to answer.
const PROBED: Duration = Duration::from_secs(45);
const WAIT: Duration = Duration::from_secs(20);
/// Where a sample's labels begin, after its name.
const LABELS_OPEN: char = '{';

fn monitoring_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/monitoring")
}

/// Every `lks_…` identifier in `text` (PromQL read loosely).
fn lks_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while let Some(at) = text[i..].find("lks_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && word(b[end]) {
            end += 1;
        }
        if start == 0 || !word(b[start - 1]) {
            out.insert(text[start..end].to_string());
        }
        i = end.max(start + 1);
    }
    out
}

/// Every `expr` of the dashboard's panels (and of nested rows).
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// Metric families in a `/metrics` text: `# TYPE` names with their kind,
/// and every sample's name.
fn exported(metrics: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for l in metrics.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let mut p = t.split_whitespace();
            let (name, kind) = (p.next().unwrap(), p.next().unwrap());
            names.insert(name.to_string());
            if kind == "histogram" {
                histograms.insert(name.to_string());
            }
        } else if !l.starts_with('#') && !l.is_empty() {
            let end = l.find([LABELS_OPEN, ' ']).unwrap_or(l.len());
            names.insert(l[..end].to_string());
        }
    }
    (names, histograms)
}

/// The names of `used` not in `metrics` (a histogram's `_bucket`, `_sum`
/// and `_count` count as its family's).
fn missing(used: &BTreeSet<String>, metrics: &str) -> Vec<String> {
    let (names, histograms) = exported(metrics);
    used.iter()
        .filter(|n| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .filter(|f| histograms.contains(*f));
            !names.contains(*n) && family.is_none()
        })
        .cloned()
        .collect()
}

/// The value of the sample `series` (exact name and labels), if present.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

fn file(path: &'static str, version: &'static str) -> [BundleFile<'static>; 1] {
    [BundleFile {
        path,
        content: version.as_bytes(),
        mode: "0644",
    }]
}

async fn renew(node: &TestNode, csr: &str) -> Result<pb::RenewCertificateResponse, tonic::Status> {
    node.client()
        .await
        .renew_certificate(pb::RenewCertificateRequest { csr_pem: csr.into() })
        .await
        .map(tonic::Response::into_inner)
}

#[test]
fn every_metric_the_alerts_and_the_dashboard_use_is_exported_and_says_what_happened() {
    let used = names_the_rules_and_the_dashboard_use();

    let mut etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (f, node2, failed, paused) = a_fleet_with_a_rollout_completed_one_failed_one_paused(&etcd, &rt);

    // Renewals: a CSR that does not parse is refused; a good one renews;
    // the certificate it replaced is refused from then on.
    renewals_refused_renewed_and_refused(&rt, &node2);

    let failed_series =
        every_used_metric_is_exported_and_the_gauges_say_what_happened(&f, &used, &failed, &paused);

    // A rollback of the failed rollout: no longer failed, rolling back or
    // done, so its alert ends.
    f.server.lksctl_ok(&["rollout", "rollback", &failed]);
    wait_until(WAIT, "the failed rollout no longer listed as failed", || {
        let m = f.server.http_get("/metrics");
        sample(&m, &failed_series).is_none() && sample(&m, "lks_rollouts{state=\"failed\"}") == Some(0.0)
    });

    // etcd gone: both probes fail (the blobs are in etcd too).
    etcd.kill9();
    wait_until(PROBED, "the store probes to fail", || {
        let m = f.server.http_get("/metrics");
        sample(&m, "lks_store_up") == Some(0.0) && sample(&m, "lks_blob_store_up") == Some(0.0)
    });
}

/// Every `lks_…` name rules.yaml and dashboard.json's queries use, the
/// new families among them.
fn names_the_rules_and_the_dashboard_use() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(monitoring_dir().join("rules.yaml")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(monitoring_dir().join("dashboard.json")).unwrap())
            .unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() > 20, "the dashboard's queries were found: {exprs:?}");
    let mut used = lks_names(&rules);
    for e in &exprs {
        used.extend(lks_names(e));
    }
    for new in [
        "lks_rollouts",
        "lks_rollout_state_seconds",
        "lks_store_up",
        "lks_blob_store_up",
        "lks_enrolled_nodes",
        "lks_certificate_renewals_total",
        "lks_kube_cordoned_nodes",
    ] {
        assert!(used.contains(new), "{new} is used by the rules or the dashboard");
    }
    used
}

/// A replica on etcd with a cluster, a real agent (node-1) and node-2
/// enrolled but never connected; a rollout that completes (node-2
/// deferred), one that fails, one of another bundle paused. Returns the
/// fleet, node-2 and the failed and paused rollouts' IDs.
fn a_fleet_with_a_rollout_completed_one_failed_one_paused(
    etcd: &Etcd,
    rt: &tokio::runtime::Runtime,
) -> (Fleet, TestNode, String, String) {
    // A collector pass every second: the blob store gauges appear.
    let server = etcd.replica("/lks-monitoring/", &["--blob-gc-interval", "1s"]);
    server.create_cluster("c1");
    let log = server.work_dir().join("steps.log");
    let mut f = Fleet {
        server,
        cluster: "c1".into(),
        agents: Vec::new(),
        log,
    };
    f.add("node-1").wait_connected();
    // node-2 is enrolled and never connects.
    let token = join_info(&f.server, "c1", &[]).token;
    let node2 = rt.block_on(TestNode::enroll(&f.server, &token, "node-2", &[]));

    // A rollout that completes (node-2 deferred), one that fails.
    let b1 = f.publish("app", "1", &file(CONF, "app v1\n"), "0.1", "");
    lks_e2e::ok_stdout(&f.start_rollout(&b1, &["--wait"]), "app v1");
    let b2 = f.publish(
        "app",
        "2",
        &file(CONF, "app v2\n"),
        "0.1",
        "\n[health]\nrun = [\"sh\", \"-c\", \"exit 1\"]\nretries = 1\ninterval = \"100ms\"\n",
    );
    let out = f.start_rollout(&b2, &["--wait"]);
    one_line_error(&out, "rollout --wait of a failing bundle");
    let failed = first_line(&String::from_utf8_lossy(&out.stdout));
    f.wait_state(&failed, "failed");
    // One of another bundle that waits for node-2, paused.
    let b3 = f.publish("other", "1", &file("/etc/other.conf", "other v1\n"), "0.1", "");
    let paused = f.roll_out(&b3, &["--offline", "wait", "--batch-size", "1"]);
    f.server.lksctl_ok(&["rollout", "pause", &paused]);
    wait_until(WAIT, "the rollout paused", || {
        f.status(&paused)["state"] == "paused"
    });

    (f, node2, failed, paused)
}

/// A CSR that does not parse is refused; a good one renews; the
/// certificate it replaced is refused from then on.
fn renewals_refused_renewed_and_refused(rt: &tokio::runtime::Runtime, node2: &TestNode) {
    rt.block_on(async {
        let bad = renew(node2, "not a CSR").await.unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
        let (csr, _) = make_csr(&["node-2"]);
        renew(node2, &csr).await.unwrap();
        let old = renew(node2, &csr).await.unwrap_err();
        assert!(
            matches!(
                old.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ),
            "{old:?}"
        );
    });
}

/// Every metric the rules and the dashboard use is in /metrics, and the
/// gauges the alerts rest on say what happened. Returns the failed
/// rollout's series.
fn every_used_metric_is_exported_and_the_gauges_say_what_happened(
    f: &Fleet,
    used: &BTreeSet<String>,
    failed: &str,
    paused: &str,
) -> String {
    let failed_series = format!(
        "lks_rollout_state_seconds{{rollout=\"{failed}\",cluster=\"c1\",bundle=\"app\",state=\"failed\"}}"
    );
    let paused_series = format!(
        "lks_rollout_state_seconds{{rollout=\"{paused}\",cluster=\"c1\",bundle=\"other\",state=\"paused\"}}"
    );
    let mut m = String::new();
    wait_until(PROBED, "the probes and the controller's pass in /metrics", || {
        m = f.server.http_get("/metrics");
        sample(&m, "lks_enrolled_nodes") == Some(2.0)
            && sample(&m, "lks_blob_store_blobs").is_some()
            && sample(&m, &paused_series).is_some()
    });
    let missing = missing(used, &m);
    assert!(
        missing.is_empty(),
        "used by rules.yaml or dashboard.json but not in /metrics: {missing:?}\n{m}"
    );

    assert_eq!(sample(&m, "lks_store_up"), Some(1.0));
    assert_eq!(sample(&m, "lks_blob_store_up"), Some(1.0));
    assert_eq!(sample(&m, "lks_connected_agents"), Some(1.0));
    assert_eq!(sample(&m, "lks_rollouts{state=\"paused\"}"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "lks_rollouts{state=\"failed\"}"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "lks_rollouts{state=\"running\"}"), Some(0.0), "{m}");
    assert_eq!(
        sample(&m, "lks_rollouts{state=\"rolling_back\"}"),
        Some(0.0),
        "{m}"
    );
    let paused_for = sample(&m, &paused_series).unwrap();
    assert!((0.0..60.0).contains(&paused_for), "{paused_series} {paused_for}");
    let failed_for = sample(&m, &failed_series).expect("the failed rollout is listed");
    assert!((0.0..120.0).contains(&failed_for), "{failed_series} {failed_for}");
    let rows = m
        .lines()
        .filter(|l| l.starts_with("lks_rollout_state_seconds{"))
        .count();
    assert_eq!(rows, 2, "the completed rollout has no series: {m}");
    assert_eq!(
        sample(&m, "lks_certificate_renewals_total{outcome=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&m, "lks_certificate_renewals_total{outcome=\"refused\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(&m, "lks_certificate_renewals_total{outcome=\"error\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&m, "lks_kube_cordoned_nodes{state=\"stray\"}"), Some(0.0));

    failed_series
}

#[test]
fn the_loose_promql_reader_finds_names_and_histograms_count_by_family() {
    let names = lks_names(
        "histogram_quantile(0.99, sum by (le) (rate(lks_rpc_duration_seconds_bucket[5m]))) / max(lks_x) + xlks_y",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["lks_rpc_duration_seconds_bucket", "lks_x"]
    );
    let m = "# TYPE lks_rpc_duration_seconds histogram\n# TYPE lks_a gauge\nlks_b{x=\"1\"} 2\n";
    let used: BTreeSet<String> = [
        "lks_rpc_duration_seconds_bucket",
        "lks_a",
        "lks_b",
        "lks_a_count",
        "lks_c",
    ]
    .map(String::from)
    .into();
    assert_eq!(missing(&used, m), ["lks_a_count", "lks_c"]);
}
