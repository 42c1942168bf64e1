#!/usr/bin/env bash
# The release plan benchmark behind BENCHMARKS.md ("A release plan over
# 1,000 clusters", issue [fleet-plans] item 4). For each store (SQLite;
# etcd: one member on loopback and one release replica), RUNS times, on a
# fresh server each time:
#   - baseline: lks-loadgen enrols CLUSTERS × PER agents in CLUSTERS
#     clusters and starts the same rollout in each, one StartRollout after
#     the other over one admin connection (`--rollout`);
#   - plan: the same, but the rollouts are started by one release plan
#     (`--rollout --plan`, one group, at most IN_FLIGHT clusters in flight,
#     default all).
# Each reports `rollouts_started_seconds` (the first admin call → the
# newest rollout's created_at) and `rollout_seconds` (→ every rollout
# completed). Between the load generator's "starting N rollouts" line and
# its "rollout completed" line the script measures what the store took:
# on etcd the revision delta (one per write transaction) and the bytes
# put, on SQLite the bytes the server wrote to disk (/proc/PID/io); and
# the server's CPU seconds. After a plan run it reads the plan's record:
# its writes (SQLite `revision`, etcd key `version`) and its size.
# Then, once per store, the server is left idle for IDLE_S seconds with
# the 1,000 clusters (reboots off), the nodes (none connected), the
# rollouts and the plan in it, next to a fresh empty server for the same
# time: CPU seconds of each (the reboot leader and the plan driver pass
# over every cluster or plan every 2 s / 1 s).
# Usage: bash scripts/bench-plans.sh [sqlite] [etcd]   (default both)
#        RUNS=3 CLUSTERS=1000 PER=10 IN_FLIGHT=CLUSTERS IDLE_S=60
#        BENCH_NO_BUILD=1: the binaries already built; BENCH_SERVER=PATH: that
#        lks-control-server instead (a before/after pair in one session)
# Needs python3, curl, etcd (scripts/setup.sh installs it). Not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
CLUSTERS=${CLUSTERS:-1000}
PER=${PER:-10}
IN_FLIGHT=${IN_FLIGHT:-$CLUSTERS}
IDLE_S=${IDLE_S:-60}
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(sqlite etcd)
agents=$((CLUSTERS * PER))

if [ -z "${BENCH_NO_BUILD:-}" ]; then
  cargo build --release -p lks-control-server -p lksctl -p lks-loadgen --bins >&2
fi
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null && { wait "$p" 2>/dev/null || true; }
  done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
median() { python3 -c 'import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]), 2))' "$@"; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=d
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }
# CPU seconds (user + system) process $1 has used.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat"; }
write_bytes() { awk '/^write_bytes/{print $2}' "/proc/$1/io"; }
etcd_metric() { curl -fs "$etcd_url/metrics" | awk -v k="$1" '$1 == k {printf "%d\n", $2}'; }
sub() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$2"; }

# A fresh store and server in $1: sets srv_pid, srv_conf (and for etcd
# etcd_pid, etcd_url). $2: sqlite or etcd.
up() {
  local d=$1 store=$2 p mp
  mkdir -p "$d"
  p=$(free_port) mp=$(free_port)
  local extra=()
  if [ "$store" = etcd ]; then
    local ecp epp
    ecp=$(free_port) epp=$(free_port)
    etcd_url=http://127.0.0.1:$ecp
    ETCD_UNSUPPORTED_ARCH=$(uname -m) etcd --name bench --data-dir "$d/etcd" \
      --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
      --listen-peer-urls "http://127.0.0.1:$epp" --initial-advertise-peer-urls "http://127.0.0.1:$epp" \
      --initial-cluster "bench=http://127.0.0.1:$epp" --auto-compaction-retention 1 >"$d/etcd.log" 2>&1 &
    etcd_pid=$!
    pids+=("$etcd_pid")
    for _ in $(seq 100); do curl -fs "$etcd_url/health" >/dev/null && break; sleep 0.2; done
    extra=(--store etcd --etcd-endpoints "$etcd_url" --etcd-prefix /lksadmin-plans/)
  fi
  "${BENCH_SERVER:-$bin/lks-control-server}" --data-dir "$d/server" --listen "127.0.0.1:$p" \
    --metrics-listen "127.0.0.1:$mp" --advertise-address 127.0.0.1 "${extra[@]}" >"$d/server.log" 2>&1 &
  srv_pid=$!
  pids+=("$srv_pid")
  srv_conf=$d/server/admin.conf
  for _ in $(seq 150); do
    if [ -f "$srv_conf" ]; then
      [ "$store" = sqlite ] && break
      grep -q 'elected: this replica drives rollouts' "$d/server.log" && break
    fi
    sleep 0.2
  done
  [ -f "$srv_conf" ] || { echo "no server in $d" >&2; tail -5 "$d/server.log" >&2; exit 1; }
  sleep 1
}

down() {
  kill "$srv_pid" 2>/dev/null && { wait "$srv_pid" 2>/dev/null || true; }
  if [ "$1" = etcd ]; then kill "$etcd_pid" 2>/dev/null && { wait "$etcd_pid" 2>/dev/null || true; }; fi
}

