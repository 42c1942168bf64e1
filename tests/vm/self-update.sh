#!/usr/bin/env bash
# End-to-end: the agent replacing its own binary (a `self_update = true`
# bundle) under real systemd, with the package's unit and
# lksadmin-agent-guard (ExecStopPost=+, the deadline timer it arms with
# systemd-run), in one booted Debian 12 VM (lib.sh) joined to a real server
# on the host's loopback. tests/tests/self_update.rs runs the same
# scenarios without systemd (the test plays it); here systemd does.
#
#   0. install the agent .deb, join, `systemctl enable --now`; roll out
#      bundles/lks-demo (managed files that must survive every hand-over);
#   1. good: an agent built with LKS_AGENT_VERSION=<base>+vm2, published as
#      a self-update bundle for /usr/bin/lksadmin-agent: the rollout
#      completes, the node reports agent_version <base>+vm2 and the bundle
#      applied, the VM runs the new binary (sha256, mode 0755), the unit is
#      active, no hand-over record is left, lks-demo's files and unit are
#      untouched, and the new agent repairs drift (a deleted file comes back);
#   2. bad, exits 1 at start (fake-agent.c): the guard restores the
#      previous binary, the node reports `rolled_back` naming the exit;
#   3. bad, hangs before READY=1: systemd's start timeout kills it (a
#      drop-in lowers TimeoutStartSec to 10 s), the guard restores;
#   4. bad, sends READY=1 and watchdog pings but never connects: the guard's
#      deadline timer fires (a drop-in sets LKS_SELF_UPDATE_DEADLINE=15, the
#      agent writes it into the record instead of 120 s), the guard restores
#      and restarts the service.
#   After each bad one: the rollout fails, the previous binary (sha256) runs,
#   active and connected again, agent_version unchanged, no record left, and
#   the node applies a later ordinary bundle. Never is the unit left
#   without a running agent for long: it is active after every scenario,
#   and the guard never failed to arm its timer.
#
#   tests/vm/self-update.sh [--profile release|dev] [--no-lint] [--no-build]
#
#   --profile dev   the debug binaries (CI: scripts/test.sh built them)
#   --no-lint       skip lintian in packaging/deb/build.sh
#   --no-build      use the packages in target/debian as they are (CI: after
#                   cloud-init-join.sh built them); the second agent is
#                   built either way
#
# The second agent is built into the same target dir, copied out, and the
# agent rebuilt without LKS_AGENT_VERSION (by build.sh, or by cargo with
# --no-build), so target/ is left as it was: two compiles of the agent crate
# only (~10-20 s each on 2 cores), where a separate --target-dir would compile
# the whole dependency tree (minutes).
#
# Environment: LKS_VM_TIMEOUT (boot, default 300 s), LKS_VM_KEEP=1 (keep the
# VM directory and the work dir), LKS_VM_CACHE (see build-root.sh). Needs
# root and a C compiler. Progress goes to stderr; on failure the logs of the
# server and the agent's journal, then one last line `vm: FAIL: …`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

usage="usage: tests/vm/self-update.sh [--profile release|dev] [--no-lint] [--no-build]"
vm_parse_args "$usage" "$@"
bin=$VM_BIN

CLUSTER=vm-self-update
AGENT=/usr/bin/lksadmin-agent
SU=/var/lib/lksadmin/self-update
# Instead of the shipped 90 s start timeout and 120 s hand-over deadline (and
# 5 s between restarts), so that scenarios 3 and 4 take seconds.
START_TIMEOUT=10
DEADLINE=15

work=$(mktemp -d "${TMPDIR:-/tmp}/lks-self-update.XXXXXX")


on_exit() {
  if [ "${LKS_VM_KEEP:-0}" = 1 ]; then
    vm_log "kept $work (LKS_VM_KEEP=1)"
  else
    rm -rf "$work"
  fi
}
VM_EXIT_HOOK=on_exit


diagnose() {
  if [ -s "$work/server.log" ]; then
    section "lks-control-server log (last 30 lines)"
    tail -n 30 "$work/server.log" >&2
  fi
  if [ -n "${VM_PID:-}" ] && kill -0 "$VM_PID" 2>/dev/null; then
    section "journalctl -u lksadmin-agent -u lksadmin-agent-self-update-deadline in the VM (last 60 lines)"
    vm_exec journalctl -u lksadmin-agent -u lksadmin-agent-self-update-deadline --no-pager -n 60 >&2 || true
    section "$SU in the VM"
    vm_exec sh -c "ls -l $SU && cat $SU/pending $SU/result" >&2 2>/dev/null || true
  fi
}
VM_DIAG_HOOK=diagnose

