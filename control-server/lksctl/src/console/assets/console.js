// lksadmin operator console: pages rendered from the console's JSON
// endpoints (the lksctl verbs), refreshed every REFRESH_MS. Every value is
// put into the page with textContent or as an attribute, never as HTML.
"use strict";

const REFRESH_MS = 1500;
const PAGE_SIZE = 100;
const TOKEN = document.querySelector('meta[name="lks-console-token"]').content;
const ACTIVE = ["running", "paused", "rolling_back"];

// ---- DOM helpers ----

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Replaces a node's children; arrays are flattened, null and false dropped.
function fill(node, ...children) {
  node.replaceChildren();
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

function link(href, text) {
  return el("a", { href }, text);
}

function enc(s) {
  return encodeURIComponent(s);
}

function nodeLink(name) {
  return name ? link("#/nodes/" + enc(name), name) : "-";
}

function rolloutLink(id, text) {
  return id ? link("#/rollouts/" + enc(id), text || id.slice(0, 8)) : "-";
}

function chip(state) {
  return el("span", { class: "chip s-" + String(state).replace(/[^a-z_]/g, "") }, state);
}

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 90) return s + " s ago";
  if (s < 90 * 60) return Math.round(s / 60) + " min ago";
  if (s < 36 * 3600) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

function time(iso) {
  if (!iso) return "-";
  return el("time", { datetime: iso, title: iso }, iso.replace("T", " ").replace("Z", " UTC"));
}

function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

// What a node fetched for a version (peer sharing): "-", or the total and
// the part from peers.
function fetchedText(b) {
  const s = b.fetched_from_server || 0, p = b.fetched_from_peers || 0;
  if (s + p === 0) return "-";
  return p === 0 ? bytes(s) : bytes(s + p) + ", " + bytes(p) + " from peers";
}

// What a rollout's nodes fetched for it (`rollout status`'s "Fetched:"):
// from the server, of it as binary deltas, from peers; "-" for nothing.
function rolloutFetchedText(f) {
  const s = (f && f.from_server) || 0, d = (f && f.as_delta) || 0, p = (f && f.from_peers) || 0;
  if (s + p === 0) return "-";
  return bytes(s) + " from the server" + (d ? " (" + bytes(d) + " as deltas)" : "") + (p ? ", " + bytes(p) + " from peers" : "");
}

function labelsText(l) {
  const s = Object.entries(l || {}).map(([k, v]) => k + "=" + v).join(",");
  return s || "-";
}

// A table: headers and rows of cells (strings or nodes).
function table(id, headers, rows, empty) {
  if (!rows.length) return el("p", { class: "empty", id }, empty || "Nothing here.");
  return el("div", { class: "scroll" },
    el("table", { id },
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c)))))));
}

// Progress bar of a rollout or batch: updated, failed, applying of total.
function bar(total, updated, failed, applying, label) {
  const pct = (n) => (total ? (100 * n) / total : 0) + "%";
  const b = el("div", { class: "bar", role: "img", "aria-label": label },
    el("span", { class: "b-updated" }), el("span", { class: "b-failed" }), el("span", { class: "b-applying" }));
  b.children[0].style.width = pct(updated);
  b.children[1].style.width = pct(failed);
  b.children[2].style.width = pct(applying);
  return b;
}

function rolloutBar(r) {
  return el("div", { class: "progress" },
    bar(r.total, r.updated, r.failed, r.applying, r.updated + " of " + r.total + " updated"),
    el("span", { class: "count" }, r.updated + "/" + r.total));
}

// ---- talking to the console ----

class ApiError extends Error {
  constructor(msg, unreachable, field) {
    super(msg);
    this.unreachable = unreachable;
    this.field = field;
  }
}

async function call(path, init) {
  let resp;
  try {
    resp = await fetch("/api/" + path, Object.assign({ cache: "no-store" }, init));
  } catch (e) {
    throw new ApiError("the console (lksctl console) is not running: " + e.message, true, null);
  }
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    body = { error: "the console answered " + resp.status };
  }
  if (!resp.ok) throw new ApiError(body.error || "HTTP " + resp.status, !!body.unreachable, body.field || null);
  return body;
}

function get(path) {
  return call(path);
}

function post(path, body) {
  return call(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Console-Token": TOKEN },
    body: JSON.stringify(body || {}),
  });
}

const banner = {
  show(msg) {
    const b = document.getElementById("banner");
    b.textContent = "Control server unreachable: " + msg + " — retrying every " + REFRESH_MS / 1000 + " s.";
    b.hidden = false;
  },
  hide() {
    document.getElementById("banner").hidden = true;
  },
};

// ---- routing ----

function route() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts: parts.length ? parts : ["fleet"], params: new URLSearchParams(query || "") };
}

// Writes the page's filters into the URL without re-rendering the page.
function setParams(params) {
  const r = route();
  const clean = new URLSearchParams();
  for (const [k, v] of params) if (v) clean.set(k, v);
  const q = clean.toString();
  history.replaceState(null, "", "#/" + r.parts.map(enc).join("/") + (q ? "?" + q : ""));
}

let current = null; // { refresh: async () => void }
let generation = 0;
let refreshing = false;

async function show() {
  const r = route();
  generation++;
  const main = document.getElementById("main");
  fill(main);
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === r.parts[0]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const page = PAGES[r.parts[0]] || notFound;
  current = page(main, r);
  document.title = (main.querySelector("h1") || { textContent: "lksadmin" }).textContent + " · lksadmin console";
  await refresh();
}

