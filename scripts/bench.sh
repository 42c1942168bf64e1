#!/usr/bin/env bash
# Benchmarks behind BENCHMARKS.md. Each figure is the median of RUNS runs,
# measured next to its baseline in the same run:
#   - lks-loadgen against a release lks-control-server (SQLite store):
#     enrolment rate, connect → first desired state, rollout fan-out and
#     completion, server memory per connected agent;
#     baseline: the same clients against an idle tonic server (mTLS, one
#     tonic-health Watch stream each).
#   - SHA-256 of a large file the way agent and server verify blobs,
#     baseline: coreutils sha256sum.
#   - the agent package download of cloud-init user-data (curl --cacert,
#     HTTP/2 over TLS from lks-control-server --agent-package), one VM and a
#     boot storm of parallel VMs; baseline: the same file with the same curl
#     from python3's http.server (plain HTTP, the simplest static server).
#   - one agent installing a 256 MiB file (fresh) and replacing it with
#     another 256 MiB version (upgrade), each a `rollout start --wait`;
#     each paired with a floor measured right after it: curl over HTTPS
#     (the server's own agent-package endpoint, pinned CA) + openssl dgst
#     -sha256 + one fdatasync of the same size, which is the transfer,
#     hashing and durable-write floor. The server's data dir is on tmpfs
#     (UPGRADE_SERVER_DIR, default /dev/shm; "same" for the agent's disk),
#     standing in for kube0's own disk.
#   - blob download and verify: one agent fetching a 256 MiB blob through
#     FetchBlob, and 100 agents (BLOB_AGENTS) a 64 MiB one at once, timed
#     by the agent's "blob fetched and verified" log line; baseline: curl
#     over HTTPS of the same bytes from the same server (--agent-package)
#     + openssl dgst -sha256, one and 100 at once (at most 64 running).
#   - blob store on S3 (--blob-store s3://…, against s3s-fs): publishing
#     a 256 MiB file through a server on S3 and through one on the local
#     store, baseline: boto3's multipart upload_file (16 MiB parts, 4
#     threads, as the server uploads) and one curl --aws-sigv4 PUT of the
#     same file to the same s3s-fs; one agent installing it (`rollout start
#     --wait` and its FetchBlob log line) from the local store, from the S3
#     server lacking its local copy (first fetch from the bucket) and from
#     it again once cached, baseline: curl GET of the object from s3s-fs and
#     curl HTTPS from the server, each + openssl dgst -sha256. s3s-fs's
#     root, the servers' data dirs and the agents on S3_BENCH_DIR (default
#     /dev/shm; S3_AGENT_DIR puts the agents elsewhere).
#   - HA: 3 replicas (--store etcd) on a throwaway etcd next to the one
#     SQLite server: agents held, rollout to HA_AGENTS agents (spread over
#     the replicas, started through a replica that is not the leader), and
#     what an idle control plane with those agents writes (etcd revisions,
#     keys, bytes; disk bytes of etcd and of the SQLite server).
#   - reconnect storm: lks-loadgen --storm starts its own server, connects
#     N agents, restarts the server (SIGTERM) and times until every agent
#     has its desired state again, with errors by class; baseline: the
#     same N agents' first connection in the same run.
#   - scale-out: for each of SCALE_AGENTS (default 10000 20000 30000), a
#     fresh region (three etcd members and three replicas on loopback), the
#     agents in as many lks-loadgen processes as the open-file limit needs,
#     in clusters of CLUSTER_NODES (1000) nodes, one rollout per cluster,
#     a 20-file rollout to all and an idle window (etcd write rate and DB
#     size, RSS per replica and per agent), then a fresh region again with
#     the leading replica killed mid-rollout; baseline: one SQLite server
#     with 10,000 agents and the same rollout.
#   - delta-cost: the server's delta maker on kubectl 1.37.0 -> 1.37.1 and
#     on two unrelated 256 MiB files (CPU seconds by its metrics, peak RSS),
#     baseline: bsdiff 4.3 and zstd -19 --patch-from of the same pairs and
#     sha256sum of the new file (issue [upgrade-cost] item 3).
#   - kube-drain: what a drained node's turn adds to a rollout (cordon,
#     evictions under a PodDisruptionBudget, Ready gate, uncordon) on a
#     real kube-apiserver and controller manager (tests/src/kube.rs), with
#     requests counted by the API server's audit log; baseline: `kubectl
#     drain` + `kubectl uncordon` of the same node, kubectl of the same
#     release, on the same API server (tests/tests/kube_drain_bench.rs;
#     RUNS_KUBE runs, default 5; PODS, UNAVAILABLE, POD_START_MS,
#     POD_STOP_MS).
# Usage: bash scripts/bench.sh [--only agents|sha|packages|upgrade|blob|s3|ha|footprint|storm|scale-out|swarm|delta-cost|kube-drain] [AGENTS...]
#        (default: every section, agents 1000 2000; HA_AGENTS=1000,
#        IDLE_SECONDS=60, FOOTPRINT_SECONDS=IDLE_SECONDS)
# The issue's whole set in one run (BENCHMARKS.md, "Every figure in one run"):
#        FOOTPRINT_SECONDS=600 bash scripts/bench.sh 1000 10000
# Needs python3 (medians), curl, openssl (the upgrade baseline), for the HA
# section etcd, for the s3 section s3s-fs (scripts/setup.sh installs it),
# python3-venv and PyPI (boto3, into a throwaway venv), for the delta-cost
# section bsdiff and zstd (apt-get install bsdiff zstd) and PyPI (the
# kubectl releases). Not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
only=""
if [ "${1:-}" = --only ]; then
  only=${2:?--only needs agents, sha, packages, upgrade, blob, s3, ha, footprint, storm, scale-out, swarm, delta-cost or kube-drain}
  shift 2
fi
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }
agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(1000 2000)

bash scripts/setup.sh
# BENCH_NO_BUILD=1: measure the binaries already built (e.g. a server built
# earlier in the same session, with BENCH_AGENT naming each agent).
if [ -z "${BENCH_NO_BUILD:-}" ]; then
cargo build --release -p lks-control-server -p lksctl -p lks-loadgen --bins >&2
# The agent as it is shipped: its own profile (Cargo.toml, [profile.agent]).
cargo build --profile agent -p lksadmin-agent --bins >&2
cargo build --release -p lks-proto --example sha256_file >&2
cargo build --profile agent -p lks-proto --example sha256_file >&2
fi
bin=target/release
# BENCH_AGENT: another agent binary to measure (e.g. an earlier build,
# for a before/after pair in one session).
agent_bin=${BENCH_AGENT:-target/agent/lksadmin-agent}
# Agents run with the environment their systemd unit gives them.
mapfile -t agent_env < <(sed -n 's/^Environment=//p' packaging/systemd/lksadmin-agent.service)

work=$(mktemp -d)
server_pid=
http_pid=
replica_pids=()
up_pids=()
fp_pids=()
s3_pids=()
bl_agents=()
sc_pids=()
etcd_pid=
elsewhere=()
cleanup() {
  # Replicas before etcd: they give their leases back on the way out.
  for p in $server_pid $http_pid "${bl_agents[@]}" "${up_pids[@]}" "${fp_pids[@]}" "${s3_pids[@]}" "${sc_pids[@]}" "${replica_pids[@]}" $etcd_pid; do
    # A killed process's status is not a failure here (set -e would stop
    # the cleanup at the first one).
    kill "$p" 2>/dev/null && { wait "$p" 2>/dev/null || true; }
  done
  rm -rf "$work" "${elsewhere[@]}"
}
trap cleanup EXIT

# Two snapshots of etcd's /metrics ($1, $2) taken $3 seconds apart: per
# second, revisions (one per committed write transaction), keys written,
# KiB put and raft proposals; then the DB size and the part in use (MiB).
etcd_diff() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
def load(p):
    m = {}
    for line in open(p):
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            m[k] = float(v)
    return m
a, b, s = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
d = lambda k: (b[k] - a[k]) / s
print("%.2f %.2f %.2f %.2f %.1f %.1f" % (
    d("etcd_debugging_mvcc_current_revision"),
    d("etcd_mvcc_put_total") + d("etcd_mvcc_delete_total"),
    d("etcd_debugging_mvcc_total_put_size_in_bytes") / 1024,
    d("etcd_server_proposals_committed_total"),
    b["etcd_mvcc_db_total_size_in_bytes"] / 2**20,
    b["etcd_mvcc_db_total_size_in_use_in_bytes"] / 2**20))
PY
}
median() { python3 -c 'import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]), 1))' "$@"; }
# The median of ratios, to two decimals.
median2() { python3 -c 'import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]), 2))' "$@"; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=d
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }

echo "## Machine"
echo "- $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
# shellcheck disable=SC1091
echo "- memory: $(free -g | awk '/Mem:/{print $2}') GiB; kernel $(uname -r); $(. /etc/os-release; echo "$PRETTY_NAME")"
echo "- $(rustc --version); release profile (the agent: agent profile); date $(date -u +%F)"
echo

# A file --agent-package takes: SIZE bytes, a .deb's first bytes then random.
fake_deb() { { printf '!<arch>\ndebian-binary   '; head -c $(($2 - 24)) /dev/urandom; } >"$1"; }
# The CA a client pins, from an admin.conf.
ca_pem() {
  python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["ca_cert"], end="")' "$1"
}

# Starts a release server of a section's own, data in DIR/server, log in
# DIR/server.log, the other arguments passed on; waits for its admin.conf,
# writes its CA to DIR/ca.pem and sets srv_port. Cleanup stops it.
start_server() {
  local dir=$1
  shift
  srv_port=$(free_port) srv_metrics_port=$(free_port)
  "$bin/lks-control-server" --data-dir "$dir/server" --listen "127.0.0.1:$srv_port" \
    --metrics-listen "127.0.0.1:$srv_metrics_port" --advertise-address 127.0.0.1 "$@" \
    >"$dir/server.log" 2>&1 &
  up_pids+=($!)
  for _ in $(seq 100); do [ -f "$dir/server/admin.conf" ] && break; sleep 0.1; done
  ca_pem "$dir/server/admin.conf" >"$dir/ca.pem"
}

# The package the download section serves: 20 MiB, a .deb's first bytes.
# Only that section has the server import it.
pkg=$work/pkg/lksadmin-agent_0.0.0-bench_amd64.deb
pkg_args=()
if want packages; then
  mkdir -p "$work/pkg"
  fake_deb "$pkg" $((20 << 20))
  pkg_args=(--agent-package "$pkg")
fi

port=$((20000 + RANDOM % 20000))
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
metrics_port=$(free_port)
"$bin/lks-control-server" --data-dir "$work/server" --listen "127.0.0.1:$port" \
  --metrics-listen "127.0.0.1:$metrics_port" \
  --advertise-address 127.0.0.1 "${pkg_args[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -f "$work/server/admin.conf" ] && break; sleep 0.1; done
sleep 0.5

rss_of() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
# The peak RSS (KiB) of process $2, sampled every 0.5 s from $3 (its RSS
# before) while process $1 (a load generator) runs. Called in $(...), so
# the caller waits for $1 (and gets its exit status) afterwards.
rss_peak_while() {
  local lg=$1 pid=$2 peak=$3 cur
  while kill -0 "$lg" 2>/dev/null; do
    cur=$(rss_of "$pid"); [ "$cur" -gt "$peak" ] && peak=$cur
    sleep 0.5
  done
  echo "$peak"
}
# The baseline runs its clients and the tonic server in one process: two
# sockets per agent. Without that many open files (10,000 agents here: the
# hard limit is 20,000) it is left out rather than spinning on EMFILE.
baseline_fits() { [ $((2 * $1 + 256)) -le "$(ulimit -Hn)" ]; }

