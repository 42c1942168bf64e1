//! Benchmark of issue [kube-drain] item 6, not a test (`#[ignore]`d; run by
//! `bash scripts/bench.sh --only kube-drain`, which passes the release
//! binaries): what a drained node's turn adds to a rollout — cordon,
//! evictions honouring a PodDisruptionBudget, the Node Ready gate, uncordon
//! — against `kubectl drain` + `kubectl uncordon` of the same node, with the
//! kubectl of the same release, on the same API server, in one run.
//!
//! - **The cluster**: the real kube-apiserver and controller manager of
//!   tests/src/kube.rs. Node `node-1` (a real agent) runs `PODS` pods of a
//!   ReplicaSet under a budget `minAvailable: PODS - UNAVAILABLE`, and a
//!   DaemonSet's pod; `node-2` takes the replacements. There are no
//!   kubelets, scheduler or ReplicaSet controller: the simulated ones below
//!   react to watch events — an evicted pod is gone `POD_STOP_MS` after its
//!   eviction, a replacement is created at once on a node that takes pods
//!   and is Ready `POD_START_MS` later — the same for both drains. So the
//!   budget refuses evictions until replacements are Ready, and both drains
//!   retry.
//! - **lksadmin**: `rollout start --batch-size 1 --wait` of one node, with
//!   `--drain` (until it exited and the cordon is lifted, which the
//!   controller does just after the rollout completes) and without, in the
//!   same run; the turn adds the difference.
//! - **kubectl**: `kubectl drain node-1 --ignore-daemonsets
//!   --delete-emptydir-data`, then `kubectl wait --for=condition=Ready
//!   node/node-1` (the Ready gate's counterpart, timed apart), then
//!   `kubectl uncordon node-1`, each a process of its own.
//! - **Requests** are counted by the API server: its audit log, by user
//!   (lksadmin's and kubectl's client certificates name different users; the
//!   simulated workload is the admin).
//!
//! Each run resets the pods onto node-1 first; runs alternate which of the
//! two goes first. Environment: `RUNS` (5), `PODS` (10), `UNAVAILABLE` (2),
//! `POD_START_MS` (1000), `POD_STOP_MS` (500); `TRACE=1` prints each
//! drain's requests in order, with their times.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lks_e2e::agent::BundleFile;
use lks_e2e::kube::{KubeControlPlane, KubeOptions, SimulatedKubelet, kube_bin_dir};
use lks_e2e::rollout::{Fleet, first_line};
use lks_e2e::{ok_stdout, run, wait_until};

#[path = "kube_drain_bench/sim.rs"]
mod sim;

use sim::{Workload, is_ready};

const NS: &str = "bench";
const NODE: &str = "node-1";
const SINK: &str = "node-2";
const KUBELET: &str = "v1.37.2";

fn env_or(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{k}={v}: not a number")))
        .unwrap_or(d)
}

/// Seconds of the day of an audit timestamp (`2026-11-27T12:20:01.123456Z`).
fn day_secs(ts: &str) -> Option<f64> {
    let t = ts.split_once('T')?.1.trim_end_matches('Z');
    let mut p = t.split(':');
    let (h, m, s): (f64, f64, f64) = (
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
    );
    Some(h * 3600.0 + m * 60.0 + s)
}