# What the store took since mark(): prints "writes bytes cpu" (etcd: write
# transactions and KiB put; SQLite: "–" and KiB written to disk).
mark() {
  m_cpu=$(cpu_s "$srv_pid")
  if [ "$1" = etcd ]; then
    m_rev=$(etcd_metric etcd_debugging_mvcc_current_revision)
    m_put=$(etcd_metric etcd_debugging_mvcc_total_put_size_in_bytes)
    m_ecpu=$(cpu_s "$etcd_pid")
  else
    m_wb=$(write_bytes "$srv_pid")
  fi
}
since_mark() {
  local cpu
  cpu=$(sub "$m_cpu" "$(cpu_s "$srv_pid")")
  if [ "$1" = etcd ]; then
    echo "$(($(etcd_metric etcd_debugging_mvcc_current_revision) - m_rev)) $((($(etcd_metric etcd_debugging_mvcc_total_put_size_in_bytes) - m_put) / 1024)) $cpu $(sub "$m_ecpu" "$(cpu_s "$etcd_pid")")"
  else
    echo "– $((($(write_bytes "$srv_pid") - m_wb) / 1024)) $cpu –"
  fi
}

# The plan's record: "writes KiB" (its revision / key version, its size).
plan_record() {
  local d=$1 store=$2 name=$3
  if [ "$store" = etcd ]; then
    python3 - "$etcd_url" "/lksadmin-plans/plans/$name" <<'PY'
import base64, json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v3/kv/range",
    data=json.dumps({"key": base64.b64encode(sys.argv[2].encode()).decode()}).encode())
kv = json.load(urllib.request.urlopen(req))["kvs"][0]
print(kv["version"], round(len(base64.b64decode(kv["value"])) / 1024, 1))
PY
  else
    python3 - "$d/server/state.db" "$name" <<'PY'
import sqlite3, sys
c = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True)
rev, size = c.execute("SELECT revision, length(doc) FROM plans WHERE name = ?", (sys.argv[2],)).fetchone()
print(rev, round(size / 1024, 1))
PY
  fi
}

# One run: $1 store, $2 mode (one-by-one or plan), $3 run number. Appends
# to the arrays of results.
one_run() {
  local store=$1 mode=$2 r=$3 d
  d=$work/$store-$mode-$r
  up "$d" "$store"
  # The first plan run holds its agents on for the soak phase.
  local first=
  [ "$r" = 1 ] && [ "$mode" = plan ] && first=1
  local args=(--config "$srv_conf" --cluster p --clusters "$CLUSTERS" --agents "$agents"
    --rollout --hold "$([ -n "$first" ] && echo $((3 * IDLE_S + 600)) || echo 1)" --keep-nodes -o json)
  [ "$mode" = plan ] && args+=(--plan --plan-in-flight "$IN_FLIGHT")
  "$bin/lks-loadgen" "${args[@]}" >"$d/lg.json" 2>"$d/lg.err" &
  local lg=$!
  for _ in $(seq 36000); do
    grep -q '^starting [0-9]* rollouts' "$d/lg.err" 2>/dev/null && break
    kill -0 "$lg" 2>/dev/null || break
    sleep 0.05
  done
  mark "$store"
  for _ in $(seq 36000); do
    grep -q 'rollout completed' "$d/lg.err" 2>/dev/null && break
    kill -0 "$lg" 2>/dev/null || break
    sleep 0.05
  done
  local cost
  cost=$(since_mark "$store")
  if [ -n "$first" ]; then
    soak_phase "$store" "$d"
    kill -TERM "$lg"
  fi
  wait "$lg" || { echo "lks-loadgen ($store $mode $r) failed:" >&2; tail -5 "$d/lg.err" >&2; exit 1; }
  [ "$(field "$d/lg.json" errors)" = 0 ] || { echo "lks-loadgen ($store $mode $r) reported errors" >&2; exit 1; }
  local rec="– –"
  if [ "$mode" = plan ]; then
    local name
    name=$(sed -n 's/^starting [0-9]* rollouts of \([^@]*\)@1 through one plan$/\1/p' "$d/lg.err")
    rec=$(plan_record "$d" "$store" "$name")
  fi
  local row
  row="$(field "$d/lg.json" rollouts_started_seconds) $(field "$d/lg.json" rollout_seconds) $cost $rec $(cut -d' ' -f1 /proc/loadavg)"
  echo "$store $mode run $r: started completed writes KiB cpu etcd-cpu plan-writes plan-KiB load: $row" >&2
  res["$store-$mode"]+="$row;"
  if [ -n "$first" ]; then idle "$store" "$d"; fi
  down "$store"
}