if want agents; then
echo "## Agents (median of $RUNS runs)"
echo
echo "| agents | what | enrol/s | first message p50 / p99 (ms) | rollout fan-out p50 / p99 (ms) | rollout done (s) | server RSS per agent (KiB) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for n in "${agents[@]}"; do
  declare -A acc=()
  for r in $(seq "$RUNS"); do
    if baseline_fits "$n"; then
      "$bin/lks-loadgen" --baseline --agents "$n" --cluster bench --spread-source-ips -o json >"$work/base.json"
      acc[b50]+=" $(field "$work/base.json" first_message.p50_ms)"
      acc[b99]+=" $(field "$work/base.json" first_message.p99_ms)"
    fi

    # A fresh server for each run: one that served the run before keeps
    # the memory it freed (glibc reuses it), and the next run's growth
    # would read as a fraction of what an agent costs.
    mkdir -p "$work/agents-$n-$r"
    start_server "$work/agents-$n-$r"
    ag_pid=${up_pids[-1]}
    sleep 0.5
    idle=$(rss_of "$ag_pid")
    "$bin/lks-loadgen" --config "$work/agents-$n-$r/server/admin.conf" --cluster bench --agents "$n" \
      --spread-source-ips --rollout --hold 4 -o json >"$work/run.json" &
    lg=$!
    # Sample the server while every agent is connected (during --hold).
    peak=$(rss_peak_while "$lg" "$ag_pid" "$idle")
    wait "$lg"
    kill "$ag_pid" && { wait "$ag_pid" 2>/dev/null || true; }
    rm -rf "$work/agents-$n-$r"
    [ "$(field "$work/run.json" errors)" = 0 ] || { echo "loadgen reported errors" >&2; exit 1; }
    acc[e]+=" $(field "$work/run.json" enrol_per_second)"
    acc[f50]+=" $(field "$work/run.json" first_message.p50_ms)"
    acc[f99]+=" $(field "$work/run.json" first_message.p99_ms)"
    acc[o50]+=" $(field "$work/run.json" fanout.p50_ms)"
    acc[o99]+=" $(field "$work/run.json" fanout.p99_ms)"
    acc[done]+=" $(field "$work/run.json" rollout_seconds)"
    acc[rss]+=" $(( (peak - idle) / n ))"
  done
  # shellcheck disable=SC2086
  if baseline_fits "$n"; then
    echo "| $n | idle tonic server (baseline) | – | $(median ${acc[b50]}) / $(median ${acc[b99]}) | – | – | – |"
  else
    echo "| $n | idle tonic server (baseline) | – | not run: needs $((2 * n + 256)) open files, the limit is $(ulimit -Hn) | – | – | – |"
  fi
  # shellcheck disable=SC2086
  echo "| $n | lks-control-server | $(median ${acc[e]}) | $(median ${acc[f50]}) / $(median ${acc[f99]}) | $(median ${acc[o50]}) / $(median ${acc[o99]}) | $(median ${acc[done]}) | $(median ${acc[rss]}) |"
  unset acc
done
echo
fi

if want sha; then
echo "## SHA-256 of a 1 GiB file (median of $RUNS runs, page cache warm)"
echo
head -c $((1 << 30)) /dev/urandom >"$work/blob"
sha256sum "$work/blob" >/dev/null
ms() { local s; s=$(date +%s%N); "$@" >/dev/null; echo $(( ($(date +%s%N) - s) / 1000000 )); }
base=() ours=() ours_agent=()
for _ in $(seq "$RUNS"); do
  base+=("$(ms sha256sum "$work/blob")")
  ours+=("$(ms "$bin/examples/sha256_file" "$work/blob")")
  ours_agent+=("$(ms target/agent/examples/sha256_file "$work/blob")")
done
echo "| what | time (ms) | MiB/s |"
echo "| --- | --- | --- |"
b=$(median "${base[@]}"); o=$(median "${ours[@]}")
echo "| sha256sum (baseline) | $b | $(python3 -c "print(round(1024/($b/1000)))") |"
echo "| lks_proto::Digest::of_file | $o | $(python3 -c "print(round(1024/($o/1000)))") |"
a=$(median "${ours_agent[@]}")
echo "| lks_proto::Digest::of_file, agent profile (the agent's hashing) | $a | $(python3 -c "print(round(1024/($a/1000)))") |"
echo
fi

if want packages; then
  python3 -m http.server --bind 127.0.0.1 --directory "$work/pkg" $((port + 1)) >"$work/http.log" 2>&1 &
  http_pid=$!
  ca_pem "$work/server/admin.conf" >"$work/ca.pem"
  ours_url="https://127.0.0.1:$port/v1/agent-package/amd64"
  base_url="http://127.0.0.1:$((port + 1))/$(basename "$pkg")"
  for _ in $(seq 50); do curl -fs -o /dev/null "$base_url" && break; sleep 0.1; done
  # PAR downloads at once, each from its own 127.0.x.y source address as
  # VMs have (the endpoint rate-limits per IP); prints the wall time in ms
  # until the last one finished, after checking every one got the file.
  storm() {
    local url=$1 par=$2 run=$3 s i
    s=$(date +%s%N)
    for i in $(seq "$par"); do
      curl -fsS --cacert "$work/ca.pem" --interface "127.0.$run.$((i + 1))" \
        -o "$work/dl.$i" "$url" &
    done
    wait
    echo $(( ($(date +%s%N) - s) / 1000000 ))
    for i in $(seq "$par"); do cmp -s "$pkg" "$work/dl.$i" || { echo "download $i differs" >&2; exit 1; }; done
    rm -f "$work"/dl.*
  }
  echo "## Agent package download, 20 MiB (median of $RUNS runs)"
  echo
  echo "| parallel VMs | python3 http.server, plain HTTP/1.1 (baseline) (ms) | lks-control-server, HTTPS + HTTP/2 (ms) |"
  echo "| --- | --- | --- |"
  for par in 1 32; do
    base=() ours=()
    for r in $(seq "$RUNS"); do
      base+=("$(storm "$base_url" "$par" "$r")")
      ours+=("$(storm "$ours_url" "$par" "$((r + 100))")")
    done
    echo "| $par | $(median "${base[@]}") | $(median "${ours[@]}") |"
  done
  echo
