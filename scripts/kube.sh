#!/usr/bin/env bash
# Builds the tenant control plane that the Kubernetes end-to-end tests start
# (tests/src/kube.rs): kube-apiserver, kube-controller-manager and kubectl of
# the one Kubernetes release pinned in tests/kube/go.mod, from the Go module
# proxy, into a cache outside the repository:
#
#   ${LKS_KUBE_CACHE:-~/.cache/lksadmin}/kube-<version>/bin/
#
# Built once and reused while tests/kube/go.mod, go.sum and this script are
# unchanged (their hash is kept beside the binaries). Test dependency only:
# no Go code ships in lksadmin. etcd is Debian's etcd-server (setup.sh
# installs it), which this release's apiserver accepts.
#
# Usage: bash scripts/kube.sh [--print-dir]
set -euo pipefail
cd "$(dirname "$0")/.."

mod=tests/kube
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$mod/go.mod")
if [ -z "$version" ]; then
  echo "kube: no k8s.io/kubernetes requirement in $mod/go.mod" >&2
  exit 1
fi
out="${LKS_KUBE_CACHE:-$HOME/.cache/lksadmin}/kube-${version#v}"
if [ "${1:-}" = "--print-dir" ]; then
  echo "$out"
  exit 0
fi
key=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-16)
bins=(kube-apiserver kube-controller-manager kubectl)

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

echo "setup: building ${bins[*]} $version from the Go module proxy into $out (once; about 15 minutes on 2 cores, then reused)" >&2
start=$(date +%s)
rm -rf "${out:?}/bin.new"
mkdir -p "$out/bin.new"
# -mod=readonly: go.sum must already hold every module (CI builds from a
# clean clone); GOTOOLCHAIN=local: this machine's Go, never a download.
(
  cd "$mod"
  GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -trimpath -ldflags "$ldflags" -o "$out/bin.new/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl
)
rm -rf "${out:?}/bin"
mv "$out/bin.new" "$out/bin"
echo "$key" > "$out/built"
echo "setup: built ${bins[*]} $version in $(( $(date +%s) - start ))s" >&2
