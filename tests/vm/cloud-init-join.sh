#!/usr/bin/env bash
# End-to-end: a tenant VM's life with lksadmin, with the real packages, the
# real server and lksctl, and a booted Debian 12 "VM" (lib.sh: real systemd
# and cloud-init in systemd-nspawn, sharing the host's network):
#
#   1. build the .debs (packaging/deb/build.sh) and serve the agent's over
#      HTTP on loopback;
#   2. start lks-control-server on loopback (free port, temporary data dir),
#      `lksctl cluster create`, `lksctl token create --cloud-init
#      --package-url http://127.0.0.1:PORT/lksadmin-agent_….deb`;
#   3. boot a VM whose NoCloud user-data is that output, exactly as printed;
#      check that cloud-init accepts its schema (and that of the --apt
#      form, and of the form with --trust-key), downloaded and installed the package, ran the join
#      line and started the agent, that systemd got READY=1 (the Type=notify
#      unit is active) and watchdog pings, and that the server sees the node
#      connected;
#   4. publish and roll out tests/vm/bundles/lks-demo, whose steps run
#      `systemctl daemon-reload` and `systemctl restart lks-demo` on a unit it
#      installs: the unit runs and the node reports the bundle `applied`;
#   5. roll out examples/bundles/kubelet-node-identity (after `lksctl cluster
#      set --api-server`): the VM makes its keys, gets its kubelet client and
#      serving certificates signed by the cluster CA and a kubeconfig; checked
#      with openssl in the VM (chain, subject, SAN, key mode and match),
#      `kubectl config view` on a copy of the kubeconfig, `lksctl node get`
#      (2 certificates), and the key's absence from the server's data and
#      log; then the key is deleted and the agent restores the same bytes;
#   6. kill -9 the agent's main process: systemd restarts it, it reconnects,
#      the bundle stays applied and is not activated again;
#   7. boot a second VM from `lksctl token create --cloud-init` without
#      --package-url: its user-data downloads the package from the control
#      server itself (started with --agent-package) over HTTPS, curl checking
#      the server against the CA the user-data carries; the VM installs,
#      joins, starts the agent, and gets the cluster's lks-demo and its own
#      kubelet identity applied without a new rollout.
#
#   tests/vm/cloud-init-join.sh [--profile release|dev] [--no-lint] [--no-build]
#
#   --profile dev   pack the debug binaries (also LKS_DEB_PROFILE=dev). CI
#                   does this: scripts/test.sh has built them already, and a
#                   release build would cost minutes. The packages are then
#                   test-only; the behaviour checked here is the same.
#   --no-lint       skip lintian in build.sh
#   --no-build      use the packages in target/debian and the binaries of the
#                   profile as they are
#
# CI (.ci/run) runs it with --profile dev; where namespaces cannot be created
# (an unprivileged container) CI runs a reduced form instead: the packages
# are built and linted, no VM boots.
#
# Environment: LKS_VM_TIMEOUT (boot, default 300 s), LKS_VM_KEEP=1 (keep the
# VM directory and the server's data), LKS_VM_CACHE (see build-root.sh).
# Needs root. Progress goes to stderr; on failure the logs of the server, the
# agent and cloud-init, then one last line `vm: FAIL: …`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

usage="usage: tests/vm/cloud-init-join.sh [--profile release|dev] [--no-lint] [--no-build]"
vm_parse_args "$usage" "$@"
bin=$VM_BIN

CLUSTER=vm-test
# Seconds instead of the shipped 30 s and 5 s, so that "no restart over more
# than one watchdog period" and "restarted after kill -9" take seconds. The
# agent derives its ping interval from WATCHDOG_USEC, whatever the value.
WATCHDOG_SEC=3

work=$(mktemp -d "${TMPDIR:-/tmp}/lks-cloud-init-join.XXXXXX")
HTTP_PID=""


