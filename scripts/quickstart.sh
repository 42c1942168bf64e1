#!/usr/bin/env bash
# Quickstart: build everything, start a control server on the embedded SQLite
# store, enrol one agent whose node root is a sandbox folder, publish the
# signed example bundle, roll it out and show it applied.
#
#   bash scripts/quickstart.sh         # start (replaces an earlier quickstart)
#   bash scripts/quickstart.sh stop    # stop the server and the agent
#
# Everything lives in ./.quickstart; nothing outside it is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
qs=$top/.quickstart
bin=$top/target/debug

stop() {
  for name in agent server; do
    if [ -f "$qs/$name.pid" ]; then
      pid=$(cat "$qs/$name.pid")
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$qs/$name.pid"
    fi
  done
}

if [ "${1:-}" = "stop" ]; then
  stop
  echo "quickstart stopped; remove $qs to forget its state"
  exit 0
fi

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { echo "quickstart: $*" >&2; exit 1; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
  local p=$1
  while ! port_free "$p"; do p=$((p + 1)); done
  echo "$p"
}

say "Installing what is missing and building (first build takes a few minutes)"
bash scripts/setup.sh quickstart
# Only what the quickstart runs (not lks-kube-controller, lks-loadgen or
# the tests), so a first run compiles no more than it needs.
cargo build --bins -p lks-control-server -p lksadmin-agent -p lksctl

stop
rm -rf "$qs"
mkdir -p "$qs/server" "$qs/agent-state" "$qs/node-root"

grpc_port=$(pick_port "${LKS_QUICKSTART_PORT:-17443}")
metrics_port=$(pick_port $((grpc_port + 1000)))

say "Starting lks-control-server on 127.0.0.1:$grpc_port (SQLite store in $qs/server)"
"$bin/lks-control-server" --data-dir "$qs/server" --listen "127.0.0.1:$grpc_port" \
  --metrics-listen "127.0.0.1:$metrics_port" --advertise-address 127.0.0.1 \
  >"$qs/server.log" 2>&1 &
echo $! >"$qs/server.pid"
for _ in $(seq 100); do
  [ -f "$qs/server/admin.conf" ] && ! port_free "$grpc_port" && break
  kill -0 "$(cat "$qs/server.pid")" 2>/dev/null || fail "server exited; see $qs/server.log"
  sleep 0.1
done
[ -f "$qs/server/admin.conf" ] || fail "server did not come up; see $qs/server.log"
export LKSCTL_CONFIG=$qs/server/admin.conf
lksctl() { "$bin/lksctl" "$@"; }

say "Creating cluster 'demo', a publisher key and a bootstrap token"
lksctl cluster create demo
lksctl bundle keygen --out "$qs/publisher"
join=$(lksctl token create --cluster demo --ttl 1h --uses 1)
echo "$join"

say "Joining one agent (node root: $qs/node-root, trusts only the publisher key)"
# The join line is what cloud-init would run on a VM; here it runs against a
# sandbox root and state dir.
read -r -a join_argv <<<"$join"
[ "${join_argv[0]}" = "lksadmin-agent" ] || fail "unexpected join line: $join"
"$bin/lksadmin-agent" "${join_argv[@]:1}" --node-name demo-node-1 \
  --state-dir "$qs/agent-state" --root "$qs/node-root" --trust-key "$qs/publisher.pub"
"$bin/lksadmin-agent" run --state-dir "$qs/agent-state" --heal-interval 5s \
  >"$qs/agent.log" 2>&1 &
echo $! >"$qs/agent.pid"
# A node offline at its turn is deferred (it catches up later); wait until
# the agent's stream is up so the rollout below reaches it at once.
for _ in $(seq 300); do
  lksctl node get demo-node-1 -o json | grep -q '"connected": true' && break
  kill -0 "$(cat "$qs/agent.pid")" 2>/dev/null || fail "agent exited; see $qs/agent.log"
  sleep 0.1
done

say "Publishing the signed example bundle examples/bundles/hello"
lksctl bundle publish examples/bundles/hello --sign-key "$qs/publisher.key"

say "Rolling hello@1.0.0 out to cluster demo"
lksctl rollout start --cluster demo --bundle hello@1.0.0 --wait

say "Nodes"
lksctl node list
cat <<MSG

The agent installed these files under its sandbox root:
$(cd "$qs/node-root" && find . -type f | sort | sed 's/^\./  /')

Contents of /etc/hello/motd on the node:
$(sed 's/^/  /' "$qs/node-root/etc/hello/motd")

Try next:
  echo tampered > $qs/node-root/etc/hello/motd    # drift: repaired within 5 s
  $bin/lksadmin-agent status --state-dir $qs/agent-state
  LKSCTL_CONFIG=$LKSCTL_CONFIG $bin/lksctl node list -o json
  LKSCTL_CONFIG=$LKSCTL_CONFIG $bin/lksctl bundle list
  LKSCTL_CONFIG=$LKSCTL_CONFIG $bin/lksctl console --open   # the fleet live in a browser (127.0.0.1:8080)
Logs: $qs/server.log, $qs/agent.log
Stop everything: bash scripts/quickstart.sh stop
MSG