async function refresh() {
  if (!current || refreshing) return;
  refreshing = true;
  const gen = generation;
  try {
    await current.refresh();
    if (gen === generation) {
      banner.hide();
      document.getElementById("live").textContent = "live · updated " + new Date().toLocaleTimeString();
    }
  } catch (e) {
    if (gen === generation) {
      if (e.unreachable) banner.show(e.message);
      else if (current.error) current.error(e);
      document.getElementById("live").textContent = "update failed " + new Date().toLocaleTimeString();
    }
  } finally {
    refreshing = false;
  }
}

// A section whose content is replaced on every refresh.
function slot(parent, id) {
  const s = el("div", { id });
  parent.append(s);
  return s;
}

function errorBox(parent) {
  const box = el("p", { class: "error", role: "alert", hidden: true });
  parent.append(box);
  return {
    set(e) {
      box.textContent = e ? e.message : "";
      box.hidden = !e;
    },
  };
}

// Page links over `items`, PAGE_SIZE per page; `page` is 1-based.
function paginate(items, page, onPage) {
  const pages = Math.max(1, Math.ceil(items.length / PAGE_SIZE));
  const p = Math.min(Math.max(1, page || 1), pages);
  const shown = items.slice((p - 1) * PAGE_SIZE, p * PAGE_SIZE);
  const nav = el("nav", { class: "pager", "aria-label": "Pages of results" },
    el("button", { type: "button", disabled: p <= 1, onclick: () => onPage(p - 1) }, "‹ Previous"),
    el("span", {}, items.length ? `${(p - 1) * PAGE_SIZE + 1}–${(p - 1) * PAGE_SIZE + shown.length} of ${items.length}` : "0 of 0"),
    el("button", { type: "button", disabled: p >= pages, onclick: () => onPage(p + 1) }, "Next ›"));
  return { shown, nav: pages > 1 ? nav : null, page: p };
}

// ---- pages ----

function notFound(main, r) {
  main.append(el("h1", {}, "Not found"), el("p", {}, "No page " + r.parts.join("/") + ". "), link("#/fleet", "Go to the fleet"));
  return { refresh: async () => {} };
}

function fleetPage(main) {
  main.append(el("h1", {}, "Fleet"));
  const clusters = slot(main, "fleet-clusters");
  const versions = slot(main, "fleet-versions");
  const rollouts = slot(main, "fleet-rollouts");
  const failures = slot(main, "fleet-failures");
  return {
    async refresh() {
      const [cs, nodes, rs, events] = await Promise.all([get("clusters"), get("nodes"), get("rollouts"), get("events?limit=200")]);
      const per = {};
      for (const n of nodes) {
        const c = (per[n.cluster] = per[n.cluster] || { total: 0, connected: 0 });
        c.total++;
        if (n.connected) c.connected++;
      }
      fill(clusters, el("h2", {}, "Clusters"), table("clusters-table",
        ["Cluster", "Connected / total", "Maintenance windows", "CA", "Created"],
        cs.map((c) => {
          const p = per[c.name] || { total: 0, connected: 0 };
          return [link("#/nodes?cluster=" + enc(c.name), c.name), el("span", { class: "num" }, `${p.connected} / ${p.total}`),
            c.maintenance_windows.length ? c.maintenance_windows.join("; ") + (c.window_open ? " (open)" : " (closed)") : "any time",
            c.ca_cert_hash ? el("code", { title: c.ca_cert_hash }, c.ca_cert_hash.slice(0, 19) + "…") : "none",
            time(c.created_at)];
        }), "No clusters yet: lksctl cluster create NAME."));

      const inUse = {};
      for (const n of nodes) {
        for (const b of n.bundles) {
          const k = n.cluster + "\u0000" + b.name + "@" + b.version;
          const v = (inUse[k] = inUse[k] || { cluster: n.cluster, name: b.name, version: b.version, count: 0, states: {} });
          v.count++;
          v.states[b.state] = (v.states[b.state] || 0) + 1;
        }
      }
      const vs = Object.values(inUse).sort((a, b) => a.cluster.localeCompare(b.cluster) || a.name.localeCompare(b.name) || a.version.localeCompare(b.version));
      fill(versions, el("h2", {}, "Bundle versions in use"), table("versions-table",
        ["Cluster", "Bundle", "Nodes", "States"],
        vs.map((v) => [v.cluster, link("#/bundles/" + enc(v.name) + "/" + enc(v.version), v.name + "@" + v.version),
          el("span", { class: "num" }, v.count),
          el("span", {}, Object.entries(v.states).map(([s, c]) => el("span", { class: "pair" }, chip(s), " " + c)))]),
        "No node holds a bundle yet."));

      const active = rs.filter((r) => ACTIVE.includes(r.state));
      fill(rollouts, el("h2", {}, "Active rollouts"), table("active-rollouts-table",
        ["Rollout", "Cluster", "Bundle", "State", "Progress", "Failed"],
        active.map((r) => [rolloutLink(r.id), r.cluster, r.bundle + "@" + r.version, chip(r.state), rolloutBar(r), String(r.failed)]),
        "No rollout is running."));

      const recent = [];
      for (const n of nodes) {
        for (const b of n.bundles) {
          if (b.state === "failed" || b.state === "rolled_back") recent.push([nodeLink(n.name), n.cluster, b.name + "@" + b.version, chip(b.state), b.message || "-"]);
        }
      }
      const failedEvents = events.filter((e) => e.kind === "failed" || e.kind === "rollout_failed").reverse().slice(0, 10);
      // Two different questions, each answered under its own title: which
      // nodes hold a bundle that failed now (the bundle's own state), and
      // what failed lately (the event log, which also holds failures that
      // leave a bundle applied, such as a node failed by the Ready gate).
      fill(failures, el("h2", {}, "Recent failures"),
        el("h3", {}, "Bundles failed or rolled back on a node"),
        el("p", { class: "hint" }, "Each node's bundles in state failed or rolled_back, now. A node failed by the Ready gate keeps its bundle applied and shows under the failure events below."),
        table("failing-nodes-table", ["Node", "Cluster", "Bundle", "State", "Message"], recent.slice(0, 50), "No node holds a bundle in state failed or rolled_back."),
        el("h3", {}, "Latest failure events"),
        el("p", { class: "hint" }, "The last 10 events of kind failed or rollout_failed, newest first, whatever the bundle's state is now."),
        table("failure-events-table", ["Time", "Kind", "Node", "Rollout", "Message"],
          failedEvents.map((e) => [time(e.at), e.kind, nodeLink(e.node), rolloutLink(e.rollout_id), e.message]), "No failure event recently."));
    },
  };
}