on_exit() {
  stop_pid "$HTTP_PID"
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
  if [ -s "$work/http.log" ]; then
    section "HTTP server log (last 10 lines)"
    tail -n 10 "$work/http.log" >&2
  fi
  if [ -n "${VM_PID:-}" ] && kill -0 "$VM_PID" 2>/dev/null; then
    section "cloud-init-output.log in the VM (last 30 lines)"
    vm_exec tail -n 30 /var/log/cloud-init-output.log >&2 || true
    section "journalctl -u lksadmin-agent in the VM (last 40 lines)"
    vm_exec journalctl -u lksadmin-agent --no-pager -n 40 >&2 || true
  fi
}
VM_DIAG_HOOK=diagnose

# The drop-in a test image carries for the short watchdog (see WATCHDOG_SEC).
preboot() {
  local d=$1/etc/systemd/system/lksadmin-agent.service.d
  mkdir -p "$d"
  printf '# cloud-init-join.sh: short periods for the test\n[Service]\nWatchdogSec=%s\nRestartSec=1s\n' \
    "$WATCHDOG_SEC" >"$d/50-vm-test.conf"
}
VM_PREBOOT_HOOK=preboot




apt_install() {
  vm_log "installing $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

[ "$(id -u)" -eq 0 ] || vm_die "must run as root (systemd-nspawn needs it)"
command -v jq >/dev/null || apt_install jq
command -v curl >/dev/null || apt_install curl ca-certificates
# Reads the node's kubeconfig (the VM has no kubectl).
command -v kubectl >/dev/null || apt_install kubernetes-client
# A static file server for the package: python3's when there is one, else
# busybox's httpd (both a few MB; CI machines have python3).
if python3 -c 'import http.server' 2>/dev/null; then
  httpd=python3
else
  command -v busybox >/dev/null || apt_install busybox
  httpd=busybox
fi

# --- 1. packages ------------------------------------------------------------
vm_packages "$work"
agent_deb=$VM_AGENT_DEB
deb_name=$(basename "$agent_deb")
vm_log "package: $deb_name ($(du -h "$agent_deb" | cut -f1))"

# Built before the server starts, so a cold cache (a minute or two) does not
# eat into anything that has a timeout.
"$here/build-root.sh" >/dev/null || vm_die "could not build the VM root (see above)"

mkdir -p "$work/www"
cp "$agent_deb" "$work/www/"
http_port=$(free_port) || vm_die "no free port for the HTTP server"
if [ "$httpd" = python3 ]; then
  python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$http_port" >"$work/http.log" 2>&1 &
else
  busybox httpd -f -p "127.0.0.1:$http_port" -h "$work/www" >"$work/http.log" 2>&1 &
fi
HTTP_PID=$!
package_url=http://127.0.0.1:$http_port/$deb_name
http_up() {
  kill -0 "$HTTP_PID" 2>/dev/null || vm_die "the HTTP server ($httpd) exited"
  curl -fsS -o /dev/null "$package_url" 2>/dev/null
}
wait_for "serving $package_url ($httpd)" 20 http_up

# --- 2. control server, cluster, token ---------------------------------------
vm_server "$work" --agent-package "$agent_deb"
lksctl() { "$bin/lksctl" --config "$work/server/admin.conf" "$@"; }

lksctl cluster create "$CLUSTER" >/dev/null || vm_die "lksctl cluster create failed"
lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1 --cloud-init \
  --package-url "$package_url" >"$work/user-data" || vm_die "lksctl token create --cloud-init failed"
# The one shell line of the user-data (a JSON string item of runcmd).
join_line=$(sed -n 's/^  - "\(lksadmin-agent join .*\)"$/\1/p' "$work/user-data")
[ -n "$join_line" ] || vm_die "no join line in the user-data lksctl printed"
section "user-data from lksctl token create --cloud-init"
cat "$work/user-data" >&2
# The --apt form (package from the image's apt repositories) is only
# schema-checked below: this image has no repository that serves the agent.
lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1 --cloud-init --apt >"$work/user-data-apt" ||
  vm_die "lksctl token create --cloud-init --apt failed"
# The form with trusted publisher keys and signed releases required (keys in
# write_files, passed to the join line): schema-checked below too.
lksctl bundle keygen --out "$work/publisher" >/dev/null || vm_die "lksctl bundle keygen failed"
lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1 --cloud-init --apt \
  --trust-key "$work/publisher.pub" --trust-threshold 1 >"$work/user-data-trust" ||
  vm_die "lksctl token create --cloud-init --trust-key failed"

# --- 3. boot, cloud-init, agent ----------------------------------------------
vm_start "$work/user-data"
# Validated by the cloud-init inside the image, as the VM received it.
if ! out=$(vm_exec cloud-init schema --config-file /var/lib/cloud/seed/nocloud/user-data 2>&1); then
  printf '%s\n' "$out" >&2
  vm_die "cloud-init schema rejects the user-data (above)"
fi
vm_log "ok: cloud-init schema: $out"
vm_exec sh -c 'cat >/run/user-data-apt.yaml' <"$work/user-data-apt"
if ! out=$(vm_exec cloud-init schema --config-file /run/user-data-apt.yaml 2>&1); then
  printf '%s\n' "$out" "--- the user-data:" >&2
  cat "$work/user-data-apt" >&2
  vm_die "cloud-init schema rejects the user-data of --cloud-init --apt (above)"
fi
vm_log "ok: cloud-init schema of the apt form: $out"
vm_exec sh -c 'cat >/run/user-data-trust.yaml' <"$work/user-data-trust"
if ! out=$(vm_exec cloud-init schema --config-file /run/user-data-trust.yaml 2>&1); then
  printf '%s\n' "$out" "--- the user-data:" >&2
  cat "$work/user-data-trust" >&2
  vm_die "cloud-init schema rejects the user-data of --cloud-init --trust-key (above)"
fi
vm_log "ok: cloud-init schema of the form with trusted keys: $out"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
# And at boot: cloud-init logs a schema warning (not an error) for any key it
# finds invalid in the user-data or the image's own configuration.
check "cloud-init logged no schema warning at boot" \
  vm_exec sh -c '! grep "Invalid cloud-config" /var/log/cloud-init.log >&2'

prop() { vm_exec systemctl show -P "$1" lksadmin-agent.service; }
agent_status() { vm_exec cat /var/lib/lksadmin/status.json; }
node_json() { lksctl node list --cluster "$CLUSTER" -o json | jq -c --arg n "$VM_NAME" '.[] | select(.name == $n)'; }

# shellcheck disable=SC2016 # ${Status} is dpkg-query's field, not the shell's
pkg_status=$(vm_exec dpkg-query -W -f='${Status}' lksadmin-agent 2>/dev/null) || true
check "cloud-init downloaded and installed $deb_name" test "$pkg_status" = "install ok installed"
check "cloud-init ran the join line exactly as printed" \
  vm_exec grep -qxF "$join_line" /var/lib/cloud/instance/scripts/runcmd
check "the join enrolled node $VM_NAME into cluster $CLUSTER" \
  vm_exec grep -q "^node $VM_NAME joined cluster $CLUSTER " /var/log/cloud-init-output.log
check "systemctl is-active lksadmin-agent" vm_exec systemctl is-active --quiet lksadmin-agent
check "lksadmin-agent is enabled" vm_exec systemctl is-enabled --quiet lksadmin-agent
# A Type=notify unit turns active only on READY=1; STATUS= shows the agent's
# own messages reached systemd.
check "READY=1 received (Type=$(prop Type), status: $(prop StatusText))" \
  test "$(prop Type)/$(prop ActiveState)/$(prop SubState)" = notify/active/running
check "the agent's watchdog is armed (WatchdogUSec=$(prop WatchdogUSec))" \
  test "$(prop WatchdogUSec)" != 0

pid0=$(prop MainPID)
ping0=$(prop WatchdogTimestampMonotonic)
# Longer than one watchdog period: a missing ping would have restarted it.
sleep $((WATCHDOG_SEC + 2))
ping1=$(prop WatchdogTimestampMonotonic)
check "watchdog pings arrive (last ping moved ${ping0}us -> ${ping1}us)" test "$ping1" -gt "$ping0"
check "no restart over $((WATCHDOG_SEC + 2))s: NRestarts=$(prop NRestarts), same MainPID" \
  test "$(prop NRestarts)/$(prop MainPID)" = "0/$pid0"

connected() { [ "$(node_json | jq -r .connected)" = true ]; }
wait_for "the server lists $VM_NAME as connected" 30 connected

# --- 4. a bundle that restarts a unit it installs ----------------------------
bundle_ref=$(lksctl bundle publish "$here/bundles/lks-demo") || vm_die "lksctl bundle publish failed"
vm_log "published $bundle_ref"
if ! timeout 180 "$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
  --bundle "$bundle_ref" --wait >"$work/rollout.out" 2>&1; then
  cat "$work/rollout.out" >&2
  lksctl node list --cluster "$CLUSTER" -o json >&2 || true
  vm_die "rollout of $bundle_ref did not complete"
fi
vm_log "ok: rollout of $bundle_ref completed"
bundle_state() { node_json | jq -r '.bundles[] | select(.name == "lks-demo") | .state'; }
check "lksctl node list shows lks-demo applied on $VM_NAME" test "$(bundle_state)" = applied
check "the bundle's unit is installed and active (systemctl is-active lks-demo)" \
  vm_exec systemctl is-active --quiet lks-demo
demo_pid=$(vm_exec systemctl show -P MainPID lks-demo)
check "the unit runs the bundle's script (pid $demo_pid)" \
  test "$(vm_exec cat /run/lks-demo/pid)" = "$demo_pid"

# --- 5. the node's kubelet identity -------------------------------------------
# examples/bundles/kubelet-node-identity as a tenant would roll it out: keys
# made in the VM, certificates signed by the cluster CA over IssueCertificate,
# a kubeconfig for them. openssl runs in the VM (the root has it, as a
# dependency of ca-certificates); kubectl on the host, on a copy of the
# kubeconfig, since the VM has none.
api_server=https://api.$CLUSTER.example:6443
pki=/var/lib/kubelet/pki
lksctl cluster set "$CLUSTER" --api-server "$api_server" >/dev/null ||
  vm_die "lksctl cluster set $CLUSTER --api-server $api_server failed"
identity_ref=$(lksctl bundle publish "$repo/examples/bundles/kubelet-node-identity") ||
  vm_die "lksctl bundle publish examples/bundles/kubelet-node-identity failed"
vm_log "published $identity_ref"
if ! timeout 120 "$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
  --bundle "$identity_ref" --wait >"$work/rollout-identity.out" 2>&1; then
  cat "$work/rollout-identity.out" >&2
  lksctl node list --cluster "$CLUSTER" -o json >&2 || true
  vm_die "rollout of $identity_ref did not complete"
fi
vm_log "ok: rollout of $identity_ref completed"
identity_state() { node_json | jq -r '.bundles[] | select(.name == "kubelet-node-identity") | .state'; }
check "lksctl node list shows kubelet-node-identity applied on $VM_NAME" test "$(identity_state)" = applied
# The VM has no kubelet: the bundle's step only reloads systemd, and succeeds.
check "the step lks-kubelet-restart succeeds on a node without kubelet.service" \
  vm_exec sh -c '! systemctl cat kubelet.service >/dev/null 2>&1 &&
    /usr/local/bin/lks-kubelet-restart | grep -qx "lks-kubelet-restart: no kubelet.service on this node yet"'

lksctl cluster ca "$CLUSTER" >"$work/cluster-ca.crt" || vm_die "lksctl cluster ca $CLUSTER failed"
vm_exec sh -c 'cat >/run/lks-test-cluster-ca.crt' <"$work/cluster-ca.crt"
check "the node's /etc/kubernetes/pki/ca.crt is the cluster CA" \
  cmp -s "$work/cluster-ca.crt" <(vm_exec cat /etc/kubernetes/pki/ca.crt)
for cert in "$pki/kubelet-client.crt" "$pki/kubelet.crt"; do
  check "openssl verify -CAfile <cluster CA> $cert" \
    vm_exec openssl verify -CAfile /run/lks-test-cluster-ca.crt "$cert" >/dev/null
done
subject=$(vm_exec openssl x509 -noout -subject -in "$pki/kubelet-client.crt") || subject=""
check "the client certificate is system:node:$VM_NAME in system:nodes ($subject)" \
  grep -qE "^subject=(CN = system:node:$VM_NAME, O = system:nodes|O = system:nodes, CN = system:node:$VM_NAME)\$" <<<"$subject"
check "the serving certificate names DNS:$VM_NAME" \
  vm_exec sh -c "openssl x509 -noout -ext subjectAltName -in $pki/kubelet.crt | grep -qF 'DNS:$VM_NAME'"
check "$pki/kubelet-client.key is mode 0600, owned by root" \
  test "$(vm_exec stat -c %a:%U "$pki/kubelet-client.key")" = 600:root
key_pub=$(vm_exec openssl pkey -pubout -in "$pki/kubelet-client.key") || key_pub=""
cert_pub=$(vm_exec openssl x509 -noout -pubkey -in "$pki/kubelet-client.crt") || cert_pub=""
check "the client key matches its certificate (openssl pkey -pubout = x509 -pubkey)" \
  test -n "$key_pub" -a "$key_pub" = "$cert_pub"

check "/etc/kubernetes/kubelet.conf is mode 0600" \
  test "$(vm_exec stat -c %a /etc/kubernetes/kubelet.conf)" = 600
vm_exec cat /etc/kubernetes/kubelet.conf >"$work/kubelet.conf"
kubeconfig=$(kubectl config view --kubeconfig "$work/kubelet.conf" --raw -o json) ||
  vm_die "kubectl config view rejects the node's /etc/kubernetes/kubelet.conf"
check "kubelet.conf: server $api_server, user system:node:$VM_NAME with $pki/kubelet-client.crt" \
  test "$(jq -r '[.clusters[0].cluster.server, .users[0].name, .users[0].user["client-certificate"],
    .users[0].user["client-key"]] | join(" ")' <<<"$kubeconfig")" = \
  "$api_server system:node:$VM_NAME $pki/kubelet-client.crt $pki/kubelet-client.key"