# With the agents of plan run 1 still held: the server's CPU over IDLE_S s
# with that plan completed, then with a second plan whose first group is
# every cluster but one, soaking for an hour (the driver follows the plan
# every second): "cpu-held cpu-soaking load".
soak_phase() {
  local store=$1 d=$2 c0 held soaking names
  sleep 5
  c0=$(cpu_s "$srv_pid"); sleep "$IDLE_S"; held=$(sub "$c0" "$(cpu_s "$srv_pid")")
  mkdir -p "$d/soak-bundle"
  echo soak >"$d/soak-bundle/f0"
  printf 'name = "soak"\nversion = "1"\n\n[[file]]\npath = "/etc/lks-bench/soak.conf"\nsource = "f0"\nmode = "0644"\n' >"$d/soak-bundle/bundle.toml"
  "$bin/lksctl" --config "$srv_conf" bundle publish "$d/soak-bundle" >/dev/null
  names=$(seq 0 $((CLUSTERS - 2)) | sed 's/^/p-/' | paste -sd,)
  "$bin/lksctl" --config "$srv_conf" plan create soak --bundle soak@1 --group "a=$names" \
    --group "b=p-$((CLUSTERS - 1))" --soak 1h --max-clusters-in-flight "$CLUSTERS" --batch-size "$PER" >/dev/null
  for _ in $(seq 600); do
    [ "$("$bin/lksctl" --config "$srv_conf" plan status soak -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["groups"][0]["state"])')" = soaking ] && break
    sleep 1
  done
  sleep 3
  c0=$(cpu_s "$srv_pid"); sleep "$IDLE_S"; soaking=$(sub "$c0" "$(cpu_s "$srv_pid")")
  soak_res[$store]="$held $soaking $(cut -d' ' -f1 /proc/loadavg)"
  echo "$store agents held ${IDLE_S}s: CPU s plan completed / second plan soaking, load: ${soak_res[$store]}" >&2
}

# The server just measured, idle for IDLE_S s (no agent connected), next
# to a fresh empty one: "cpu-with-clusters cpu-empty".
idle() {
  local store=$1 d=$2 c0 c1 full
  sleep 5
  c0=$(cpu_s "$srv_pid"); sleep "$IDLE_S"; c1=$(cpu_s "$srv_pid")
  full=$(sub "$c0" "$c1")
  local keep_pid=$srv_pid keep_etcd=${etcd_pid:-}
  up "$work/$store-empty" "$store"
  sleep 5
  c0=$(cpu_s "$srv_pid"); sleep "$IDLE_S"; c1=$(cpu_s "$srv_pid")
  idle_res[$store]="$full $(sub "$c0" "$c1") $(cut -d' ' -f1 /proc/loadavg)"
  echo "$store idle ${IDLE_S}s: CPU s with $CLUSTERS clusters / empty, load: ${idle_res[$store]}" >&2
  down "$store"
  srv_pid=$keep_pid etcd_pid=$keep_etcd
}

declare -A res=() idle_res=() soak_res=()
echo "## Machine"
echo
echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD); load average at the start $(cut -d' ' -f1-3 /proc/loadavg)."
echo
for store in "${stores[@]}"; do
  for r in $(seq "$RUNS"); do
    for mode in one-by-one plan; do one_run "$store" "$mode" "$r"; done
  done
done

echo "## $CLUSTERS clusters × $PER agents: the same rollout in each (median of $RUNS runs)"
echo
echo "| store | started by | first call → last rollout stored (s) | → all completed (s) | store writes (etcd revisions) | KiB put (etcd) / written (SQLite) | server CPU (s) | etcd CPU (s) | plan record writes | plan record (KiB) | load (1 min) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for store in "${stores[@]}"; do
  for mode in one-by-one plan; do
    IFS=';' read -r -a rows <<<"${res[$store-$mode]}"
    cols=()
    for k in 0 1 2 3 4 5 6 7 8; do
      vals=()
      for row in "${rows[@]}"; do
        read -r -a f <<<"$row"
        [ "${f[$k]}" != – ] && vals+=("${f[$k]}")
      done
      if [ ${#vals[@]} -gt 0 ]; then cols+=("$(median "${vals[@]}")"); else cols+=("–"); fi
    done
    what=$([ "$mode" = plan ] && echo "one plan (in flight $IN_FLIGHT)" || echo "StartRollout × $CLUSTERS, one by one (baseline)")
    line=$(IFS='|'; echo "${cols[*]}")
    echo "| $store | $what | ${line//|/ | } |"
  done
done
echo
echo "## Idle for $IDLE_S s (no agent connected, one window each)"
echo
echo "| store | server CPU (s) with $CLUSTERS clusters, their nodes, rollouts and the plan | the same on a fresh empty server | load (1 min) |"
echo "| --- | --- | --- | --- |"
for store in "${stores[@]}"; do
  read -r a b l <<<"${idle_res[$store]:-– – –}"
  echo "| $store | $a | $b | $l |"
done
echo
echo "## $CLUSTERS clusters, $agents agents held: a plan soaking (one window each, $IDLE_S s)"
echo
echo "| store | server CPU (s), the plan completed | a second plan soaking after its first group ($((CLUSTERS - 1)) clusters) | load (1 min) |"
echo "| --- | --- | --- | --- |"
for store in "${stores[@]}"; do
  read -r a b l <<<"${soak_res[$store]:-– – –}"
  echo "| $store | $a | $b | $l |"
done
