# shellcheck shell=bash
# Boots the cached Debian 12 root (build-root.sh) as a throw-away "VM": a
# systemd-nspawn container running real systemd and cloud-init, seeded with
# NoCloud user-data, as a tenant VM would be. Source this file, then:
#
#   vm_start USER_DATA [NSPAWN_ARG...]  boot a copy-on-write copy of the root
#   vm_wait_boot [TIMEOUT_SECS]         wait until boot and cloud-init are done
#   vm_exec CMD [ARG...]                run a command inside the VM
#   vm_stop                             power off and delete the VM (idempotent;
#                                       the EXIT trap this file sets calls it)
#   vm_die MESSAGE                      fail: diagnostics, console tail, cleanup,
#                                       one FAIL line
#   vm_packages WORK                    the .debs (built unless --no-build):
#                                       VM_AGENT_DEB
#   vm_server WORK [ARG...]             lks-control-server on loopback, data
#                                       in WORK/server (VM_SERVER_PID; stopped
#                                       at exit)
#
# Hooks (function names, set before vm_start):
#   VM_PREBOOT_HOOK   called with the VM's root after the seed is written and
#                     before systemd starts: files the image would carry
#   VM_DIAG_HOOK      called on failure while the VM still runs: print what
#                     helps (logs of the test's own processes, journals)
#   VM_EXIT_HOOK      called at exit after the VM is gone: stop the test's own
#                     processes, remove its files
#
# After vm_start: VM_ROOT is the VM's / seen from the host (read files there,
# but mind absolute symlinks: they resolve on the host), VM_CONSOLE its console
# log, VM_NAME its hostname. The container shares the host's network, so
# servers the test starts on the host's loopback are reachable from inside.
#
# Environment: LKS_VM_CACHE (see build-root.sh), LKS_VM_KEEP=1 keeps the VM's
# directory after vm_stop for debugging.
#
# Needs root. Call the functions directly, not in $(…): they keep the VM's
# state in global variables of the calling shell.

VM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_T0=$SECONDS

vm_log() { printf 'vm: [%3ds] %s\n' "$((SECONDS - VM_T0))" "$*" >&2; }

# The options of a VM test that packs the agent: [--profile release|dev]
# [--no-lint] [--no-build]; USAGE is the one-line usage for errors. Sets
# VM_PROFILE, VM_BUILD (1/0), VM_BUILD_ARGS (for packaging/deb/build.sh),
# VM_BIN (target/release or target/debug) and, for the agent, which ships
# from its own profile in a release build, VM_AGENT_PROFILE (agent or dev)
# and VM_AGENT_BIN (target/agent or target/debug). LKS_DEB_PROFILE is the
# default.
# shellcheck disable=SC2034 # VM_* are the outputs, read by the caller
vm_parse_args() {
  local usage=$1 repo
  shift
  repo=$(cd "$VM_LIB_DIR/../.." && pwd)
  VM_PROFILE=${LKS_DEB_PROFILE:-release}
  VM_BUILD=1
  VM_BUILD_ARGS=()
  while (($#)); do
    case "$1" in
    --profile)
      (($# >= 2)) || vm_die "--profile needs a value ($usage)"
      VM_PROFILE=$2
      shift
      ;;
    --profile=*) VM_PROFILE=${1#--profile=} ;;
    --no-lint) VM_BUILD_ARGS+=(--no-lint) ;;
    --no-build) VM_BUILD=0 ;;
    *) vm_die "unknown argument '$1' ($usage)" ;;
    esac
    shift
  done
  case "$VM_PROFILE" in
  release) VM_BIN=$repo/target/release VM_AGENT_PROFILE=agent VM_AGENT_BIN=$repo/target/agent ;;
  dev) VM_BIN=$repo/target/debug VM_AGENT_PROFILE=dev VM_AGENT_BIN=$repo/target/debug ;;
  *) vm_die "--profile must be release or dev, not '$VM_PROFILE'" ;;
  esac
}

# The caller's diagnostics and the last lines of the console, then (after
# cleanup, so that it is the last line) one line saying what failed.
vm_die() {
  VM_FAILURE=$*
  vm__diagnose
  exit 1
}

