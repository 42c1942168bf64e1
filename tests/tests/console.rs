//! `lksctl console` end to end: a real server and agents, the console
//! process, its JSON endpoints compared with `lksctl … -o json`, its
//! request checks (token, Origin, Host), and its pages in headless Chromium
//! driven over WebDriver — live updates without a reload, the rollout
//! buttons, the node page of a failed bundle and the unreachable banner;
//! and with a cluster that has a kubeconfig of a real tenant control plane
//! (tests/src/kube.rs), each node's Kubernetes state and a draining node's
//! step; and a release plan's page (issue [fleet-plans]): its groups in
//! order, each with its progress, every cluster's state and why, its
//! rollout, the failure budget and the soak. Screenshots of each page go to
//! `target/console-screenshots/`.

// Test code: a helper that fails panics with what it was doing, as a
// #[test] does (clippy.toml allows that only inside #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use lks_e2e::agent::{Agent, BundleFile};
use lks_e2e::console::{Browser, Console, Http, Reply, page_token, screenshot_dir};
use lks_e2e::kube::{KubeControlPlane, SimulatedKubelet};
use lks_e2e::rollout::Fleet;
use lks_e2e::{free_addr, one_line_error, wait_until};
use serde_json::{Value, json};

const CONF: &str = "/etc/app/app.conf";

fn files() -> [BundleFile<'static>; 1] {
    [BundleFile {
        path: CONF,
        content: b"app\n",
        mode: "0644",
    }]
}

