# shellcheck shell=bash
# A tenant control plane that real nodes can `kubeadm join`: etcd (Debian's),
# kube-apiserver and kube-controller-manager of tests/kube (scripts/kube.sh),
# run as host processes on loopback, with their certificates, kubeconfigs,
# bootstrap token, cluster-info and uploaded kubeadm/kubelet configuration
# made by kubeadm's own `init phase` commands, so what a node meets is what
# `kubeadm init` would have left: an unmodified `kubeadm join` works against
# it. No kubelet, scheduler or add-on on the control plane (the tenant's
# control plane runs on kube0, not on a node).
#
# Source lib.sh first, then this file, then:
#
#   tenant_start DIR        start it; state in DIR (certificates, logs, data)
#   tenant_kubectl ARG...   kubectl as cluster admin (super-admin.conf)
#   tenant_stop             stop the processes (idempotent; DIR is the caller's)
#
# After tenant_start: TENANT_API (host:port), TENANT_TOKEN (a bootstrap
# token), TENANT_CA_HASH (sha256:… of the CA's public key, kubeadm's
# --discovery-token-ca-cert-hash), TENANT_ADMIN_CONF (kubeconfig path),
# TENANT_BIN (the binaries' directory).
#
# The kubelet settings every joining node gets (kubeadm uploads them to the
# kubelet-config ConfigMap) are TENANT_KUBELET_CONFIG, a KubeletConfiguration
# document the caller may set before tenant_start.

TENANT_PIDS=()

tenant_log() { vm_log "tenant: $*"; }

tenant_kubectl() {
  "$TENANT_BIN/kubectl" --kubeconfig "$TENANT_ADMIN_CONF" --request-timeout=20s "$@"
}

# tenant_spawn NAME CMD...: runs CMD in the background, output in NAME.log.
tenant_spawn() {
  local name=$1
  shift
  "$@" >"$TENANT_DIR/$name.log" 2>&1 &
  TENANT_PIDS+=("$!")
}

tenant_stop() {
  local pid
  for pid in "${TENANT_PIDS[@]}"; do
    stop_pid "$pid"
  done
  TENANT_PIDS=()
}

# Prints the tails of the control plane's logs (for a VM_DIAG_HOOK).
tenant_diagnose() {
  local f
  for f in kube-apiserver kube-controller-manager etcd; do
    if [ -s "${TENANT_DIR:-/nonexistent}/$f.log" ]; then
      section "tenant $f log (last 15 lines)"
      tail -n 15 "$TENANT_DIR/$f.log" >&2
    fi
  done
}

tenant_api_ready() { tenant_kubectl get --raw /readyz >/dev/null 2>&1; }

tenant_cluster_info_signed() {
  tenant_kubectl -n kube-public get configmap cluster-info -o json 2>/dev/null |
    jq -e --arg id "${TENANT_TOKEN%%.*}" '.data["jws-kubeconfig-" + $id] != null' >/dev/null
}

