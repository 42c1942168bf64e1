#!/usr/bin/env bash
# Installs the two Debian packages in a booted Debian 12 VM (lib.sh) and checks
# what the packaging promises, with real systemd:
#   - install enables lksadmin-agent but starts nothing; the server is neither
#     enabled nor started; the conffiles and sandbox directories exist;
#   - before join, starting the agent is skipped by its condition, not failed;
#   - the agent's sandbox lets it write exactly the directories it manages,
#     and its watchdog restarts an agent that stops pinging;
#   - the server runs as an unprivileged dynamic user that can write only its
#     state directory;
#   - an upgrade restarts a running agent; purge leaves no unit, no state.
# The sandbox checks run a stub in place of each binary (a shell script that
# probes and speaks sd_notify), so they hold for any build of the binaries.
#
#   tests/vm/package-smoke.sh [DEB_DIR]     # DEB_DIR defaults to target/debian
#
# Build the packages first: packaging/deb/build.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

debs=$(cd "${1:-$here/../../target/debian}" 2>/dev/null && pwd) ||
  vm_die "no ${1:-target/debian} directory: run packaging/deb/build.sh first"
agent_deb=$(find "$debs" -maxdepth 1 -name 'lksadmin-agent_*.deb' | sort -V | tail -n 1)
server_deb=$(find "$debs" -maxdepth 1 -name 'lks-control-server_*.deb' | sort -V | tail -n 1)
if [ -z "$agent_deb" ] || [ -z "$server_deb" ]; then
  vm_die "lksadmin-agent_*.deb or lks-control-server_*.deb missing in $debs: run packaging/deb/build.sh first"
fi

in_vm() { vm_exec sh -c "$1"; }
prop() { vm_exec systemctl show -P "$2" "$1"; }

vm_start "$here/smoke-user-data.yaml" --bind-ro="$debs:/debs"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"

vm_log "installing $(basename "$agent_deb") $(basename "$server_deb")"
if ! out=$(vm_exec env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  "/debs/$(basename "$agent_deb")" "/debs/$(basename "$server_deb")" 2>&1); then
  printf '%s\n' "$out" | tail -n 20 >&2
  vm_die "apt-get install of the packages failed (above)"
fi

agent=lksadmin-agent.service
server=lks-control-server.service
check "agent enabled at install" in_vm "systemctl is-enabled --quiet $agent"
check "agent not started at install" in_vm "! systemctl is-active --quiet $agent"
check "server not enabled at install" in_vm "! systemctl is-enabled --quiet $server"
check "server not started at install" in_vm "! systemctl is-active --quiet $server"
check "conffiles installed" in_vm "test -f /etc/lksadmin/agent.toml && test -f /etc/default/lks-control-server"
check "sandbox directories created" in_vm "test -d /etc/kubernetes && test -d /var/lib/kubelet && test -d /opt/cni/bin"

vm_exec systemctl start "$agent"
check "agent skipped, not failed, before join" \
  test "$(prop "$agent" ConditionResult)/$(prop "$agent" Result)/$(prop "$agent" ActiveState)" = "no/success/inactive"

# The stub agent: records which directories it can write, signals READY and
# pings the watchdog (as its main process: NotifyAccess=main), and stops
# pinging when /var/lib/lksadmin/hang exists.
cat >"$VM_DIR/agent-stub" <<'STUB'
#!/bin/bash
probe=/var/lib/lksadmin/probe
: >"$probe.tmp"
for d in /etc/kubernetes /var/lib/kubelet /etc/containerd /etc/cni/net.d /opt/cni/bin \
  /usr/local/bin /etc/systemd/system /etc/sysctl.d /etc/modules-load.d /run /tmp \
  /var/lib/lksadmin /etc /usr/bin /var/lib /root /home; do
  if touch "$d/.lks-probe" 2>/dev/null; then rm -f "$d/.lks-probe"; echo "rw $d"; else echo "ro $d"; fi
done >>"$probe.tmp"
mv "$probe.tmp" "$probe"
systemd-notify --pid=$$ --ready
while sleep 1; do
  [ -e /var/lib/lksadmin/hang ] || systemd-notify --pid=$$ WATCHDOG=1