fi
if want upgrade; then
  # Its own server, so that the baseline's 256 MiB file is served by the
  # same HTTPS stack (--agent-package), and one release agent in a sandbox.
  # UPGRADE_MIB: the file's size (default 256).
  big=$(( ${UPGRADE_MIB:-256} << 20 ))
  up=$work/up
  mkdir -p "$up/pkg" "$up/root"
  deb=$up/pkg/lksadmin-agent_0.0.0-big_amd64.deb
  fake_deb "$deb" "$big"
  # In production the control server runs on kube0, never on the node's
  # disk. Here both share one disk, and the server's fsyncs (each status
  # report it stores) would queue behind the node's writes and the trims of
  # what an upgrade frees. So its data dir is on tmpfs (UPGRADE_SERVER_DIR,
  # default /dev/shm; UPGRADE_SERVER_DIR=same keeps it on the agent's disk).
  srv_on=${UPGRADE_SERVER_DIR:-/dev/shm}
  if [ "$srv_on" != same ]; then
    elsewhere+=("$(mktemp -d "$srv_on/lks-bench-server.XXXXXX")")
    ln -s "${elsewhere[-1]}" "$up/server"
  fi
  # UPGRADE_SERVER_ARGS: more server flags (e.g. "--delta-interval off").
  read -r -a up_args <<<"${UPGRADE_SERVER_ARGS:-}"
  start_server "$up" --agent-package "$deb" "${up_args[@]}"
  up_server=${up_pids[-1]}
  up_port=$srv_port
  lk() { "$bin/lksctl" --config "$up/server/admin.conf" "$@"; }
  lk cluster create up >/dev/null
  read -r -a joinv <<<"$(lk token create --cluster up --uses 1)"
  "$agent_bin" "${joinv[@]:1}" --node-name up-1 --state-dir "$up/state" --root "$up/root" >/dev/null
  env "${agent_env[@]}" "$agent_bin" run --state-dir "$up/state" >"$up/agent.log" 2>&1 &
  up_pids+=($!)
  up_agent=$!
  for _ in $(seq 100); do lk node get up-1 -o json | grep -q '"connected": true' && break; sleep 0.1; done
  # A bundle NAME@VERSION holding one fresh 256 MiB file at PATH.
  mkbundle() {
    local d=$up/src-$1-$2
    mkdir -p "$d"
    head -c "$big" /dev/urandom >"$d/blob"
    printf 'name = "%s"\nversion = "%s"\n\n[[file]]\npath = "%s"\nsource = "blob"\nmode = "0755"\n' \
      "$1" "$2" "$3" >"$d/bundle.toml"
    lk bundle publish "$d" >/dev/null
    rm -rf "$d"
  }
  # Publishing just wrote 256 MiB on the server's side: flush it first, so
  # its writeback does not land inside the measured apply.
  # The agent's peak RSS (KiB) during each roll goes into $up/rss.
  # The agent's CPU time (ms: utime + stime) and the bytes it passed
  # through read and write calls (MiB; /proc/PID/io rchar and wchar,
  # sockets and the page cache included), to tell what a rollout made the
  # agent do apart from how long it took on a machine that may be busy.
  cpu_ms_of() { awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"; }
  agent_cpu_ms() { cpu_ms_of "$up_agent"; }
  agent_io() { awk '$1 == "rchar:" { r = $2 } $1 == "wchar:" { w = $2 } END { print r, w }' "/proc/$up_agent/io"; }
  # Waits until the agent has used no CPU for half a second (its work
  # after the report: the cache copy, the collection of old blobs).
  settle() {
    local a b
    b=$(agent_cpu_ms)
    for _ in $(seq 100); do
      sleep 0.5
      a=$b b=$(agent_cpu_ms)
      [ "$a" != "$b" ] || return 0
    done
  }
  # One rollout: prints its wall time (ms); appends the agent's peak RSS
  # to $up/rss and "cpu_ms read_MiB written_MiB" during the rollout, then
  # the same for its work after the report, to $up/work.
  roll() {
    local s c0 c1 io0 io1 io2 s0 s1
    sync
    # Reset the agent's peak RSS (VmHWM), to read the apply's own peak.
    echo 5 >"/proc/$up_agent/clear_refs" 2>/dev/null || true
    c0=$(agent_cpu_ms) io0=$(agent_io) s0=$(cpu_ms_of "$up_server")
    s=$(date +%s%N)
    lk rollout start --cluster up --bundle "$1" --wait >/dev/null
    echo $(( ($(date +%s%N) - s) / 1000000 ))
    c1=$(agent_cpu_ms) io1=$(agent_io) s1=$(cpu_ms_of "$up_server")
    awk '/^VmHWM/ {print $2}' "/proc/$up_agent/status" >>"$up/rss"
    settle
    io2=$(agent_io)
    python3 - "$c0" "$c1" "$(agent_cpu_ms)" "$io0" "$io1" "$io2" "$s0" "$s1" >>"$up/work" <<'PY'
import sys
c0, c1, c2 = map(int, sys.argv[1:4])
(r0, w0), (r1, w1), (r2, w2) = (map(int, a.split()) for a in sys.argv[4:7])
s0, s1 = map(int, sys.argv[7:9])
m = lambda b: round(b / 2**20)
print(c1 - c0, m(r1 - r0), m(w1 - w0), c2 - c1, m(r2 - r1), m(w2 - w1), s1 - s0)
PY
  }
  # shellcheck disable=SC2120 # "durable" comes through ms below
  fetch_and_hash() {
    curl -fsS --cacert "$up/ca.pem" -o "$up/dl" "https://127.0.0.1:$up_port/v1/agent-package/amd64"
    openssl dgst -sha256 "$up/dl" >/dev/null
    # The durable variant: the same, then the file's data on the disk
    # (coreutils sync --data FILE: one fdatasync), as an agent must have
    # it before it may switch a target to it.
    [ "${1:-}" != durable ] || sync --data "$up/dl"
    rm -f "$up/dl"
  }
  ms() { local s; s=$(date +%s%N); "$@" >/dev/null; echo $(( ($(date +%s%N) - s) / 1000000 )); }
  fetch_and_hash
  # The agent's own figure for the last fetch: stream_ms of its latest
  # "blob fetched and verified" line (request to last byte verified and
  # written, before the fsync).
  last_stream_ms() { grep 'blob fetched and verified' "$up/agent.log" | tail -1 | sed -n 's/.*stream_ms=\([0-9]*\).*/\1/p'; }
  # Each rollout is paired with a floor measured right after it (issue
  # [upgrade-cost]): curl over HTTPS + openssl dgst + one fdatasync of the
  # same size, so that a slower disk or a busier core moves both sides of
  # a pair alike. A pair's speed is floor / rollout (1.00: as fast as the
  # floor; above: faster).
  fresh=() upgr=() ffloor=() ufloor=() fspeed=() uspeed=() ratio=() fstream=() ustream=()
  pairs=() works=()
  for r in $(seq "$RUNS"); do
    mkbundle "fresh$r" 1 "/opt/fresh$r/kubelet"
    f=$(roll "fresh$r@1") fs=$(last_stream_ms) fw=$(tail -1 "$up/work")
    sync
    ff=$(ms fetch_and_hash durable)
    mkbundle fresh1 $((r + 1)) /opt/fresh1/kubelet
    u=$(roll "fresh1@$((r + 1))") us=$(last_stream_ms) uw=$(tail -1 "$up/work")
    sync
    uf=$(ms fetch_and_hash durable)
    fresh+=("$f") ffloor+=("$ff") upgr+=("$u") ufloor+=("$uf") fstream+=("$fs") ustream+=("$us")
    fspeed+=("$(python3 -c "print($ff/$f)")") uspeed+=("$(python3 -c "print($uf/$u)")")
    ratio+=("$(python3 -c "print($u/$f)")")
    works+=("| $r | fresh install | $(echo "$fw" | awk '{ printf "%d | %d | %d | %d | %d | %d | %d", $1, $2, $3, $4, $5, $6, $7 }') |"
      "| $r | upgrade | $(echo "$uw" | awk '{ printf "%d | %d | %d | %d | %d | %d | %d", $1, $2, $3, $4, $5, $6, $7 }') |")
    pairs+=("| $r | $f | $ff | $(python3 -c "print(round($ff/$f, 2))") | $fs | $u | $uf | $(python3 -c "print(round($uf/$u, 2))") | $us | $(python3 -c "print(round($u/$f, 2))") |")
  done
  peak=$(sort -n "$up/rss" | tail -1)
  # UPGRADE_KEEP_LOG=FILE keeps the agent's log (its timings) there.
  [ -z "${UPGRADE_KEEP_LOG:-}" ] || cp "$up/agent.log" "$UPGRADE_KEEP_LOG"
  echo "## One $((big >> 20)) MiB file on one agent, each rollout paired with its floor ($RUNS pairs, \`rollout start --wait\`)"
  echo
  echo "Server flags: ${UPGRADE_SERVER_ARGS:-(defaults)}. Server data dir: $srv_on ($(stat -f -c %T "$(readlink -f "$up/server")")); agent state and root: $(stat -f -c %T "$up") $(findmnt -n -o OPTIONS -T "$up" | grep -o discard || true)"
  echo
  echo "Floor: curl HTTPS (the same server's agent-package endpoint, pinned CA) + openssl dgst -sha256 + sync --data of the file, measured right after the rollout it is paired with. Speed: floor / rollout. stream: the agent's stream_ms (request to last byte verified and written)."
  echo
  echo "| pair | fresh install (ms) | its floor (ms) | speed | stream (ms) | upgrade (ms) | its floor (ms) | speed | stream (ms) | upgrade / fresh |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${pairs[@]}"
  echo "| median | $(median "${fresh[@]}") | $(median "${ffloor[@]}") | **$(median2 "${fspeed[@]}")** | $(median "${fstream[@]}") | $(median "${upgr[@]}") | $(median "${ufloor[@]}") | **$(median2 "${uspeed[@]}")** | $(median "${ustream[@]}") | **$(median2 "${ratio[@]}")** |"
  echo
  echo "What the agent did (its CPU time, utime + stime; the bytes it read and wrote through system calls, sockets and page cache included: /proc/PID/io rchar and wchar), during the rollout and after the report until it was idle for 0.5 s:"
  echo
  echo "| pair | rollout | CPU during (ms) | read during (MiB) | written during (MiB) | CPU after (ms) | read after (MiB) | written after (MiB) | server CPU during (ms) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${works[@]}"
  echo
  echo "The agent's peak RSS during an install or upgrade (VmHWM, reset before each): $((peak / 1024)) MiB."
  echo
fi

if want blob; then
  # FetchBlob next to curl + openssl on the same bytes from the same server:
  # its own server imports two agent packages (a 256 MiB amd64 one, a
  # 64 MiB arm64 one, served over HTTPS by --agent-package) and publishes
  # each file again as a bundle, so both paths read one blob file.
  # Every run enrols fresh agents (a new cluster), so the blob is never in
  # an agent's cache yet. The agent's figure is its "blob fetched and
  # verified" log line: FetchBlob request to the last byte verified,
  # written and fsynced into the cache (ms), and without the fsync
  # (stream_ms). The baseline never fsyncs.
  bl=$work/bl
  mkdir -p "$bl/pkg"
  par=${BLOB_AGENTS:-100}
  big_deb=$bl/pkg/lksadmin-agent_0.0.0-big_amd64.deb
  mid_deb=$bl/pkg/lksadmin-agent_0.0.0-mid_arm64.deb
  fake_deb "$big_deb" $((256 << 20))
  fake_deb "$mid_deb" $((64 << 20))
  start_server "$bl" --agent-package "$big_deb" --agent-package "$mid_deb"
  bl_port=$srv_port
  blk() { "$bin/lksctl" --config "$bl/server/admin.conf" "$@"; }
  for b in big:"$big_deb" mid:"$mid_deb"; do
    d=$bl/src-${b%%:*}
    mkdir -p "$d"
    cp "${b#*:}" "$d/blob"
    printf 'name = "%s"\nversion = "1"\n\n[[file]]\npath = "/opt/%s/blob"\nsource = "blob"\nmode = "0755"\n' \
      "${b%%:*}" "${b%%:*}" >"$d/bundle.toml"
    blk bundle publish "$d" >/dev/null
    rm -rf "$d"
  done
  # Enrols and starts N agents in cluster C; their pids go to bl_agents.
  agents_up() {
    local c=$1 n=$2 i
    blk cluster create "$c" >/dev/null
    read -r -a joinv <<<"$(blk token create --cluster "$c" --uses "$n")"
    for i in $(seq "$n"); do
      mkdir -p "$bl/$c/$i/root"
      "$agent_bin" "${joinv[@]:1}" --node-name "$c-$i" --state-dir "$bl/$c/$i/state" \
        --root "$bl/$c/$i/root" >/dev/null
    done
    for i in $(seq "$n"); do
      env "${agent_env[@]}" "$agent_bin" run --state-dir "$bl/$c/$i/state" >"$bl/$c/$i/agent.log" 2>&1 &
      bl_agents+=($!)
    done
    for _ in $(seq 600); do
      [ "$(blk node list --cluster "$c" -o json | grep -c '"connected": true')" = "$n" ] && return
      sleep 0.1
    done
    echo "not every agent of $c connected" >&2
    exit 1
  }
  agents_down() {
    local p
    for p in "${bl_agents[@]}"; do kill "$p" && { wait "$p" || true; }; done
    bl_agents=()
    rm -rf "${bl:?}/$1"
  }
  # The fetch lines of cluster C's agent logs: "MS STREAM_MS", median over
  # agents; with --span, first fetch start to last fetch end (ms), the same
  # to the last fetch's last byte verified and written (before its fsync),
  # and how many agents logged a fetch.
  fetched() {
    python3 - "$@" <<'PY'
import datetime, glob, re, statistics, sys
c, span = sys.argv[1], len(sys.argv) > 2
rows = []
for f in glob.glob(c + "/*/agent.log"):
    for line in open(f):
        if "blob fetched and verified" in line:
            ts = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp() * 1000
            ms = int(re.search(r"\bms=(\d+)", line).group(1))
            st = int(re.search(r"\bstream_ms=(\d+)", line).group(1))
            rows.append((ts, ms, st))
if span:
    start = min(t - m for t, m, _ in rows)
    print(round(max(t for t, _, _ in rows) - start), round(max(t - m + st for t, m, st in rows) - start), len(rows))
else:
    print(statistics.median(m for _, m, _ in rows), statistics.median(s for _, _, s in rows))
PY
  }
  ms() { local s; s=$(date +%s%N); "$@" >/dev/null; echo $(( ($(date +%s%N) - s) / 1000000 )); }
  get_hash() {
    curl -fsS --cacert "$bl/ca.pem" ${3:+--interface "$3"} -o "$2" "https://127.0.0.1:$bl_port/v1/agent-package/$1"
    openssl dgst -sha256 "$2" >/dev/null
  }
  # PAR curl + openssl at once, each from its own 127.1.R.x address (the
  # endpoint rate-limits per IP). The endpoint serves at most 64 downloads
  # at once (MAX_DOWNLOADS in packages.rs): more are turned away, so at most
  # 64 run at a time here.
  curl_storm() {
    local r=$1 i
    for i in $(seq "$par"); do echo "$i"; done |
      xargs -P 64 -I{} bash -c "$(declare -f get_hash); bl=$bl bl_port=$bl_port get_hash arm64 $bl/dl.{} 127.1.$r.{}"
    rm -f "$bl"/dl.*
  }
  get_hash amd64 "$bl/dl" && rm -f "$bl/dl"
  base=() ours=() stream=() apply=() mbase=() mspan=() mstream=() mapply=()
  for r in $(seq "$RUNS"); do
    sync
    base+=("$(ms get_hash amd64 "$bl/dl")")
    rm -f "$bl/dl"
    agents_up "one$r" 1
    sync
    s=$(date +%s%N)
    blk rollout start --cluster "one$r" --bundle big@1 --wait >/dev/null
    apply+=("$(( ($(date +%s%N) - s) / 1000000 ))")
    read -r m st <<<"$(fetched "$bl/one$r")"
    ours+=("$m") stream+=("$st")
    agents_down "one$r"

    sync
    mbase+=("$(ms curl_storm "$r")")
    agents_up "many$r" "$par"
    sync
    s=$(date +%s%N)
    blk rollout start --cluster "many$r" --bundle mid@1 --batch-size "$par" --wait >/dev/null
    mapply+=("$(( ($(date +%s%N) - s) / 1000000 ))")
    read -r sp sst n <<<"$(fetched "$bl/many$r" --span)"
    [ "$n" = "$par" ] || { echo "$n of $par agents logged their fetch" >&2; exit 1; }
    mspan+=("$sp") mstream+=("$sst")
    agents_down "many$r"
  done
  b=$(median "${base[@]}") o=$(median "${ours[@]}") st=$(median "${stream[@]}") a=$(median "${apply[@]}")
  mb=$(median "${mbase[@]}") ms_=$(median "${mspan[@]}") ma=$(median "${mapply[@]}") mst=$(median "${mstream[@]}")
  ratio() { python3 -c "print(round($1/$2, 2))"; }
  echo "## Blob download and verify (median of $RUNS runs)"
  echo
  echo "| what | baseline: curl HTTPS + openssl dgst -sha256 (ms) | FetchBlob + verify into the cache (ms) | speed vs baseline | without the fsync (ms) | whole \`rollout start --wait\` (ms) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  echo "| 1 agent, 256 MiB | $b | $o | $(ratio "$b" "$o") | $st | $a |"
  echo "| $par agents at once, 64 MiB each (first fetch start to last fetch end) | $mb | $ms_ | $(ratio "$mb" "$ms_") | $mst | $ma |"
  echo
fi

if want s3; then
  # One 256 MiB file of random bytes through --blob-store s3://… against
  # s3s-fs (the S3 server the e2e tests use), next to the local store and
  # to plain S3 clients on the same s3s-fs. Publish: lksctl bundle publish
  # to a server on the local store and to one on S3 (which verifies the
  # file into its data dir, then uploads it: 16 MiB parts, 4 in flight);
  # baseline: boto3's upload_file with the same part size and concurrency
  # (timed inside Python, without its start and imports) and one curl PUT.
  # Fetch: one fresh agent's `rollout start --wait` and its "blob fetched
  # and verified" line from (a) the local-store server, (b) the S3 server
  # with its local copy deleted (stopped, the file removed, started again:
  # the first FetchBlob makes it download the blob from the bucket) and
  # (c) the S3 server again, now holding its copy; baseline: curl GET of
  # the object from s3s-fs, and curl over HTTPS from the server
  # (--agent-package), each + openssl dgst -sha256. s3s-fs's root, both
  # servers' data dirs and the source file share one place (S3_BENCH_DIR,
  # default /dev/shm: tmpfs, so neither side's fsyncs nor a disk decide),
  # and so do the agents' state and root and the baselines' downloads
  # unless S3_AGENT_DIR names another (e.g. /var/tmp, this VM's disk): the
  # cases differ only on the server's side, and the agent's own writes and
  # fsyncs, the same in each, would only add the disk's noise.
  big=$((256 << 20))
  s3on=${S3_BENCH_DIR:-/dev/shm}
  elsewhere+=("$(mktemp -d "$s3on/lks-bench-s3.XXXXXX")")
  s3w=${elsewhere[-1]}
  elsewhere+=("$(mktemp -d "${S3_AGENT_DIR:-$s3on}/lks-bench-s3-agents.XXXXXX")")
  s3a=${elsewhere[-1]}
  mkdir -p "$s3w/root/bench" "$s3w/local" "$s3w/s3srv"
  s3s=$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")
  ak=lks-bench sk=lks-bench-secret
  s3_port=$(free_port)
  s3_url=http://127.0.0.1:$s3_port
  "$s3s" --host 127.0.0.1 --port "$s3_port" --access-key "$ak" --secret-key "$sk" "$s3w/root" \
    >"$s3w/s3s-fs.log" 2>&1 &
  s3_pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null "$s3_url/" && break; sleep 0.1; done
  # curl 7.88 signs with SigV4 but sends no payload hash; s3s-fs wants one.
  s3curl() { curl -fsS --aws-sigv4 aws:amz:us-east-1:s3 --user "$ak:$sk" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@"; }
  # The baseline client, from PyPI in a throwaway venv.
  python3 -m venv "$s3a/venv"
  "$s3a/venv/bin/pip" install -q boto3 >&2
  cat >"$s3a/upload.py" <<'PY'
import os, sys, time
import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
endpoint, bucket, key, path = sys.argv[1:5]
c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=os.environ["AK"], aws_secret_access_key=os.environ["SK"],
                 config=Config(s3={"addressing_style": "path"}))
tc = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4)
s = time.monotonic()
c.upload_file(path, bucket, key, Config=tc)
print(round((time.monotonic() - s) * 1000))
PY
  boto_v=$("$s3a/venv/bin/python" -c 'import boto3; print(boto3.__version__)')

  deb=$s3w/lksadmin-agent_0.0.0-s3_amd64.deb
  fake_deb "$deb" "$big"
  start_server "$s3w/local" --agent-package "$deb"
  s3_pids+=("${up_pids[-1]}")
  l_port=$srv_port
  l_conf=$s3w/local/server/admin.conf
  # The S3 server: fixed ports, so that it can be started again on its
  # data; the credentials by environment, as an operator gives them.
  s_port=$(free_port) s_mport=$(free_port)
  s_conf=$s3w/s3srv/server/admin.conf
  s3_server() {
    AWS_ACCESS_KEY_ID=$ak AWS_SECRET_ACCESS_KEY=$sk "$bin/lks-control-server" \
      --data-dir "$s3w/s3srv/server" --listen "127.0.0.1:$s_port" \
      --metrics-listen "127.0.0.1:$s_mport" --advertise-address 127.0.0.1 \
      --blob-store s3://bench/kube0 --s3-endpoint "$s3_url" >>"$s3w/s3srv/server.log" 2>&1 &
    s_pid=$!
    s3_pids+=("$s_pid")
    for _ in $(seq 200); do
      [ -f "$s_conf" ] && "$bin/lksctl" --config "$s_conf" bundle list >/dev/null 2>&1 && return
      sleep 0.1
    done
    echo "the server on S3 did not start (see $s3w/s3srv/server.log)" >&2
    exit 1
  }
  s3_server
  # One agent enrolled in a new cluster C of the server whose admin.conf is
  # CONF, running (pid in ag_pid), connected.
  s3_agent() {
    local conf=$1 c=$2 d=$s3a/$2
    mkdir -p "$d/root"
    "$bin/lksctl" --config "$conf" cluster create "$c" >/dev/null
    read -r -a joinv <<<"$("$bin/lksctl" --config "$conf" token create --cluster "$c" --uses 1)"
    "$agent_bin" "${joinv[@]:1}" --node-name "$c-1" --state-dir "$d/state" --root "$d/root" >/dev/null
    env "${agent_env[@]}" "$agent_bin" run --state-dir "$d/state" >"$d/agent.log" 2>&1 &
    ag_pid=$!
    s3_pids+=("$ag_pid")
    for _ in $(seq 100); do
      "$bin/lksctl" --config "$conf" node get "$c-1" -o json | grep -q '"connected": true' && return
      sleep 0.1
    done
    echo "agent $c-1 did not connect" >&2
    exit 1
  }
  # A fresh agent in cluster C installs bundle B: the whole `rollout start
  # --wait` (ms) into roll_ms, the agent's FetchBlob + verify into its
  # cache (ms, its log line) into fetch_ms; then the agent stops and its
  # files go. (No command substitution: set -e stops the bench on a failure.)
  s3_roll() {
    local conf=$1 c=$2 b=$3 s
    s3_agent "$conf" "$c"
    sync
    s=$(date +%s%N)
    "$bin/lksctl" --config "$conf" rollout start --cluster "$c" --bundle "$b" --wait >/dev/null
    roll_ms=$(( ($(date +%s%N) - s) / 1000000 ))
    fetch_ms=$(grep 'blob fetched and verified' "$s3a/$c/agent.log" | grep -oE '(^| )ms=[0-9]+' | cut -d= -f2)
    kill "$ag_pid" && { wait "$ag_pid" || true; }
    rm -rf "${s3a:?}/$c"
    [ -n "$fetch_ms" ] || { echo "agent $c logged no fetch" >&2; exit 1; }
  }
  # The time of a command (ms); nothing if it failed, which stops the bench.
  ms() { local s; s=$(date +%s%N); "$@" >/dev/null || return; echo $(( ($(date +%s%N) - s) / 1000000 )); }
  get_s3() {
    s3curl -o "$s3a/dl" "$s3_url/bench/$1" && openssl dgst -sha256 "$s3a/dl" >/dev/null && rm "$s3a/dl"
  }
  get_https() {
    curl -fsS --cacert "$s3w/local/ca.pem" -o "$s3a/dl" "https://127.0.0.1:$l_port/v1/agent-package/amd64" &&
      openssl dgst -sha256 "$s3a/dl" >/dev/null && rm "$s3a/dl"
  }
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  get_https
  declare -A s3r=()
  for r in $(seq "$RUNS"); do
    src=$s3w/src$r
    mkdir -p "$src"
    head -c "$big" /dev/urandom >"$src/blob"
    printf 'name = "s3big%s"\nversion = "1"\n\n[[file]]\npath = "/opt/s3big%s/blob"\nsource = "blob"\nmode = "0755"\n' \
      "$r" "$r" >"$src/bundle.toml"
    hex=$(sha256sum "$src/blob" | cut -d' ' -f1)
    # Publish: the two baselines, then each server.
    sync
    s3r[mp]+=" $(AK=$ak SK=$sk "$s3a/venv/bin/python" "$s3a/upload.py" "$s3_url" bench "base/mp$r" "$src/blob")"
    rm -f "$s3w/root/bench/base/mp$r"
    sync
    s3r[put]+=" $(ms s3curl -o /dev/null -T "$src/blob" "$s3_url/bench/base/put$r")"
    rm -f "$s3w/root/bench/base/put$r"
    sync
    s3r[pl]+=" $(ms "$bin/lksctl" --config "$l_conf" bundle publish "$src")"
    sync
    s3r[ps]+=" $(ms "$bin/lksctl" --config "$s_conf" bundle publish "$src")"
    [ -f "$s3w/root/bench/kube0/sha256/${hex:0:2}/$hex" ] || { echo "no object for $hex in the bucket" >&2; exit 1; }
    rm -rf "$src"
    # Fetch: the two baselines, then (a), (b), (c).
    sync
    s3r[get]+=" $(ms get_s3 "kube0/sha256/${hex:0:2}/$hex")"
    sync
    s3r[https]+=" $(ms get_https)"
    s3_roll "$l_conf" "la$r" "s3big$r@1"
    s3r[aw]+=" $roll_ms" s3r[af]+=" $fetch_ms"
    kill "$s_pid" && { wait "$s_pid" || true; }
    rm "$s3w/s3srv/server/blobs/sha256/${hex:0:2}/$hex"
    s3_server
    s3_roll "$s_conf" "sb$r" "s3big$r@1"
    s3r[bw]+=" $roll_ms" s3r[bf]+=" $fetch_ms"
    [ -f "$s3w/s3srv/server/blobs/sha256/${hex:0:2}/$hex" ] || { echo "the S3 server did not keep its copy of $hex" >&2; exit 1; }
    s3_roll "$s_conf" "sc$r" "s3big$r@1"
    s3r[cw]+=" $roll_ms" s3r[cf]+=" $fetch_ms"
    echo "s3 run $r (ms): boto3 ${s3r[mp]##* }, PUT ${s3r[put]##* }, publish local ${s3r[pl]##* } s3 ${s3r[ps]##* };" \
      "GET ${s3r[get]##* }, HTTPS ${s3r[https]##* }; fetch/rollout (a) ${s3r[af]##* }/${s3r[aw]##* }" \
      "(b) ${s3r[bf]##* }/${s3r[bw]##* } (c) ${s3r[cf]##* }/${s3r[cw]##* }" >&2
  done
  declare -A s3m=()
  # shellcheck disable=SC2086
  for k in "${!s3r[@]}"; do s3m[$k]=$(median ${s3r[$k]}); done
  ratio() { python3 -c "print(round($1/$2, 2))"; }
  fs_of() { stat -f -c %T "$1"; }
  echo "## Blob store on S3: one 256 MiB file (median of $RUNS runs)"
  echo
  echo "$("$s3s" --version) on loopback; its root, both servers' data dirs and the published file on $s3on ($(fs_of "$s3w")); agent state and root, and the baselines' downloads, on ${S3_AGENT_DIR:-$s3on} ($(fs_of "$s3a")$(findmnt -n -o OPTIONS -T "$s3a" | grep -o ',discard' || true)). boto3 $boto_v. Load average at the start: $load0; at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "| publish | time (ms) | vs boto3 multipart |"
  echo "| --- | --- | --- |"
  echo "| boto3 upload_file, 16 MiB parts, 4 threads (baseline) | ${s3m[mp]} | 1.00 |"
  echo "| curl --aws-sigv4 -T, one PUT | ${s3m[put]} | $(ratio "${s3m[put]}" "${s3m[mp]}") |"
  echo "| lksctl bundle publish, --blob-store local | ${s3m[pl]} | $(ratio "${s3m[pl]}" "${s3m[mp]}") |"
  echo "| lksctl bundle publish, --blob-store s3:// (goal ≤ 1.5) | ${s3m[ps]} | **$(ratio "${s3m[ps]}" "${s3m[mp]}")** |"
  echo
  echo "| a node's fetch | FetchBlob + verify into the agent's cache (ms) | vs local store | whole \`rollout start --wait\` (ms) | vs local store |"
  echo "| --- | --- | --- | --- | --- |"
  echo "| curl --aws-sigv4 GET from s3s-fs + openssl dgst -sha256 (baseline) | ${s3m[get]} | $(ratio "${s3m[get]}" "${s3m[af]}") | – | – |"
  echo "| curl HTTPS from the server (--agent-package) + openssl dgst -sha256 (baseline) | ${s3m[https]} | $(ratio "${s3m[https]}" "${s3m[af]}") | – | – |"
  echo "| (a) server on the local store | ${s3m[af]} | 1.00 | ${s3m[aw]} | 1.00 |"
  echo "| (b) server on S3, first fetch (the replica downloads it from the bucket) | ${s3m[bf]} | $(ratio "${s3m[bf]}" "${s3m[af]}") | ${s3m[bw]} | $(ratio "${s3m[bw]}" "${s3m[aw]}") |"
  echo "| (c) server on S3, its copy cached (goal ≤ 1.3) | ${s3m[cf]} | **$(ratio "${s3m[cf]}" "${s3m[af]}")** | ${s3m[cw]} | **$(ratio "${s3m[cw]}" "${s3m[aw]}")** |"
  echo
  # Frees the tmpfs for the sections after this one.
  for p in "${s3_pids[@]}"; do kill "$p" 2>/dev/null && { wait "$p" 2>/dev/null || true; }; done
  s3_pids=()
  rm -rf "$s3w" "$s3a"
