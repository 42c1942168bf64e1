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
# Usage: bash scripts/bench.sh [--only agents|sha|packages] [AGENTS...]
#        (default: every section, agents 1000 2000)
# Needs python3 (medians) and curl. Not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
only=""
if [ "${1:-}" = --only ]; then
  only=${2:?--only needs agents, sha or packages}
  shift 2
fi
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }
agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(1000 2000)

bash scripts/setup.sh
cargo build --release -p lks-control-server --bins >&2
cargo build --release -p lks-proto --example sha256_file >&2
bin=target/release

work=$(mktemp -d)
server_pid=
http_pid=
cleanup() {
  for p in $server_pid $http_pid; do
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

median() { python3 -c 'import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]), 1))' "$@"; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=d
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }

echo "## Machine"
echo "- $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
# shellcheck disable=SC1091
echo "- memory: $(free -g | awk '/Mem:/{print $2}') GiB; kernel $(uname -r); $(. /etc/os-release; echo "$PRETTY_NAME")"
echo "- $(rustc --version); release profile; date $(date -u +%F)"
echo

# The package the download section serves: 20 MiB, a .deb's first bytes.
# Only that section has the server import it.
pkg=$work/pkg/lksadmin-agent_0.0.0-bench_amd64.deb
pkg_args=()
if want packages; then
  mkdir -p "$work/pkg"
  { printf '!<arch>\ndebian-binary   '; head -c $((20 << 20)) /dev/urandom; } >"$pkg"
  pkg_args=(--agent-package "$pkg")
fi

port=$((20000 + RANDOM % 20000))
"$bin/lks-control-server" --data-dir "$work/server" --listen "127.0.0.1:$port" \
  --advertise-address 127.0.0.1 "${pkg_args[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -f "$work/server/admin.conf" ] && break; sleep 0.1; done
sleep 0.5

rss_kib() { awk '/VmRSS/{print $2}' "/proc/$server_pid/status"; }

if want agents; then
echo "## Agents (median of $RUNS runs)"
echo
echo "| agents | what | enrol/s | first message p50 / p99 (ms) | rollout fan-out p50 / p99 (ms) | rollout done (s) | server RSS per agent (KiB) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for n in "${agents[@]}"; do
  declare -A acc=()
  for r in $(seq "$RUNS"); do
    "$bin/lks-loadgen" --baseline --agents "$n" --cluster bench --spread-source-ips -o json >"$work/base.json"
    acc[b50]+=" $(field "$work/base.json" first_message.p50_ms)"
    acc[b99]+=" $(field "$work/base.json" first_message.p99_ms)"

    idle=$(rss_kib)
    "$bin/lks-loadgen" --config "$work/server/admin.conf" --cluster "bench$r" --agents "$n" \
      --spread-source-ips --rollout --hold 4 -o json >"$work/run.json" &
    lg=$!
    # Sample the server while every agent is connected (during --hold).
    peak=$idle
    while kill -0 "$lg" 2>/dev/null; do
      cur=$(rss_kib); [ "$cur" -gt "$peak" ] && peak=$cur
      sleep 0.5
    done
    wait "$lg"
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
  echo "| $n | idle tonic server (baseline) | – | $(median ${acc[b50]}) / $(median ${acc[b99]}) | – | – | – |"
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
base=() ours=()
for _ in $(seq "$RUNS"); do
  base+=("$(ms sha256sum "$work/blob")")
  ours+=("$(ms "$bin/examples/sha256_file" "$work/blob")")
done
echo "| what | time (ms) | MiB/s |"
echo "| --- | --- | --- |"
b=$(median "${base[@]}"); o=$(median "${ours[@]}")
echo "| sha256sum (baseline) | $b | $(python3 -c "print(round(1024/($b/1000)))") |"
echo "| lks_proto::Digest::of_file | $o | $(python3 -c "print(round(1024/($o/1000)))") |"
echo
fi

if want packages; then
  python3 -m http.server --bind 127.0.0.1 --directory "$work/pkg" $((port + 1)) >"$work/http.log" 2>&1 &
  http_pid=$!
  python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["ca_cert"], end="")' \
    "$work/server/admin.conf" >"$work/ca.pem"
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