# Once per run: a failure seen by vm_die and then by the EXIT trap prints
# its diagnostics only once.
vm__diagnose() {
  [ -z "${VM_DIAGNOSED:-}" ] || return 0
  VM_DIAGNOSED=1
  if [ -n "${VM_DIAG_HOOK:-}" ]; then
    "$VM_DIAG_HOOK" || true
  fi
  if [ -n "${VM_CONSOLE:-}" ] && [ -s "$VM_CONSOLE" ]; then
    printf -- '--- last lines of the VM console (%s) ---\n' "$VM_CONSOLE" >&2
    tail -n 25 "$VM_CONSOLE" | sed 's/\x1b\[[0-9;]*m//g' >&2
    printf -- '---\n' >&2
  fi
}

vm__on_exit() {
  local status=$?
  # A command that failed under `set -e` did not go through vm_die.
  [ "$status" -eq 0 ] || vm__diagnose
  vm_stop
  if [ -n "${VM_SERVER_PID:-}" ]; then
    stop_pid "$VM_SERVER_PID"
    VM_SERVER_PID=""
  fi
  if [ -n "${VM_EXIT_HOOK:-}" ]; then
    "$VM_EXIT_HOOK" || true
  fi
  if [ -n "${VM_FAILURE:-}" ]; then
    printf 'vm: FAIL: %s\n' "$VM_FAILURE" >&2
  elif [ "$status" -ne 0 ]; then
    printf 'vm: FAIL: exit status %s\n' "$status" >&2
  fi
}
trap vm__on_exit EXIT
trap 'VM_FAILURE=${VM_FAILURE:-interrupted}; exit 130' INT
trap 'VM_FAILURE=${VM_FAILURE:-terminated}; exit 143' TERM

vm_start() {
  local user_data=$1
  shift
  [ "$(id -u)" -eq 0 ] || vm_die "must run as root (systemd-nspawn needs it)"
  [ -r "$user_data" ] || vm_die "user-data file '$user_data' not readable"

  local base
  base=$("$VM_LIB_DIR/build-root.sh") || vm_die "could not build the VM root (see above)"

  VM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/lks-vm.XXXXXX")
  # Machine name and hostname: unique, so VMs can run side by side.
  VM_NAME=lks-vm-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
  VM_ROOT=$VM_DIR/root
  VM_CONSOLE=$VM_DIR/console.log
  mkdir -p "$VM_ROOT" "$VM_DIR/upper" "$VM_DIR/work"

  # Copy-on-write over the cached root: instant, and the cache stays pristine.
  # Where overlayfs is unavailable (e.g. TMPDIR itself on overlayfs), copy.
  if mount -t overlay overlay \
    -o "lowerdir=$base,upperdir=$VM_DIR/upper,workdir=$VM_DIR/work" "$VM_ROOT" 2>/dev/null; then
    VM_OVERLAY=1
  else
    VM_OVERLAY=0
    vm_log "overlayfs unavailable, copying the root"
    cp -a --reflink=auto "$base/." "$VM_ROOT/"
  fi

  # NoCloud seed: cloud-init's ds-identify finds it in this directory.
  local seed=$VM_ROOT/var/lib/cloud/seed/nocloud
  mkdir -p "$seed"
  printf 'instance-id: %s\nlocal-hostname: %s\n' "$VM_NAME" "$VM_NAME" >"$seed/meta-data"
  cp "$user_data" "$seed/user-data"
  if [ -n "${VM_PREBOOT_HOOK:-}" ]; then
    "$VM_PREBOOT_HOOK" "$VM_ROOT" || vm_die "the pre-boot hook $VM_PREBOOT_HOOK failed"
  fi

  vm_log "booting $VM_NAME from $base"
  VM_NSPAWN_ARGS=("$@")
  vm__power_on
}

# Starts systemd-nspawn on the VM's root (the arguments vm_start was given)
# and finds the VM's init: the power button, used at the first boot and
# again after a reboot.
vm__power_on() {
  # --register=no --keep-unit: no machined or host systemd needed.
  # --console=read-only: the VM's console goes to the log, nothing reads stdin.
  systemd-nspawn --boot --register=no --keep-unit --machine="$VM_NAME" \
    --directory="$VM_ROOT" --console=read-only "${VM_NSPAWN_ARGS[@]}" \
    >>"$VM_CONSOLE" 2>&1 </dev/null &
  VM_PID=$!

  # The VM's init: the child of systemd-nspawn that is PID 1 in its namespace.
  VM_LEADER=""
  local i child
  for ((i = 0; i < 100; i++)); do
    for child in $(pgrep -P "$VM_PID" 2>/dev/null || true); do
      if grep -qE '^NSpid:.*[[:space:]]1$' "/proc/$child/status" 2>/dev/null; then
        VM_LEADER=$child
        break 2
      fi
    done
    kill -0 "$VM_PID" 2>/dev/null || vm_die "systemd-nspawn exited at start"
    sleep 0.1
  done
  [ -n "$VM_LEADER" ] || vm_die "systemd-nspawn started no init within 10s"
}