fi

# One release agent holding what a real node holds — 512 MiB of binaries
# (8 x 64 MiB: kubelet-, containerd-, kubectl-sized) and 40 small config
# files — healing every HEAL_SECONDS (default 10 s, six times the
# default's rate): its CPU over FOOTPRINT_SECONDS (default IDLE_SECONDS),
# its RSS and its binary. `footprint off` as before; `footprint on` with
# signed releases required (FOOTPRINT_TRUST=off|on|both, default both).
footprint() {
  local trust=$1
  heal_s=${HEAL_SECONDS:-10}
  idle_s=${FOOTPRINT_SECONDS:-${IDLE_SECONDS:-60}}
  fp=$work/fp-$trust
  mkdir -p "$fp/root" "$fp/src"
  start_server "$fp"
  lf() { "$bin/lksctl" --config "$fp/server/admin.conf" "$@"; }
  lf cluster create fp >/dev/null
  read -r -a joinv <<<"$(lf token create --cluster fp --uses 1)"
  local trust_args=() sign_args=()
  if [ "$trust" = on ]; then
    # A node that requires signed releases (issue [trust]): the bundle is
    # signed, and a release naming it is signed and published first.
    lf bundle keygen --out "$fp/publisher" >/dev/null
    trust_args=(--trust-key "$fp/publisher.pub" --trust-threshold 1)
    sign_args=(--sign-key "$fp/publisher.key")
  fi
  "$agent_bin" "${joinv[@]:1}" --node-name fp-1 --state-dir "$fp/state" --root "$fp/root" "${trust_args[@]}" >/dev/null
  env "${agent_env[@]}" "$agent_bin" run --state-dir "$fp/state" --heal-interval "${heal_s}s" >"$fp/agent.log" 2>&1 &
  agent_pid=$!
  fp_pids+=("$agent_pid")
  printf 'name = "node-binaries"\nversion = "1"\n' >"$fp/src/bundle.toml"
  for i in $(seq 8); do
    head -c $((64 << 20)) /dev/urandom >"$fp/src/bin$i"
    printf '\n[[file]]\npath = "/usr/local/bin/bin%s"\nsource = "bin%s"\nmode = "0755"\n' "$i" "$i" >>"$fp/src/bundle.toml"
  done
  for i in $(seq 40); do
    head -c 4096 /dev/urandom >"$fp/src/conf$i"
    printf '\n[[file]]\npath = "/etc/node/conf%s"\nsource = "conf%s"\n' "$i" "$i" >>"$fp/src/bundle.toml"
  done
  lf bundle publish "$fp/src" "${sign_args[@]}" >/dev/null
  if [ "$trust" = on ]; then
    lf release create --cluster fp --bundle node-binaries@1 --key "$fp/publisher.key" --publish >/dev/null
  fi
  lf rollout start --cluster fp --bundle node-binaries@1 --wait >/dev/null
  # The first pass after the apply reads everything once; then idle.
  sleep $((heal_s * 2))
  ticks() { awk '{print $14 + $15}' "/proc/$agent_pid/stat"; }
  hz=$(getconf CLK_TCK)
  t0=$(ticks)
  sleep "$idle_s"
  t1=$(ticks)
  cpu_ms=$(( (t1 - t0) * 1000 / hz ))
  passes=$(( idle_s / heal_s ))
  rss=$(rss_of "$agent_pid")
  # RSS = anonymous memory (heap, stacks: what the agent allocates) + pages
  # of files it maps (its own text, libc, libm: clean page-cache pages,
  # shared with every process that maps them and dropped under pressure).
  anon=$(awk '/RssAnon/{print $2}' "/proc/$agent_pid/status")
  filemapped=$(awk '/RssFile/{print $2}' "/proc/$agent_pid/status")
  text=$(awk -v exe="$(readlink -f "$agent_bin")" '$6 == exe {m = 1; next} /^[0-9a-f]+-[0-9a-f]+ /{m = 0} m && /^Rss:/{s += $2} END {print s + 0}' "/proc/$agent_pid/smaps")
  libs=$(awk '/^[0-9a-f]+-[0-9a-f]+ /{m = ($6 ~ /\.so(\.[0-9]+)*$/)} m && /^Rss:/{s += $2} END {print s + 0}' "/proc/$agent_pid/smaps")
  threads=$(awk '/^Threads:/{print $2}' "/proc/$agent_pid/status")
  # FP_SMAPS=FILE keeps the agent's smaps for a closer look.
  [ -z "${FP_SMAPS:-}" ] || cp "/proc/$agent_pid/smaps" "$FP_SMAPS"
  size=$(stat -c %s "$agent_bin")
  mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
  s=$(date +%s%N)
  for i in $(seq 8); do openssl dgst -sha256 "$fp/root/usr/local/bin/bin$i" >/dev/null; done
  full_ms=$(( ($(date +%s%N) - s) / 1000000 ))
  local trust_title="trust off"
  [ "$trust" = on ] && trust_title="trust on: join --trust-threshold 1, a signed release accepted"
  state_trust=$("$agent_bin" status --state-dir "$fp/state" -o json | python3 -c 'import json,sys; t=json.load(sys.stdin).get("trust") or {}; print(t.get("state") or "off")')
  echo "## Agent footprint: 512 MiB + 40 files managed, heal every ${heal_s} s, idle ${idle_s} s, ${trust_title}"
  echo
  echo "Environment as the unit sets it: ${agent_env[*]:-none}. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "| what | figure | goal |"
  echo "| --- | --- | --- |"
  echo "| agent CPU while idle (all threads) | ${cpu_ms} ms in ${idle_s} s = $(python3 -c "print(round($cpu_ms / ($idle_s * 10), 2))") % (${passes} heal passes, $(( cpu_ms / (passes > 0 ? passes : 1) )) ms each) | ≈ 0 |"
  echo "| reading and hashing those 512 MiB once (openssl dgst -sha256; what every pass cost before passes compared inode metadata) | ${full_ms} ms | – |"
  echo "| agent RSS | $(mib "$rss") MiB | ≤ 10 MiB |"
  echo "| of which anonymous (heap, stacks; $threads threads) | $(mib "$anon") MiB | – |"
  echo "| of which mapped files (clean, shared page cache) | $(mib "$filemapped") MiB: the agent's own binary $(mib "$text") MiB, shared libraries $(mib "$libs") MiB | – |"
  echo "| agent binary (agent profile, not stripped) | $(mib $((size / 1024))) MiB | ≤ 15 MiB |"
  echo "| the agent's release trust at the end (\`status -o json\`) | ${state_trust} | $([ "$trust" = on ] && echo ok || echo off) |"
  echo
  kill "$agent_pid" 2>/dev/null || true
}

