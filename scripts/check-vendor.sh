#!/usr/bin/env bash
# Checks that each vendored crate under third_party/ is the crate published
# on crates.io plus its patch file, and nothing else: downloads the exact
# .crate, checks its SHA-256 against the crates.io index, applies
# third_party/NAME/lksadmin.patch and compares the result with the vendored
# tree. Run by CI (.ci/run); needs curl, python3 and patch.
#
# Not compared: LKSADMIN-PATCH.md and lksadmin.patch (ours),
# .cargo_vcs_info.json (crates.io metadata, not kept) and Cargo.lock (the
# crate's own lockfile, which the workspace build does not read and which
# `cargo test --manifest-path third_party/NAME/Cargo.toml` in
# scripts/test.sh rewrites).
#
# Usage: bash scripts/check-vendor.sh [NAME...]   (default: every directory
# of third_party/ that has a lksadmin.patch)
set -euo pipefail
cd "$(dirname "$0")/.."

crates=("$@")
if [ ${#crates[@]} -eq 0 ]; then
  for p in third_party/*/lksadmin.patch; do
    crates+=("$(basename "$(dirname "$p")")")
  done
fi
[ ${#crates[@]} -gt 0 ] || { echo "check-vendor: no third_party/*/lksadmin.patch" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The sparse index's path for a crate name (https://doc.rust-lang.org/cargo/reference/registry-index.html).
index_path() {
  local n=${1,,}
  case ${#n} in
    1) echo "1/$n" ;;
    2) echo "2/$n" ;;
    3) echo "3/${n:0:1}/$n" ;;
    *) echo "${n:0:2}/${n:2:2}/$n" ;;
  esac
}

status=0
for name in "${crates[@]}"; do
  dir=third_party/$name
  [ -f "$dir/lksadmin.patch" ] || { echo "check-vendor: $dir/lksadmin.patch is missing" >&2; exit 1; }
  # The vendored crate's own version: the first `version` of [package].
  version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["package"]["version"])' "$dir/Cargo.toml")
  want=$(curl -sSf --retry 3 "https://index.crates.io/$(index_path "$name")" |
    python3 -c 'import sys, json
v = sys.argv[1]
for line in sys.stdin:
    e = json.loads(line)
    if e["vers"] == v:
        print(e["cksum"])
        break' "$version")
  [ -n "$want" ] || { echo "check-vendor: $name $version is not in the crates.io index" >&2; exit 1; }
  curl -sSfL --retry 3 -o "$work/$name.crate" "https://static.crates.io/crates/$name/$name-$version.crate"
  got=$(sha256sum "$work/$name.crate" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "check-vendor: $name-$version.crate has SHA-256 $got, the crates.io index says $want" >&2
    exit 1
  fi
  tar -xzf "$work/$name.crate" -C "$work"
  published=$work/$name-$version
  (cd "$published" && patch -p1 --quiet --forward --no-backup-if-mismatch) <"$dir/lksadmin.patch" || {
    echo "check-vendor: $dir/lksadmin.patch does not apply to $name $version as published" >&2
    exit 1
  }
  if diff -r -q \
    -x LKSADMIN-PATCH.md -x lksadmin.patch -x .cargo_vcs_info.json -x Cargo.lock \
    "$published" "$dir" >"$work/$name.diff"; then
    echo "check-vendor: $dir is $name $version as published (sha256:$got) plus lksadmin.patch"
  else
    echo "check-vendor: $dir is not $name $version plus lksadmin.patch:" >&2
    sed "s#$work/##" "$work/$name.diff" >&2
    status=1
  fi
done
exit $status
