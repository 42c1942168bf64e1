// lksadmin operator console: release plans (issue [fleet-plans]) — the
// list and a plan's page, rendered from `plan list -o json` and `plan
// status NAME -o json`; the buttons run `plan pause|resume|abort|rollback`.
// Loaded after console.js, whose helpers it uses; like them, every value
// goes into the page as text or an attribute, never as HTML.
"use strict";

// A plan's states a verb applies to (the server's own rules).
const PLAN_VERBS = {
  pause: { label: "Pause", when: ["running"] },
  resume: { label: "Resume", when: ["paused", "halted"] },
  abort: { label: "Abort", when: ["running", "paused", "halted"], confirm: "Abort this plan? Its running rollouts are aborted and the clusters it has not reached are skipped." },
  rollback: { label: "Roll back", when: ["running", "paused", "halted", "completed", "aborted"], confirm: "Roll back this plan? Every cluster rollout it started is rolled back, newest first." },
};

// Clusters done with: completed (or soaking after it), failed, skipped.
function planCounts(clusters) {
  const n = (...s) => clusters.filter((c) => s.includes(c.state)).length;
  return { total: clusters.length, completed: n("completed", "soaking"), failed: n("failed"), running: n("running", "rolling_back"),
    skipped: n("skipped"), rolledBack: n("rolled_back") };
}

function planBar(clusters, label) {
  const k = planCounts(clusters);
  return el("div", { class: "progress" },
    bar(k.total, k.completed, k.failed, k.running, label + ": " + k.completed + " of " + k.total + " clusters completed"),
    el("span", { class: "count" }, `${k.completed}/${k.total} completed` + (k.failed ? `, ${k.failed} failed` : "") +
      (k.running ? `, ${k.running} running` : "") + (k.skipped ? `, ${k.skipped} skipped` : "")));
}

function allClusters(p) {
  return p.groups.flatMap((g) => g.clusters);
}

// A cluster's state as `plan status` writes it: "running 3/8" while its
// rollout runs.
function planClusterState(c) {
  return el("span", { class: "plan-cluster-state" }, chip(c.state), c.state === "running" && c.total ? " " + c.updated + "/" + c.total : null);
}

// "in 4 min" / "ended" for a time to come.
function until(iso) {
  const s = Math.round((Date.parse(iso) - Date.now()) / 1000);
  if (s <= 0) return "ending now";
  if (s < 90) return s + " s left";
  if (s < 90 * 60) return Math.round(s / 60) + " min left";
  return Math.round(s / 3600) + " h left";
}

function plansPage(main) {
  main.append(el("h1", {}, "Plans"),
    el("p", { class: "hint" }, "Release plans: one bundle version to many clusters in ordered groups (lksctl plan create)."));
  const out = slot(main, "plans");
  return {
    async refresh() {
      const ps = await get("plans");
      const sorted = ps.slice().sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
      fill(out, table("plans-table", ["Plan", "Bundle", "State", "Progress", "Failure budget", "Created", "By"],
        sorted.map((p) => [link("#/plans/" + enc(p.name), p.name), p.bundle, chip(p.state), planBar(allClusters(p), p.name),
          `${p.budget_used} of ${p.failure_budget} used`, time(p.created_at), p.started_by || "-"]),
        "No plans yet: lksctl plan create NAME --bundle B --group G=SELECTOR …"));
    },
  };
}

function planPage(main, r) {
  const name = r.parts[1];
  main.append(el("p", { class: "crumbs" }, link("#/plans", "Plans"), " / "), el("h1", {}, "Plan " + name));
  const head = slot(main, "plan-head");
  const actions = actionBar(main, PLAN_VERBS, "plans/" + enc(name), "plan-", "Plan actions", () => refresh());
  const groups = slot(main, "plan-groups");
  const loadErr = errorBox(main);
  return {
    error: (e) => loadErr.set(e),
    async refresh() {
      const p = await get("plans/" + enc(name));
      loadErr.set(null);
      actions.enable(p.state);
      const soaking = p.groups.find((g) => g.state === "soaking" && g.soak_until);
      fill(head,
        kv("plan-facts", [["State", el("span", { id: "plan-state" }, chip(p.state))],
          p.message && ["Message", el("span", { id: "plan-message" }, p.message)],
          ["Bundle", el("span", {}, p.bundle)],
          ["Failure budget", el("span", { id: "plan-budget" }, `${p.budget_used} of ${p.failure_budget} used` +
            (p.failures > p.budget_used ? ` (${p.failures} failed in all)` : "") + ", on halt " + p.on_halt)],
          ["In flight", `${p.in_flight} cluster(s) now, ${p.max_clusters_in_flight} at most`],
          ["Soak", el("span", { id: "plan-soak" }, soaking
            ? ["group " + soaking.name + " soaking until ", time(soaking.soak_until), " (" + until(soaking.soak_until) + ")"]
            : p.soak_seconds ? p.soak_seconds + " s after each group" : "none")],
          Object.keys(p.selector).length && ["Selector", labelsText(p.selector)],
          p.overdue && ["Overdue", "running longer than " + p.alert_after_seconds + " s (--alert-after)"],
          ["Created", [time(p.created_at), p.started_by ? " by " + p.started_by : ""]]]),
        planBar(allClusters(p), "plan " + p.name));
      fill(groups, el("ol", { class: "groups", id: "plan-groups-list" }, p.groups.map((g, i) => el("li", { id: "plan-group-" + i, "data-group": g.name },
        el("div", { class: "group-head" }, el("h2", {}, "Group " + (i + 1) + ": " + g.name), chip(g.state),
          g.state === "soaking" && g.soak_until ? el("span", { class: "soak" }, "soak " + until(g.soak_until)) : null,
          planBar(g.clusters, "group " + g.name)),
        el("p", { class: "hint" }, "Selector: " + g.selector),
        table("plan-group-" + i + "-table", ["Cluster", "State", "Why", "Rollout", "Nodes", "Windows"],
          g.clusters.map((c) => [link("#/nodes?cluster=" + enc(c.name), c.name), planClusterState(c), c.message || "-",
            c.rollout_id ? rolloutLink(c.rollout_id) : "-", String(c.nodes) + (c.held ? `, ${c.held} held` : ""),
            c.maintenance_windows.length ? c.maintenance_windows.join("; ") + (c.window_open ? " (open)" : " (closed)") : "any time"]),
          "No cluster matched this group.")))));
    },
  };
}

PAGES.plans = (m, r) => (r.parts[1] ? planPage(m, r) : plansPage(m, r));