if want footprint; then
  case "${FOOTPRINT_TRUST:-both}" in
    off) footprint off ;;
    on) footprint on ;;
    both) footprint off; footprint on ;;
    *) echo "FOOTPRINT_TRUST must be off, on or both" >&2; exit 2 ;;
  esac
fi

if want ha; then
  ha_n=${HA_AGENTS:-1000}
  idle_s=${IDLE_SECONDS:-60}
  # A throwaway single-member etcd on loopback, as tests/src/etcd.rs starts
  # one: temp data dir, free ports, an hour of history at most.
  ecp=$(free_port) epp=$(free_port)
  etcd_url=http://127.0.0.1:$ecp
  ETCD_UNSUPPORTED_ARCH=$(uname -m) etcd --name bench --data-dir "$work/etcd" \
    --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "http://127.0.0.1:$epp" --initial-advertise-peer-urls "http://127.0.0.1:$epp" \
    --initial-cluster "bench=http://127.0.0.1:$epp" --auto-compaction-retention 1 >"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do curl -fs "$etcd_url/health" >/dev/null && break; sleep 0.2; done
  urls=() mports=()
  for k in 1 2 3; do
    p=$(free_port) mp=$(free_port)
    "$bin/lks-control-server" --data-dir "$work/r$k" --listen "127.0.0.1:$p" \
      --metrics-listen "127.0.0.1:$mp" --advertise-address 127.0.0.1 \
      --store etcd --etcd-endpoints "$etcd_url" --etcd-prefix /lksadmin-bench/ >"$work/r$k.log" 2>&1 &
    replica_pids+=($!)
    urls+=("https://127.0.0.1:$p") mports+=("$mp")
  done
  leader=
  for _ in $(seq 150); do
    for k in 1 2 3; do
      grep -q 'elected: this replica drives rollouts' "$work/r$k.log" 2>/dev/null && leader=$k
    done
    [ -n "$leader" ] && [ -f "$work/r1/admin.conf" ] && [ -f "$work/r2/admin.conf" ] && [ -f "$work/r3/admin.conf" ] && break
    sleep 0.2
  done
  [ -n "$leader" ] || { echo "no replica was elected" >&2; exit 1; }
  # Admin calls (publish, StartRollout) go through a replica that does not
  # lead: the leader's controller drives the rollout, every replica's etcd
  # watch carries the desired states to the agents on it.
  via=$((leader % 3 + 1))
  servers=$(IFS=,; echo "${urls[*]}")

  # Agents with an open stream, per server: lks_connected_agents.
  connected() { curl -fs "http://127.0.0.1:$1/metrics" | awk '$1 == "lks_connected_agents" {print $2}'; }
  ha_connected() { local k out=(); for k in 0 1 2; do out+=("$(connected "${mports[$k]}")"); done; echo "${out[*]}"; }
  sum() { local t=0 x; for x in "$@"; do t=$((t + x)); done; echo "$t"; }
  write_bytes() { awk '/^write_bytes/{print $2}' "/proc/$1/io"; }
  # One load generator run in the background; records the peak number of
  # agents held (all servers together) while it runs.
  held_peak() {
    local lg=$1 peak=0 now
    shift
    while kill -0 "$lg" 2>/dev/null; do
      # shellcheck disable=SC2046
      now=$(sum $("$@" 2>/dev/null || echo 0)); [ "$now" -gt "$peak" ] && peak=$now
      sleep 0.5
    done
    echo "$peak"
  }

  echo "## HA: 3 replicas on etcd next to 1 server on SQLite ($ha_n agents, median of $RUNS runs)"
  echo
  echo "etcd $(etcd --version | awk '/etcd Version/{print $3}'), one member on loopback; replica $leader leads, rollouts are started through replica $via. Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  declare -A ha=()
  for r in $(seq "$RUNS"); do
    "$bin/lks-loadgen" --config "$work/server/admin.conf" --cluster "ha-sq$r" --agents "$ha_n" \
      --spread-source-ips --rollout --hold 4 -o json >"$work/ha-sq.json" &
    ha[sq_held]+=" $(held_peak $! connected "$metrics_port")"
    wait $!
    "$bin/lks-loadgen" --config "$work/r$via/admin.conf" --servers "$servers" --cluster "ha-etcd$r" \
      --agents "$ha_n" --spread-source-ips --rollout --hold 4 -o json >"$work/ha-etcd.json" &
    ha[etcd_held]+=" $(held_peak $! ha_connected)"
    wait $!
    for w in sq etcd; do
      j=$work/ha-$w.json
      [ "$(field "$j" errors)" = 0 ] || { echo "loadgen ($w) reported errors" >&2; exit 1; }
      ha[${w}_e]+=" $(field "$j" enrol_per_second)"
      ha[${w}_retry]+=" $(field "$j" enrol_retries)"
      ha[${w}_f50]+=" $(field "$j" first_message.p50_ms)"
      ha[${w}_f99]+=" $(field "$j" first_message.p99_ms)"
      ha[${w}_o50]+=" $(field "$j" fanout.p50_ms)"
      ha[${w}_o99]+=" $(field "$j" fanout.p99_ms)"
      ha[${w}_done]+=" $(field "$j" rollout_seconds)"
    done
  done
  echo "| store | servers | agents held (peak) | enrol/s | enrolments retried (\"try again\") | first message p50 / p99 (ms) | rollout fan-out p50 / p99 (ms) | rollout done (s) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for w in sq etcd; do
    if [ $w = sq ]; then what="SQLite (baseline)" nsrv=1; else what="etcd" nsrv=3; fi
    # shellcheck disable=SC2086
    echo "| $what | $nsrv | $(median ${ha[${w}_held]}) | $(median ${ha[${w}_e]}) | $(median ${ha[${w}_retry]}) | $(median ${ha[${w}_f50]}) / $(median ${ha[${w}_f99]}) | $(median ${ha[${w}_o50]}) / $(median ${ha[${w}_o99]}) | $(median ${ha[${w}_done]}) |"
  done
  echo

  # Idle: what each control plane writes in IDLE_SECONDS with nothing
  # going on but the agents' heartbeats and the replicas' own upkeep
  # (lease, election, the last-seen document every 5 s).
  etcd_metrics() { curl -fs "$etcd_url/metrics" >"$1"; }
  etcd_rates() { etcd_diff "$@" | cut -d' ' -f1-4; }
  # Prints: held, RSS per server (MiB), then the rates over the window.
  idle_window() {
    local kind=$1 t0 t1 wb0 wb1 held rss=() p
    sleep 5
    etcd_metrics "$work/m0"
    if [ "$kind" = sq ]; then wb0=$(write_bytes "$server_pid"); else wb0=$(write_bytes "$etcd_pid"); fi
    t0=$(date +%s%N)
    sleep "$idle_s"
    etcd_metrics "$work/m1"
    if [ "$kind" = sq ]; then wb1=$(write_bytes "$server_pid"); else wb1=$(write_bytes "$etcd_pid"); fi
    t1=$(date +%s%N)
    if [ "$kind" = sq ]; then
      held=$(connected "$metrics_port")
      rss=("$(( $(rss_of "$server_pid") / 1024 ))")
    else
      held=$(ha_connected | tr ' ' /)
      for p in "${replica_pids[@]}"; do rss+=("$(( $(rss_of "$p") / 1024 ))"); done
    fi
    local secs
    secs=$(python3 -c "print(($t1 - $t0) / 1e9)")
    echo "$held $(IFS=/; echo "${rss[*]}") $(etcd_rates "$work/m0" "$work/m1" "$secs") $(python3 -c "print(round(($wb1 - $wb0) / 1024 / $secs, 1))") $(( $(rss_of "$etcd_pid") / 1024 ))"
  }
  # Starts a load generator (pid in $lg) that holds N agents well past the
  # window, and waits until every agent is held.
  hold_agents() {
    local n=$1 now
    shift
    "$bin/lks-loadgen" "$@" --agents "$n" --spread-source-ips --hold $((idle_s + 20)) -o json >"$work/idle.json" &
    lg=$!
    for _ in $(seq 600); do
      kill -0 "$lg" 2>/dev/null || break
      if [ "$1" = --servers ]; then now=$(ha_connected); else now=$(connected "$metrics_port"); fi
      # shellcheck disable=SC2086
      [ "$(sum $now)" -ge "$n" ] && break
      sleep 0.5
    done
  }
  # label kind, then idle_window's fields: held rss revs keys KiB props disk etcd-RSS
  idle_row() {
    local label=$1 kind=$2
    shift 2
    if [ "$kind" = sq ]; then
      echo "| $label | $1 | $2 | – | – | – | – | $7 (server) |"
    else
      echo "| $label | $1 | $2 (etcd $8) | $3 | $4 | $5 | $6 | $7 (etcd) |"
    fi
  }

  echo "## HA: idle for ${idle_s} s with agents held (one window each, same run)"
  echo
  echo "| control plane | agents held (per server) | RSS per server (MiB) | etcd revisions/s (write txns) | keys written/s | KiB put/s | raft proposals/s | disk KiB/s written |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  # shellcheck disable=SC2046
  idle_row "SQLite, 1 server, no agents" sq $(idle_window sq)
  # shellcheck disable=SC2046
  idle_row "etcd, 3 replicas, no agents" etcd $(idle_window etcd)
  hold_agents "$ha_n" --config "$work/server/admin.conf" --cluster ha-idle-sq
  # shellcheck disable=SC2046
  idle_row "SQLite, 1 server (baseline)" sq $(idle_window sq)
  wait "$lg"
  [ "$(field "$work/idle.json" errors)" = 0 ] || { echo "loadgen (idle, SQLite) reported errors" >&2; exit 1; }
  hold_agents "$ha_n" --servers "$servers" --config "$work/r$via/admin.conf" --cluster ha-idle-etcd
  # shellcheck disable=SC2046
  idle_row "etcd, 3 replicas" etcd $(idle_window etcd)
  wait "$lg"
  [ "$(field "$work/idle.json" errors)" = 0 ] || { echo "loadgen (idle, etcd) reported errors" >&2; exit 1; }
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
fi