const NODE_STATES = ["connected", "disconnected", "held", "stale-release", "failed", "applying", "pending", "applied", "rolled_back"];

// The RELEASE column of `lksctl node list`: "-" without release trust, the
// release followed, and the state unless ok ("7 stale-release").
function trustCell(t) {
  if (!t || !t.enabled) return "-";
  const v = t.release_version ? String(t.release_version) : "-";
  return el("span", { title: t.message || "" }, v, t.state === "ok" ? null : [" ", chip(t.state)]);
}

// The KUBE column of `lksctl node list` (clusters with a kubeconfig): the
// Node's state in its tenant cluster, its kubelet, and the rollout whose
// cordon it carries; "-" when the tenant API has no Node of that name.
function kubeCell(k) {
  if (!k || !k.state || k.state === "absent") return el("span", { class: "kube", title: k ? "no Node of this name in the tenant cluster" : "" }, "-");
  const title = k.error || (k.last_transition ? "Ready condition last changed " + k.last_transition : "");
  return el("span", { class: "kube" },
    el("span", { class: "chip s-" + k.state.toLowerCase().replace(/[^a-z]/g, ""), title }, k.state),
    k.kubelet_version ? " " + k.kubelet_version : null,
    k.cordoned_by ? [" cordoned by ", rolloutLink(k.cordoned_by)] : null);
}

// The REBOOT column of `lksctl node list`: whether the node needs a
// reboot (`required: <why>`, `rebooting`, `-`), and where it stands with
// its cluster's reboot lock unless that ended ("done"): why it waits for a
// slot, up to the first "; " or " (" (the whole reason in the title and on
// the node's page).
function rebootText(r) {
  if (!r || !r.state || r.state === "none") return "-";
  if (r.state === "rebooting") return "rebooting";
  return r.reason ? r.state + ": " + r.reason : r.state;
}

function rebootCell(n) {
  const base = rebootText(n.reboot);
  const l = n.reboot_lock;
  if (!l || !l.state || l.state === "done" || l.state === base) return el("span", { class: "reboot" }, base);
  const why = (l.message || "").split("; ")[0].split(" (")[0];
  return el("span", { class: "reboot", title: l.message || "" }, base === "-" ? null : base + " (",
    chip(l.state), why ? ": " + why : null, base === "-" ? null : ")");
}

// A rollout node's step while the rollout owns its cordon (draining,
// upgrading, readying), as `rollout status` shows it.
function kubeStep(n) {
  if (!n.kube_step) return null;
  return [" ", el("span", { class: "chip kube-step s-" + n.kube_step, title: n.kube_since ? "since " + n.kube_since : "" }, n.kube_step)];
}

function nodeMatches(n, f) {
  if (f.cluster && n.cluster !== f.cluster) return false;
  if (f.q && !n.name.includes(f.q)) return false;
  for (const pair of (f.label || "").split(",").map((s) => s.trim()).filter(Boolean)) {
    const i = pair.indexOf("=");
    const k = i < 0 ? pair : pair.slice(0, i);
    if (!(k in n.labels)) return false;
    if (i >= 0 && n.labels[k] !== pair.slice(i + 1)) return false;
  }
  switch (f.state) {
    case "": case undefined: case null: return true;
    case "connected": return n.connected;
    case "disconnected": return !n.connected;
    case "held": return n.held;
    case "stale-release": return !!(n.trust && n.trust.enabled && n.trust.state === "stale-release");
    default: return n.bundles.some((b) => b.state === f.state);
  }
}

