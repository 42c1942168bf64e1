//! Harness for rollout end-to-end tests: a fleet of real agents joined to
//! one cluster of a real server, bundles whose step appends `start`/`end`
//! lines with nanosecond timestamps to one log file shared by every agent
//! (outside their roots, its path passed in the step's argv), and readers of
//! that log — so concurrency is measured from the agents' side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::agent::{Agent, BundleFile, CONVERGE, write_bundle};
use crate::server::Server;
use crate::{ok_stdout, wait_until};

/// A server, one cluster and agents joined to it and running.
pub struct Fleet {
    pub server: Server,
    pub cluster: String,
    pub agents: Vec<Agent>,
    /// The step log every agent appends to.
    pub log: PathBuf,
}

impl Fleet {
    /// Starts a server, creates `cluster`, joins and starts `n` agents named
    /// `node-1` … `node-n` and waits until each is connected.
    pub fn start(cluster: &str, n: usize) -> Fleet {
        let server = Server::start();
        server.create_cluster(cluster);
        let log = server.work_dir().join("steps.log");
        let mut f = Fleet {
            server,
            cluster: cluster.to_string(),
            agents: Vec::new(),
            log,
        };
        for i in 1..=n {
            f.add(&format!("node-{i}"));
        }
        for a in &f.agents {
            a.wait_connected();
        }
        f
    }

    /// Joins and starts one more agent.
    pub fn add(&mut self, name: &str) -> &mut Agent {
        let mut a = Agent::new(name);
        a.join(&self.server, &self.cluster, &[]);
        a.start();
        self.agents.push(a);
        self.agents.last_mut().expect("just pushed")
    }

    pub fn agent(&self, name: &str) -> &Agent {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
    }

    pub fn agent_mut(&mut self, name: &str) -> &mut Agent {
        self.agents
            .iter_mut()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
    }

