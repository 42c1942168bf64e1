#!/usr/bin/env bash
# A rolling upgrade of the replicas across releases (issue [ops] item 2;
# control-server/README.md, "Version skew"): builds lks-control-server of
# REV (once, cached) and of the working tree, then runs tests/tests/skew.rs:
# three REV replicas on a three-member etcd hold simulated agents and drive
# a rollout; mid-rollout they are replaced one by one by this tree's build.
# It checks that the rollout completes, nothing is lost and no node is sent
# its version twice, and that what must wait for every replica does.
#
#   bash scripts/skew.sh REV            e.g. bash scripts/skew.sh fe07736
#   bash scripts/skew.sh REV --build    only build REV's binaries
#
# REV's binaries are kept in ~/.cache/lksadmin/skew/<commit>/bin (override
# with LKS_SKEW_CACHE). Needs what the test suite needs (scripts/setup.sh
# tests): etcd-server and cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: bash scripts/skew.sh REV [--build]}
sha=$(git rev-parse --verify --quiet "$rev^{commit}") || {
  echo "skew.sh: $rev is not a commit of this repository" >&2
  exit 2
}
cache=${LKS_SKEW_CACHE:-$HOME/.cache/lksadmin/skew}/$sha
bins=(lks-control-server lksctl lks-loadgen)

if [[ ! -x $cache/bin/lks-control-server ]]; then
  echo "skew.sh: building ${bins[*]} of $(git log -1 --format='%h %s' "$sha")"
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  git archive "$sha" | tar -x -C "$src"
  start=$SECONDS
  args=(-p lks-control-server -p lksctl -p lks-loadgen)
  cargo build --locked --manifest-path "$src/Cargo.toml" --target-dir "$cache/target" --bins "${args[@]}"
  mkdir -p "$cache/bin.tmp"
  for b in "${bins[@]}"; do
    cp "$cache/target/debug/$b" "$cache/bin.tmp/$b"
  done
  rm -rf "${cache:?}/bin" "${cache:?}/target/debug/incremental"
  mv "$cache/bin.tmp" "$cache/bin"
  echo "skew.sh: built $rev in $((SECONDS - start)) s into $cache/bin"
fi
[[ ${2:-} == --build ]] && exit 0

cargo build --workspace --bins
LKS_SKEW_OLD_BIN=$cache/bin LKS_SKEW_OLD_REV=$(git log -1 --format=%h "$sha") \
  cargo nextest run -p lks-e2e --test skew --run-ignored only --no-capture