# The drop-in a test image carries for short timeouts (see START_TIMEOUT).
preboot() {
  local d=$1/etc/systemd/system/lksadmin-agent.service.d
  mkdir -p "$d"
  printf '# self-update.sh: short periods for the test\n[Service]\nTimeoutStartSec=%s\nRestartSec=1s\nEnvironment=LKS_SELF_UPDATE_DEADLINE=%s\n' \
    "$START_TIMEOUT" "$DEADLINE" >"$d/50-vm-test.conf"
}
VM_PREBOOT_HOOK=preboot




[ "$(id -u)" -eq 0 ] || vm_die "must run as root (systemd-nspawn needs it)"
command -v jq >/dev/null || vm_die "jq is missing (apt-get install jq)"
command -v cc >/dev/null || vm_die "no C compiler for fake-agent.c (apt-get install build-essential)"

# --- packages and the second agent ---------------------------------------------
base=$(cd "$repo" && cargo pkgid -p lksadmin-agent | sed 's/.*[#@]//')
v2=$base+vm2
vm_log "building agent $v2 (LKS_AGENT_VERSION, $VM_AGENT_PROFILE profile)"
(cd "$repo" && LKS_AGENT_VERSION=$v2 cargo build --quiet --profile "$VM_AGENT_PROFILE" -p lksadmin-agent --bin lksadmin-agent) ||
  vm_die "cargo build of agent $v2 failed (output above)"
mkdir -p "$work/agent-vm2"
# Without its debug info: a smaller blob to publish and download, the same program.
strip --strip-debug -o "$work/agent-vm2/lksadmin-agent" "$VM_AGENT_BIN/lksadmin-agent"
check "the second agent says it is $v2" \
  test "$("$work/agent-vm2/lksadmin-agent" version)" = "lksadmin-agent $v2"
# And back: target/ holds the agent without LKS_AGENT_VERSION again
# (build.sh rebuilds it; with --no-build, cargo does).
if [ "$VM_BUILD" = 0 ]; then
  (cd "$repo" && cargo build --quiet --profile "$VM_AGENT_PROFILE" -p lksadmin-agent --bin lksadmin-agent) ||
    vm_die "cargo build of the agent failed (output above)"
fi
vm_packages "$work"
check "target/ holds agent $base again" test "$("$VM_AGENT_BIN/lksadmin-agent" version)" = "lksadmin-agent $base"
agent_deb=$VM_AGENT_DEB

for how in exit hang no-connect; do
  mkdir -p "$work/agent-$how"
  macro=FAKE_$(tr a-z- A-Z_ <<<"$how")
  cc -O -Wall -Werror -DFAKE_VERSION="\"$base+$how\"" -D"$macro" \
    -o "$work/agent-$how/lksadmin-agent" "$here/fake-agent.c" || vm_die "cc fake-agent.c -D$macro failed"
done
vm_log "ok: compiled fake agents (exit, hang, no-connect) from fake-agent.c"

"$here/build-root.sh" >/dev/null || vm_die "could not build the VM root (see above)"

# --- server, VM, join -------------------------------------------------------------
vm_server "$work"
lksctl() { "$bin/lksctl" --config "$work/server/admin.conf" "$@"; }
lksctl cluster create "$CLUSTER" >/dev/null || vm_die "lksctl cluster create failed"
join_line=$(lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1) || vm_die "lksctl token create failed"

vm_start "$here/smoke-user-data.yaml" --bind-ro="$(dirname "$agent_deb"):/debs"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
if ! out=$(vm_exec env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "/debs/$(basename "$agent_deb")" 2>&1); then
  printf '%s\n' "$out" | tail -n 20 >&2
  vm_die "apt-get install $(basename "$agent_deb") failed (above)"
fi
vm_log "ok: installed $(basename "$agent_deb")"
vm_exec sh -c "$join_line" >&2 || vm_die "the join line failed in the VM"
vm_exec systemctl enable --now lksadmin-agent || vm_die "systemctl enable --now lksadmin-agent failed"