/// The console's `path` equals `lksctl ARGS -o json` (tried a few times:
/// last-seen times and rollouts move between the two reads).
fn same_as_lksctl(f: &Fleet, http: &Http, console: &Console, path: &str, args: &[&str]) {
    let start = Instant::now();
    loop {
        let ours = http.get(&format!("{}api/{path}", console.url()));
        assert_eq!(ours.status, 200, "GET /api/{path}: {}", ours.text);
        let theirs = f.server.lksctl_json(args);
        if ours.json == theirs {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "/api/{path} differs from lksctl {args:?}:\n{:#}\n---\n{theirs:#}",
            ours.json
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn state(f: &Fleet, id: &str) -> String {
    f.status(id)["state"].as_str().unwrap_or_default().to_string()
}

#[test]
fn endpoints_mirror_lksctl_and_actions_need_the_token() {
    let f = Fleet::start("c1", 2);
    let b = f.publish("app", "1", &files(), "3", "");
    let id = f.roll_out(&b, &["--batch-size", "1"]);
    let mut console = Console::start(&f.server, None);
    let http = Http::new();
    let url = console.url();
    the_json_endpoints_are_what_lksctl_prints(&f, &http, &console, &id);

    let page = http.get(&url);
    assert_eq!(page.status, 200);
    let token = page_token(&page.text);
    let origin = url.trim_end_matches('/').to_string();
    without_the_token_or_from_elsewhere_nothing_changes(&f, &http, &url, &token, &origin, &id);

    // With it, the verbs do what lksctl's do.
    let actions = Actions {
        http: &http,
        url: &url,
        token: &token,
        origin: &origin,
    };
    the_rollout_verbs_do_what_lksctls_do(&f, &actions, &id);
    the_start_form_refuses_what_lksctl_refuses_and_starts_the_rest(&f, &actions);

    // Ctrl-C (SIGTERM) stops it cleanly.
    assert_eq!(console.stop(), Some(0), "{}", console.log());

    // Anything but loopback is served with a warning.
    let port = free_addr().port();
    let wide = Console::start(&f.server, Some(SocketAddr::from(([0, 0, 0, 0], port))));
    wait_until(Duration::from_secs(5), "the warning", || {
        wide.log().contains("warning:")
    });
    assert!(wide.log().contains("not a loopback address"), "{}", wide.log());
    assert_eq!(http.get(&format!("{}api/clusters", wide.url())).status, 200);
}

/// Every JSON endpoint answers what `lksctl … -o json` prints; the
/// bundle carries its manifest, the selector preview counts the nodes.
fn the_json_endpoints_are_what_lksctl_prints(f: &Fleet, http: &Http, console: &Console, id: &str) {
    let url = console.url();
    for (path, args) in [
        ("clusters", vec!["cluster", "list"]),
        ("nodes", vec!["node", "list"]),
        ("nodes?cluster=c1", vec!["node", "list", "--cluster", "c1"]),
        ("nodes/node-1", vec!["node", "get", "node-1"]),
        ("bundles", vec!["bundle", "list"]),
        ("bundles/app/1", vec!["bundle", "get", "app@1"]),
        ("rollouts", vec!["rollout", "list"]),
        (&format!("rollouts/{id}"), vec!["rollout", "status", id]),
        (
            &format!("events?rollout={id}&limit=1000"),
            vec!["event", "list", "--rollout", id, "--limit", "1000"],
        ),
        ("audit?verb=StartRollout", vec!["audit", "--verb", "StartRollout"]),
        ("audit?limit=1000", vec!["audit", "--limit", "1000"]),
    ] {
        same_as_lksctl(f, http, console, path, &args);
    }
    let bundle = http.get(&format!("{url}api/bundles/app/1")).json;
    assert_eq!(bundle["manifest"]["files"][0]["path"], CONF, "{bundle:#}");
    assert_eq!(bundle["manifest"]["steps"][0]["name"], "timed", "{bundle:#}");
    let m = http.get(&format!("{url}api/selector?cluster=c1&selector=")).json;
    assert_eq!((&m["matches"], &m["connected"]), (&json!(2), &json!(2)), "{m:#}");
}

/// Without the token, or from another origin, nothing changes; a
/// rebound host name and a preflight from elsewhere are refused.
fn without_the_token_or_from_elsewhere_nothing_changes(
    f: &Fleet,
    http: &Http,
    url: &str,
    token: &str,
    origin: &str,
    id: &str,
) {
    let pause = format!("{url}api/rollouts/{id}/pause");
    let r = http.request("POST", &pause, &[("origin", origin)], None);
    assert_eq!(r.status, 403, "{}", r.text);
    let r = http.request("POST", &pause, &[("x-console-token", "0123")], None);
    assert_eq!(r.status, 403, "{}", r.text);
    let r = http.request(
        "POST",
        &pause,
        &[("x-console-token", token), ("origin", "http://evil.example")],
        None,
    );
    assert_eq!(r.status, 403, "{}", r.text);
    let r = http.request(
        "GET",
        &format!("{url}api/clusters"),
        &[("host", "evil.example")],
        None,
    );
    assert_eq!(r.status, 421, "a rebound host name is refused: {}", r.text);
    assert_eq!(state(f, id), "running");
    let r = http.request("OPTIONS", &pause, &[("origin", "http://evil.example")], None);
    assert!(r.status >= 400, "{}", r.text);
}

/// What the console's actions post with: its URL, the page's token and
/// its own origin.
struct Actions<'a> {
    http: &'a Http,
    url: &'a str,
    token: &'a str,
    origin: &'a str,
}

impl Actions<'_> {
    /// POSTs to `api/{path}` with the token, from the console's origin.
    fn post(&self, path: &str, body: Option<&Value>) -> Reply {
        self.http.request(
            "POST",
            &format!("{}api/{path}", self.url),
            &[("x-console-token", self.token), ("origin", self.origin)],
            body,
        )
    }
}

/// pause, resume and abort do what lksctl's do; a verb the state does
/// not allow is lksctl's own error line; an unknown verb is 404.
fn the_rollout_verbs_do_what_lksctls_do(f: &Fleet, actions: &Actions<'_>, id: &str) {
    let post = |path: &str, body: Option<&Value>| actions.post(path, body);
    for (verb, want) in [("pause", "paused"), ("resume", "running"), ("abort", "aborted")] {
        let r = post(&format!("rollouts/{id}/{verb}"), None);
        assert_eq!(r.status, 200, "{verb}: {}", r.text);
        assert_eq!(r.json["rollout"]["state"], want, "{}", r.text);
        assert!(
            r.json["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("rollout {id} "))
        );
        assert_eq!(state(f, id), want, "after {verb}");
    }
    // A verb the state does not allow: lksctl's own error line.
    let r = post(&format!("rollouts/{id}/pause"), None);
    assert_eq!(r.status, 409, "{}", r.text);
    let cli = one_line_error(
        &f.server.lksctl(&["rollout", "pause", id]),
        "pause an aborted rollout",
    );
    assert_eq!(format!("error: {}", r.json["error"].as_str().unwrap()), cli);
    let r = post(&format!("rollouts/{id}/explode"), None);
    assert_eq!(r.status, 404, "{}", r.text);
}

/// The start form: bad input is lksctl's error, on its field, and starts
/// nothing; good input starts a rollout as asked.
fn the_start_form_refuses_what_lksctl_refuses_and_starts_the_rest(f: &Fleet, actions: &Actions<'_>) {
    let post = |path: &str, body: Option<&Value>| actions.post(path, body);
    let before = f
        .server
        .lksctl_json(&["rollout", "list"])
        .as_array()
        .unwrap()
        .len();
    for (body, field, args) in [
        (
            json!({"cluster": "c1", "bundle": "app@1", "selector": "role"}),
            "selector",
            vec!["--bundle", "app@1", "--selector", "role"],
        ),
        (
            json!({"cluster": "c1", "bundle": "nope@1"}),
            "bundle",
            vec!["--bundle", "nope@1"],
        ),
    ] {
        let r = post("rollouts", Some(&body));
        assert!(r.status >= 400, "{}", r.text);
        assert_eq!(r.json["field"], field, "{}", r.text);
        let mut a = vec!["rollout", "start", "--cluster", "c1"];
        a.extend(args);
        let cli = one_line_error(&f.server.lksctl(&a), "start with bad input");
        assert_eq!(format!("error: {}", r.json["error"].as_str().unwrap()), cli);
    }
    assert_eq!(
        f.server
            .lksctl_json(&["rollout", "list"])
            .as_array()
            .unwrap()
            .len(),
        before
    );
    let r = post(
        "rollouts",
        Some(&json!({"cluster": "c1", "bundle": "app@1", "batch_size": 2})),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let started = r.json["rollout"]["id"].as_str().unwrap().to_string();
    assert_eq!(f.status(&started)["batch_size"], 2);
}

#[test]
fn pages_in_a_real_browser() {
    let mut f = Fleet::start("c1", 3);
    let b = f.publish("app", "1", &files(), "4", "");
    let bad = f.publish(
        "bad",
        "1",
        &[],
        "0",
        "[[step]]\nname = \"boom\"\nrun = [\"sh\", \"-c\", \"echo kaboom-from-step >&2; exit 3\"]\n",
    );
    let console = Console::start(&f.server, None);
    let br = Browser::start();
    let shots = screenshot_dir();
    let url = console.url();

    the_fleet_and_nodes_pages_filter_and_keep_the_filter_in_the_url(&br, &shots, &url);
    let id = a_rollout_started_from_the_form_shows_progress_by_itself(&br, &shots, &url, &b);
    pause_resume_and_an_abort_that_asks_first_and_is_audited(&f, &br, &shots, &url, &id);
    a_failing_bundles_message_shows_on_the_node_page(&f, &br, &shots, &url, &bad);

    // The server goes away: the banner says so.
    br.goto(&format!("{url}#/fleet"));
    br.wait_text("#versions-table", "app@1");
    br.wait_text("#failing-nodes-table", "kaboom-from-step");
    br.screenshot(&shots, "fleet-busy");
    f.server.stop();
    br.wait("the unreachable banner", |b| {
        b.js("return !document.getElementById('banner').hidden;", json!([])) == true
    });
    assert!(
        br.text("#banner").contains("unreachable"),
        "{}",
        br.text("#banner")
    );
    br.screenshot(&shots, "unreachable");
    f.agents.clear();
}

/// Fleet: the cluster and its connected nodes. Nodes: the filters work
/// and stay in the URL; the Release column shows, no Kube column.
fn the_fleet_and_nodes_pages_filter_and_keep_the_filter_in_the_url(br: &Browser, shots: &Path, url: &str) {
    // Fleet: the cluster and its connected nodes.
    br.goto(&format!("{url}#/fleet"));
    br.wait_text("#clusters-table", "c1");
    br.wait_text("#clusters-table", "3 / 3");
    br.screenshot(shots, "fleet");

    // Nodes: the filters work and stay in the URL.
    br.goto(&format!("{url}#/nodes"));
    br.wait_text("#nodes-summary", "3 of 3 node(s)");
    br.type_into("#filter-name", "node-2");
    br.wait_text("#nodes-summary", "1 of 3 node(s)");
    assert_eq!(
        br.js(
            "return document.querySelectorAll('#nodes-table tbody tr').length;",
            json!([])
        ),
        1
    );
    assert!(br.text("#nodes-table").contains("node-2"));
    // The RELEASE column of `node list` (issue [trust]).
    assert!(
        br.text("#nodes-table").contains("Release"),
        "{}",
        br.text("#nodes-table")
    );
    assert!(br.hash().contains("q=node-2"), "{}", br.hash());
    // No cluster has a kubeconfig: no Kube column, as in `node list`.
    assert!(
        !br.text("#nodes-table thead").contains("Kube"),
        "{}",
        br.text("#nodes-table thead")
    );
    br.screenshot(shots, "nodes");
}

/// A rollout started from the form shows progress by itself, and what
/// its nodes fetched, without a reload. Returns its ID.
fn a_rollout_started_from_the_form_shows_progress_by_itself(
    br: &Browser,
    shots: &Path,
    url: &str,
    b: &str,
) -> String {
    br.goto(&format!("{url}#/rollouts"));
    br.click("#start-box summary");
    br.wait("the cluster choice", |b| b.text("#start-cluster").contains("c1"));
    br.type_into("#start-selector", "");
    br.wait_text("#start-matches", "matches 3 node(s)");
    br.type_into("#start-bundle", b);
    br.type_into("#start-batch_size", "1");
    br.screenshot(shots, "rollout-start");
    br.click("#start-submit");
    br.wait("the rollout page", |b| b.hash().starts_with("#/rollouts/"));
    let id = br.hash().trim_start_matches("#/rollouts/").to_string();
    br.js("window.__sameDocument = true;", json!([]));
    br.wait_text("#rollout-state", "running");
    br.wait("an updated node", |b| {
        b.text("#count-updated").parse::<u32>().unwrap_or(0) >= 1
    });
    // What its nodes fetched, as `rollout status` says it (issue [delta]).
    br.wait_text("#rollout-fetched", "from the server");
    assert_eq!(
        br.js("return window.__sameDocument === true;", json!([])),
        true,
        "the page updated without a reload"
    );
    br.screenshot(shots, "rollout");

    id
}

/// Pause and Resume; Abort asks first, and Cancel keeps it running. The
/// audit trail names the abort the console made, and who made it.
fn pause_resume_and_an_abort_that_asks_first_and_is_audited(
    f: &Fleet,
    br: &Browser,
    shots: &Path,
    url: &str,
    id: &str,
) {
    br.click("#act-pause");
    wait_until(Duration::from_secs(5), "paused", || state(f, id) == "paused");
    br.wait_text("#rollout-state", "paused");
    br.wait("Resume enabled", |b| {
        b.js(
            "return !document.getElementById('act-resume').disabled;",
            json!([]),
        ) == true
    });
    br.click("#act-resume");
    wait_until(Duration::from_secs(5), "running", || state(f, id) == "running");
    br.wait_text("#rollout-state", "running");
    br.click("#act-abort");
    br.wait("the confirmation", |b| {
        b.js("return document.getElementById('confirm').open;", json!([])) == true
    });
    br.click("#confirm-no");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(state(f, id), "running", "cancelled abort changed nothing");
    br.click("#act-abort");
    br.wait("the confirmation", |b| {
        b.js("return document.getElementById('confirm').open;", json!([])) == true
    });
    br.click("#confirm-yes");
    wait_until(Duration::from_secs(5), "aborted", || state(f, id) == "aborted");
    br.wait_text("#rollout-state", "aborted");
    br.wait_text("#action-result", "aborted");
    // The audit trail names the abort the console made, and who made it.
    br.goto(&format!("{url}#/audit?verb=AbortRollout"));
    br.wait_text("#audit-table", id);
    assert!(
        br.text("#audit-table").contains("ok"),
        "{}",
        br.text("#audit-table")
    );
    br.screenshot(shots, "audit");
}

/// A failing bundle: its message and the rollback on the node page, the
/// failure in the events; the bundle page lists its files.
fn a_failing_bundles_message_shows_on_the_node_page(
    f: &Fleet,
    br: &Browser,
    shots: &Path,
    url: &str,
    bad: &str,
) {
    let out = f.start_rollout(bad, &["--selector", "", "--batch-size", "1"]);
    lks_e2e::ok_stdout(&out, "roll out the failing bundle");
    br.goto(&format!("{url}#/nodes/node-1"));
    br.wait_text("#node-bundles-table", "kaboom-from-step");
    // The agent put the old state back after the failed step.
    br.wait_text("#node-bundles-table", "rolled_back");
    br.wait_text("#node-events-table", "failed");
    br.wait_text("#node-facts-list", "Release");
    br.screenshot(shots, "node");
    br.goto(&format!("{url}#/bundles/app/1"));
    br.wait_text("#bundle-files-table", CONF);
    br.screenshot(shots, "bundle");
    br.goto(&format!("{url}#/events?kind=failed"));
    br.wait_text("#events-table", "kaboom-from-step");
    br.screenshot(shots, "events");
}

/// The column's cell of `node`'s row in `#nodes-table` under `header`.
fn cell(br: &Browser, node: &str, header: &str) -> String {
    br.js(
        "const t = document.getElementById('nodes-table'); if (!t) return '';
         const i = Array.from(t.tHead.rows[0].cells).findIndex((c) => c.textContent === arguments[1]);
         const row = Array.from(t.tBodies[0].rows).find((r) => r.cells[0].textContent === arguments[0]);
         return i < 0 || !row ? '' : row.cells[i].textContent;",
        json!([node, header]),
    )
    .as_str()
    .unwrap_or_default()
    .to_string()
}

#[test]
fn kube_state_and_drain_steps_in_a_real_browser() {
    // A real kube-apiserver and controller manager; the Node objects and
    // the pod's status are the tests' simulated kubelet's. node-2 has no
    // Node in the tenant cluster.
    let cp = KubeControlPlane::start();
    let f = Fleet::start("k1", 2);
    SimulatedKubelet::new(&cp, "node-1").register(true, "v1.37.2");
    let conf = cp.admin_kubeconfig.to_str().unwrap().to_string();
    f.server
        .lksctl_ok(&["cluster", "set", "k1", "--kubeconfig", &conf]);
    let console = Console::start(&f.server, None);
    let br = Browser::start();
    let shots = screenshot_dir();
    let url = console.url();

    br.goto(&format!("{url}#/nodes"));
    br.wait("node-1 Ready with its kubelet", |b| {
        cell(b, "node-1", "Kube") == "Ready v1.37.2"
    });
    assert_eq!(cell(&br, "node-2", "Kube"), "-", "no Node named node-2");

    // A drain that a budget holds: node-1 stays cordoned by the rollout,
    // at its `draining` step, while the pages are read.
    cp.kubectl_ok(&["create", "namespace", "work"]);
    wait_until(Duration::from_secs(60), "the namespace's ServiceAccount", || {
        cp.kubectl(&["get", "serviceaccount", "default", "-n", "work"])
            .status
            .success()
    });
    cp.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-1\n  namespace: work\n  labels: {app: db}\nspec:\n  nodeName: node-1\n  containers:\n  - name: c\n    image: registry.invalid/pause:1\n",
    );
    cp.apply(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: db\n  namespace: work\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels: {app: db}\n",
    );
    // Running and Ready (a Pending pod is evicted whatever the budget says).
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "db-1",
        "-n",
        "work",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    wait_until(Duration::from_secs(60), "the budget's status", || {
        cp.get_json(&["get", "pdb", "db", "-n", "work"])["status"]["observedGeneration"].is_number()
    });
    let b = f.publish("kubelet", "2", &files(), "0", "");
    let id = f.roll_out(
        &b,
        &[
            "--selector",
            "",
            "--batch-size",
            "1",
            "--drain",
            "--drain-timeout",
            "10m",
        ],
    );
    br.wait("node-1 cordoned by the rollout", |b| {
        cell(b, "node-1", "Kube") == format!("cordoned v1.37.2 cordoned by {}", &id[..8])
    });
    let link = br.js(
        "return document.querySelector('#nodes-table .kube a').getAttribute('href');",
        json!([]),
    );
    assert_eq!(link, format!("#/rollouts/{id}"), "the cordon links its rollout");
    br.screenshot(&shots, "nodes-kube");

    br.goto(&format!("{url}#/nodes/node-1"));
    br.wait_text("#node-facts-list", "Kubernetes");
    br.wait_text("#node-facts-list", "cordoned by");
    br.screenshot(&shots, "node-kube");
    br.goto(&format!("{url}#/nodes/node-2"));
    br.wait_text("#node-facts-list", "Kubernetes");
    let kube_row = br.js(
        "const dt = Array.from(document.querySelectorAll('#node-facts-list dt')).find((d) => d.textContent === 'Kubernetes');
         return dt.nextElementSibling.textContent;",
        json!([]),
    );
    assert_eq!(kube_row, "-", "node-2 has no Node in the tenant cluster");

    br.goto(&format!("{url}#/rollouts/{id}"));
    br.wait_text("#rollout-nodes-table", "draining");
    let step = br.js(
        "return Array.from(document.querySelectorAll('#rollout-nodes-table .kube-step')).map((e) => e.closest('tr').cells[0].textContent + ' ' + e.textContent);",
        json!([]),
    );
    assert_eq!(step, json!(["node-1 draining"]), "only node-1's turn has begun");
    br.screenshot(&shots, "rollout-draining");

    // Aborted: the drain stops, the cordon is lifted, the step is gone.
    f.server.lksctl_ok(&["rollout", "abort", &id]);
    br.wait("no step left", |b| {
        b.js(
            "return document.querySelectorAll('#rollout-nodes-table .kube-step').length;",
            json!([]),
        ) == 0
    });
    br.goto(&format!("{url}#/nodes"));
    br.wait("node-1 Ready again", |b| {
        cell(b, "node-1", "Kube") == "Ready v1.37.2"
    });
}

/// The cells of `cluster`'s row in the table `#id`, joined by " | "
/// ("" while there is no such row).
fn plan_row(br: &Browser, id: &str, cluster: &str) -> String {
    br.js(
        "const t = document.getElementById(arguments[0]); if (!t) return '';
         const row = Array.from(t.tBodies[0].rows).find((r) => r.cells[0].textContent === arguments[1]);
         return row ? Array.from(row.cells).map((c) => c.textContent).join(' | ') : '';",
        json!([id, cluster]),
    )
    .as_str()
    .unwrap_or_default()
    .to_string()
}

#[test]
fn a_plans_page_shows_its_groups_progress_and_states() {
    // Real agents: node-1 and node-2 in c1, bad-1 in c2 (the bundle's step
    // fails there, saying so in markup), node-3 in c3; c4 has no node.
    let mut f = Fleet::start("c1", 2);
    for (cluster, node) in [("c2", "bad-1"), ("c3", "node-3")] {
        f.server.create_cluster(cluster);
        let mut a = Agent::new(node);
        a.join(&f.server, cluster, &[]);
        a.start();
        a.wait_connected();
        f.agents.push(a);
    }
    f.server.create_cluster("c4");
    let picky = "[[step]]\nname = \"picky\"\nrun = [\"sh\", \"-c\", \"case $LKS_NODE in bad-*) echo '<i>refused</i>' on $LKS_NODE >&2; exit 3;; esac\"]\n";
    let b = f.publish("app", "1", &files(), "0", picky);
    let console = Console::start(&f.server, None);
    let br = Browser::start();
    let shots = screenshot_dir();
    let url = console.url();
    let http = Http::new();

    let out = f.server.lksctl_ok(&[
        "plan",
        "create",
        "fleet",
        "--bundle",
        &b,
        "--group",
        "canary=c1",
        "--group",
        "rest=*",
        "--soak",
        "8s",
        "--max-clusters-in-flight",
        "1",
        "--failure-budget",
        "1",
    ]);
    assert_eq!(out.trim(), "fleet");
    br.goto(&format!("{url}#/plans/fleet"));
    br.wait_text("#plan-state", "running");
    // The canary group done, the next one waits out the soak: the page
    // says how long is left.
    br.wait_text("#plan-group-0", "soaking");
    assert!(
        br.text("#plan-group-0").contains("1/1 completed"),
        "{}",
        br.text("#plan-group-0")
    );
    assert!(
        br.text("#plan-soak").contains("group canary soaking until"),
        "{}",
        br.text("#plan-soak")
    );
    assert!(
        br.text("#plan-soak").contains("left"),
        "{}",
        br.text("#plan-soak")
    );
    let c2 = plan_row(&br, "plan-group-1-table", "c2");
    assert!(c2.starts_with("c2 | waiting"), "{c2}");
    br.screenshot(&shots, "plan-soaking");

    // c2 fails: the budget is used up, the plan halts, c3 never starts.
    br.wait_text("#plan-state", "halted");
    let p = f.server.lksctl_json(&["plan", "status", "fleet"]);
    let failed = lks_e2e::plan::cluster(&p, "c2").clone();
    assert_eq!(failed["state"], "failed", "{p:#}");
    let id = failed["rollout_id"].as_str().unwrap();
    br.wait_text("#plan-budget", "1 of 1 used");
    let c2 = plan_row(&br, "plan-group-1-table", "c2");
    assert!(c2.starts_with("c2 | failed | "), "{c2}");
    let why = failed["message"].as_str().unwrap();
    assert!(
        why.contains("<i>refused</i> on bad-1") && c2.contains(why),
        "the why {why:?} in {c2}"
    );
    // The step's words are text, never markup.
    assert_eq!(
        br.js(
            "return document.querySelectorAll('#plan-groups-list i').length;",
            json!([])
        ),
        0
    );
    assert!(c2.contains(&id[..8]), "its rollout in {c2}");
    let href = br.js(
        "const t = document.getElementById('plan-group-1-table');
         const row = Array.from(t.tBodies[0].rows).find((r) => r.cells[0].textContent === 'c2');
         return row.querySelector('a[href^=\"#/rollouts/\"]').getAttribute('href');",
        json!([]),
    );
    assert_eq!(href, format!("#/rollouts/{id}"), "the rollout links its page");
    assert!(
        plan_row(&br, "plan-group-1-table", "c3").starts_with("c3 | waiting"),
        "nothing new starts: {}",
        br.text("#plan-group-1")
    );
    assert!(
        br.text("#plan-group-1").contains("0/3 completed, 1 failed"),
        "{}",
        br.text("#plan-group-1")
    );
    assert!(
        br.text("#plan-message").contains("failure budget"),
        "{}",
        br.text("#plan-message")
    );
    br.screenshot(&shots, "plan-halted");

    // The JSON the page reads is what `lksctl plan … -o json` prints.
    same_as_lksctl(&f, &http, &console, "plans", &["plan", "list"]);
    same_as_lksctl(&f, &http, &console, "plans/fleet", &["plan", "status", "fleet"]);
    // A verb without the page's token changes nothing.
    let r = http.request("POST", &format!("{url}api/plans/fleet/resume"), &[], None);
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(
        f.server.lksctl_json(&["plan", "status", "fleet"])["state"],
        "halted"
    );

    // Resume, from the page: c3 completes, c4 (no node) is skipped, c2
    // stays failed, and the plan completes.
    br.wait("Resume enabled", |b| {
        b.js(
            "return !document.getElementById('plan-act-resume').disabled;",
            json!([]),
        ) == true
    });
    br.click("#plan-act-resume");
    br.wait_text("#plan-action-result", "plan fleet running");
    br.wait_text("#plan-state", "completed");
    assert!(
        plan_row(&br, "plan-group-1-table", "c3").starts_with("c3 | completed"),
        "{}",
        br.text("#plan-group-1")
    );
    assert!(
        plan_row(&br, "plan-group-1-table", "c4").starts_with("c4 | skipped"),
        "{}",
        br.text("#plan-group-1")
    );
    assert!(
        plan_row(&br, "plan-group-1-table", "c2").starts_with("c2 | failed"),
        "{}",
        br.text("#plan-group-1")
    );
    assert!(
        br.text("#plan-group-1")
            .contains("1/3 completed, 1 failed, 1 skipped"),
        "{}",
        br.text("#plan-group-1")
    );
    br.screenshot(&shots, "plan");

    // The list: the plan, its state and progress.
    br.goto(&format!("{url}#/plans"));
    br.wait_text("#plans-table", "fleet");
    let row = plan_row(&br, "plans-table", "fleet");
    assert!(
        row.contains("completed") && row.contains("2/4 completed, 1 failed, 1 skipped"),
        "{row}"
    );
    br.screenshot(&shots, "plans");
}
