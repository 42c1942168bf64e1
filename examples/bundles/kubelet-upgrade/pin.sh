#!/usr/bin/env bash
# Pins bundle.toml to a kubelet release: downloads the binary from the mirror,
# checks it against the upstream kubelet.sha256, and rewrites version, url,
# sha256 and size in bundle.toml.
#
#   ./pin.sh VERSION [MIRROR] [ARCH]
#     VERSION  e.g. 1.33.3
#     MIRROR   URL prefix laid out like dl.k8s.io/release (default:
#              https://dl.k8s.io/release); the nodes download from it
#     ARCH     amd64 (default) or arm64
#   KUBELET_UPSTREAM (environment): where the reference kubelet.sha256 comes
#     from (default https://dl.k8s.io/release)
#
# Bump the bundle's revision (the -N in version) by hand when only the drop-in
# or the health check changed.
set -euo pipefail

die() { printf 'pin.sh: %s\n' "$*" >&2; exit 1; }

(($# >= 1 && $# <= 3)) || die "usage: ./pin.sh VERSION [MIRROR] [ARCH]"
version=${1#v}
mirror=${2:-https://dl.k8s.io/release}
arch=${3:-amd64}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "VERSION must look like 1.33.3, not '$1'"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
url=${mirror%/}/v$version/bin/linux/$arch/kubelet

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/kubelet" "$url" || die "download $url failed"
sha=$(sha256sum "$tmp/kubelet" | cut -d' ' -f1)
size=$(stat -c %s "$tmp/kubelet")
# The upstream checksum, fetched separately from the binary: a mirror that
# serves other bytes is caught here, before any node downloads them.
upstream_base=${KUBELET_UPSTREAM:-https://dl.k8s.io/release}
upstream=$(curl -fsSL --retry 3 "${upstream_base%/}/v$version/bin/linux/$arch/kubelet.sha256") ||
  die "fetch the upstream kubelet.sha256 for v$version failed"
[ "$sha" = "${upstream%% *}" ] || die "$url has sha256 $sha, upstream publishes ${upstream%% *}"

sed -i \
  -e "s|^version = .*|version = \"$version-1\"|" \
  -e "s|^url = .*|url = \"$url\"|" \
  -e "s|^sha256 = .*|sha256 = \"$sha\"|" \
  -e '/^size = /d' \
  -e "/^sha256 = /a size = $size" \
  -e "/^# The upstream release's kubelet.sha256/s|.*|# The upstream release's kubelet.sha256 for v$version linux/$arch.|" \
  "$here/bundle.toml"
echo "pinned kubelet $version ($arch): $url, $size bytes, sha256 $sha"