function nodesPage(main, r) {
  main.append(el("h1", {}, "Nodes"));
  const f = { cluster: r.params.get("cluster") || "", label: r.params.get("label") || "", state: r.params.get("state") || "", q: r.params.get("q") || "" };
  let page = Number(r.params.get("page")) || 1;
  let last = null;
  const clusterSel = el("select", { id: "filter-cluster", name: "cluster" }, el("option", { value: "" }, "all clusters"));
  const stateSel = el("select", { id: "filter-state", name: "state" }, el("option", { value: "" }, "any state"),
    NODE_STATES.map((s) => el("option", { value: s }, s)));
  stateSel.value = f.state;
  const labelIn = el("input", { id: "filter-label", name: "label", type: "search", placeholder: "role=worker,zone", value: f.label, size: 18 });
  const nameIn = el("input", { id: "filter-name", name: "q", type: "search", placeholder: "part of a name", value: f.q, size: 14 });
  const onChange = () => {
    Object.assign(f, { cluster: clusterSel.value, state: stateSel.value, label: labelIn.value.trim(), q: nameIn.value.trim() });
    page = 1;
    sync();
    render();
  };
  for (const i of [clusterSel, stateSel]) i.addEventListener("change", onChange);
  for (const i of [labelIn, nameIn]) i.addEventListener("input", onChange);
  main.append(el("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    el("label", {}, "Cluster ", clusterSel), el("label", {}, "Label ", labelIn), el("label", {}, "State ", stateSel), el("label", {}, "Name ", nameIn)));
  const out = slot(main, "nodes");
  const sync = () => setParams(new URLSearchParams({ ...f, page: page > 1 ? String(page) : "" }));
  const render = () => {
    if (!last) return;
    const matching = last.nodes.filter((n) => nodeMatches(n, f));
    const p = paginate(matching, page, (np) => { page = np; sync(); render(); });
    // Kube only when some node's cluster has a kubeconfig, as in lksctl.
    const kube = last.nodes.some((n) => n.kube);
    fill(out, 
      el("p", { class: "summary", id: "nodes-summary" }, `${matching.length} of ${last.nodes.length} node(s), ${matching.filter((n) => n.connected).length} connected`),
      table("nodes-table", ["Name", "Cluster", "Connected", kube && "Kube", "Last seen", "Agent", "Arch", "Labels", "Bundles", "Certificates", "Release", "Reboot"].filter(Boolean),
        p.shown.map((n) => [nodeLink(n.name), n.cluster,
          el("span", { class: n.connected ? "yes" : "no" }, n.connected ? "yes" : "no"),
          kube ? kubeCell(n.kube) : false,
          el("span", { title: n.last_seen || "never" }, ago(n.last_seen)),
          n.agent_version || "-", el("span", { class: "nowrap" }, n.architecture || "-"), labelsText(n.labels),
          el("span", {}, n.bundles.map((b) => el("span", { class: "pair", title: b.message || "" }, b.name + "@" + b.version + " ", chip(b.state))), n.held ? chip("held") : null),
          String(n.certificates.length || "-"), trustCell(n.trust), rebootCell(n)].filter((c) => c !== false)),
        "No node matches."), p.nav);
  };
  return {
    async refresh() {
      const [cs, nodes] = await Promise.all([get("clusters"), get("nodes")]);
      if (clusterSel.options.length !== cs.length + 1) {
        fill(clusterSel, el("option", { value: "" }, "all clusters"), cs.map((c) => el("option", { value: c.name }, c.name)));
        clusterSel.value = f.cluster;
      }
      last = { nodes };
      render();
    },
  };
}

function kv(id, pairs) {
  return el("dl", { class: "kv", id }, pairs.filter(Boolean).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function nodePage(main, r) {
  const name = r.parts[1];
  main.append(el("p", { class: "crumbs" }, link("#/nodes", "Nodes"), " / "), el("h1", {}, name));
  const facts = slot(main, "node-facts");
  const bundles = slot(main, "node-bundles");
  const certs = slot(main, "node-certificates");
  const events = slot(main, "node-events");
  const err = errorBox(main);
  return {
    error: (e) => err.set(e),
    async refresh() {
      const [n, es] = await Promise.all([get("nodes/" + enc(name)), get("events?limit=100&node=" + enc(name))]);
      err.set(null);
      const f = n.facts || {};
      fill(facts, kv("node-facts-list", [
        ["Cluster", link("#/nodes?cluster=" + enc(n.cluster), n.cluster)],
        ["Connected", el("span", { class: n.connected ? "yes" : "no" }, n.connected ? "yes" : "no")],
        ["Last seen", n.last_seen ? el("span", { title: n.last_seen }, ago(n.last_seen)) : "never"],
        ["Labels", labelsText(n.labels)],
        n.held && ["Held", n.hold_reason ? "yes: " + n.hold_reason : "yes"],
        n.kube && ["Kubernetes", [kubeCell(n.kube), n.kube.error ? ": " + n.kube.error : "",
          n.kube.last_transition ? ["; Ready condition last changed ", time(n.kube.last_transition)] : ""]],
        ["Release", n.trust && n.trust.enabled
          ? [trustCell(n.trust), n.trust.release_expires_at ? ", expires " + time(n.trust.release_expires_at) : "", ", root " + n.trust.root_version, n.trust.message ? ": " + n.trust.message : ""]
          : "- (no release trust reported)"],
        ["Reboot", el("span", { id: "node-reboot" }, rebootText(n.reboot), n.reboot && n.reboot.since ? [" (since ", time(n.reboot.since), ")"] : null)],
        n.reboot_lock && ["Reboot lock", el("span", { id: "node-reboot-lock" }, chip(n.reboot_lock.state), n.reboot_lock.message ? ": " + n.reboot_lock.message : "")],
        ["Hostname", f.hostname || "-"],
        ["OS", [f.os, f.kernel, f.arch].filter(Boolean).join(", ") || "-"],
        ["CPUs / memory", f.cpus ? f.cpus + " / " + bytes(f.memory_bytes) : "-"],
        ["Agent", n.agent_version || "-"],
        ["Architecture", n.architecture || "- (not reported: an agent before multi-arch bundles)"],
        ["Enrolled", time(n.enrolled_at)],
        ["Certificate serial", el("code", {}, n.certificate_serial || "-")],
      ]));
      fill(bundles, el("h2", {}, "Bundles"), table("node-bundles-table", ["Bundle", "Version", "State", "Fetched", "Message"],
        n.bundles.map((b) => [link("#/bundles/" + enc(b.name) + "/" + enc(b.version), b.name), b.version, chip(b.state), fetchedText(b), b.message || "-"]), "No bundle is desired for this node."));
      fill(certs, el("h2", {}, "Certificates"), table("node-certs-table", ["Profile", "Path", "Serial", "Not after", "State", "Bundle"],
        n.certificates.map((c) => [c.profile, el("code", {}, c.path), el("code", {}, c.serial), time(c.not_after), chip(c.state), c.bundle + "@" + c.version]),
        "No certificate was issued for this node."));
      fill(events, el("h2", {}, "Events"), eventsTable("node-events-table", es.slice().reverse()));
    },
  };
}

function eventsTable(id, es) {
  return table(id, ["Time", "Kind", "Cluster", "Node", "Rollout", "Bundle", "Message"],
    es.map((e) => [time(e.at), e.kind, e.cluster || "-", nodeLink(e.node), rolloutLink(e.rollout_id), e.bundle ? e.bundle + "@" + e.version : "-", e.message]),
    "No events.");
}

function bundlesPage(main) {
  main.append(el("h1", {}, "Bundles"));
  const out = slot(main, "bundles");
  return {
    async refresh() {
      const bs = await get("bundles");
      fill(out, table("bundles-table", ["Bundle", "Version", "Files", "Size", "Signed", "Published", "Digest"],
        bs.map((b) => [link("#/bundles/" + enc(b.name) + "/" + enc(b.version), b.name), b.version, String(b.files), bytes(b.total_size),
          b.signed ? "yes" : "no", time(b.published_at), el("code", { title: b.manifest_digest }, b.manifest_digest.slice(0, 19) + "…")]),
        "No bundles published: lksctl bundle publish DIR."));
    },
  };
}

function bundlePage(main, r) {
  const [name, version] = [r.parts[1], r.parts[2] || ""];
  main.append(el("p", { class: "crumbs" }, link("#/bundles", "Bundles"), " / "), el("h1", {}, name + "@" + version));
  const out = slot(main, "bundle");
  const err = errorBox(main);
  let shown = false;
  return {
    error: (e) => err.set(e),
    async refresh() {
      // A published version never changes: fetched once.
      if (shown) return;
      const b = await get("bundles/" + enc(name) + "/" + enc(version));
      err.set(null);
      shown = true;
      const m = b.manifest;
      const run = (a) => el("code", {}, a.join(" "));
      fill(out, 
        kv("bundle-facts", [["Signer", b.signer ? el("code", {}, b.signer) : "unsigned"], ["Digest", el("code", {}, b.manifest_digest)],
          ["Published", time(b.published_at)], ["Size", bytes(b.total_size)],
          ["Architectures", (b.architectures || []).length ? b.architectures.join(", ") : "any (arch-neutral)"]]),
        el("h2", {}, "Files"), table("bundle-files-table", ["Path", "Size", "Mode", "SHA-256", "Mirror", "Arch"],
          m.files.map((f) => [el("code", {}, f.path), el("span", { class: "num" }, String(f.size)), el("code", {}, f.mode), el("code", { class: "hash" }, f.sha256), f.url || "-", f.arch || "any"]), "No files."),
        el("h2", {}, "Steps"), table("bundle-steps-table", ["Name", "Run", "Timeout"], m.steps.map((s) => [s.name, run(s.run), s.timeout || "default"]), "No steps."),
        el("h2", {}, "Health check"), m.health ? kv("bundle-health", [["Run", run(m.health.run)], ["Timeout", m.health.timeout || "default"],
          ["Retries", String(m.health.retries)], ["Interval", m.health.interval || "default"]]) : el("p", { class: "empty" }, "No health check."),
        el("h2", {}, "Certificates ([[certificate]])"), table("bundle-certs-table", ["Path", "Key", "Profile", "Common name", "DNS names", "IPs", "TTL", "CA path"],
          m.certificates.map((c) => [el("code", {}, c.path), el("code", {}, c.key_path), c.profile, c.common_name || "-", c.dns_names.join(", ") || "-",
            c.ip_addresses.join(", ") || "-", c.ttl || "default", c.ca_path || "-"]), "None."),
        el("h2", {}, "Kubeconfigs ([[kubeconfig]])"), table("bundle-kubeconfigs-table", ["Path", "Client certificate"],
          m.kubeconfigs.map((k) => [el("code", {}, k.path), el("code", {}, k.certificate)]), "None."));
    },
  };
}

function rolloutsPage(main, r) {
  main.append(el("h1", {}, "Rollouts"));
  const form = startForm(main);
  const cluster = r.params.get("cluster") || "";
  const out = slot(main, "rollouts");
  return {
    async refresh() {
      const [rs, cs, bs] = await Promise.all([get("rollouts" + (cluster ? "?cluster=" + enc(cluster) : "")), get("clusters"), get("bundles")]);
      form.options(cs, bs);
      const sorted = rs.slice().sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
      fill(out, el("h2", {}, "All rollouts" + (cluster ? " of " + cluster : "")), table("rollouts-table",
        ["Rollout", "Cluster", "Bundle", "State", "Progress", "Failed", "Started", "Fetched"],
        sorted.map((x) => [rolloutLink(x.id), x.cluster, x.bundle + "@" + x.version, chip(x.state), rolloutBar(x), String(x.failed), time(x.created_at),
          rolloutFetchedText(x.fetched)]),
        "No rollouts yet."));
    },
  };
}

function startForm(main) {
  const fieldErr = {};
  const field = (id, label, input, hint) => {
    fieldErr[id] = el("span", { class: "field-error", id: "start-" + id + "-error", role: "alert" });
    input.id = "start-" + id;
    input.setAttribute("aria-describedby", "start-" + id + "-error");
    return el("div", { class: "field" }, el("label", { for: input.id }, label), input, hint ? el("small", {}, hint) : null, fieldErr[id]);
  };
  const clusterSel = el("select", { name: "cluster", required: true });
  const bundleIn = el("input", { name: "bundle", required: true, placeholder: "kubelet@1.29.3-1", list: "start-bundles", autocomplete: "off" });
  const bundleList = el("datalist", { id: "start-bundles" });
  const selectorIn = el("input", { name: "selector", placeholder: "role=worker" });
  const batchIn = el("input", { name: "batch_size", type: "number", min: 0, value: 0 });
  const thresholdIn = el("input", { name: "failure_threshold", type: "number", min: 0, value: 0 });
  const matches = el("p", { id: "start-matches", "aria-live": "polite" }, "");
  const general = el("p", { class: "error", id: "start-error", role: "alert", hidden: true });
  const submit = el("button", { type: "submit", id: "start-submit" }, "Start rollout");
  const clearErrors = () => {
    for (const e of Object.values(fieldErr)) e.textContent = "";
    general.hidden = true;
  };
  const showError = (e) => {
    clearErrors();
    if (e.field && fieldErr[e.field]) fieldErr[e.field].textContent = e.message;
    else {
      general.textContent = e.message;
      general.hidden = false;
    }
  };
  let timer = null;
  let seq = 0;
  const count = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const mine = ++seq;
      if (!clusterSel.value) return;
      try {
        const m = await get("selector?cluster=" + enc(clusterSel.value) + "&selector=" + enc(selectorIn.value.trim()));
        if (mine !== seq) return;
        fieldErr.selector.textContent = "";
        matches.textContent = `The selector matches ${m.matches} node(s) of ${m.cluster} (${m.connected} connected)` +
          (m.nodes.length ? ": " + m.nodes.join(", ") + (m.matches > m.nodes.length ? ", …" : "") : ".");
      } catch (e) {
        if (mine !== seq) return;
        matches.textContent = "";
        if (e.field === "selector" || e.field === "cluster") fieldErr[e.field].textContent = e.message;
      }
    }, 250);
  };
  clusterSel.addEventListener("change", count);
  selectorIn.addEventListener("input", count);
  const f = el("form", {
    id: "start-form", class: "start",
    async onsubmit(ev) {
      ev.preventDefault();
      clearErrors();
      submit.disabled = true;
      try {
        const r = await post("rollouts", {
          cluster: clusterSel.value, bundle: bundleIn.value.trim(), selector: selectorIn.value.trim(),
          batch_size: Number(batchIn.value) || 0, failure_threshold: Number(thresholdIn.value) || 0,
        });
        location.hash = "#/rollouts/" + enc(r.rollout.id);
      } catch (e) {
        showError(e);
      } finally {
        submit.disabled = false;
      }
    },
  },
  field("cluster", "Cluster", clusterSel),
  field("bundle", "Bundle", bundleIn, "NAME@VERSION"), bundleList,
  field("selector", "Selector", selectorIn, "k=v,… (empty: every node)"),
  field("batch_size", "Batch size", batchIn, "0: 10 % of the nodes"),
  field("failure_threshold", "Failure threshold", thresholdIn, "0: 1 failure"),
  matches, general, el("div", { class: "buttons" }, submit));
  main.append(el("details", { class: "start-box", id: "start-box" }, el("summary", {}, "Start a rollout"), f));
  let counted = false;
  return {
    options(cs, bs) {
      const names = cs.map((c) => c.name);
      const have = Array.from(clusterSel.options).map((o) => o.value);
      if (names.join("\n") !== have.join("\n")) {
        const keep = clusterSel.value;
        fill(clusterSel, names.map((n) => el("option", { value: n }, n)));
        if (names.includes(keep)) clusterSel.value = keep;
      }
      const refs = bs.map((b) => b.name + "@" + b.version);
      if (bundleList.options.length !== refs.length) fill(bundleList, refs.map((x) => el("option", { value: x })));
      if (!counted && clusterSel.value) {
        counted = true;
        count();
      }
    },
  };
}

function batches(r) {
  const size = Math.max(1, r.batch_size || 1);
  const out = [];
  for (let i = 0; i < r.nodes.length; i += size) out.push(r.nodes.slice(i, i + size));
  return out;
}

const VERBS = {
  pause: { label: "Pause", when: ["running"] },
  resume: { label: "Resume", when: ["paused"] },
  abort: { label: "Abort", when: ["running", "paused"], confirm: "Abort this rollout? No further node will start; nodes applying now finish and keep the new version." },
  rollback: { label: "Roll back", when: ["running", "paused", "completed", "failed", "aborted"], confirm: "Roll back this rollout? Every node it changed returns to the version it had before, in batches." },
};

function confirmDialog(text) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

// A row of verb buttons (`verbs`: verb -> {label, confirm?, when}) that
// POST `path/VERB`, say the answer's message or error under them and then
// call `refresh`; `ids` prefixes the elements' ids. `.enable(state)` turns
// on the verbs allowed in `state`.
function actionBar(main, verbs, path, ids, label, refresh) {
  const result = el("p", { id: ids + "action-result", role: "status" });
  const err = el("p", { class: "error", id: ids + "action-error", role: "alert", hidden: true });
  const buttons = {};
  for (const [verb, v] of Object.entries(verbs)) {
    buttons[verb] = el("button", {
      type: "button", id: ids + "act-" + verb, class: v.confirm ? "danger" : "", disabled: true,
      async onclick() {
        if (v.confirm && !(await confirmDialog(v.confirm))) return;
        err.hidden = true;
        result.textContent = "";
        try {
          const x = await post(path + "/" + verb);
          result.textContent = x.message;
        } catch (e) {
          err.textContent = e.message;
          err.hidden = false;
        }
        await refresh();
      },
    }, v.label);
  }
  main.append(el("div", { class: "buttons actions", role: "group", "aria-label": label }, Object.values(buttons)), result, err);
  return {
    enable(state) {
      for (const [verb, v] of Object.entries(verbs)) buttons[verb].disabled = !v.when.includes(state);
    },
  };
}

function rolloutPage(main, r) {
  const id = r.parts[1];
  main.append(el("p", { class: "crumbs" }, link("#/rollouts", "Rollouts"), " / "), el("h1", {}, "Rollout " + id.slice(0, 8)));
  const head = slot(main, "rollout-head");
  const actions = actionBar(main, VERBS, "rollouts/" + enc(id), "", "Rollout actions", () => refresh());
  const batchesOut = slot(main, "rollout-batches");
  const nodesOut = slot(main, "rollout-nodes");
  let page = 1;
  let last = null;
  const renderNodes = () => {
    const p = paginate(last.nodes, page, (np) => { page = np; renderNodes(); });
    fill(nodesOut, el("h2", {}, "Nodes"), table("rollout-nodes-table", ["Node", "Previous", "State", "Message"],
      p.shown.map((n) => [nodeLink(n.name), n.previous_version || "-", el("span", {}, chip(n.state), n.canary ? " canary" : "", kubeStep(n)), n.message || "-"]),
      "No node matches this rollout's selector."), p.nav);
  };
  const loadErr = errorBox(main);
  return {
    error: (e) => loadErr.set(e),
    async refresh() {
      const x = await get("rollouts/" + enc(id));
      loadErr.set(null);
      last = x;
      actions.enable(x.state);
      const counts = ["total", "updated", "failed", "pending", "applying", "deferred", "held", "skipped", "rolled_back"];
      fill(head, 
        kv("rollout-facts", [["State", el("span", { id: "rollout-state" }, chip(x.state))], ["Cluster", link("#/nodes?cluster=" + enc(x.cluster), x.cluster)],
          ["Bundle", link("#/bundles/" + enc(x.bundle) + "/" + enc(x.version), x.bundle + "@" + x.version)], ["Selector", labelsText(x.selector)],
          ["Batch", `${x.batch_size} node(s) at a time, stops at ${x.failure_threshold} failure(s)`],
          ["Fetched", el("span", { id: "rollout-fetched" }, rolloutFetchedText(x.fetched))],
          x.message && ["Message", x.message], x.waiting_for_window && ["Waiting", "for a maintenance window (next " + (x.next_window || "-") + ")"],
          x.canary_phase && ["Canaries", x.canary_phase + " (" + x.canaries.join(", ") + ")"],
          ["Started", time(x.created_at)], ["ID", el("code", {}, x.id)]]),
        el("div", { class: "counts", id: "rollout-counts" }, counts.filter((c) => c === "total" || c === "updated" || c === "failed" || c === "pending" || x[c] > 0)
          .map((c) => el("div", { class: "count-box" }, el("span", { class: "n", id: "count-" + c }, String(x[c])), el("span", {}, c.replace("_", " "))))),
        rolloutBar(x));
      const bs = batches(x);
      fill(batchesOut, el("h2", {}, "Batches"), el("p", { class: "hint" }, `Nodes in the rollout's order, ${x.batch_size} per batch.`),
        el("ol", { class: "batches", id: "rollout-batches-list" }, bs.slice(0, 200).map((b, i) => {
          const n = (s) => b.filter((m) => m.state === s).length;
          const done = n("updated"), failed = n("failed"), applying = n("applying");
          return el("li", {}, el("span", { class: "batch-name" }, "Batch " + (i + 1)),
            bar(b.length, done, failed, applying, `batch ${i + 1}: ${done} of ${b.length} updated`),
            el("span", { class: "count" }, `${done}/${b.length}` + (failed ? `, ${failed} failed` : "") + (applying ? `, ${applying} applying` : "")));
        })), bs.length > 200 ? el("p", { class: "hint" }, `… and ${bs.length - 200} more batches.`) : null);
      renderNodes();
    },
  };
}

const EVENT_FILTERS = ["cluster", "node", "rollout", "kind", "q"];

function eventsPage(main, r) {
  main.append(el("h1", {}, "Events"));
  const f = {};
  const inputs = {};
  for (const k of EVENT_FILTERS) {
    f[k] = r.params.get(k) || "";
    inputs[k] = el("input", { id: "events-" + k, name: k, type: "search", value: f[k], size: k === "rollout" ? 12 : 14 });
  }
  const limitSel = el("select", { id: "events-limit", name: "limit" }, ["100", "500", "1000"].map((n) => el("option", { value: n }, n)));
  limitSel.value = r.params.get("limit") || "100";
  let page = 1;
  let last = [];
  let timer = null;
  const out = slot(main, "events");
  const sync = () => setParams(new URLSearchParams({ ...f, limit: limitSel.value === "100" ? "" : limitSel.value }));
  const onChange = (server) => () => {
    for (const k of EVENT_FILTERS) f[k] = inputs[k].value.trim();
    page = 1;
    sync();
    render();
    if (server) {
      clearTimeout(timer);
      timer = setTimeout(refresh, 300);
    }
  };
  for (const k of EVENT_FILTERS) inputs[k].addEventListener("input", onChange(!["kind", "q"].includes(k)));
  limitSel.addEventListener("change", onChange(true));
  main.append(el("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    el("label", {}, "Cluster ", inputs.cluster), el("label", {}, "Node ", inputs.node), el("label", {}, "Rollout ", inputs.rollout),
    el("label", {}, "Kind ", inputs.kind), el("label", {}, "Text ", inputs.q), el("label", {}, "Last ", limitSel)));
  const render = () => {
    const shown = last.filter((e) => (!f.kind || e.kind.includes(f.kind)) && (!f.q || JSON.stringify(e).toLowerCase().includes(f.q.toLowerCase())));
    const p = paginate(shown, page, (np) => { page = np; render(); });
    fill(out, el("p", { class: "summary" }, `${shown.length} event(s), newest first`), eventsTable("events-table", p.shown), p.nav);
  };
  return {
    async refresh() {
      const q = new URLSearchParams({ limit: limitSel.value });
      for (const k of ["cluster", "node", "rollout"]) if (f[k]) q.set(k, f[k]);
      last = (await get("events?" + q.toString())).reverse();
      render();
    },
    error: (e) => fill(out, el("p", { class: "error", role: "alert" }, e.message)),
  };
}

const AUDIT_VERBS = ["", "CreateCluster", "SetCluster", "CreateToken", "PublishBundle", "DeleteBundle", "StartRollout",
  "PauseRollout", "ResumeRollout", "AbortRollout", "RollbackRollout", "HoldNode", "UnholdNode", "RetryNode", "DeleteNode"];

// Who did what: the audit trail, newest first; the call filter asks the
// server, the text filter looks through what was fetched.
function auditPage(main, r) {
  main.append(el("h1", {}, "Audit"));
  const verbSel = el("select", { id: "audit-verb", name: "verb" }, AUDIT_VERBS.map((v) => el("option", { value: v }, v || "every call")));
  verbSel.value = AUDIT_VERBS.includes(r.params.get("verb")) ? r.params.get("verb") : "";
  const text = el("input", { id: "audit-q", name: "q", type: "search", value: r.params.get("q") || "", size: 16 });
  const limitSel = el("select", { id: "audit-limit", name: "limit" }, ["100", "500", "1000"].map((n) => el("option", { value: n }, n)));
  limitSel.value = r.params.get("limit") || "100";
  let page = 1;
  let last = [];
  main.append(el("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    el("label", {}, "Call ", verbSel), el("label", {}, "Text ", text), el("label", {}, "Last ", limitSel)));
  const out = slot(main, "audit");
  const sync = () => setParams(new URLSearchParams({ verb: verbSel.value, q: text.value.trim(), limit: limitSel.value === "100" ? "" : limitSel.value }));
  const render = () => {
    const q = text.value.trim().toLowerCase();
    const shown = last.filter((a) => !q || JSON.stringify(a).toLowerCase().includes(q));
    const p = paginate(shown, page, (np) => { page = np; render(); });
    fill(out, el("p", { class: "summary" }, `${shown.length} record(s), newest first`),
      table("audit-table", ["Time", "Call", "Target", "Outcome", "Caller", "Arguments"],
        p.shown.map((a) => [time(a.at), a.verb, a.target || "-", a.outcome, a.caller + " (" + a.caller_fingerprint.slice(0, 19) + "…)",
          JSON.stringify(a.args)]),
        "No records."), p.nav);
  };
  const refresh = async () => {
    const q = new URLSearchParams({ limit: limitSel.value });
    if (verbSel.value) q.set("verb", verbSel.value);
    last = (await get("audit?" + q.toString())).reverse();
    render();
  };
  verbSel.addEventListener("change", () => { page = 1; sync(); refresh(); });
  limitSel.addEventListener("change", () => { page = 1; sync(); refresh(); });
  text.addEventListener("input", () => { page = 1; sync(); render(); });
  return {
    refresh,
    error: (e) => fill(out, el("p", { class: "error", role: "alert" }, e.message)),
  };
}

const PAGES = {
  fleet: fleetPage,
  nodes: (m, r) => (r.parts[1] ? nodePage(m, r) : nodesPage(m, r)),
  bundles: (m, r) => (r.parts[1] ? bundlePage(m, r) : bundlesPage(m, r)),
  rollouts: (m, r) => (r.parts[1] ? rolloutPage(m, r) : rolloutsPage(m, r)),
  events: eventsPage,
  audit: auditPage,
};

window.addEventListener("hashchange", show);
document.addEventListener("DOMContentLoaded", () => {
  show();
  setInterval(refresh, REFRESH_MS);
});