done
STUB
vm_exec install -m 0755 /dev/stdin /usr/bin/lksadmin-agent <"$VM_DIR/agent-stub"
# Seconds instead of the shipped 30 s, so the watchdog check is quick.
vm_exec mkdir -p /run/systemd/system/$agent.d
printf '[Service]\nWatchdogSec=3s\nRestartSec=1s\n' |
  vm_exec install -m 0644 /dev/stdin /run/systemd/system/$agent.d/test.conf
in_vm "mkdir -p /var/lib/lksadmin && echo '# joined (test)' >/var/lib/lksadmin/join.toml && systemctl daemon-reload"
check "agent starts once joined (READY=1)" vm_exec systemctl start "$agent"

want="rw /etc/kubernetes
rw /var/lib/kubelet
rw /etc/containerd
rw /etc/cni/net.d
rw /opt/cni/bin
rw /usr/local/bin
rw /etc/systemd/system
rw /etc/sysctl.d
rw /etc/modules-load.d
rw /run
rw /tmp
rw /var/lib/lksadmin
ro /etc
ro /usr/bin
ro /var/lib
ro /root
ro /home"
got=$(vm_exec cat /var/lib/lksadmin/probe)
if [ "$got" != "$want" ]; then
  diff <(printf '%s\n' "$want") <(printf '%s\n' "$got") >&2 || true
  vm_die "agent sandbox: writable directories differ from the expected (diff above: - expected, + got)"
fi
vm_log "ok: agent sandbox writes exactly the managed directories"
check "state directory is 0700" test "$(vm_exec stat -c %a /var/lib/lksadmin)" = 700

restarts=$(prop "$agent" NRestarts)
vm_exec touch /var/lib/lksadmin/hang
for ((i = 0; i < 100; i++)); do
  [ "$(prop "$agent" NRestarts)" -gt "$restarts" ] && break
  sleep 0.1
done
check "watchdog restarts a hung agent" test "$(prop "$agent" NRestarts)" -gt "$restarts"
vm_exec rm -f /var/lib/lksadmin/hang

# The stub server: records who it runs as and what it can write, then waits.
cat >"$VM_DIR/server-stub" <<'STUB'
#!/bin/sh
out=/var/lib/lks-control-server/probe
{
  echo "uid $(id -u)"
  for d in /var/lib/lks-control-server /tmp /etc /var/lib /usr/bin; do
    if touch "$d/.lks-probe" 2>/dev/null; then rm -f "$d/.lks-probe"; echo "rw $d"; else echo "ro $d"; fi
  done
} >"$out.tmp"
mv "$out.tmp" "$out"
exec sleep infinity
STUB
vm_exec install -m 0755 /dev/stdin /usr/bin/lks-control-server <"$VM_DIR/server-stub"
check "server starts" vm_exec systemctl start "$server"
for ((i = 0; i < 50; i++)); do
  vm_exec test -e /var/lib/lks-control-server/probe && break
  sleep 0.1
done
got=$(vm_exec cat /var/lib/lks-control-server/probe 2>/dev/null || true)
uid=$(printf '%s\n' "$got" | sed -n 's/^uid //p')
check "server runs as a dynamic user, not root (uid ${uid:-none})" test "${uid:-0}" -ge 61184
check "server sandbox writes only its state and /tmp" test "$(printf '%s\n' "$got" | grep -v '^uid ')" = "rw /var/lib/lks-control-server
rw /tmp
ro /etc
ro /var/lib
ro /usr/bin"
vm_exec systemctl stop "$server"

# Upgrade (same version, reinstalled): postinst restarts the running agent.
before=$(prop "$agent" InvocationID)
vm_exec env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall \
  "/debs/$(basename "$agent_deb")" >/dev/null 2>&1 || vm_die "reinstalling the agent package failed"
check "upgrade restarts a running agent" test "$(prop "$agent" InvocationID)" != "$before"

vm_exec env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q lksadmin-agent lks-control-server \
  >/dev/null 2>&1 || vm_die "purging the packages failed"
check "purge stops the agent" in_vm "! systemctl is-active --quiet $agent"
check "purge removes the agent's state and config" in_vm "! test -e /var/lib/lksadmin && ! test -e /etc/lksadmin"
check "purge leaves no unit or enablement link" \
  in_vm "! test -e /lib/systemd/system/$agent && ! test -e /etc/systemd/system/multi-user.target.wants/$agent && ! test -L /etc/systemd/system/$agent"
check "purge keeps the server's data" in_vm "test -e /var/lib/private/lks-control-server/probe"

vm_stop
vm_log "package-smoke: OK"
