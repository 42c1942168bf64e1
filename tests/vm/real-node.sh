#!/usr/bin/env bash
# End-to-end: a VM becomes a real Kubernetes node of a real tenant cluster
# and is kept one — everything real but the cloud: the real packages, server
# and lksctl, a booted Debian 12 "VM" (lib.sh), a tenant control plane made
# with kubeadm's phases (tenant.sh), a real kubelet (v1.36.3, then v1.37.2,
# built by scripts/kube.sh) and a real container runtime (Debian's
# containerd 1.6 and runc in the VM):
#
#   1. the node image: the VM root (build-root.sh: containerd, runc, CNI
#      plugins, kubeadm's preflight tools) gets, before boot, what a kubeadm
#      node image carries: kubelet v1.36.3 and kubeadm v1.37.2 in /usr/bin,
#      kubelet.service and kubeadm's 10-kubeadm.conf, containerd's config, a
#      CNI conflist and a locally built pause image (node-image/);
#   2. a tenant control plane (tenant.sh) and lks-control-server with the
#      tenant's kubeconfig (`cluster set --kubeconfig`); the VM boots with the
#      user-data of `lksctl token create --cloud-init` exactly as printed;
#   3. the shipped examples/bundles/kubeadm-join, its env filled for this
#      tenant → a real `kubeadm join` (token discovery, TLS bootstrap) → the
#      Node registers and turns Ready; `lksctl node list` shows KUBE Ready
#      and kubelet v1.36.3;
#   4. the shipped examples/bundles/kubelet-upgrade pinned (pin.sh) to
#      v1.36.3 from a mirror on loopback, the version the node runs, so that
#      the next one has a version to roll back to;
#   5. a pod bound to the node (run for real: the pause image) and a
#      PodDisruptionBudget; `rollout start --drain --kubelet-version v1.37.2`
#      of kubelet-upgrade pinned to v1.37.2 → cordon, the pod evicted, the
#      kubelet replaced and restarted, the Ready gate reads the real
#      kubeletVersion v1.37.2, uncordon;
#   6. a broken kubelet (a drop-in with a flag the kubelet refuses) → the
#      health check fails → rollback restores v1.37.2's files and re-runs its
#      steps → the Node is Ready again at v1.37.2;
#   7. drift: the kubelet's drop-in deleted on the node, then edited by hand
#      to run the image's old kubelet (and that kubelet started) → restored
#      by the agent (inotify, then a heal pass), whose on_heal steps reload
#      systemd and restart the kubelet → the bundle's kubelet runs again and
#      the Node is Ready at v1.37.2;
#   8. a rolling reboot: `cluster set --reboots manual`, `lksctl reboot
#      start` → the reboot lock cordons and drains the node → the agent runs
#      `systemctl reboot` in the VM → systemd-nspawn exits 133 and the
#      harness boots the VM again (vm_reboot_wait, as a hypervisor would) →
#      the agent is back with a new boot ID and reports the reboot done →
#      the Ready gate → uncordoned, `reboot status` done, the kubelet runs
#      again and the Node is Ready at v1.37.2.
#
#   tests/vm/real-node.sh [--profile release|dev] [--no-lint] [--no-build]
#
# The options are cloud-init-join.sh's. CI runs it with --profile dev
# --no-build after cloud-init-join.sh (whose packages it reuses).
#
# The VM's deviations from a real one (tests/vm/README.md, "real-node.sh"):
# systemd-nspawn arguments (all capabilities, /dev/kmsg, keyring and bpf
# system calls, a real directory for /var/lib/containerd), writable cgroup v1
# controllers, and three kernel settings the kubelet wants set on the host
# for the test's duration (kernel.panic, kernel.panic_on_oops,
# vm.overcommit_memory) plus net.ipv4.ip_forward (kubeadm's preflight); the
# host's values are restored at exit. The kubelet settings this host needs
# (cgroup v1, cgroupfs, no swap check, low eviction thresholds) are the
# tenant cluster's KubeletConfiguration, which kubeadm uploads and every
# joining node gets.
#
# Environment: LKS_VM_KEEP=1 (keep the VM directory and the work dir),
# LKS_VM_CACHE (see build-root.sh), LKS_DEBUG_SLEEP=SECS (on a failure, keep
# the VM running SECS seconds after the diagnostics, to look inside with
# nsenter -t LEADER -a). Needs root.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
# shellcheck source-path=SCRIPTDIR source=tenant.sh
. "$here/tenant.sh"