/// `user`'s requests in order, each as "+SECONDS verb resource code",
/// seconds from the first: where a drain's time went (`TRACE=1`).
fn timeline(events: &[serde_json::Value], user: &str) -> String {
    let mut out = Vec::new();
    let mut first = None;
    for e in events
        .iter()
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
    {
        let Some(at) = e["requestReceivedTimestamp"].as_str().and_then(day_secs) else {
            continue;
        };
        let t0 = *first.get_or_insert(at);
        out.push(format!(
            "+{:.2} {} {}{} {}",
            (at - t0).rem_euclid(86_400.0),
            e["verb"].as_str().unwrap_or_default(),
            e["objectRef"]["resource"].as_str().unwrap_or_default(),
            e["objectRef"]["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            e["responseStatus"]["code"]
        ));
    }
    out.join(", ")
}

/// What one drain asked of the API server, from its audit log.
#[derive(Clone, Debug, Default)]
struct Requests {
    evictions: u64,
    refused: u64,
    /// Reads of pods: lists, gets, watches.
    pod_reads: u64,
    /// Node reads and writes (cordon, Ready, uncordon).
    node: u64,
    /// Discovery and anything else.
    other: u64,
    total: u64,
    by_kind: BTreeMap<String, u64>,
}

impl Requests {
    fn of(events: &[serde_json::Value], user: &str) -> Requests {
        let mut r = Requests::default();
        let mut ids = HashSet::new();
        for e in events {
            if e["user"]["username"] != user
                || !ids.insert(e["auditID"].as_str().unwrap_or_default().to_string())
            {
                continue;
            }
            let verb = e["verb"].as_str().unwrap_or_default();
            let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
            let sub = e["objectRef"]["subresource"].as_str().unwrap_or_default();
            let code = e["responseStatus"]["code"].as_i64().unwrap_or_default();
            r.total += 1;
            match (resource, sub) {
                ("pods", "eviction") => {
                    r.evictions += 1;
                    r.refused += u64::from(code == 429);
                }
                ("pods", "") => r.pod_reads += 1,
                ("nodes", _) => r.node += 1,
                _ => r.other += 1,
            }
            let kind = match (resource, sub) {
                ("", _) => format!("{verb} {}", e["requestURI"].as_str().unwrap_or_default()),
                (r, "") => format!("{verb} {r}"),
                (r, s) => format!("{verb} {r}/{s} {code}"),
            };
            *r.by_kind.entry(kind).or_default() += 1;
        }
        r
    }

    /// Pod requests (evictions and reads of pods) per eviction request:
    /// 1.0 would be one request per pod per try and nothing else.
    fn per_try(&self) -> f64 {
        (self.evictions + self.pod_reads) as f64 / self.evictions.max(1) as f64
    }
}

struct Bench {
    // Dropped first: the workload stops before the API server does.
    work: Workload,
    cp: KubeControlPlane,
    f: Fleet,
    pods: usize,
    unavailable: usize,
    kubectl_conf: PathBuf,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The first number in `text` after `after` ("drained in 2.3s: …" → 2.3).
fn number_after(text: &str, after: &str) -> Option<f64> {
    let rest = &text[text.find(after)? + after.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

struct LksRun {
    plain: Duration,
    drained: Duration,
    drain_phase: f64,
    ready_phase: f64,
    req: Requests,
}

struct KubectlRun {
    drain: Duration,
    wait: Duration,
    uncordon: Duration,
    req: Requests,
}

impl Bench {
    fn setup() -> Bench {
        let pods = env_or("PODS", 10) as usize;
        let unavailable = env_or("UNAVAILABLE", 2) as usize;
        assert!(
            unavailable >= 1 && unavailable <= pods,
            "1 <= UNAVAILABLE <= PODS"
        );
        let cp = KubeControlPlane::start_with(KubeOptions { audit: true });
        let f = Fleet::start("t", 1);
        SimulatedKubelet::new(&cp, NODE).register(true, KUBELET);
        SimulatedKubelet::new(&cp, SINK).register(true, KUBELET);
        // lksadmin and kubectl each with a user of their own, both
        // cluster admins: the audit log tells their requests apart.
        let lks_conf = cp.dir().join("lksadmin.conf");
        cp.write_kubeconfig(
            &lks_conf,
            "lksadmin",
            &cp.client_cert("lksadmin", &["system:masters"]),
        );
        let kubectl_conf = cp.dir().join("kubectl.conf");
        cp.write_kubeconfig(
            &kubectl_conf,
            "kubectl",
            &cp.client_cert("kubectl", &["system:masters"]),
        );
        f.server.lksctl_ok(&[
            "cluster",
            "set",
            &f.cluster,
            "--kubeconfig",
            lks_conf.to_str().expect("utf-8 path"),
        ]);

        cp.kubectl_ok(&["create", "namespace", NS]);
        wait_until(Duration::from_secs(60), "the namespace's ServiceAccount", || {
            cp.kubectl(&["get", "serviceaccount", "default", "-n", NS])
                .status
                .success()
        });
        let template = "  template:\n    metadata:\n      labels: {app: APP}\n    spec:\n      containers:\n      - name: c\n        image: registry.invalid/pause:1\n";
        cp.apply(&format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: web\n  namespace: {NS}\nspec:\n  replicas: {pods}\n  selector:\n    matchLabels: {{app: web}}\n{}",
            template.replace("APP", "web")
        ));
        cp.apply(&format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\n  namespace: {NS}\nspec:\n  selector:\n    matchLabels: {{app: agent}}\n{}",
            template.replace("APP", "agent")
        ));
        let uid = |kind: &str, name: &str| {
            cp.get_json(&["get", kind, name, "-n", NS])["metadata"]["uid"]
                .as_str()
                .expect("uid")
                .to_string()
        };
        let (rs_uid, ds_uid) = (uid("replicaset", "web"), uid("daemonset", "agent"));
        cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: agent-{NODE}\n  namespace: {NS}\n  labels: {{app: agent}}\n  ownerReferences:\n  - {{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: {ds_uid}, controller: true}}\nspec:\n  nodeName: {NODE}\n  containers:\n  - name: c\n    image: registry.invalid/pause:1\n"
        ));
        cp.apply(&format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: {NS}\nspec:\n  minAvailable: {}\n  selector:\n    matchLabels: {{app: web}}\n",
            pods - unavailable
        ));
        let work = Workload::start(
            &cp,
            pods,
            &rs_uid,
            Duration::from_millis(env_or("POD_START_MS", 1000)),
            Duration::from_millis(env_or("POD_STOP_MS", 500)),
        );
        Bench {
            work,
            cp,
            f,
            pods,
            unavailable,
            kubectl_conf,
        }
    }

    fn kubectl(&self, args: &[&str]) -> Duration {
        let mut c = Command::new(kube_bin_dir().join("kubectl"));
        c.arg(format!("--kubeconfig={}", self.kubectl_conf.display()))
            .args(args);
        let t = Instant::now();
        let out = run(c);
        let took = t.elapsed();
        ok_stdout(&out, &format!("kubectl {}", args.join(" ")));
        took
    }

    /// Every `web` pod back on node-1, Ready, the budget allowing
    /// UNAVAILABLE disruptions, no node cordoned.
    fn reset(&self) {
        let cp = &self.cp;
        cp.kubectl_ok(&["cordon", SINK]);
        cp.kubectl_ok(&[
            "delete",
            "pods",
            "-n",
            NS,
            "-l",
            "app=web",
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        wait_until(Duration::from_secs(60), "every web pod Ready on node-1", || {
            let pods = cp.get_json(&["get", "pods", "-n", NS, "-l", "app=web"]);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            let pdb = cp.get_json(&["get", "pdb", "web", "-n", NS]);
            items.len() == self.pods
                && items.iter().all(|p| {
                    p["spec"]["nodeName"] == NODE
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && is_ready(&serde_json::from_value(p.clone()).unwrap_or_default())
                })
                && pdb["status"]["currentHealthy"] == self.pods
                && pdb["status"]["disruptionsAllowed"] == self.unavailable
        });
        cp.kubectl_ok(&["uncordon", SINK]);
        cp.kubectl_ok(&["uncordon", NODE]);
    }

    fn bundle(&self, version: &str) -> String {
        self.f.publish(
            "kubelet",
            version,
            &[BundleFile {
                path: "/etc/kubernetes/kubelet.conf",
                content: format!("kubelet {version}\n").as_bytes(),
                mode: "0600",
            }],
            "0",
            "",
        )
    }

    fn lksadmin(&self, run: usize) -> LksRun {
        // Without draining: what the turn takes anyway.
        let plain = self.bundle(&format!("{run}.1"));
        let t = Instant::now();
        ok_stdout(
            &self.f.start_rollout(&plain, &["--batch-size", "1", "--wait"]),
            "rollout start --wait",
        );
        let plain = t.elapsed();

        let b = self.bundle(&format!("{run}.2"));
        let mark = self.cp.audit_mark();
        let t = Instant::now();
        let out = self.f.start_rollout(
            &b,
            &[
                "--batch-size",
                "1",
                "--drain",
                "--drain-timeout",
                "5m",
                "--kubelet-version",
                KUBELET,
                "--wait",
            ],
        );
        let exited = t.elapsed();
        let id = first_line(&ok_stdout(&out, "rollout start --drain --wait"));
        wait_until(Duration::from_secs(30), "the cordon lifted", || {
            self.work.uncordoned(NODE).is_some_and(|u| u > t)
        });
        let lifted = self.work.uncordoned(NODE).map_or(exited, |u| u - t);
        let drained = exited.max(lifted);
        std::thread::sleep(Duration::from_millis(300));
        let audit = self.cp.audit_events(mark);
        if std::env::var_os("TRACE").is_some() {
            eprintln!("lksadmin's requests: {}", timeline(&audit, "lksadmin"));
        }
        let req = Requests::of(&audit, "lksadmin");
        let events = self
            .f
            .server
            .lksctl_json(&["event", "list", "--rollout", &id, "--limit", "1000"]);
        let message = |kind: &str| {
            events
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["kind"] == kind)
                .and_then(|e| e["message"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        LksRun {
            plain,
            drained,
            drain_phase: number_after(&message("drained"), "drained in ").unwrap_or(f64::NAN),
            ready_phase: number_after(&message("node_ready"), "Ready ").unwrap_or(f64::NAN),
            req,
        }
    }

    fn kubectl_drain(&self) -> KubectlRun {
        let mark = self.cp.audit_mark();
        let drain = self.kubectl(&["drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data"]);
        let wait = self.kubectl(&["wait", "--for=condition=Ready", &format!("node/{NODE}")]);
        let uncordon = self.kubectl(&["uncordon", NODE]);
        std::thread::sleep(Duration::from_millis(300));
        let audit = self.cp.audit_events(mark);
        if std::env::var_os("TRACE").is_some() {
            eprintln!("kubectl's requests: {}", timeline(&audit, "kubectl"));
        }
        KubectlRun {
            drain,
            wait,
            uncordon,
            req: Requests::of(&audit, "kubectl"),
        }
    }
}

fn kinds(r: &Requests) -> String {
    r.by_kind
        .iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
#[ignore = "a benchmark: bash scripts/bench.sh --only kube-drain"]
fn kube_drain_bench() {
    let runs = env_or("RUNS", 5) as usize;
    let b = Bench::setup();
    let mut lks = Vec::new();
    let mut kc = Vec::new();
    for i in 0..runs {
        // Alternate which goes first, so neither always has the warmer
        // API server.
        for first in [i % 2 == 0, i % 2 == 1] {
            b.reset();
            if first {
                lks.push(b.lksadmin(i));
            } else {
                kc.push(b.kubectl_drain());
            }
        }
        let (l, k) = (lks.last().expect("a run"), kc.last().expect("a run"));
        eprintln!(
            "run {}: lksadmin {:.2} s with drain, {:.2} s without (drained in {:.1} s, Ready {:.1} s after applying); {} requests: {}",
            i + 1,
            secs(l.drained),
            secs(l.plain),
            l.drain_phase,
            l.ready_phase,
            l.req.total,
            kinds(&l.req)
        );
        eprintln!(
            "run {}: kubectl drain {:.2} s, wait {:.2} s, uncordon {:.2} s; {} requests: {}",
            i + 1,
            secs(k.drain),
            secs(k.wait),
            secs(k.uncordon),
            k.req.total,
            kinds(&k.req)
        );
    }
    let m = |f: &dyn Fn(usize) -> f64| median((0..runs).map(f).collect());
    let l_added = m(&|i| secs(lks[i].drained) - secs(lks[i].plain));
    let l_with = m(&|i| secs(lks[i].drained));
    let l_plain = m(&|i| secs(lks[i].plain));
    let k_du = m(&|i| secs(kc[i].drain) + secs(kc[i].uncordon));
    let k_dwu = m(&|i| secs(kc[i].drain) + secs(kc[i].wait) + secs(kc[i].uncordon));
    println!(
        "| what ({} pods on the node, budget minAvailable {}; median of {runs} runs) | time (s) | × kubectl drain + uncordon | eviction requests (refused with 429) | reads of pods | node requests | other | all requests | pod requests per eviction request |",
        b.pods,
        b.pods - b.unavailable
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let fmt = |v: f64| {
        if v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    // The request columns: medians over `rs`, or dashes.
    let cells = |rs: &[&Requests]| {
        if rs.is_empty() {
            return "- (-) | - | - | - | - | -".to_string();
        }
        let med = |g: fn(&Requests) -> f64| fmt(median(rs.iter().map(|r| g(r)).collect()));
        format!(
            "{} ({}) | {} | {} | {} | {} | {}",
            med(|r| r.evictions as f64),
            med(|r| r.refused as f64),
            med(|r| r.pod_reads as f64),
            med(|r| r.node as f64),
            med(|r| r.other as f64),
            med(|r| r.total as f64),
            med(Requests::per_try),
        )
    };
    let row = |what: &str, t: f64, rs: &[&Requests]| {
        println!("| {what} | {t:.2} | {:.2} | {} |", t / k_du, cells(rs));
    };
    let lreq: Vec<&Requests> = lks.iter().map(|r| &r.req).collect();
    let kreq: Vec<&Requests> = kc.iter().map(|r| &r.req).collect();
    row("kubectl drain + kubectl uncordon (baseline)", k_du, &kreq);
    row("kubectl drain + wait Ready + uncordon", k_dwu, &[]);
    row(
        "lksadmin: what the drained turn adds (with − without)",
        l_added,
        &lreq,
    );
    row("lksadmin: the turn with --drain", l_with, &[]);
    row("lksadmin: the turn without --drain", l_plain, &[]);
    println!();
    println!(
        "lksadmin's own phases (median): drained in {:.2} s, Ready {:.2} s after applying.",
        m(&|i| lks[i].drain_phase),
        m(&|i| lks[i].ready_phase)
    );
}
