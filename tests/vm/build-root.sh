#!/usr/bin/env bash
# Builds, once, the Debian 12 root that tests/vm boots with systemd-nspawn: a
# minimal system with real systemd and cloud-init, so a boot test runs the same
# units and cloud-init stages a tenant VM does.
#
#   tests/vm/build-root.sh          # prints the root's path; builds it if missing or stale
#
# Environment:
#   LKS_VM_CACHE   cache directory (default /var/cache/lksadmin-vm)
#   LKS_VM_MIRROR  Debian mirror (default: the host's bookworm mirror from apt sources)
#
# The root lives at $LKS_VM_CACHE/bookworm-root. It is built in a temporary
# directory beside it and renamed into place only when complete, so a killed
# build never leaves a half root behind. Tests must never modify it: they boot
# an overlay or a copy (see lib.sh).
set -euo pipefail

# Bump when the recipe below changes: a cached root with another version is
# rebuilt. (Not a hash of this file, so editing a comment costs no rebuild.)
ROOT_VERSION=4
STAMP=.lksadmin-vm-root
SUITE=bookworm

log() { printf 'build-root: %s\n' "$*" >&2; }
die() { printf 'build-root: FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap and chroot need it)"

cache=${LKS_VM_CACHE:-/var/cache/lksadmin-vm}
root=$cache/$SUITE-root

if [ -f "$root/$STAMP" ] && [ "$(cat "$root/$STAMP")" = "$ROOT_VERSION" ]; then
  printf '%s\n' "$root"
  exit 0
fi

# CI runs on a fresh machine: install what this needs. systemd-container
# (systemd-nspawn) is for the boot scripts that use this root.
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The mirror the host already uses for bookworm main (it is reachable; another
# may not be). Reads both one-line .list files and deb822 .sources files and
# skips the security archive and third-party repositories.
host_mirror() {
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  local f
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  awk -v suite="$SUITE" '
    function has(list, word,   n, a, i) {
      n = split(list, a, /[ \t]+/)
      for (i = 1; i <= n; i++) if (a[i] == word) return 1
      return 0
    }
    function flush() {
      if (types != "" && has(types, "deb") && has(suites, suite) && has(comps, "main") && uri !~ /security/) {
        print uri; found = 1; exit
      }
      types = suites = comps = uri = ""
    }
    FNR == 1 { flush() }
    /^[ \t]*#/ { next }
    # one-line format: deb [options] URI SUITE COMPONENT...
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      u = $(i); s = $(i + 1); c = ""
      for (j = i + 2; j <= NF; j++) c = c " " $j
      if (s == suite && has(c, "main") && u !~ /security/) { print u; found = 1; exit }
      next
    }
    # deb822 format: fields of one stanza, stanzas separated by blank lines
    /^[ \t]*$/ { flush(); next }
    tolower($1) == "types:"      { types = $0;  sub(/^[^:]*:[ \t]*/, "", types) }
    tolower($1) == "suites:"     { suites = $0; sub(/^[^:]*:[ \t]*/, "", suites) }
    tolower($1) == "components:" { comps = $0;  sub(/^[^:]*:[ \t]*/, "", comps) }
    tolower($1) == "uris:"       { uri = $2 }
    END { if (!found) flush() }
  ' "${files[@]}"
}

mirror=${LKS_VM_MIRROR:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}

mkdir -p "$cache"
# Two test runs may start at once on a cold cache: one builds, the other waits.
exec 9>"$cache/.build.lock"
flock 9
if [ -f "$root/$STAMP" ] && [ "$(cat "$root/$STAMP")" = "$ROOT_VERSION" ]; then
  printf '%s\n' "$root"
  exit 0
fi

tmp=$(mktemp -d "$cache/.$SUITE-root.build.XXXXXX")
cleanup() { rm -rf --one-file-system "$tmp"; }
trap cleanup EXIT

start=$SECONDS
log "debootstrap $SUITE from $mirror into $tmp"
# cloud-init is not in --include: its configure step fails inside debootstrap's
# second stage, but installs cleanly once the base system is complete.
if ! debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,curl,ca-certificates,iproute2 \
  "$SUITE" "$tmp" "$mirror" >"$cache/debootstrap.log" 2>&1; then
  tail -n 20 "$cache/debootstrap.log" >&2
  die "debootstrap failed (full log: $cache/debootstrap.log)"
fi

# Runs a command in the new root with /proc mounted, in a private mount
# namespace so that nothing stays mounted when it ends (or is killed).
in_root() {
  # shellcheck disable=SC2016 # $0 and $@ are the inner shell's, on purpose
  unshare --mount --propagation private -- \
    sh -c 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"' "$tmp" "$@"
}

# Package scripts must not start daemons in the build chroot.
printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
chmod 0755 "$tmp/usr/sbin/policy-rc.d"

log "installing cloud-init"
# No recommends: they are disk and growpart tools a container has no use for.
if ! in_root env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends cloud-init >"$cache/cloud-init-install.log" 2>&1; then
  tail -n 20 "$cache/cloud-init-install.log" >&2
  die "installing cloud-init failed (full log: $cache/cloud-init-install.log)"
fi

# What a Kubernetes node image carries besides kubelet and kubeadm (which
# tests/vm/real-node.sh ships in bundles): a container runtime (Debian's
# containerd and runc), the CNI plugins, and the tools kubeadm's preflight
# checks ask for (conntrack, iptables, ethtool, socat, mount, nsenter).
# containerd is disabled here: the other VM tests boot this root too and
# need no runtime; real-node.sh enables it before boot, as a node image would.
log "installing containerd, runc and the node tools"
if ! in_root env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends containerd runc containernetworking-plugins \
  conntrack iptables ethtool socat kmod util-linux >"$cache/node-install.log" 2>&1; then
  tail -n 20 "$cache/node-install.log" >&2
  die "installing containerd failed (full log: $cache/node-install.log)"
fi
rm -f "$tmp/etc/systemd/system/multi-user.target.wants/containerd.service"
in_root apt-get clean
rm -rf "$tmp"/var/lib/apt/lists/* "$tmp/usr/sbin/policy-rc.d"

# A root console without a password, for debugging a booted root by hand
# (systemd-nspawn --boot -D ROOT): this root only ever runs on a test host.
in_root passwd -d root >/dev/null

cat >"$tmp/etc/cloud/cloud.cfg.d/90-lksadmin-vm.cfg" <<'CFG'
# lksadmin VM tests: user-data comes from a NoCloud seed in
# /var/lib/cloud/seed/nocloud; never probe cloud metadata services.
datasource_list: [ NoCloud, None ]
# The container shares the host's network namespace: cloud-init must not
# render or apply network configuration, or it would reconfigure the host.
network:
  config: disabled
# No disk to grow, no clock of its own to set, and no locales package to
# generate a locale with. locale is a string in the schema; "false" is one
# cc_locale reads as "skip" (a YAML false would make every boot log
# "Invalid cloud-config provided").
growpart:
  mode: "off"
resize_rootfs: false
ntp:
  enabled: false
locale: "false"
CFG

# Units that cannot work in a container sharing the host's network, and would
# otherwise fail and leave the system "degraded" on every boot.
for unit in e2scrub_reap.service systemd-networkd-wait-online.service; do
  ln -sf /dev/null "$tmp/etc/systemd/system/$unit"
done

# Each boot gets a fresh machine id (systemd makes one when the file is empty),
# as a freshly provisioned VM would.
: >"$tmp/etc/machine-id"
rm -f "$tmp/var/lib/dbus/machine-id"

printf '%s\n' "$ROOT_VERSION" >"$tmp/$STAMP"

# Swap in the new root. The old one (if any) is moved aside first, so at every
# instant $root is either absent or complete.
if [ -e "$root" ]; then
  old=$(mktemp -d "$cache/.$SUITE-root.old.XXXXXX")
  mv "$root" "$old/"
  rm -rf --one-file-system "$old"
fi
mv "$tmp" "$root"
trap - EXIT
log "built $root in $((SECONDS - start))s ($(du -sh "$root" | cut -f1))"
printf '%s\n' "$root"