    /// Writes and publishes a timed bundle (see [`timed_bundle`]); returns
    /// `NAME@VERSION`.
    pub fn publish(
        &self,
        name: &str,
        version: &str,
        files: &[BundleFile<'_>],
        sleep: &str,
        extra: &str,
    ) -> String {
        let dir = timed_bundle(
            self.server.work_dir(),
            name,
            version,
            files,
            &self.log,
            sleep,
            extra,
        );
        self.server.publish(&dir)
    }

    /// `lksctl rollout start --cluster C --bundle B ARGS…` (no `-o`); the
    /// whole output.
    pub fn start_rollout(&self, bundle: &str, args: &[&str]) -> Output {
        let mut a = vec!["rollout", "start", "--cluster", &self.cluster, "--bundle", bundle];
        a.extend_from_slice(args);
        self.server.lksctl(&a)
    }

    /// Starts a rollout without waiting; returns its ID.
    pub fn roll_out(&self, bundle: &str, args: &[&str]) -> String {
        let out = self.start_rollout(bundle, args);
        first_line(&ok_stdout(&out, &format!("rollout start {bundle}")))
    }

    /// `rollout status ID -o json`.
    pub fn status(&self, id: &str) -> serde_json::Value {
        self.server.lksctl_json(&["rollout", "status", id])
    }

    /// Waits until the rollout is in `state` with no node applying; returns
    /// its status.
    pub fn wait_state(&self, id: &str, state: &str) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        let start = std::time::Instant::now();
        while start.elapsed() < CONVERGE * 2 {
            last = self.status(id);
            if last["state"] == state && last["applying"] == 0 {
                return last;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("rollout {id} did not reach {state}: {last:#}");
    }

    /// The step runs logged so far.
    pub fn runs(&self) -> Vec<StepRun> {
        step_runs(&self.log)
    }
}

/// The first line of `text`, trimmed.
pub fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// A bundle whose one step appends `start NODE VERSION NANOS` to `log`,
/// sleeps `sleep` (a `sleep(1)` argument) and appends `end NODE VERSION NANOS`.
pub fn timed_bundle(
    parent: &Path,
    name: &str,
    version: &str,
    files: &[BundleFile<'_>],
    log: &Path,
    sleep: &str,
    extra: &str,
) -> PathBuf {
    let script = format!(
        "echo start $LKS_NODE $LKS_VERSION $(date +%s%N) >> \\\"$0\\\"; sleep {sleep}; \
         echo end $LKS_NODE $LKS_VERSION $(date +%s%N) >> \\\"$0\\\""
    );
    let step = format!(
        "[[step]]\nname = \"timed\"\nrun = [\"sh\", \"-c\", \"{script}\", \"{}\"]\ntimeout = \"60s\"\n{extra}",
        log.display()
    );
    let parent = parent.join(format!("src-{name}-{version}"));
    std::fs::create_dir_all(&parent).expect("create bundle parent");
    write_bundle(&parent, name, version, files, &step)
}

/// One run of a timed step: from its `start` line to its `end` line
/// (`end_ns` is `i128::MAX` while it is still running).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRun {
    pub node: String,
    pub version: String,
    pub start_ns: i128,
    pub end_ns: i128,
}

/// Every run in the log, in start order.
pub fn step_runs(log: &Path) -> Vec<StepRun> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    let mut runs: Vec<StepRun> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [what, node, version, ns] = f.as_slice() else {
            panic!("bad step log line {line:?}");
        };
        let ns: i128 = ns.parse().unwrap_or_else(|_| panic!("bad timestamp in {line:?}"));
        let key = (node.to_string(), version.to_string());
        match *what {
            "start" => {
                open.entry(key).or_default().push(runs.len());
                runs.push(StepRun {
                    node: node.to_string(),
                    version: version.to_string(),
                    start_ns: ns,
                    end_ns: i128::MAX,
                });
            }
            "end" => {
                let i = open
                    .get_mut(&key)
                    .and_then(|v| v.pop())
                    .unwrap_or_else(|| panic!("end without start: {line:?}"));
                runs[i].end_ns = ns;
            }
            _ => panic!("bad step log line {line:?}"),
        }
    }
    runs
}

/// The most runs that overlapped in time.
pub fn max_concurrency(runs: &[StepRun]) -> usize {
    let mut edges: Vec<(i128, i32)> = Vec::new();
    for r in runs {
        edges.push((r.start_ns, 1));
        edges.push((r.end_ns, -1));
    }
    // At equal times an end sorts before a start: touching runs do not overlap.
    edges.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    max as usize
}

/// How many runs of `version` started on each node.
pub fn starts_per_node(runs: &[StepRun], version: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in runs.iter().filter(|r| r.version == version) {
        *m.entry(r.node.clone()).or_default() += 1;
    }
    m
}

/// Waits until at least `n` runs have started.
pub fn wait_runs(f: &Fleet, n: usize) {
    wait_until(CONVERGE, &format!("{n} step run(s) to start"), || {
        f.runs().len() >= n
    });
}

/// Event kinds of a rollout, oldest first, as (kind, node).
pub fn rollout_events(server: &Server, id: &str) -> Vec<(String, String)> {
    let v = server.lksctl_json(&["event", "list", "--rollout", id, "--limit", "1000"]);
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["kind"].as_str().unwrap_or_default().to_string(),
                        e["node"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_concurrency_from_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::write(
            &log,
            "start a 1 10\nstart b 1 11\nend a 1 20\nstart c 1 20\nend b 1 25\nend c 1 30\nstart a 2 40\n",
        )
        .unwrap();
        let runs = step_runs(&log);
        assert_eq!(runs.len(), 4);
        assert_eq!(max_concurrency(&runs), 2);
        assert_eq!(runs[3].end_ns, i128::MAX);
        assert_eq!(starts_per_node(&runs, "1").values().sum::<usize>(), 3);
    }
}
