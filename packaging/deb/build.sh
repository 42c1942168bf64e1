#!/usr/bin/env bash
# Builds the Debian packages of lksadmin into target/debian/:
#   lksadmin-agent_<version>_<arch>.deb       agent, its unit, /etc/lksadmin/agent.toml
#   lks-control-server_<version>_<arch>.deb   server, lksctl, lks-kube-controller, its unit, /etc/default file
#
#   packaging/deb/build.sh [--no-lint] [--profile release|dev]
#
# Binaries are built first with cargo (so a compile error reads as one), then
# packed by cargo-deb with --no-build; the package metadata is in
# [package.metadata.deb] of lksadmin-agent/Cargo.toml and
# control-server/Cargo.toml. Each package is then checked with lintian, and
# any error fails the build (--no-lint skips that). Installs what it needs
# (cargo-deb, dpkg-dev, lintian, the compile dependencies) when missing.
#
# A release build ships the agent from its own cargo profile, `agent`
# (size-optimised, panic = abort: Cargo.toml), and the server and lksctl
# from `release`.
#
# --profile dev (or LKS_DEB_PROFILE=dev) packs the debug binaries of
# target/debug instead of an optimised release build: CI's VM test uses it,
# because `scripts/test.sh` has built them already, while a release build
# would cost minutes more. Such packages are for tests only, never to ship.
set -euo pipefail

usage="usage: packaging/deb/build.sh [--no-lint] [--profile release|dev]"
lint=1
profile=${LKS_DEB_PROFILE:-release}
while (($#)); do
  case "$1" in
  --no-lint) lint=0 ;;
  --profile)
    (($# >= 2)) || { echo "build.sh: --profile needs a value ($usage)" >&2; exit 2; }
    profile=$2
    shift
    ;;
  --profile=*) profile=${1#--profile=} ;;
  *)
    echo "build.sh: unknown argument '$1' ($usage)" >&2
    exit 2
    ;;
  esac
  shift
done
case "$profile" in
release | dev) ;;
*)
  echo "build.sh: --profile must be release or dev, not '$profile'" >&2
  exit 2
  ;;
esac

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { printf 'build.sh: FAIL: %s\n' "$*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
out=$repo/target/debian

apt_need=()
# dpkg-shlibdeps turns the binaries' shared libraries into Depends ($auto);
# strip and objcopy (binutils) strip the binaries.
command -v dpkg-shlibdeps >/dev/null || apt_need+=(dpkg-dev)
command -v strip >/dev/null || apt_need+=(binutils)
# What compiling the workspace needs (as scripts/setup.sh, without its test tools).
command -v protoc >/dev/null || apt_need+=(protobuf-compiler)
command -v pkg-config >/dev/null || apt_need+=(pkg-config)
command -v cc >/dev/null || apt_need+=(build-essential)
if [ "$lint" = 1 ] && ! command -v lintian >/dev/null; then apt_need+=(lintian); fi
if ((${#apt_need[@]})); then
  log "installing ${apt_need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${apt_need[@]}" >/dev/null
fi
if ! cargo deb --version >/dev/null 2>&1; then
  log "installing cargo-deb"
  # Major version pinned: the metadata and flags used here are cargo-deb 3.x.
  cargo install --locked cargo-deb --version "^3.8" >/dev/null
fi

# package name -> the binaries it ships
declare -A bins=(
  [lksadmin-agent]="lksadmin-agent"
  [lks-control-server]="lks-control-server lksctl lks-kube-controller"
)
packages=(lksadmin-agent lks-control-server)

version=$(cargo pkgid -p lksadmin-agent | sed 's/.*[#@]//')
if ! head -n 1 "$here/changelog" | grep -qF "($version-"; then
  log "warning: packaging/deb/changelog has no entry for $version yet (lintian will say so too)"
fi

# package -> the cargo profile its binaries are built with
declare -A pkg_profile=([lksadmin-agent]=dev [lks-control-server]=dev)
[ "$profile" = dev ] || pkg_profile=([lksadmin-agent]=agent [lks-control-server]=release)

# binary -> the cargo package that builds it (lksctl and lks-kube-controller
# are crates of their own, packed into the server's package: the image in
# kube0 runs either)
declare -A bin_crate=([lksadmin-agent]=lksadmin-agent [lks-control-server]=lks-control-server [lksctl]=lksctl
  [lks-kube-controller]=lks-kube-controller)

for pkg in "${packages[@]}"; do
  build_args=(build --profile "${pkg_profile[$pkg]}")
  for bin in ${bins[$pkg]}; do build_args+=(-p "${bin_crate[$bin]}" --bin "$bin"); done
  log "cargo ${build_args[*]}"
  cargo "${build_args[@]}" || die "${pkg_profile[$pkg]} build of $pkg failed (cargo output above)"
done

mkdir -p "$out"
debs=()
for pkg in "${packages[@]}"; do
  deb_args=(--no-build --profile "${pkg_profile[$pkg]}")
  # Test packages need no small download: xz at its fastest level takes a
  # fifth of the time on debug binaries.
  [ "$profile" = release ] || deb_args+=(--fast)
  # cargo-deb prints the path of the package it wrote on stdout.
  # --profile maps the assets' target/release/ to that profile's directory.
  deb=$(cargo deb "${deb_args[@]}" -p "$pkg" --output "$out" --quiet) ||
    die "cargo deb -p $pkg failed (output above)"
  debs+=("$deb")
  log "built $deb"
done

# The agent's fault points (LKS_AGENT_FAULT, cargo feature fault-injection)
# are for the tests: a package must not carry them. The workspace's test
# builds turn the feature on; `cargo build -p lksadmin-agent` above does not.
for deb in "${debs[@]}"; do
  case ${deb##*/} in lksadmin-agent_*) ;; *) continue ;; esac
  bin_copy=$(mktemp)
  dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/bin/lksadmin-agent >"$bin_copy" ||
    { rm -f "$bin_copy"; die "$deb: cannot read usr/bin/lksadmin-agent"; }
  if grep -aq ': aborting here' "$bin_copy"; then
    rm -f "$bin_copy"
    die "$deb: the agent was built with its test fault points (feature fault-injection)"
  fi
  rm -f "$bin_copy"
  log "$deb: no fault points"
done

if [ "$lint" = 1 ]; then
  failed=0
  for deb in "${debs[@]}"; do
    # Warnings are shown but accepted; errors fail the build.
    lintian --fail-on error "$deb" >&2 || failed=1
  done
  [ "$failed" = 0 ] || die "lintian reported errors (above)"
  log "lintian: no errors"
fi

printf '%s\n' "${debs[@]}"