check "kubelet.conf carries the cluster CA" \
  cmp -s "$work/cluster-ca.crt" <(jq -r '.clusters[0].cluster["certificate-authority-data"]' <<<"$kubeconfig" | base64 -d)

node_certs=$(lksctl node get "$VM_NAME" -o json | jq -r '[.certificates[] | .profile] | sort | join(" ")') ||
  vm_die "lksctl node get $VM_NAME -o json failed"
check "lksctl node get lists the node's 2 certificates ($node_certs)" \
  test "$node_certs" = "kubelet-client kubelet-serving"
# The key never leaves the node: no line of its body is on the server.
key_pem=$(vm_exec cat "$pki/kubelet-client.key") || vm_die "cannot read $pki/kubelet-client.key in the VM"
awk '!/^-----/ && length >= 40' <<<"$key_pem" >"$work/key-lines"
check "read the client key's body ($(wc -l <"$work/key-lines") lines)" test -s "$work/key-lines"
# grep: 1 is "no line found"; 2 (an unreadable file) is no proof.
key_absent() {
  local rc=0
  grep -rqF -f "$work/key-lines" "$work/server" "$work/server.log" || rc=$?
  [ "$rc" = 1 ]
}
check "the client key is nowhere in the server's data dir or log" key_absent

# Drift: the agent heals on inotify (within about a second; its periodic pass
# runs every 60 s, longer than this waits).
key_sum=$(vm_exec sha256sum "$pki/kubelet-client.key" | cut -d' ' -f1)
vm_exec rm "$pki/kubelet-client.key"
vm_log "deleted $pki/kubelet-client.key in the VM"
key_back() {
  [ "$(vm_exec sha256sum "$pki/kubelet-client.key" 2>/dev/null | cut -d' ' -f1)" = "$key_sum" ] &&
    [ "$(vm_exec stat -c %a "$pki/kubelet-client.key")" = 600 ]
}
wait_for "the agent restored $pki/kubelet-client.key, same bytes and mode 0600" 15 key_back
key_repaired() {
  lksctl event list --node "$VM_NAME" -o json |
    jq -e --arg k "$pki/kubelet-client.key" \
      'any(.[]; .kind == "repaired" and (.message | contains($k)))' >/dev/null
}
wait_for "the server got the node's event: repaired $pki/kubelet-client.key" 10 key_repaired
check "kubelet-node-identity still applied after the repair" test "$(identity_state)" = applied