if want storm; then
  # Each run: a fresh server (own data dir and port) that lks-loadgen
  # starts, stops with SIGTERM under N connected agents and starts again.
  echo "## Reconnect storm: server restarted (SIGTERM) under N agents (median of $RUNS runs)"
  echo
  echo "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "| agents | first connection of all agents (s) (baseline) | server exit (s) | all back after the signal (s) | back p50 / p99 (ms) | attempts p50 / p99 / max | streams dropped, by class (all runs) | failed attempts, by class (all runs) | auth errors (all runs) | restarted server: TLS handshakes ok / shed / timeout / failed, Connect shed (all runs) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for n in "${agents[@]}"; do
    declare -A st=()
    jsons=()
    for r in $(seq "$RUNS"); do
      d=$work/storm-$n-$r
      mkdir -p "$d"
      "$bin/lks-loadgen" --config "$d/data/admin.conf" --cluster storm --agents "$n" --storm \
        --server-log "$d/server.log" -o json -- \
        "$bin/lks-control-server" --data-dir "$d/data" --listen "127.0.0.1:$(free_port)" \
        --metrics-listen "127.0.0.1:$(free_port)" --advertise-address 127.0.0.1 >"$d/storm.json"
      jsons+=("$d/storm.json")
      [ "$(field "$d/storm.json" storm.back)" = "$n" ] || echo "storm: only $(field "$d/storm.json" storm.back)/$n agents back in run $r" >&2
      st[base]+=" $(field "$d/storm.json" connect_seconds)"
      st[exit]+=" $(field "$d/storm.json" storm.exit_seconds)"
      st[all]+=" $(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["storm"]["all_back_seconds"]; print(v if v is not None else "inf")' "$d/storm.json")"
      st[b50]+=" $(field "$d/storm.json" storm.back_after.p50_ms)"
      st[b99]+=" $(field "$d/storm.json" storm.back_after.p99_ms)"
      st[a50]+=" $(field "$d/storm.json" storm.attempts_p50)"
      st[a99]+=" $(field "$d/storm.json" storm.attempts_p99)"
      st[amax]+=" $(field "$d/storm.json" storm.attempts_max)"
    done
    classes=$(python3 - "${jsons[@]}" <<'PY'
import json, sys
from collections import Counter
import os, re
dropped, failed, auth = Counter(), Counter(), 0
adm = Counter()
for p in sys.argv[1:]:
    s = json.load(open(p))["storm"]
    dropped.update(s["dropped"]); failed.update(s["errors"]); auth += s["auth_errors"]
    # The restarted server's counters: its "stopped" line, the log's last.
    log = os.path.join(os.path.dirname(p), "server.log")
    last = [l for l in open(log, errors="replace") if "tls_ok=" in l][-1:]
    for l in last:
        adm.update({k: int(v) for k, v in re.findall(r"(tls_ok|tls_shed|tls_timeout|tls_failed|connect_shed)=(\d+)", l)})
fmt = lambda c: ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"
a = " / ".join(str(adm[k]) for k in ("tls_ok", "tls_shed", "tls_timeout", "tls_failed"))
print(f"{fmt(dropped)} | {fmt(failed)} | {auth} | {a}, {adm['connect_shed']}")
PY
)
    # shellcheck disable=SC2086
    echo "| $n | $(median ${st[base]}) | $(median ${st[exit]}) | $(median ${st[all]}) | $(median ${st[b50]}) / $(median ${st[b99]}) | $(median ${st[a50]}) / $(median ${st[a99]}) / $(median ${st[amax]}) | $classes |"
    unset st
  done
  echo
fi

if want scale-out; then
  # Issue [scale-out]: a region on replicas. For each N: a fresh
  # three-member etcd cluster (three etcd processes on loopback ports, data
  # on this disk) and three release replicas on it; N simulated agents
  # spread over them, in as many lks-loadgen processes as the open-file
  # limit needs (one socket per agent; the hard limit here is 20,000 and
  # cannot be raised); a rollout of a 20-file bundle to all N, then an idle
  # window. Then the same again on a fresh region with the leading replica
  # killed (SIGKILL) once 30 % of the first process's agents have the
  # rollout. Baseline in the same run: one SQLite server with 10,000
  # agents, the same bundle.
  read -r -a scale_ns <<<"${SCALE_AGENTS:-10000 20000 30000}"
  # Which runs: the steady state (with the SQLite baseline), the failover.
  scale_parts=${SCALE_PARTS:-steady failover}
  part() { [[ " $scale_parts " == *" $1 "* ]]; }
  idle_s=${IDLE_SECONDS:-60}
  per_proc=${AGENTS_PER_LOADGEN:-$(( $(ulimit -Hn) - 1000 ))}
  # A region holds many tenant clusters; each gets its own rollout. One
  # rollout's document lists its nodes and must fit etcd's 1.5 MiB request
  # limit (BENCHMARKS.md: a 10,000-node rollout did not).
  per_cluster=${CLUSTER_NODES:-1000}
  # A JSON number rounded to $3 decimals.
  fnum() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=d
