#!/usr/bin/env bash
# Checks the unit files in this directory with `systemd-analyze verify`, and
# prints each one's exposure score from `systemd-analyze security`.
#
#   packaging/systemd/check.sh
#
# verify refuses a unit whose ExecStart binary is missing, and the binaries
# are not installed on a build host. So the units are verified as they are,
# unmodified, inside a scratch root (--root): a copy of the host's system units
# (for sysinit.target and friends), the units under test, and for each Exec*
# command either a copy of the host's binary or, when the host has none (our
# own, not installed), an executable stub. Any message from verify, warnings
# included, fails the check.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if ! command -v systemd-analyze >/dev/null; then
  echo "check: installing systemd (for systemd-analyze)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

mkdir -p "$root/lib/systemd"
cp -a /lib/systemd/system "$root/lib/systemd/"

units=()
for unit in "$here"/*.service; do
  units+=("$(basename "$unit")")
  cp "$unit" "$root/lib/systemd/system/"
  # The executable of every Exec*= line, without systemd's prefixes (-@:+!).
  sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$unit" | while read -r exe; do
    mkdir -p "$root$(dirname "$exe")"
    if [ -x "$exe" ]; then
      cp -L "$exe" "$root$exe"
    else
      printf '#!/bin/sh\nexit 0\n' >"$root$exe"
      chmod 0755 "$root$exe"
    fi
  done
done

status=0
for unit in "${units[@]}"; do
  out=$(systemd-analyze verify --root="$root" "$unit" 2>&1) || status=1
  if [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    status=1
  fi
  score=$(systemd-analyze security --offline=yes --root="$root" "$unit" 2>/dev/null |
    sed -n "s/.*Overall exposure level for [^:]*: *\\([0-9.]* [A-Z]*\\).*/\\1/p")
  printf 'check: %s: verify %s; exposure %s\n' "$unit" \
    "$([ -z "$out" ] && echo ok || echo FAILED)" "${score:-unknown}"
done
if [ "$status" -ne 0 ]; then
  echo "check: FAIL: systemd-analyze verify reported problems (above)" >&2
fi
exit "$status"
