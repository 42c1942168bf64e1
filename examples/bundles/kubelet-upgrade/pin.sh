#!/usr/bin/env bash
# Pins bundle.toml to a kubelet release for one architecture: downloads the
# binary from the mirror, checks it against the upstream kubelet.sha256, and
# rewrites the bundle's version and that architecture's url, sha256 and size
# in bundle.toml (the `[[file]]` with `arch = "ARCH"`). Run it once for each
# architecture the bundle lists.
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
[[ $arch =~ ^[a-z0-9]+$ ]] || die "ARCH must look like amd64 or arm64, not '$arch'"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
grep -qx "arch = \"$arch\"" "$here/bundle.toml" || die "bundle.toml has no file with arch = \"$arch\""
url=${mirror%/}/v$version/bin/linux/$arch/kubelet

tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$here/.bundle.toml.pin"' EXIT
curl -fsSL --retry 3 -o "$tmp/kubelet" "$url" || die "download $url failed"
sha=$(sha256sum "$tmp/kubelet" | cut -d' ' -f1)
size=$(stat -c %s "$tmp/kubelet")
# The upstream checksum, fetched separately from the binary: a mirror that
# serves other bytes is caught here, before any node downloads them.
upstream_base=${KUBELET_UPSTREAM:-https://dl.k8s.io/release}
upstream=$(curl -fsSL --retry 3 "${upstream_base%/}/v$version/bin/linux/$arch/kubelet.sha256") ||
  die "fetch the upstream kubelet.sha256 for v$version failed"
[ "$sha" = "${upstream%% *}" ] || die "$url has sha256 $sha, upstream publishes ${upstream%% *}"

# The bundle's version (above the first table), and in the `[[file]]` of
# this architecture its url, comment, sha256 and size; the rest as it was.
# Written beside bundle.toml and renamed over it: never half-written.
awk -v arch="$arch" -v url="$url" -v sha="$sha" -v size="$size" -v version="$version" '
  function flush(   i, mine, line) {
    mine = 0
    for (i = 1; i <= n; i++) if (buf[i] == "arch = \"" arch "\"") mine = 1
    for (i = 1; i <= n; i++) {
      line = buf[i]
      if (mine && line ~ /^size = /) continue
      if (mine && line ~ /^url = /) line = "url = \"" url "\""
      if (mine && line ~ /^sha256 = /) line = "sha256 = \"" sha "\"\nsize = " size
      if (mine && line ~ /^# The upstream release\047s kubelet.sha256/)
        line = "# The upstream release\047s kubelet.sha256 for v" version " linux/" arch "."
      print line
    }
    n = 0
  }
  /^\[/ { flush(); table = 1 }
  !table && /^version = / { $0 = "version = \"" version "-1\"" }
  { buf[++n] = $0 }
  END { flush() }
' "$here/bundle.toml" > "$here/.bundle.toml.pin"
mv "$here/.bundle.toml.pin" "$here/bundle.toml"
echo "pinned kubelet $version ($arch): $url, $size bytes, sha256 $sha"