# Waits until the VM rebooted itself (its systemd ran `systemctl reboot`:
# systemd-nspawn then exits with status 133, as a VM's firmware would reset)
# and boots it again from the same root, as a hypervisor does; fails if the
# VM powered off or died instead, or did not go down within TIMEOUT
# seconds. The caller then waits for the boot (vm_wait_boot).
vm_reboot_wait() {
  local timeout=${1:-120} i status=0
  for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$VM_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$VM_PID" 2>/dev/null && vm_die "the VM did not go down to reboot within ${timeout}s"
  wait "$VM_PID" || status=$?
  VM_PID=""
  [ "$status" -eq 133 ] || vm_die "systemd-nspawn exited with status $status, not 133 (a reboot)"
  vm_log "$VM_NAME rebooted (systemd-nspawn exited 133); booting it again"
  vm__power_on
}

# Runs a command inside the VM (its mount, UTS, IPC and PID namespaces; the
# network is shared anyway) with a clean environment.
vm_exec() {
  nsenter --target "$VM_LEADER" --mount --uts --ipc --pid --root --wd -- \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
}

# Waits until systemd has finished the boot transaction. cloud-final.service
# is part of it (multi-user.target wants cloud-init.target), so this also
# waits for cloud-init. Fails on a timeout, a VM that died, failed units
# (unless LKS_VM_ALLOW_DEGRADED=1) or cloud-init errors.
vm_wait_boot() {
  local timeout=${1:-300}
  local deadline=$((SECONDS + timeout)) state=""
  while :; do
    kill -0 "$VM_PID" 2>/dev/null || vm_die "the VM stopped while booting"
    # "offline" until systemd's socket exists, then initializing/starting.
    state=$(vm_exec systemctl is-system-running 2>/dev/null) || true
    case "$state" in
    running | degraded) break ;;
    stopping) vm_die "the VM is stopping instead of booting" ;;
    esac
    ((SECONDS < deadline)) || vm_die "boot not finished after ${timeout}s (system state: ${state:-unknown})"
    sleep 0.5
  done
  vm_exec systemctl is-active --quiet multi-user.target ||
    vm_die "boot finished without reaching multi-user.target"
  vm_log "booted: multi-user.target reached (system $state)"

  if [ "$state" = degraded ] && [ "${LKS_VM_ALLOW_DEGRADED:-0}" != 1 ]; then
    vm_exec systemctl --failed --no-legend --no-pager >&2 || true
    vm_die "units failed during boot: $(vm_exec systemctl --failed --no-legend --plain | awk '{print $1}' | paste -sd ' ')"
  fi

  local ci
  if ! ci=$(vm_exec cloud-init status --long 2>&1); then
    printf '%s\n' "$ci" >&2
    vm_die "cloud-init finished with errors (above)"
  fi
  vm_log "cloud-init: $(printf '%s\n' "$ci" | sed -n 's/^status: //p')"
}

vm_stop() {
  if [ -n "${VM_PID:-}" ]; then
    if kill -0 "$VM_PID" 2>/dev/null; then
      # systemd-nspawn turns SIGTERM into SIGRTMIN+3 for the VM's systemd: an
      # orderly poweroff (it takes about a second).
      kill -TERM "$VM_PID" 2>/dev/null || true
      local i
      for ((i = 0; i < 300; i++)); do
        kill -0 "$VM_PID" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 "$VM_PID" 2>/dev/null; then
        vm_log "no poweroff after 30s; killing the VM"
        # Killing the namespace's init kills every process in it.
        kill -KILL "$VM_LEADER" 2>/dev/null || true
        kill -KILL "$VM_PID" 2>/dev/null || true
      fi
    fi
    wait "$VM_PID" 2>/dev/null || true
    VM_PID=""
    vm_log "stopped $VM_NAME"
  fi
  if [ -n "${VM_DIR:-}" ]; then
    if [ "${VM_OVERLAY:-0}" = 1 ] && mountpoint -q "$VM_ROOT"; then
      umount "$VM_ROOT" 2>/dev/null || umount --lazy "$VM_ROOT"
    fi
    # systemd-nspawn leaves its (empty) mount propagation directory behind.
    rmdir "/run/systemd/nspawn/propagate/$VM_NAME" 2>/dev/null || true
    if [ "${LKS_VM_KEEP:-0}" = 1 ]; then
      vm_log "kept $VM_DIR (LKS_VM_KEEP=1)"
    else
      rm -rf --one-file-system "$VM_DIR"
    fi
    VM_DIR=""
  fi
}