prop() { vm_exec systemctl show -P "$1" lksadmin-agent.service; }
node_json() { lksctl node list --cluster "$CLUSTER" -o json | jq -c --arg n "$VM_NAME" '.[] | select(.name == $n)'; }
bundle_field() { node_json | jq -r --arg b "$1" ".bundles[] | select(.name == \$b) | .$2"; }
vm_sha() { vm_exec sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }
agent_version() { node_json | jq -r .agent_version; }
# The unit active with the agent's own process, which is connected (its
# status file and the server agree).
agent_up() {
  local pid s
  [ "$(prop ActiveState)/$(prop SubState)" = active/running ] || return 1
  pid=$(prop MainPID)
  s=$(vm_exec cat /var/lib/lksadmin/status.json 2>/dev/null) || return 1
  [ "$(jq -r '"\(.pid) \(.connected)"' <<<"$s")" = "$pid true" ] &&
    [ "$(node_json | jq -r .connected)" = true ]
}
wait_for "the agent is active and connected" 30 agent_up
check "the server reports agent_version $base" test "$(agent_version)" = "$base"

# rollout NAME REF [fail]: rolls REF out and waits; the rollout must complete,
# or with `fail`, must fail. Prints nothing; the final state is in $work/NAME.json.
rollout() {
  local name=$1 ref=$2 want=${3:-completed} rc=0 state
  timeout 180 "$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
    --bundle "$ref" --wait -o json >"$work/$name.json" 2>"$work/$name.err" || rc=$?
  state=$(jq -r .state "$work/$name.json" 2>/dev/null) || state=""
  if [ "$state" != "$want" ] || { [ "$want" = completed ] && [ "$rc" != 0 ]; }; then
    cat "$work/$name.err" "$work/$name.json" >&2
    node_json >&2 || true
    vm_die "rollout of $ref: state '${state:-none}' (lksctl exit $rc), expected $want"
  fi
  vm_log "ok: rollout of $ref: $state"
}

# publish DIR: prints NAME@VERSION (call as `ref=$(publish DIR) || vm_die …`).
publish() {
  local ref
  ref=$(lksctl bundle publish "$1") || return 1
  vm_log "published $ref"
  printf '%s\n' "$ref"
}

# A self-update bundle for the binary in DIR (version VERSION).
self_update_bundle() {
  printf 'name = "lksadmin-agent"\nversion = "%s"\nself_update = true\n\n[[file]]\npath = "%s"\nsource = "lksadmin-agent"\nmode = "0755"\n' \
    "$2" "$AGENT" >"$1/bundle.toml"
  publish "$1"
}

# An ordinary bundle: one file whose content is VERSION.
marker=0
ordinary_rollout() {
  marker=$((marker + 1))
  local d=$work/marker-$marker
  mkdir -p "$d"
  printf 'marker %s (%s)\n' "$marker" "$1" >"$d/lks-su-marker"
  printf 'name = "lks-su-marker"\nversion = "%s"\n\n[[file]]\npath = "/usr/local/bin/lks-su-marker"\nsource = "lks-su-marker"\nmode = "0644"\n' \
    "$marker" >"$d/bundle.toml"
  ref=$(publish "$d") || vm_die "lksctl bundle publish $d failed"
  rollout "marker-$marker" "$ref"
  check "the node applied lks-su-marker $marker ($1)" \
    cmp -s "$d/lks-su-marker" <(vm_exec cat /usr/local/bin/lks-su-marker)
}

no_record() { vm_exec test ! -e "$SU/pending" -a ! -e "$SU/fallback" -a ! -e "$SU/new"; }

# --- 0. managed files that must survive ------------------------------------------
ref=$(publish "$here/bundles/lks-demo") || vm_die "lksctl bundle publish bundles/lks-demo failed"
rollout demo "$ref"
demo_files=(/etc/systemd/system/lks-demo.service /usr/local/bin/lks-demo)
demo_sums() { for f in "${demo_files[@]}"; do vm_sha "$f"; done; }
demo_before=$(demo_sums)
demo_pid=$(vm_exec systemctl show -P MainPID lks-demo)
check "lks-demo applied and its unit active (pid $demo_pid)" \
  test "$(bundle_field lks-demo state)/$(vm_exec systemctl is-active lks-demo)" = applied/active

