//! `lks-loadgen --servers` (the HA rows of BENCHMARKS.md): simulated agents
//! spread over two replicas on one throwaway etcd, a rollout started
//! through the first reaches the agents on both, and each replica enrolled
//! its share.

use std::process::Command;

use lks_e2e::etcd::Etcd;
use lks_e2e::server::Server;
use lks_e2e::{bin, ok_stdout, run};

fn replica(etcd: &Etcd) -> Server {
    etcd.replica("/lks-test-loadgen/", &[])
}

fn enrolled_ok(s: &Server) -> String {
    let metrics = s.http_get("/metrics");
    metrics
        .lines()
        .find(|l| l.starts_with("lks_enrollments_total{result=\"ok\"}"))
        .unwrap_or("none")
        .to_string()
}

#[test]
fn loadgen_spreads_agents_over_the_replicas() {
    let etcd = Etcd::start();
    let r1 = replica(&etcd);
    let r2 = replica(&etcd);
    let mut cmd = Command::new(bin("lks-loadgen"));
    cmd.arg("--config")
        .arg(r1.admin_conf_path())
        .args(["--cluster", "lg", "--agents", "6", "--rollout", "-o", "json"])
        .arg("--servers")
        .arg(format!("{},{}", r1.url(), r2.url()));
    let out = ok_stdout(&run(cmd), "lks-loadgen --servers");
    let report: serde_json::Value = serde_json::from_str(&out).expect("loadgen JSON");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["first_message"]["count"], 6, "{report}");
    assert_eq!(
        report["fanout"]["count"], 6,
        "every agent got the rollout: {report}"
    );
    assert!(report["rollout_seconds"].is_number(), "{report}");
    for s in [&r1, &r2] {
        assert_eq!(
            enrolled_ok(s),
            "lks_enrollments_total{result=\"ok\"} 3",
            "each replica enrolled half the agents"
        );
    }
}