usage="usage: tests/vm/real-node.sh [--profile release|dev] [--no-lint] [--no-build]"
vm_parse_args "$usage" "$@"
bin=$VM_BIN

CLUSTER=real-node
OLD=v1.36.3
NEW=v1.37.2
# containerd's state must be on a real file system (its overlayfs snapshots
# cannot sit on the VM's overlay root): not tmpfs either.
work=$(mktemp -d "${LKS_REAL_NODE_TMP:-/var/tmp}/lks-real-node.XXXXXX")
HTTP_PID=""
ROLLOUT_PID=""
SYSCTLS=(kernel.panic=10 kernel.panic_on_oops=1 vm.overcommit_memory=1 net.ipv4.ip_forward=1)
SAVED_SYSCTLS=()

on_exit() {
  stop_pid "$ROLLOUT_PID"
  stop_pid "$HTTP_PID"
  tenant_stop
  local kv
  for kv in "${SAVED_SYSCTLS[@]}"; do
    sysctl -q -w "$kv" >/dev/null 2>&1 || true
  done
  # The VM's kubelet and runc made cgroups in the host's hierarchies (the VM
  # has no cgroup namespace on a v1 host); empty once the VM is gone.
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/*/system.slice/kubelet.service; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  if [ "${LKS_VM_KEEP:-0}" = 1 ]; then
    vm_log "kept $work (LKS_VM_KEEP=1)"
  else
    rm -rf --one-file-system "$work"
  fi
}
VM_EXIT_HOOK=on_exit

diagnose() {
  if [ -s "$work/server.log" ]; then
    section "lks-control-server log (last 30 lines)"
    tail -n 30 "$work/server.log" >&2
  fi
  tenant_diagnose
  if [ -n "${TENANT_ADMIN_CONF:-}" ]; then
    section "tenant nodes and pods"
    tenant_kubectl get nodes -o wide >&2 || true
    tenant_kubectl get pods -A -o wide >&2 || true
  fi
  if [ -n "${VM_PID:-}" ] && kill -0 "$VM_PID" 2>/dev/null; then
    section "journalctl -u lksadmin-agent in the VM (last 40 lines)"
    vm_exec journalctl -u lksadmin-agent --no-pager -n 40 >&2 || true
    section "journalctl -u kubelet in the VM (last 30 lines)"
    vm_exec journalctl -u kubelet --no-pager -n 30 >&2 || true
    section "journalctl -u containerd in the VM (last 10 lines)"
    vm_exec journalctl -u containerd --no-pager -n 10 >&2 || true
  fi
}
VM_DIAG_HOOK=diagnose
if [ -n "${LKS_DEBUG_SLEEP:-}" ]; then
  debug_diagnose() { diagnose; vm_log "LKS_DEBUG_SLEEP: VM leader $VM_LEADER"; sleep "$LKS_DEBUG_SLEEP"; }
  VM_DIAG_HOOK=debug_diagnose
fi

[ "$(id -u)" -eq 0 ] || vm_die "must run as root (systemd-nspawn needs it)"
for tool in jq curl python3 openssl cc etcd; do
  command -v "$tool" >/dev/null || vm_die "$tool not found (scripts/setup.sh and .ci/run install it)"
done

# --- binaries -----------------------------------------------------------------
vm_log "node binaries: kubelet and kubeadm $NEW (tests/kube), kubelet $OLD (tests/kubelet-1.36)"
bash "$repo/scripts/kube.sh" || vm_die "scripts/kube.sh failed"
bash "$repo/scripts/kube.sh" tests/kubelet-1.36 || vm_die "scripts/kube.sh tests/kubelet-1.36 failed"
new_bin=$(bash "$repo/scripts/kube.sh" --print-dir)/bin
old_bin=$(bash "$repo/scripts/kube.sh" tests/kubelet-1.36 --print-dir)/bin
check "kubelet $OLD built" test "$("$old_bin/kubelet" --version)" = "Kubernetes $OLD"
check "kubelet $NEW built" test "$("$new_bin/kubelet" --version)" = "Kubernetes $NEW"

vm_packages "$work"
agent_deb=$VM_AGENT_DEB
"$here/build-root.sh" >/dev/null || vm_die "could not build the VM root (see above)"

# The pause image: a static pause process in a one-layer image.
cc -static -Os -s -o "$work/pause" "$here/node-image/pause.c" || vm_die "cc pause.c failed"
python3 "$here/node-image/pause-image.py" "$work/pause" lksadmin.test/pause:1 "$work/pause.tar" ||
  vm_die "pause-image.py failed"

# --- a mirror on loopback, laid out like dl.k8s.io/release -------------------
www=$work/www
for v in "$OLD" "$NEW"; do
  d=$www/release/$v/bin/linux/amd64
  mkdir -p "$d"
  src=$new_bin
  [ "$v" = "$OLD" ] && src=$old_bin
  cp "$src/kubelet" "$d/kubelet"
  # What the release publishes beside each binary (pin.sh checks it).
  (cd "$d" && sha256sum kubelet | cut -d' ' -f1 >kubelet.sha256)
done
cp "$agent_deb" "$www/"
http_port=$(free_port) || vm_die "no free port for the mirror"
python3 -m http.server --bind 127.0.0.1 --directory "$www" "$http_port" >"$work/http.log" 2>&1 &
HTTP_PID=$!
mirror=http://127.0.0.1:$http_port
mirror_up() { curl -fsS -o /dev/null "$mirror/release/$OLD/bin/linux/amd64/kubelet.sha256"; }
wait_for "a mirror on $mirror" 20 mirror_up

# --- host settings the kubelet and kubeadm want --------------------------------
for kv in "${SYSCTLS[@]}"; do
  key=${kv%%=*}
  SAVED_SYSCTLS+=("$key=$(sysctl -n "$key")")
  sysctl -q -w "$kv" >/dev/null || vm_die "sysctl -w $kv failed"
done

# --- 2. the tenant control plane and lksadmin -----------------------------------
# What every node of this tenant cluster gets as its kubelet configuration
# (kubeadm uploads it; join writes it to /var/lib/kubelet/config.yaml).
TENANT_KUBELET_CONFIG='apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host is cgroup v1, which kubelet >= 1.35 refuses unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# The test host'"'"'s disk is shared with everything else: no disk pressure
# taint for a test node at 85 % usage.
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false'
tenant_start "$work/tenant"

vm_server "$work"
lksctl() { "$bin/lksctl" --config "$work/server/admin.conf" "$@"; }
lksctl cluster create "$CLUSTER" >/dev/null || vm_die "lksctl cluster create failed"
lksctl cluster set "$CLUSTER" --kubeconfig "$TENANT_ADMIN_CONF" >"$work/cluster-set.out" 2>&1 ||
  vm_die "lksctl cluster set --kubeconfig failed: $(cat "$work/cluster-set.out")"
vm_log "ok: $(cat "$work/cluster-set.out")"
lksctl token create --cluster "$CLUSTER" --ttl 1h --uses 1 --cloud-init \
  --package-url "$mirror/$(basename "$agent_deb")" >"$work/user-data" ||
  vm_die "lksctl token create --cloud-init failed"

# --- 1. the node image ------------------------------------------------------------
image() {
  local r=$1 ni=$here/node-image
  install -m 0755 "$old_bin/kubelet" "$r/usr/bin/kubelet"
  install -m 0755 "$new_bin/kubeadm" "$r/usr/bin/kubeadm"
  install -m 0644 "$ni/kubelet.service" "$r/lib/systemd/system/kubelet.service"
  install -D -m 0644 "$ni/10-kubeadm.conf" "$r/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"
  install -D -m 0644 "$ni/containerd.toml" "$r/etc/containerd/config.toml"
  install -D -m 0644 "$ni/10-lks-loopback.conflist" "$r/etc/cni/net.d/10-lks-loopback.conflist"
  install -D -m 0644 "$work/pause.tar" "$r/usr/share/lks-vm/pause.tar"
  install -m 0644 "$ni/lks-vm-cgroups.service" "$ni/lks-vm-images.service" "$ni/lks-vm-boot-id.service" \
    "$r/etc/systemd/system/"
  install -D -m 0644 "$ni/10-lks-vm-boot-id.conf" "$r/etc/systemd/system/lksadmin-agent.service.d/10-lks-vm-boot-id.conf"
  local wants=$r/etc/systemd/system/multi-user.target.wants u
  for u in /lib/systemd/system/containerd.service /lib/systemd/system/kubelet.service \
    /etc/systemd/system/lks-vm-cgroups.service /etc/systemd/system/lks-vm-images.service \
    /etc/systemd/system/lks-vm-boot-id.service; do
    ln -sf "$u" "$wants/$(basename "$u")"
  done
}
VM_PREBOOT_HOOK=image
mkdir -p "$work/containerd"
vm_start "$work/user-data" --capability=all --bind=/dev/kmsg \
  --system-call-filter="@keyring bpf" --bind="$work/containerd:/var/lib/containerd"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
NODE=$VM_NAME

node_json() { lksctl node list --cluster "$CLUSTER" -o json | jq -c --arg n "$NODE" '.[] | select(.name == $n)'; }
connected() { [ "$(node_json | jq -r .connected)" = true ]; }
wait_for "the agent joined lksadmin; the server lists $NODE connected" 60 connected
check "containerd runs in the VM" vm_exec systemctl is-active --quiet containerd
check "the pause image is imported" vm_exec ctr --namespace k8s.io images check name==lksadmin.test/pause:1

# rollout NAME REF [ARG...]: rollout start --wait, or fail with its output.
rollout() {
  local what=$1 ref=$2
  shift 2
  if ! timeout 600 "$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
    --bundle "$ref" --wait "$@" >"$work/rollout-$what.out" 2>&1; then
    cat "$work/rollout-$what.out" >&2
    node_json >&2 || true
    vm_die "rollout of $ref did not complete"
  fi
  vm_log "ok: rollout of $ref completed"
}
bundle_state() { node_json | jq -r --arg b "$1" '.bundles[] | select(.name == $b) | "\(.version) \(.state)"'; }
kube_node() { tenant_kubectl get node "$NODE" -o json 2>/dev/null; }
node_ready() { kube_node | jq -e '.status.conditions[] | select(.type == "Ready") | .status == "True"' >/dev/null; }
kubelet_version() { kube_node | jq -r .status.nodeInfo.kubeletVersion; }

# --- 3. kubeadm join ----------------------------------------------------------------
cp -r "$repo/examples/bundles/kubeadm-join" "$work/kubeadm-join"
cat >"$work/kubeadm-join/kubeadm-join.env" <<ENV
API_SERVER="$TENANT_API"
TOKEN="$TENANT_TOKEN"
CA_CERT_HASH="$TENANT_CA_HASH"
NODE_LABELS="lksadmin.io/test=real-node"
# The test VM's deviations (tests/vm/README.md): no kernel config for the
# system verification to read, cgroup v1.
IGNORE_PREFLIGHT_ERRORS="SystemVerification"
ENV
join_ref=$(lksctl bundle publish "$work/kubeadm-join") || vm_die "lksctl bundle publish kubeadm-join failed"
rollout join "$join_ref"
check "kubeadm-join applied on $NODE" test "$(bundle_state kubeadm-join | cut -d' ' -f2)" = applied
wait_for "the Node $NODE registered and is Ready in the tenant API" 180 node_ready
check "the Node reports kubelet $OLD" test "$(kubelet_version)" = "$OLD"
kube_col() { node_json | jq -r '"\(.kube.ready) \(.kube.kubelet_version)"'; }
lksctl node list --cluster "$CLUSTER" >&2
vm_log "node list kube: $(node_json | jq -c .kube)"
kube_col_is() { [ "$(kube_col)" = "$1" ]; }
# The server reads the tenant API's Nodes every few seconds.
wait_for "lksctl node list: KUBE Ready, kubelet $OLD" 60 kube_col_is "true $OLD"

# --- 4. the kubelet bundle at the version the node runs ---------------------------
# kubelet_bundle VERSION DIR: examples/bundles/kubelet-upgrade pinned by its
# own pin.sh to VERSION from the mirror (which publishes kubelet.sha256 as
# dl.k8s.io does). amd64 only: the test builds no arm64 kubelet, so the copy
# drops the arm64 file and architecture.
kubelet_bundle() {
  local v=$1 d=$2
  cp -r "$repo/examples/bundles/kubelet-upgrade" "$d"
  python3 - "$d/bundle.toml" <<'PY' || vm_die "could not drop arm64 from $d/bundle.toml"
import re, sys
path = sys.argv[1]
text = open(path).read()
head, *files = re.split(r"(?m)^(?=\[\[)", text)
kept = [b for b in files if 'arch = "arm64"' not in b]
assert len(kept) == len(files) - 1, "no arm64 file"
head = head.replace('architectures = ["amd64", "arm64"]', 'architectures = ["amd64"]')
open(path, "w").write(head + "".join(kept))
PY
  KUBELET_UPSTREAM=$mirror/release bash "$d/pin.sh" "${v#v}" "$mirror/release" amd64 >&2 ||
    vm_die "pin.sh ${v#v} failed"
}
kubelet_bundle "$OLD" "$work/kubelet-old"
old_ref=$(lksctl bundle publish "$work/kubelet-old") || vm_die "lksctl bundle publish kubelet $OLD failed"
rollout kubelet-old "$old_ref"
# shellcheck disable=SC2016 # $(…) runs in the VM's shell
kubelet_exe() { vm_exec sh -c 'readlink /proc/$(systemctl show -P MainPID kubelet)/exe'; }
check "kubelet.service runs /usr/local/bin/kubelet (the bundle's drop-in)" test "$(kubelet_exe)" = /usr/local/bin/kubelet
wait_for "the Node is Ready again after the kubelet's restart" 120 node_ready

# --- 5. upgrade with drain and the Ready gate ------------------------------------
tenant_kubectl create namespace work >/dev/null
sa_ready() { tenant_kubectl -n work get serviceaccount default >/dev/null 2>&1; }
wait_for "the default service account in namespace work" 30 sa_ready
tenant_kubectl apply -f - >/dev/null <<YAML || vm_die "creating the pod and its budget failed"
apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: work
  labels: {app: web}
spec:
  nodeName: $NODE
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
    - name: app
      image: lksadmin.test/pause:1
      imagePullPolicy: Never
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
  namespace: work
spec:
  minAvailable: 1
  selector:
    matchLabels: {app: web}
YAML
pod_running() {
  tenant_kubectl -n work get pod app -o json 2>/dev/null |
    jq -e '.status.phase == "Running" and any(.status.conditions[]; .type == "Ready" and .status == "True")' >/dev/null
}
wait_for "pod work/app runs on $NODE (containerd, runc, the pause image)" 120 pod_running
pod_id=$(tenant_kubectl -n work get pod app -o jsonpath='{.metadata.uid}')

kubelet_bundle "$NEW" "$work/kubelet-new"
new_ref=$(lksctl bundle publish "$work/kubelet-new") || vm_die "lksctl bundle publish kubelet $NEW failed"
# The budget allows no eviction at first: the drain must wait on it (the
# node cordoned, the pod still running), then go on once it allows one.
"$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
  --bundle "$new_ref" --drain --kubelet-version "$NEW" --wait >"$work/rollout-kubelet-new.out" 2>&1 &
ROLLOUT_PID=$!
cordoned() { [ "$(kube_node | jq -r '.spec.unschedulable // false')" = true ]; }
wait_for "the drain cordoned $NODE" 60 cordoned
sleep 10
check "the budget work/web (minAvailable 1) holds the pod: still running 10 s after the cordon" pod_running
tenant_kubectl -n work patch pdb web --type merge -p '{"spec":{"minAvailable":0}}' >/dev/null ||
  vm_die "could not relax the budget"
rollout_done() { ! kill -0 "$ROLLOUT_PID" 2>/dev/null; }
wait_for "the rollout of $new_ref ended" 600 rollout_done
if ! wait "$ROLLOUT_PID"; then
  cat "$work/rollout-kubelet-new.out" >&2
  vm_die "the rollout of $new_ref failed"
fi
ROLLOUT_PID=""
cat "$work/rollout-kubelet-new.out" >&2
check "kubelet $new_ref applied" test "$(bundle_state kubelet)" = "${NEW#v}-1 applied"
pod_gone() { ! tenant_kubectl -n work get pod app -o jsonpath='{.metadata.uid}' 2>/dev/null | grep -qx "$pod_id"; }
check "the drain evicted pod work/app" pod_gone
check "the Ready gate saw the real kubelet: the Node reports $NEW" test "$(kubelet_version)" = "$NEW"
check "the Node is Ready" node_ready
check "the Node is uncordoned" test "$(kube_node | jq -r '.spec.unschedulable // false')" = false
new_sha=$(sha256sum "$new_bin/kubelet" | cut -d' ' -f1)
installed_sha() { vm_exec sha256sum /usr/local/bin/kubelet | cut -d' ' -f1; }
check "/usr/local/bin/kubelet is $NEW's" test "$(installed_sha)" = "$new_sha"
check "kubelet.service runs it" test "$(kubelet_exe)" = /usr/local/bin/kubelet
wait_for "lksctl node list: KUBE Ready, kubelet $NEW" 60 kube_col_is "true $NEW"

# --- 6. a kubelet that refuses its flags: rolled back -----------------------------
dropin=/etc/systemd/system/kubelet.service.d/20-lksadmin-kubelet.conf
good_dropin=$(vm_exec sha256sum "$dropin" | cut -d' ' -f1)
cp -r "$work/kubelet-new" "$work/kubelet-broken"
sed -i "s/^version = .*/version = \"${NEW#v}-2\"/; s/^retries = .*/retries = 6/" "$work/kubelet-broken/bundle.toml"
sed -i 's|^ExecStart=/usr/local/bin/kubelet |ExecStart=/usr/local/bin/kubelet --lks-test-no-such-flag |' \
  "$work/kubelet-broken/20-lksadmin-kubelet.conf"
grep -q -- --lks-test-no-such-flag "$work/kubelet-broken/20-lksadmin-kubelet.conf" || vm_die "could not break the drop-in"
broken_ref=$(lksctl bundle publish "$work/kubelet-broken") || vm_die "lksctl bundle publish the broken kubelet failed"
if timeout 600 "$bin/lksctl" --config "$work/server/admin.conf" rollout start --cluster "$CLUSTER" \
  --bundle "$broken_ref" --wait >"$work/rollout-broken.out" 2>&1; then
  cat "$work/rollout-broken.out" >&2
  vm_die "the rollout of $broken_ref completed: its kubelet cannot start"
fi
cat "$work/rollout-broken.out" >&2
vm_log "node's kubelet bundle: $(bundle_state kubelet) — $(node_json | jq -r '.bundles[] | select(.name == "kubelet") | .message')"
check "the node rolled $broken_ref back" test "$(bundle_state kubelet | cut -d' ' -f2)" = rolled_back
check "the drop-in is $NEW-1's again" test "$(vm_exec sha256sum "$dropin" | cut -d' ' -f1)" = "$good_dropin"
rolled_back_at=$(date +%s)
# A Ready condition can outlive a dead kubelet by the node monitor's grace
# period: what shows a live kubelet is its Lease, renewed every 10 s.
lease_renewed_since() {
  local t
  t=$(tenant_kubectl -n kube-node-lease get lease "$NODE" -o jsonpath='{.spec.renewTime}' 2>/dev/null) || return 1
  [ -n "$t" ] && [ "$(date -d "$t" +%s)" -ge "$1" ]
}
wait_for "the previous kubelet runs again: it renewed its Lease after the rollback" 60 \
  lease_renewed_since "$rolled_back_at"
check "the kubelet answers its health endpoint" vm_exec curl -sf --max-time 3 -o /dev/null http://127.0.0.1:10248/healthz
check "the Node is Ready" node_ready
check "the Node reports $NEW" test "$(kubelet_version)" = "$NEW"
check "kubelet.service runs /usr/local/bin/kubelet" test "$(kubelet_exe)" = /usr/local/bin/kubelet

# --- 7. drift ----------------------------------------------------------------------
# kubelet-upgrade's steps (daemon-reload, restart kubelet) run on heal too
# (`on_heal = true`): a restored drop-in is what the kubelet then runs.
repaired_events() {
  lksctl event list --node "$NODE" -o json |
    jq '[.[] | select(.kind == "repaired" and .bundle == "kubelet")] | length'
}
# Deleted: restored, the kubelet restarted on it.
events0=$(repaired_events)
vm_exec rm -f "$dropin"
dropin_back() { [ "$(vm_exec sha256sum "$dropin" 2>/dev/null | cut -d' ' -f1)" = "$good_dropin" ]; }
wait_for "the agent restored the deleted drop-in $dropin" 30 dropin_back
one_more_repair() { [ "$(repaired_events)" -gt "$1" ]; }
wait_for "the server got the node's repaired event" 30 one_more_repair "$events0"
lksctl event list --node "$NODE" -o json |
  jq -r '[.[] | select(.kind == "repaired" and .bundle == "kubelet")] | last | .message' >"$work/repaired.txt"
vm_log "repaired: $(cat "$work/repaired.txt")"
check "the heal ran the bundle's on_heal steps (daemon-reload, restart kubelet)" \
  grep -q 'ran steps "systemctl daemon-reload", "systemctl restart kubelet"' "$work/repaired.txt"
wait_for "the Node is Ready" 60 node_ready

# Edited by hand, while the agent was stopped, to run the image's old
# kubelet, and that kubelet started: the agent, back, restores the drop-in
# and its on_heal steps restart the kubelet the bundle installed, so the
# Node reports NEW again.
events0=$(repaired_events)
vm_exec systemctl stop lksadmin-agent || vm_die "could not stop the agent in the VM"
vm_exec sh -c "sed -i 's|^ExecStart=/usr/local/bin/kubelet |ExecStart=/usr/bin/kubelet |' $dropin &&
  systemctl daemon-reload && systemctl restart kubelet" || vm_die "could not edit the drop-in in the VM"
check "the edit took: kubelet.service runs the image's /usr/bin/kubelet" test "$(kubelet_exe)" = /usr/bin/kubelet
edited_at=$(date +%s)
vm_exec systemctl start lksadmin-agent || vm_die "could not start the agent in the VM"
wait_for "the agent, started again, restored the edited drop-in" 90 dropin_back
wait_for "the server got the node's repaired event" 30 one_more_repair "$events0"
runs_bundle_kubelet() { [ "$(kubelet_exe)" = /usr/local/bin/kubelet ]; }
wait_for "kubelet.service runs /usr/local/bin/kubelet again (restarted by the heal's steps)" 60 runs_bundle_kubelet
wait_for "the restarted kubelet renewed its Lease" 60 lease_renewed_since "$edited_at"
reports_new() { [ "$(kubelet_version)" = "$NEW" ] && node_ready; }
wait_for "the Node is Ready and reports $NEW" 60 reports_new

# --- 8. a rolling reboot through the cluster's reboot lock ---------------------------
# `cluster set --reboots manual` and `lksctl reboot start`: the lock gives
# the node its slot, cordons and drains it as a rollout's turn, then asks
# it to reboot; the agent runs its reboot command (systemctl reboot, the
# default) in the VM; the VM goes down (systemd-nspawn exits 133) and the
# harness boots it again from the same disk, as a hypervisor would; the
# agent comes back with a new boot ID, the Ready gate sees the Node Ready,
# the lock lifts its cordon and frees the slot.
boot_id=$(node_json | jq -r .boot_id)
check "the node reports its boot ID" test -n "$boot_id" -a "$boot_id" != null
bundles_before=$(node_json | jq -c '[.bundles[] | {name, version, state}]')
lksctl cluster set "$CLUSTER" --reboots manual >"$work/reboots-set.out" 2>&1 ||
  vm_die "lksctl cluster set --reboots manual failed: $(cat "$work/reboots-set.out")"
lksctl reboot start --cluster "$CLUSTER" >"$work/reboot.out" 2>&1 ||
  vm_die "lksctl reboot start failed: $(cat "$work/reboot.out")"
vm_log "ok: $(head -n 1 "$work/reboot.out")"
reboot_node_state() {
  lksctl reboot status --cluster "$CLUSTER" -o json | jq -r --arg n "$NODE" '.nodes[] | select(.name == $n) | .state'
}
wait_for "the reboot lock cordoned $NODE before its reboot" 60 cordoned
vm_reboot_wait 180
# The old boot's kubelet is gone: a Lease renewed from now on is the new one's.
reboot_at=$(date +%s)
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
new_boot() {
  local j
  j=$(node_json) || return 1
  [ "$(jq -r .connected <<<"$j")" = true ] && [ "$(jq -r .boot_id <<<"$j")" != "$boot_id" ] &&
    [ "$(jq -r '.reboot.state' <<<"$j")" = none ]
}
wait_for "the agent is back with a new boot ID and reports the reboot done" 120 new_boot
vm_log "node after the reboot: boot_id $(node_json | jq -r .boot_id), reboot $(node_json | jq -c .reboot)"
reboot_done() { [ "$(reboot_node_state)" = "done" ]; }
wait_for "the reboot lock saw the Node Ready and released $NODE (reboot status: done)" 180 reboot_done
check "the rolling reboot completed" test "$(lksctl reboot status --cluster "$CLUSTER" -o json | jq -r .run.state)" = completed
check "the Node is uncordoned" test "$(kube_node | jq -r '.spec.unschedulable // false')" = false
check "the reboot request was taken out of the desired state" test "$(node_json | jq -r .reboot.requested)" = 0
wait_for "the kubelet renewed its Lease after the reboot" 120 lease_renewed_since "$reboot_at"
wait_for "the Node is Ready and reports $NEW after the reboot" 120 reports_new
check "kubelet.service runs /usr/local/bin/kubelet after the reboot" test "$(kubelet_exe)" = /usr/local/bin/kubelet
check "the node's bundles and their states are as before the reboot" \
  test "$(node_json | jq -c '[.bundles[] | {name, version, state}]')" = "$bundles_before"

section "PASS"
lksctl node list --cluster "$CLUSTER" >&2
vm_log "PASS: $NODE joined with kubelet $OLD, upgraded to $NEW with drain, a broken kubelet rolled back, drift healed, rebooted"