# shellcheck disable=SC2034 # TENANT_* are the outputs, read by the caller
tenant_start() {
  TENANT_DIR=$1
  local repo
  repo=$(cd "$VM_LIB_DIR/../.." && pwd)
  TENANT_BIN=$(bash "$repo/scripts/kube.sh" --print-dir)/bin
  local b
  for b in kube-apiserver kube-controller-manager kubectl kubeadm; do
    [ -x "$TENANT_BIN/$b" ] || vm_die "$TENANT_BIN/$b missing: run bash scripts/kube.sh"
  done
  command -v etcd >/dev/null || vm_die "etcd not found: install etcd-server (scripts/setup.sh does)"
  local version
  version=$("$TENANT_BIN/kubeadm" version -o short) || vm_die "kubeadm version failed"

  local pki=$TENANT_DIR/pki kc=$TENANT_DIR/kubeconfig
  mkdir -p "$pki" "$kc" "$TENANT_DIR/etcd"
  local api_port etcd_port peer_port kcm_port
  api_port=$(free_port) || vm_die "no free port for the tenant apiserver"
  etcd_port=$(free_port) || vm_die "no free port for the tenant etcd"
  peer_port=$(free_port) || vm_die "no free port for the tenant etcd's peers"
  kcm_port=$(free_port) || vm_die "no free port for the tenant controller manager"
  TENANT_API=127.0.0.1:$api_port
  # A bootstrap token: [a-z0-9]{6}.[a-z0-9]{16}.
  TENANT_TOKEN=$(openssl rand -hex 3).$(openssl rand -hex 8)

  # kubeadm wants a non-loopback advertise address (for a loopback one it
  # picks an interface itself, and fails on hosts where that is lo): the
  # host's address on its default route. It only goes into the
  # configuration and the certificate; everything talks over loopback.
  local host_ip
  host_ip=$(ip -o -4 route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  [ -n "$host_ip" ] || host_ip=$(hostname -I 2>/dev/null | awk '{ print $1 }')
  [ -n "$host_ip" ] || vm_die "no IPv4 address on this host for kubeadm's advertise address"

  local cfg=$TENANT_DIR/kubeadm.yaml
  cat >"$cfg" <<YAML
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
  - token: "$TENANT_TOKEN"
    ttl: 2h0m0s
    usages: [signing, authentication]
    groups: ["system:bootstrappers:kubeadm:default-node-token"]
localAPIEndpoint:
  advertiseAddress: $host_ip
  bindPort: $api_port
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: lks-tenant
kubernetesVersion: $version
controlPlaneEndpoint: "$TENANT_API"
certificatesDir: /etc/kubernetes/pki
networking:
  serviceSubnet: 10.96.0.0/16
  dnsDomain: cluster.local
apiServer:
  certSANs: ["127.0.0.1", "localhost"]
---
${TENANT_KUBELET_CONFIG:-apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration}
YAML

  # What is uploaded (and what joining nodes read) names kubeadm's usual
  # /etc/kubernetes/pki: a node writes the cluster CA there and its kubelet
  # configuration points at it. The certificates themselves are made in
  # DIR/pki on this host.
  local host_cfg=$TENANT_DIR/kubeadm-host.yaml
  sed "s|^certificatesDir: .*|certificatesDir: \"$pki\"|" "$cfg" >"$host_cfg"

  tenant_log "certificates and kubeconfigs (kubeadm $version init phase certs, kubeconfig)"
  "$TENANT_BIN/kubeadm" init phase certs all --config "$host_cfg" >"$TENANT_DIR/kubeadm-certs.log" 2>&1 ||
    vm_die "kubeadm init phase certs failed: $(tail -n 3 "$TENANT_DIR/kubeadm-certs.log")"
  local conf
  for conf in super-admin controller-manager; do
    "$TENANT_BIN/kubeadm" init phase kubeconfig "$conf" --config "$host_cfg" --kubeconfig-dir "$kc" \
      >>"$TENANT_DIR/kubeadm-kubeconfig.log" 2>&1 ||
      vm_die "kubeadm init phase kubeconfig $conf failed: $(tail -n 3 "$TENANT_DIR/kubeadm-kubeconfig.log")"
  done
  # controller-manager.conf names the advertise address; the apiserver
  # listens on loopback only.
  sed -i "s|server: https://$host_ip:|server: https://127.0.0.1:|" "$kc/controller-manager.conf"
  TENANT_ADMIN_CONF=$kc/super-admin.conf
  # kubeadm's --discovery-token-ca-cert-hash: SHA-256 of the CA's public key
  # (SubjectPublicKeyInfo, DER).
  TENANT_CA_HASH=sha256:$(openssl x509 -pubkey -noout -in "$pki/ca.crt" |
    openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1)

  tenant_spawn etcd etcd --name tenant --data-dir "$TENANT_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "tenant=http://127.0.0.1:$peer_port"

  # The flags kubeadm's static pod manifest gives the apiserver, on
  # loopback; bootstrap-token authentication is what `kubeadm join` needs.
  tenant_spawn kube-apiserver "$TENANT_BIN/kube-apiserver" \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port="$api_port" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --client-ca-file="$pki/ca.crt" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --enable-bootstrap-token-auth=true \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --profiling=false --v=1
  wait_for "tenant kube-apiserver $version ready on $TENANT_API" 120 tenant_api_ready

  # csrapproving and csrsigning (with the cluster CA) are default
  # controllers; bootstrapsigner (signs cluster-info for token discovery) and
  # tokencleaner are not.
  tenant_spawn kube-controller-manager "$TENANT_BIN/kube-controller-manager" \
    --kubeconfig="$kc/controller-manager.conf" \
    --authentication-kubeconfig="$kc/controller-manager.conf" \
    --authorization-kubeconfig="$kc/controller-manager.conf" \
    --controllers='*,bootstrapsigner,tokencleaner' \
    --cluster-name=lks-tenant \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" --cert-dir="$TENANT_DIR/kcm" --v=1

  tenant_log "bootstrap token, cluster-info, kubeadm and kubelet configuration (kubeadm init phase)"
  local phase
  for phase in "upload-config kubeadm" "upload-config kubelet" "bootstrap-token"; do
    # shellcheck disable=SC2086 # the phase is two words on purpose
    "$TENANT_BIN/kubeadm" init phase $phase --config "$cfg" --kubeconfig "$TENANT_ADMIN_CONF" \
      >>"$TENANT_DIR/kubeadm-phases.log" 2>&1 ||
      vm_die "kubeadm init phase $phase failed: $(tail -n 3 "$TENANT_DIR/kubeadm-phases.log")"
  done
  # The bootstrapsigner signs cluster-info with the token: kubeadm join's
  # discovery waits for that signature.
  wait_for "cluster-info signed for the bootstrap token" 60 tenant_cluster_info_signed
}