# --- 1. a good self-update --------------------------------------------------------
section "1. good: agent $base -> $v2"
sum_v1=$(vm_sha "$AGENT")
sum_v2=$(sha256sum "$work/agent-vm2/lksadmin-agent" | cut -d' ' -f1)
pid_v1=$(prop MainPID)
check "$AGENT in the VM is the packaged agent (sha256 $sum_v1), not the new one" test "$sum_v1" != "$sum_v2"
t0=$SECONDS
ref=$(self_update_bundle "$work/agent-vm2" "$v2") || vm_die "lksctl bundle publish of agent $v2 failed"
rollout good "$ref"
vm_log "the hand-over took $((SECONDS - t0))s"
check "the server reports agent_version $v2" test "$(agent_version)" = "$v2"
check "the bundle lksadmin-agent@$v2 is applied" \
  test "$(bundle_field lksadmin-agent version)/$(bundle_field lksadmin-agent state)" = "$v2/applied"
check "$AGENT in the VM is the new binary (sha256 $sum_v2), mode 0755" \
  test "$(vm_sha "$AGENT") $(vm_exec stat -c %a "$AGENT")" = "$sum_v2 755"
check "systemctl is-active lksadmin-agent: a new process (pid $pid_v1 -> $(prop MainPID))" \
  test "$(vm_exec systemctl is-active lksadmin-agent)" = active -a "$(prop MainPID)" != "$pid_v1"
wait_for "the new agent is connected" 30 agent_up
check "no hand-over record, fallback or staged binary left in $SU" no_record
check "lks-demo's files are untouched" test "$(demo_sums)" = "$demo_before"
check "lks-demo still applied, its unit not restarted (pid $demo_pid)" \
  test "$(bundle_field lks-demo state)/$(vm_exec systemctl show -P MainPID lks-demo)" = "applied/$demo_pid"
vm_exec rm /usr/local/bin/lks-demo
vm_log "deleted /usr/local/bin/lks-demo in the VM"
demo_back() { [ "$(demo_sums)" = "$demo_before" ]; }
wait_for "the new agent restored /usr/local/bin/lks-demo (drift repair)" 15 demo_back

# --- 2-4. bad self-updates ----------------------------------------------------------
# bad HOW REASON: rolls out the fake agent built for HOW, and checks that the
# previous binary is back and reported the rollback with the guard's REASON
# (a grep -E pattern).
bad() {
  local how=$1 reason=$2 pid0 msg ref
  local version=$base+$how
  section "bad: agent $v2 -> $version"
  pid0=$(prop MainPID)
  t0=$SECONDS
  ref=$(self_update_bundle "$work/agent-$how" "$version") || vm_die "lksctl bundle publish of agent $version failed"
  rollout "bad-$how" "$ref" failed
  vm_log "the hand-over and the rollback took $((SECONDS - t0))s"
  check "the bundle lksadmin-agent@$version is rolled_back" \
    test "$(bundle_field lksadmin-agent version)/$(bundle_field lksadmin-agent state)" = "$version/rolled_back"
  msg=$(bundle_field lksadmin-agent message)
  check "the reason says why: $msg" \
    test "${msg#*" rolled back to $v2: "}" != "$msg" -a -n "$(grep -E "$reason" <<<"$msg")"
  check "$AGENT in the VM is the previous binary again (sha256 $sum_v2)" \
    test "$(vm_sha "$AGENT") $(vm_exec stat -c %a "$AGENT")" = "$sum_v2 755"
  wait_for "the previous agent is active and connected again" 30 agent_up
  check "it is a new process (pid $pid0 -> $(prop MainPID))" test "$(prop MainPID)" != "$pid0"
  check "the server reports agent_version $v2 still" test "$(agent_version)" = "$v2"
  check "no hand-over record, fallback or staged binary left in $SU" no_record
  check "lks-demo's files are untouched" test "$(demo_sums)" = "$demo_before"
  ordinary_rollout "after the rollback of $version"
}

bad exit "stopped before it reconnected and reported \(exit-code, exited 1\)"
bad hang "stopped before it reconnected and reported \(timeout, "
bad no-connect "did not reconnect and report within ${DEADLINE}s"

# --- the guard's own record ---------------------------------------------------------
guard_log=$(vm_exec journalctl -u lksadmin-agent -u lksadmin-agent-self-update-deadline -o cat --no-pager |
  grep '^lksadmin-agent-guard: ' || true)
check "the guard installed 4 binaries and rolled back 3 ($(grep -c 'installed agent' <<<"$guard_log") and $(grep -c 'rolled back' <<<"$guard_log"))" \
  test "$(grep -c 'installed agent' <<<"$guard_log")/$(grep -c 'rolled back to the previous agent' <<<"$guard_log")" = 4/3
check "the guard armed every deadline timer" test -z "$(grep -F 'could not arm' <<<"$guard_log")"

vm_stop
vm_log "self-update: OK"