for k in sys.argv[2].split("."): v=v[k]
print("–" if v is None else round(float(v), int(sys.argv[3])))' "$1" "$2" "$3"; }
  connected_on() { curl -fs "http://127.0.0.1:$1/metrics" | awk '$1 == "lks_connected_agents" {print $2}'; }
  # Starts the region in $1: sets sc_urls, sc_mports, sc_rpids, sc_epids,
  # sc_eclient (member 0's client URL), leader (1-3) and via (another).
  region_up() {
    local d=$1 k init="" eps=""
    mkdir -p "$d"
    local ec=() ep=()
    for k in 0 1 2; do ec+=("$(free_port)"); ep+=("$(free_port)"); done
    for k in 0 1 2; do init+="${init:+,}m$k=http://127.0.0.1:${ep[$k]}"; eps+="${eps:+,}http://127.0.0.1:${ec[$k]}"; done
    sc_epids=() sc_rpids=() sc_urls=() sc_mports=()
    for k in 0 1 2; do
      ETCD_UNSUPPORTED_ARCH=$(uname -m) etcd --name "m$k" --data-dir "$d/etcd$k" \
        --listen-client-urls "http://127.0.0.1:${ec[$k]}" --advertise-client-urls "http://127.0.0.1:${ec[$k]}" \
        --listen-peer-urls "http://127.0.0.1:${ep[$k]}" --initial-advertise-peer-urls "http://127.0.0.1:${ep[$k]}" \
        --initial-cluster "$init" --initial-cluster-state new --initial-cluster-token lks-bench \
        --auto-compaction-retention 1 >"$d/etcd$k.log" 2>&1 &
      sc_epids+=($!) sc_pids+=($!)
    done
    sc_eclient=http://127.0.0.1:${ec[0]} sc_mports_etcd=("${ec[@]}")
    for k in 0 1 2; do
      for _ in $(seq 150); do curl -fs "http://127.0.0.1:${ec[$k]}/health" | grep -q '"health":"true"' && break; sleep 0.2; done
    done
    for k in 1 2 3; do
      local p mp
      p=$(free_port) mp=$(free_port)
      "$bin/lks-control-server" --data-dir "$d/r$k" --listen "127.0.0.1:$p" \
        --metrics-listen "127.0.0.1:$mp" --advertise-address 127.0.0.1 \
        --store etcd --etcd-endpoints "$eps" --etcd-prefix /lksadmin-scale/ >"$d/r$k.log" 2>&1 &
      sc_rpids+=($!) sc_pids+=($!)
      sc_urls+=("https://127.0.0.1:$p") sc_mports+=("$mp")
      # The first is elected: start the others once it is.
      if [ "$k" = 1 ]; then
        for _ in $(seq 150); do grep -q 'elected: this replica drives rollouts' "$d/r1.log" 2>/dev/null && break; sleep 0.2; done
      fi
    done
    leader=
    for k in 1 2 3; do grep -q 'elected: this replica drives rollouts' "$d/r$k.log" && leader=$k; done
    [ -n "$leader" ] || { echo "scale-out: no replica was elected" >&2; exit 1; }
    for k in 1 2 3; do
      for _ in $(seq 150); do [ -f "$d/r$k/admin.conf" ] && break; sleep 0.2; done
    done
    via=$((leader % 3 + 1))
  }
  region_down() {
    local p
    for p in "${sc_rpids[@]}" "${sc_epids[@]}"; do kill "$p" 2>/dev/null && { wait "$p" 2>/dev/null || true; }; done
    sc_pids=()
    rm -rf "$1"
  }
  # Agents held per replica (0 for one that is gone).
  held_now() { local k out=(); for k in 0 1 2; do out+=("$(connected_on "${sc_mports[$k]}" 2>/dev/null || echo 0)"); done; echo "${out[*]}"; }
  sc_sum() { local t=0 x; for x in "$@"; do t=$((t + ${x:-0})); done; echo "$t"; }
  # Starts the load generators for N agents on the region in $1: helper
  # processes in the background (pids in sc_helpers), the first process's
  # arguments in $@ (it is started in the background too; pid in sc_first).
  fleet_up() {
    local d=$1 n=$2 procs share p
    shift 2
    procs=$(( (n + per_proc - 1) / per_proc ))
    share=$(( n / procs ))
    sc_clusters=$(( (n + per_cluster - 1) / per_cluster ))
    sc_helpers=()
    local servers
    servers=$(IFS=,; echo "${sc_urls[*]}")
    for p in $(seq 1 $((procs - 1))); do
      "$bin/lks-loadgen" --config "$d/r$via/admin.conf" --servers "$servers" --cluster scale \
        --clusters "$sc_clusters" --agents "$share" --first-agent $((p * share)) --hold 100000 --keep-nodes -o json \
        >"$d/lg$p.json" 2>"$d/lg$p.err" &
      sc_helpers+=($!) sc_pids+=($!)
    done
    local notify=()
    [ ${#sc_helpers[@]} -gt 0 ] && notify=(--notify-at-kill "$(IFS=,; echo "${sc_helpers[*]}")")
    if [ "$1" != --kill-mid-rollout ]; then notify=(); fi
    "$bin/lks-loadgen" --config "$d/r$via/admin.conf" --servers "$servers" --cluster scale \
      --clusters "$sc_clusters" --agents $((n - share * (procs - 1))) --rollout --files 20 --rollout-after-nodes "$n" \
      --rollout-timeout 900 --keep-nodes -o json "$@" "${notify[@]}" >"$d/lg0.json" 2>"$d/lg0.err" &
    sc_first=$! sc_pids+=($!)
    sc_procs=$procs
  }
  # Errors over the reports in $1 (failed connection attempts, which the
  # agents retried, by class), for the tables; each report's stderr tail
  # goes to stderr when it has any.
  sc_check() {
    local j
    for j in "$1"/lg*.json; do
      [ "$(field "$j" errors)" = 0 ] && continue
      echo "scale-out: $j reports $(field "$j" errors) errors; its stderr ends:" >&2
      tail -5 "${j%.json}.err" >&2
    done
    python3 - "$1"/lg*.json <<'PY'
import json, sys
from collections import Counter
c, n = Counter(), 0
for p in sys.argv[1:]:
    r = json.load(open(p))
    n += r["errors"]
    c.update(r["failed_attempts"])
print(f"{n}" + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) + ")" if c else ""))
PY
  }
  # Ends the helpers (SIGTERM: they write their reports) and checks every
  # report for errors.
  fleet_down() {
    local d=$1 p j
    wait "$sc_first" || { echo "scale-out: the first lks-loadgen failed:" >&2; tail -5 "$d/lg0.err" >&2; exit 1; }
    for p in "${sc_helpers[@]}"; do kill -TERM "$p"; wait "$p" || { echo "scale-out: a helper lks-loadgen failed" >&2; exit 1; }; done
  }
  # Sums over the processes' reports: auth errors, assigned twice, and the
  # failover's held_before / held_after per replica, reconnected, the
  # slowest all_back_seconds.
  fleet_sums() {
    python3 - "$@" <<'PY'
import json, sys
rs = [json.load(open(p)) for p in sys.argv[1:]]
auth = sum(r["auth_errors"] for r in rs)
twice = sum(r["assigned_twice"] for r in rs)
fo = [r["failover"] for r in rs if r.get("failover")]
if not fo:
    print(auth, twice); sys.exit()
hb = [sum(f["held_before"][k] for f in fo) for k in range(3)]
ha = [sum(f["held_after"][k] for f in fo) for k in range(3)]
rec = sum(f["reconnected"] for f in fo)
backs = [f["all_back_seconds"] for f in fo]
back = "not all" if any(b is None for b in backs) else "%.1f" % max(backs)
from collections import Counter
dr, er = Counter(), Counter()
for f in fo:
    dr.update(f["dropped"]); er.update(f["errors"])
fmt = lambda c: ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"
print(auth, twice, "/".join(map(str, hb)), "/".join(map(str, ha)), rec, back, fmt(dr).replace(" ", "_"), fmt(er).replace(" ", "_"))
PY
  }
  etcd_snap() { curl -fs "$sc_eclient/metrics" >"$1"; }
  # CPU seconds (user + system) of the processes given, summed.
  cpu_s() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo "$t"; }
  # What the rollout cost, for the table: each member's metrics and the
  # CPU of each process group, into the file $1.
  rollout_mark() {
    local k
    {
      for k in "${sc_mports_etcd[@]}"; do curl -fs "http://127.0.0.1:$k/metrics"; done
      echo "cpu_etcd $(cpu_s "${sc_epids[@]}")"
      echo "cpu_replicas $(cpu_s "${sc_rpids[@]}")"
      echo "cpu_loadgen $(cpu_s "$sc_first" "${sc_helpers[@]}")"
    } >"$1"
    # What the replicas read from etcd (lks_etcd_read_bytes_total).
    for k in "${sc_mports[@]}"; do curl -fs "http://127.0.0.1:$k/metrics"; done >"$1.replicas"
  }
  # Between two marks: what the three replicas read from etcd, summed, the
  # largest first: "range nodes 480.0 MiB in 30", … (value bytes).
  replica_reads() {
    python3 - "$1.replicas" "$2.replicas" <<'PY'
import re, sys
def load(p):
    m = {}
    for line in open(p):
        g = re.match(r'lks_etcd_read(s|_bytes)_total\{read="(\w+)",prefix="(\w+)"\} (\d+)', line)
        if g:
            k = (g.group(2), g.group(3))
            m.setdefault(k, [0, 0])[0 if g.group(1) == "s" else 1] += int(g.group(4))
    return m
a, b = load(sys.argv[1]), load(sys.argv[2])
d = {k: (v[0] - a.get(k, [0, 0])[0], v[1] - a.get(k, [0, 0])[1]) for k, v in b.items()}
top = sorted(d.items(), key=lambda kv: -kv[1][1])
total = sum(v[1] for v in d.values())
print("%.1f MiB in all; " % (total / 2**20) + ", ".join(
    "%s %s %.1f MiB in %d" % (k[0], k[1], v[1] / 2**20, v[0]) for k, v in top[:8] if v[1] > 0))
PY
  }
  # Between two marks, per node of the fleet ($3): etcd requests by method
  # over the three members (Range, Txn, Put), revisions (writes committed),
  # and the CPU seconds of etcd, the replicas and the load generators.
  rollout_cost() {
    python3 - "$1" "$2" "$3" "$(getconf CLK_TCK)" <<'PY'
import re, sys
def load(p):
    m = {}
    for line in open(p):
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        g = re.match(r'grpc_server_handled_total\{.*grpc_method="(\w+)"', k)
        if g:
            m["rpc_" + g.group(1)] = m.get("rpc_" + g.group(1), 0) + float(v)
        elif k in ("etcd_debugging_mvcc_current_revision", "etcd_debugging_mvcc_total_put_size_in_bytes"):
            m[k] = max(m.get(k, 0), float(v))
        elif k.startswith("etcd_network_client_grpc_sent_bytes_total"):
            m["sent"] = m.get("sent", 0) + float(v)
        elif k.startswith("cpu_"):
            m[k] = float(v)
    return m
a, b, n, hz = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
d = lambda k: b.get(k, 0) - a.get(k, 0)
print("%.1f / %.1f / %.1f | %.2f / %.0f / %.0f | %.0f / %.0f / %.0f" % (
    d("rpc_Range") / n, d("rpc_Txn") / n, d("rpc_Put") / n,
    d("etcd_debugging_mvcc_current_revision") / n,
    d("etcd_debugging_mvcc_total_put_size_in_bytes") / 2**20, d("sent") / 2**20,
    d("cpu_etcd") / hz, d("cpu_replicas") / hz, d("cpu_loadgen") / hz))
PY
  }
  etcd_window() { etcd_diff "$@" | cut -d' ' -f1-3,5-6; }

  echo "## Scale-out: a region of 3 replicas on a 3-member etcd (one run each)"
  echo
  echo "etcd $(etcd --version | awk '/etcd Version/{print $3}'), three members on loopback (data dirs on this machine's disk), three release replicas on them, all on the same $(nproc) cores as the load generators; at most $per_proc agents per lks-loadgen process; the agents in clusters of $per_cluster nodes, one rollout per cluster started at once (\"rollout to all\": until the last completes). Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo

  # Baseline: one SQLite server, 10,000 agents (or the smallest N), the
  # same 20-file rollout, RSS per agent as the agents section measures it.
  steady=() fover=() reads=()
  if part steady; then
  bn=${scale_ns[0]}
  [ "$bn" -le "$per_proc" ] || bn=$per_proc
  mkdir -p "$work/scale-base"
  start_server "$work/scale-base"
  b_pid=${up_pids[-1]}
  sleep 0.5
  b_idle=$(rss_of "$b_pid")
  "$bin/lks-loadgen" --config "$work/scale-base/server/admin.conf" --cluster scale \
    --clusters $(( (bn + per_cluster - 1) / per_cluster )) --agents "$bn" \
    --rollout --files 20 --hold 8 --keep-nodes -o json >"$work/scale-base.json" 2>"$work/scale-base.err" &
  lg=$!
  b_peak=$(rss_peak_while "$lg" "$b_pid" "$b_idle")
  wait "$lg"
  [ "$(field "$work/scale-base.json" errors)" = 0 ] || { echo "scale-out: baseline loadgen reported errors" >&2; exit 1; }
  kill "$b_pid" && { wait "$b_pid" 2>/dev/null || true; }
  rm -rf "$work/scale-base"
  base_row="| $bn (baseline: 1 server on SQLite) | 1 | $bn | $(fnum "$work/scale-base.json" enrol_per_second 0) | $(fnum "$work/scale-base.json" rollout_seconds 2) | – | – | – | $(fnum "$work/scale-base.json" fanout.p50_ms 0) / $(fnum "$work/scale-base.json" fanout.p99_ms 0) | – | – | $(field "$work/scale-base.json" errors) | – | – | $(( b_peak / 1024 )) | $(( (b_peak - b_idle) / bn )) |"

  fi
  for n in "${scale_ns[@]}"; do
    if part steady; then
    # Steady state: connect, roll out, idle.
    d=$work/scale-$n
    region_up "$d"
    sleep 2
    rss0=()
    for p in "${sc_rpids[@]}"; do rss0+=("$(rss_of "$p")"); done
    fleet_up "$d" "$n" --hold $((idle_s + 30))
    # Mark when the load generator starts the rollouts (all N connected
    # and the bundle published), and when they are done: what they cost.
    for _ in $(seq 36000); do
      grep -q '^starting [0-9]* rollouts' "$d/lg0.err" 2>/dev/null && break
      kill -0 "$sc_first" 2>/dev/null || break
      sleep 0.05
    done
    rollout_mark "$work/sc-r0"
    for _ in $(seq 3600); do
      grep -q 'rollout completed' "$d/lg0.err" 2>/dev/null && break
      kill -0 "$sc_first" 2>/dev/null || break
      sleep 0.2
    done
    grep -q 'rollout completed' "$d/lg0.err" || { echo "scale-out: no rollout at $n:" >&2; tail -5 "$d/lg0.err" >&2; exit 1; }
    rollout_mark "$work/sc-r1"
    cost=$(rollout_cost "$work/sc-r0" "$work/sc-r1" "$n")
    reads+=("- $n agents: $(replica_reads "$work/sc-r0" "$work/sc-r1")")
    sleep 5
    held=$(held_now)
    etcd_snap "$work/sc-m0"
    t0=$(date +%s%N)
    sleep "$idle_s"
    etcd_snap "$work/sc-m1"
    t1=$(date +%s%N)
    win=$(etcd_window "$work/sc-m0" "$work/sc-m1" "$(python3 -c "print(($t1 - $t0) / 1e9)")")
    rss=() per=()
    read -r -a held_a <<<"$held"
    for k in 0 1 2; do
      r=$(rss_of "${sc_rpids[$k]}")
      rss+=("$(( r / 1024 ))")
      per+=("$(( (r - rss0[k]) / (held_a[k] > 0 ? held_a[k] : 1) ))")
    done
    fleet_down "$d"
    errs=$(sc_check "$d")
    read -r revs keys kput dbmb dbuse <<<"$win"
    read -r auth twice <<<"$(fleet_sums "$d"/lg*.json)"
    steady+=("| $n | $sc_procs | ${held// //} | $(fnum "$d/lg0.json" enrol_per_second 0) (first process) | $(fnum "$d/lg0.json" rollout_seconds 2) | $cost | $(fnum "$d/lg0.json" fanout.p50_ms 0) / $(fnum "$d/lg0.json" fanout.p99_ms 0) | $revs / $keys / $kput | $dbmb ($dbuse in use) | $errs | $auth | $twice | $(IFS=/; echo "${rss[*]}") | $(IFS=/; echo "${per[*]}") |")
    region_down "$d"
    fi

    part failover || continue
    # Failover: the leading replica killed mid-rollout.
    d=$work/scale-fo-$n
    region_up "$d"
    sleep 2
    fleet_up "$d" "$n" --kill-mid-rollout "${sc_rpids[$((leader - 1))]}" --kill-at 0.3
    # What each replica holds once all are connected (the rollout starts
    # then, and the kill follows within seconds).
    hb=
    for _ in $(seq 3600); do
      now=$(held_now)
      # shellcheck disable=SC2086
      [ "$(sc_sum $now)" -ge "$n" ] && { hb=${now// //}; break; }
      kill -0 "$sc_first" 2>/dev/null || break
      sleep 0.5
    done
    if ! wait "$sc_first"; then
      # A row that says so, and on to the next N.
      fover+=("| $n | r$leader | ${hb:-?} | failed: $(grep '^error:' "$d/lg0.err" | tail -1 | tr '|' '/') |")
      for p in "${sc_helpers[@]}"; do kill -TERM "$p"; wait "$p" || true; done
      region_down "$d"
      continue
    fi
    # The helpers' agents back on the survivors, then their reports.
    want_held=$(( n - $(field "$d/lg0.json" agents) ))
    for _ in $(seq 600); do
      # shellcheck disable=SC2046
      [ "$(sc_sum $(held_now))" -ge "$want_held" ] && break
      sleep 0.5
    done
    for p in "${sc_helpers[@]}"; do kill -TERM "$p"; wait "$p" || { echo "scale-out: a helper lks-loadgen failed" >&2; exit 1; }; done
    errs=$(sc_check "$d")
    read -r auth twice _ ha rec back dr er <<<"$(fleet_sums "$d"/lg*.json)"
    fover+=("| $n | r$leader | $hb | $(fnum "$d/lg0.json" failover.killed_after_seconds 2) ($(field "$d/lg0.json" failover.had_it_at_kill) of the first process's $(field "$d/lg0.json" agents) had it) | $ha | $rec | $back | $(fnum "$d/lg0.json" failover.back_after.p50_ms 0) / $(fnum "$d/lg0.json" failover.back_after.p99_ms 0) | $(fnum "$d/lg0.json" failover.rollout_done_after_kill_seconds 2) | $errs | $auth | $twice | ${dr//_/ } | ${er//_/ } |")
    region_down "$d"
  done

  if part steady; then
  echo "### Steady state: all connected, a 20-file rollout to all, then idle ${idle_s} s"
  echo
  echo "| agents | lks-loadgen processes | held per replica | enrol/s | rollout to all done (s) | rollout: etcd Range / Txn / Put requests per node (3 members) | rollout: etcd revisions per node / MiB put / MiB sent to clients (3 members) | rollout: CPU s etcd / replicas / loadgen | fan-out p50 / p99 (ms, first process's agents) | etcd idle: revisions / keys written / KiB put per s | etcd DB MiB | connection errors (retried) | auth errors | assigned twice | RSS per replica (MiB) | RSS per agent per replica (KiB) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  echo "$base_row"
  printf '%s\n' "${steady[@]}"
  echo
  echo "What the three replicas read from etcd during the rollout (values, summed; by kind of read and key prefix, the largest first):"
  echo
  printf '%s\n' "${reads[@]}"
  echo
  fi
  if part failover; then
  echo "### The leading replica killed (SIGKILL) mid-rollout"
  echo
  echo "| agents | killed | held once all connected (r1/r2/r3) | killed after (s) | held after | agents reconnected | all back after the kill (s) | back p50 / p99 (ms, first process) | rollout done after the kill (s) | connection errors before the kill (retried) | auth errors | assigned twice | streams dropped after the kill | failed attempts after the kill |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${fover[@]}"
  echo
  fi
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
fi

if want swarm; then
  # Peer sharing (issue 28): N nodes in one tenant network (network
  # namespaces on one bridge) behind a router whose link into it is capped,
  # a file rolled out to all at once, sharing off and on. The harness is
  # the e2e crate's (tests/tests/peer_sharing_netns.rs, swarm_bench); the
  # server and agents are the release builds above. Needs root.
  sw_bin=$work/swarm-bin
  mkdir -p "$sw_bin"
  ln -s "$PWD/$bin/lks-control-server" "$PWD/$bin/lksctl" "$PWD/$agent_bin" "$sw_bin/"
  echo "## Peer sharing: one tenant network behind a link of ${SWARM_RATE:-200mbit} (none: uncapped), ${SWARM_REPLICAS:-1} replica(s), a ${SWARM_MIB:-64} MiB file to N nodes at once (${SWARM_RUNS:-1} run(s) each)"
  echo
  echo "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg). Server egress is the server's own lks_blob_bytes_served_total; link bytes the router's counter into the network (TLS, HTTP/2 and TCP/IP included); agents' CPU is user + system of all agent processes during the rollout, the control plane's that of the server(s) and etcd."
  echo
  LKS_BIN_DIR=$sw_bin SWARM_NODES=${SWARM_NODES:-8 16 32 64} SWARM_RATE=${SWARM_RATE:-200mbit} SWARM_MIB=${SWARM_MIB:-64} SWARM_OFF=${SWARM_OFF:-1} SWARM_ON=${SWARM_ON:-1} SWARM_RUNS=${SWARM_RUNS:-1} SWARM_REPLICAS=${SWARM_REPLICAS:-1} \
    cargo nextest run -p lks-e2e --test peer_sharing_netns --run-ignored only --no-capture swarm_bench 2>/dev/null | grep '^|'
  echo
fi

if want delta-cost; then
  # Issue [upgrade-cost] item 3: what the server's delta maker costs per
  # pair (a file and its earlier version), against the two tools that make
  # such patches, in the same run: bsdiff 4.3 (Debian's bsdiff, the
  # algorithm the maker runs) and zstd --patch-from (-19, a window as large
  # as the file). The maker is the release server's own, timed by its
  # metrics (lks_delta_make_seconds_total: CPU seconds of the maker's
  # thread; lks_delta_patches_total{result}) and its peak RSS (VmHWM,
  # reset before each publish; the first version's publish, with no patch
  # to make, is the server's own peak). Pairs: kubectl 1.37.0 -> 1.37.1
  # (the official builds, scripts/kubectl-releases.sh) and two unrelated
  # files of DELTA_RANDOM_MIB (256) MiB from /dev/urandom. A tool still
  # running after DELTA_BASELINE_TIMEOUT (900) seconds is stopped and shown
  # as "> N s".
  command -v bsdiff >/dev/null || { echo "the delta-cost section needs bsdiff (apt-get install bsdiff)" >&2; exit 1; }
  bash scripts/kubectl-releases.sh >&2
  kr=$(bash scripts/kubectl-releases.sh --print-dir)
  dc=$work/dc
  mkdir -p "$dc/pairs/kubectl" "$dc/pairs/random"
  ln -s "$kr/1.37.0/kubectl" "$dc/pairs/kubectl/old"
  ln -s "$kr/1.37.1/kubectl" "$dc/pairs/kubectl/new"
  head -c $(( ${DELTA_RANDOM_MIB:-256} << 20 )) /dev/urandom >"$dc/pairs/random/old"
  head -c $(( ${DELTA_RANDOM_MIB:-256} << 20 )) /dev/urandom >"$dc/pairs/random/new"
  limit=${DELTA_BASELINE_TIMEOUT:-900}
  # "CPU s (user + sys), peak MiB" of a command under /usr/bin/time (CPU,
  # not wall time: the maker's figure is its thread's CPU time, and CPU
  # time is what a busy machine inflates least), or "> limit" when it ran
  # out of (wall) time.
  timed() {
    local tout=$dc/time.out
    # time outside timeout: a stopped tool is reaped by timeout, and the
    # peak RSS of a waited-for child includes its own children's.
    if /usr/bin/time -f "%U %S %M" -o "$tout" timeout "$limit" "$@" >/dev/null 2>&1; then
      awk '{ printf "%.1f s, %d MiB", $1 + $2, $3 / 1024 }' "$tout"
    else
      echo "> $limit s"
    fi
  }
  size_of() { [ -f "$1" ] && python3 -c "import os,sys; a=os.path.getsize(sys.argv[1]); b=os.path.getsize(sys.argv[2]); print(f'{a/1e3:,.0f} KB ({100*a/b:.2f} %)')" "$1" "$2" || echo "–"; }
  metric() { curl -fsS "http://127.0.0.1:$srv_metrics_port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
  made_total() { curl -fsS "http://127.0.0.1:$srv_metrics_port/metrics" | awk '/^lks_delta_patches_total/ { n += $2 } END { print n + 0 }'; }
  echo "## The delta maker's cost against bsdiff and zstd --patch-from (issue [upgrade-cost] item 3)"
  echo
  echo "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg). Maker: the release server (\`--delta-interval 1s\`, defaults otherwise: \`--delta-min-saving\` 20, \`--delta-max-memory\` 2 GiB), data dir on tmpfs. bsdiff $(dpkg-query -W -f '${Version}' bsdiff 2>/dev/null), zstd $(zstd --version | grep -o "v[0-9.]*" | head -1)."
  echo
  echo "| pair (new file) | maker: result | maker: CPU | CPU per MiB | server peak RSS: publish only → publish + maker | bsdiff: CPU, peak RSS | bsdiff patch | zstd -19 --patch-from: CPU, peak RSS | zstd patch | sha256sum: CPU, peak RSS |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for pair in kubectl random; do
    d=$dc/pairs/$pair
    mib=$(python3 -c "import os; print(round(os.path.getsize('$d/new') / 2**20, 1))")
    srv=$(mktemp -d /dev/shm/lks-bench-dc.XXXXXX)
    elsewhere+=("$srv")
    mkdir -p "$dc/$pair"
    ln -s "$srv" "$dc/$pair/server"
    start_server "$dc/$pair" --delta-interval 1s
    dc_pid=${up_pids[-1]}
    lk() { "$bin/lksctl" --config "$dc/$pair/server/admin.conf" "$@"; }
    peaks=()
    for v in 1 2; do
      b=$dc/$pair/src-$v
      mkdir -p "$b"
      if [ "$v" = 1 ]; then cp "$d/old" "$b/blob"; else cp "$d/new" "$b/blob"; fi
      printf 'name = "%s"\nversion = "%s"\n\n[[file]]\npath = "/usr/local/bin/%s"\nsource = "blob"\nmode = "0755"\n' \
        "$pair" "$v" "$pair" >"$b/bundle.toml"
      sync
      before=$(made_total) cpu0=$(metric lks_delta_make_seconds_total)
      echo 5 >"/proc/$dc_pid/clear_refs"
      lk bundle publish "$b" >/dev/null
      if [ "$v" = 2 ]; then
        for _ in $(seq $((limit * 5))); do [ "$(made_total)" -gt "$before" ] && break; sleep 0.2; done
        result=$(curl -fsS "http://127.0.0.1:$srv_metrics_port/metrics" | awk '/^lks_delta_patches_total/ && $2 > 0 { sub(/.*result="/, ""); sub(/".*/, ""); print }' | head -1)
        cpu=$(python3 -c "print(round($(metric lks_delta_make_seconds_total) - $cpu0, 2))")
      else
        sleep 3
      fi
      peaks+=("$(awk '/^VmHWM/ { print int($2 / 1024) }' "/proc/$dc_pid/status")")
      rm -rf "$b"
    done
    kill "$dc_pid"
    wait "$dc_pid" 2>/dev/null || true
    bs=$(timed bsdiff "$d/old" "$d/new" "$dc/$pair.bsdiff")
    zs=$(timed zstd -q -f -19 --long=28 --patch-from="$d/old" "$d/new" -o "$dc/$pair.zst")
    sh=$(timed sha256sum "$d/new")
    # A tool stopped by the time limit left a partial patch: not a size.
    [[ $bs != ">"* ]] || rm -f "$dc/$pair.bsdiff"
    [[ $zs != ">"* ]] || rm -f "$dc/$pair.zst"
    echo "| $pair ($mib MiB) | ${result:-none} | $cpu s | $(python3 -c "print(round($cpu / $mib * 1000, 1))") ms | ${peaks[0]} → ${peaks[1]} MiB | $bs | $(size_of "$dc/$pair.bsdiff" "$d/new") | $zs | $(size_of "$dc/$pair.zst" "$d/new") | $sh |"
    rm -f "$dc/$pair.bsdiff" "$dc/$pair.zst"
  done
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
fi

if want kube-drain; then
  # Issue [kube-drain] item 6. The harness is the e2e crate's
  # (tests/tests/kube_drain_bench.rs); the server, lksctl and agent are the
  # release builds above, the tenant control plane scripts/kube.sh's.
  bash scripts/kube.sh >&2
  kd_bin=$work/kube-drain-bin
  mkdir -p "$kd_bin"
  ln -s "$PWD/$bin/lks-control-server" "$PWD/$bin/lksctl" "$PWD/$agent_bin" "$kd_bin/"
  echo "## Drain around a node's turn against kubectl drain (median of ${RUNS_KUBE:-5} runs)"
  echo
  echo "Kubernetes $(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' tests/kube/go.mod) (kube-apiserver, kube-controller-manager and kubectl built by scripts/kube.sh), ${PODS:-10} pods on the node, replacements Ready ${POD_START_MS:-1000} ms after they are made, evicted pods gone ${POD_STOP_MS:-500} ms after their eviction. Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  LKS_BIN_DIR=$kd_bin RUNS=${RUNS_KUBE:-5} \
    cargo nextest run -p lks-e2e --test kube_drain_bench --run-ignored only --no-capture kube_drain_bench 2>"$work/kube-drain.err" | grep -E '^(\||lksadmin)' || { tail -40 "$work/kube-drain.err" >&2; exit 1; }
  echo
  grep '^run ' "$work/kube-drain.err" | sed 's/^/    /'
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
fi
