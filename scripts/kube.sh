#!/usr/bin/env bash
# Builds the Kubernetes binaries the tests run, from the Go module proxy, into
# a cache outside the repository:
#
#   ${LKS_KUBE_CACHE:-~/.cache/lksadmin}/kube-<version>/bin/
#
# One Go module per release, which pins it and names what to build in its
# `tool` block:
#   tests/kube (the default)  v1.37.2: kube-apiserver, kube-controller-manager
#                             and kubectl, the tenant control plane the
#                             Kubernetes end-to-end tests start
#                             (tests/src/kube.rs), and kubeadm and kubelet, the
#                             node the real-node VM test makes
#                             (tests/vm/real-node.sh). One `go build`, so the
#                             packages they share compile once.
#   tests/kubelet-1.36        v1.36.3: kubelet only, the release that VM test
#                             joins with before upgrading to v1.37.2.
#
# Built once and reused while the module's go.mod, go.sum and this script are
# unchanged (their hash is kept beside the binaries). Test dependency only:
# no Go code ships in lksadmin. etcd is Debian's etcd-server (setup.sh
# installs it), which these releases' apiserver accepts.
#
# Usage: bash scripts/kube.sh [MODULE_DIR] [--print-dir]
set -euo pipefail
cd "$(dirname "$0")/.."

mod=tests/kube
print_dir=0
for arg in "$@"; do
  case "$arg" in
  --print-dir) print_dir=1 ;;
  -*) echo "usage: bash scripts/kube.sh [MODULE_DIR] [--print-dir]" >&2; exit 2 ;;
  *) mod=${arg%/} ;;
  esac
done
if [ ! -f "$mod/go.mod" ]; then
  echo "kube: $mod/go.mod not found (a module dir such as tests/kube)" >&2
  exit 1
fi
# `require k8s.io/kubernetes vX` on its own line, or inside a require block.
version=$(awk '
  $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }
  $1 == "k8s.io/kubernetes" && $2 ~ /^v[0-9]/ { print $2; exit }
' "$mod/go.mod")
if [ -z "$version" ]; then
  echo "kube: no k8s.io/kubernetes requirement in $mod/go.mod" >&2
  exit 1
fi
out="${LKS_KUBE_CACHE:-$HOME/.cache/lksadmin}/kube-${version#v}"
if [ "$print_dir" = 1 ]; then
  echo "$out"
  exit 0
fi
key=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-16)
# The packages of the module's tool directives (one-line `tool X` or a
# `tool ( … )` block), and the binaries they make.
mapfile -t pkgs < <(awk '
  $1 == "tool" && $2 != "(" { print $2; next }
  $1 == "tool" && $2 == "(" { block = 1; next }
  block && $1 == ")" { block = 0; next }
  block && NF { print $1 }
' "$mod/go.mod")
if ((${#pkgs[@]} == 0)); then
  echo "kube: no tool directive in $mod/go.mod: nothing to build" >&2
  exit 1
fi
bins=()
for p in "${pkgs[@]}"; do bins+=("${p##*/}"); done

built() {
  [ "$(cat "$out/built" 2>/dev/null)" = "$key" ] || return 1
  for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || return 1; done
}
if built; then
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "kube: go not found: the Kubernetes tests build kube-apiserver from the Go module proxy; install Go 1.26 (https://go.dev/dl) and run again" >&2
  exit 1
fi

# The version the binaries report (kubectl version, the apiserver's
# /version, the compatibility version it derives): what a release build
# stamps in with hack/lib/version.sh.
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

echo "setup: building ${bins[*]} $version ($mod) from the Go module proxy into $out (once, then reused; on 2 cores about 20 minutes for tests/kube, 8 for tests/kubelet-1.36)" >&2
start=$(date +%s)
rm -rf "${out:?}/bin.new"
mkdir -p "$out/bin.new"
# -mod=readonly: go.sum must already hold every module (CI builds from a
# clean clone); GOTOOLCHAIN=local: this machine's Go, never a download.
(
  cd "$mod"
  GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -trimpath -ldflags "$ldflags" -o "$out/bin.new/" "${pkgs[@]}"
)
rm -rf "${out:?}/bin"
mv "$out/bin.new" "$out/bin"
echo "$key" > "$out/built"
echo "setup: built ${bins[*]} $version in $(( $(date +%s) - start ))s" >&2