# --- helpers of the test scripts ---------------------------------------------

# vm_packages WORK: the packages a VM test installs. Builds the .debs of the
# profile (vm_parse_args) unless --no-build, then sets VM_AGENT_DEB (the
# newest target/debian/lksadmin-agent_*.deb) and checks that the profile's
# server and lksctl exist. build.sh's output goes to WORK/debs.txt.
# shellcheck disable=SC2034 # VM_AGENT_DEB is the output, read by the caller
vm_packages() {
  local work=$1 repo b
  repo=$(cd "$VM_LIB_DIR/../.." && pwd)
  if [ "$VM_BUILD" = 1 ]; then
    vm_log "building the packages ($VM_PROFILE profile): packaging/deb/build.sh"
    bash "$repo/packaging/deb/build.sh" --profile "$VM_PROFILE" "${VM_BUILD_ARGS[@]}" >"$work/debs.txt" ||
      vm_die "packaging/deb/build.sh failed (output above)"
  fi
  VM_AGENT_DEB=$(find "$repo/target/debian" -maxdepth 1 -name 'lksadmin-agent_*.deb' 2>/dev/null | sort -V | tail -n 1)
  [ -n "$VM_AGENT_DEB" ] || vm_die "no target/debian/lksadmin-agent_*.deb: run without --no-build"
  for b in lks-control-server lksctl; do
    [ -x "$VM_BIN/$b" ] || vm_die "$VM_BIN/$b missing: run without --no-build"
  done
}

# vm_server WORK [ARG...]: starts the profile's lks-control-server on
# loopback (free ports, data dir WORK/server, log WORK/server.log, ARGs
# added) and waits until it listens and has written admin.conf. Sets
# VM_SERVER_PID (the EXIT trap stops it) and VM_METRICS_PORT (/metrics).
# shellcheck disable=SC2034 # VM_METRICS_PORT is an output, read by the caller
vm_server() {
  local work=$1 grpc_port metrics_port
  shift
  grpc_port=$(free_port) || vm_die "no free port for the control server"
  metrics_port=$(free_port) || vm_die "no free port for the metrics endpoint"
  "$VM_BIN/lks-control-server" --data-dir "$work/server" --listen "127.0.0.1:$grpc_port" \
    --metrics-listen "127.0.0.1:$metrics_port" --advertise-address 127.0.0.1 "$@" >"$work/server.log" 2>&1 &
  VM_SERVER_PID=$!
  VM_SERVER_WORK=$work VM_SERVER_PORT=$grpc_port VM_METRICS_PORT=$metrics_port
  wait_for "lks-control-server listening on 127.0.0.1:$grpc_port" 30 vm__server_up
}

vm__server_up() {
  kill -0 "$VM_SERVER_PID" 2>/dev/null || vm_die "lks-control-server exited at start"
  [ -f "$VM_SERVER_WORK/server/admin.conf" ] && ! port_free "$VM_SERVER_PORT"
}


# check DESCRIPTION COMMAND...: one progress line, or fail with DESCRIPTION.
check() {
  local what=$1
  shift
  "$@" || vm_die "$what"
  vm_log "ok: $what"
}

# wait_for DESCRIPTION SECONDS COMMAND...: polls until COMMAND succeeds.
wait_for() {
  local what=$1 timeout=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    ((SECONDS < deadline)) || vm_die "$what: not within ${timeout}s"
    sleep 0.5
  done
  vm_log "ok: $what"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A random free port: several runs (and other tests) may share the host.
free_port() {
  local p i
  for ((i = 0; i < 100; i++)); do
    p=$((20000 + RANDOM % 40000))
    if port_free "$p"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# stop_pid PID: SIGTERM, up to 5 s, then SIGKILL; reaps it.
stop_pid() {
  local pid=$1
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

section() { printf -- '--- %s ---\n' "$1" >&2; }