# --- 6. kill -9 ---------------------------------------------------------------
restarts=$(prop NRestarts)
pid1=$(prop MainPID)
vm_exec kill -9 "$pid1"
vm_log "killed the agent (pid $pid1 in the VM) with SIGKILL"
restarted() {
  local pid
  pid=$(prop MainPID)
  [ "$(prop NRestarts)" -gt "$restarts" ] && [ "$(prop ActiveState)" = active ] &&
    [ "$pid" != 0 ] && [ "$pid" != "$pid1" ]
}
wait_for "systemd restarted the agent (NRestarts $restarts -> more, READY=1 again)" 30 restarted
pid2=$(prop MainPID)
reconnected() {
  local s
  s=$(agent_status) || return 1
  [ "$(jq -r '"\(.pid) \(.connected)"' <<<"$s")" = "$pid2 true" ] && connected
}
wait_for "the new agent (pid $pid2) reconnected; the server lists the node connected" 30 reconnected
check "lks-demo still applied after the restart" test "$(bundle_state)" = applied
check "lks-demo still active and not activated again (same pid $demo_pid)" \
  test "$(vm_exec systemctl show -P MainPID lks-demo)" = "$demo_pid"

# --- 7. a second VM: the package from the control server itself --------------
vm_stop
lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1 --cloud-init >"$work/user-data-server" ||
  vm_die "lksctl token create --cloud-init (package from the server) failed"
check "the user-data writes the cluster CA for curl (write_files)" grep -q '^write_files:' "$work/user-data-server"
section "user-data from lksctl token create --cloud-init (no --package-url)"
cat "$work/user-data-server" >&2
package_requests() {
  curl -fsS "http://127.0.0.1:$VM_METRICS_PORT/metrics" |
    sed -n 's/^lks_agent_package_requests_total{result="ok"} //p'
}
served_before=$(package_requests)
vm_start "$work/user-data-server"
if ! out=$(vm_exec cloud-init schema --config-file /var/lib/cloud/seed/nocloud/user-data 2>&1); then
  printf '%s\n' "$out" >&2
  vm_die "cloud-init schema rejects the user-data without --package-url (above)"
fi
vm_log "ok: cloud-init schema: $out"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
check "cloud-init logged no schema warning at boot" \
  vm_exec sh -c '! grep "Invalid cloud-config" /var/log/cloud-init.log >&2'
served_after=$(package_requests)
check "the VM downloaded the package from the control server (downloads: ${served_before:-0} -> $served_after)" \
  test "${served_after:-0}" -gt "${served_before:-0}"
# shellcheck disable=SC2016 # ${Status} is dpkg-query's field, not the shell's
pkg_status=$(vm_exec dpkg-query -W -f='${Status}' lksadmin-agent 2>/dev/null) || true
check "cloud-init installed $deb_name from the server" test "$pkg_status" = "install ok installed"
check "the bootstrap CA and the .deb were removed from /run" \
  vm_exec sh -c 'test ! -e /run/lksadmin-bootstrap-ca.pem && test ! -e /run/lksadmin-agent.deb'
check "the join enrolled node $VM_NAME into cluster $CLUSTER" \
  vm_exec grep -q "^node $VM_NAME joined cluster $CLUSTER " /var/log/cloud-init-output.log
check "READY=1 received: lksadmin-agent is active" \
  test "$(prop Type)/$(prop ActiveState)/$(prop SubState)" = notify/active/running
wait_for "the server lists $VM_NAME as connected" 30 connected
applied() { [ "$(bundle_state)" = applied ]; }
wait_for "the new node got the cluster's $bundle_ref applied without a rollout" 60 applied
check "its lks-demo unit is active" vm_exec systemctl is-active --quiet lks-demo
identity_applied() { [ "$(identity_state)" = applied ]; }
wait_for "the new node got $identity_ref applied without a rollout" 30 identity_applied
subject=$(vm_exec openssl x509 -noout -subject -in "$pki/kubelet-client.crt") || subject=""
check "its client certificate is its own: system:node:$VM_NAME ($subject)" \
  grep -qF "CN = system:node:$VM_NAME" <<<"$subject"

vm_stop
vm_log "cloud-init-join: OK"
