#!/usr/bin/env bash
# Checks packaging/kubernetes/monitoring/:
#  1. prometheusrule.yaml (the Prometheus Operator's PrometheusRule) holds
#     exactly the groups of rules.yaml, the source: it is generated from it
#     (`--write` regenerates it);
#  2. `promtool check rules` on rules.yaml;
#  3. `promtool test rules rules.test.yaml`: every alert fires on the series
#     meant to fire it and stays silent on the others; a self-test first: a
#     copy with one threshold changed must fail, so a promtool that passes
#     everything cannot turn this green;
#  4. dashboard.json is JSON (that its metric names exist in a real
#     server's /metrics is tests/tests/monitoring.rs).
# promtool comes with Debian's `prometheus` package, installed if missing.
#
# Usage: bash scripts/check-monitoring.sh [--write]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=packaging/kubernetes/monitoring

log() { echo "check-monitoring: $*"; }
die() { echo "check-monitoring: FAIL: $*" >&2; exit 1; }

# The PrometheusRule for rules.yaml: its groups indented under spec.
generate() {
  cat <<'HEAD'
# Generated from rules.yaml by `bash scripts/check-monitoring.sh --write`:
# edit rules.yaml (the plain Prometheus rules file) and regenerate.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: lks-control-server
  namespace: lksadmin
  labels:
    app.kubernetes.io/name: lks-control-server
    app.kubernetes.io/part-of: lksadmin
spec:
HEAD
  sed -n '/^groups:/,$p' "$dir/rules.yaml" | sed 's/^\(.\)/  \1/'
}

if [[ ${1:-} == --write ]]; then
  generate >"$dir/prometheusrule.yaml"
  log "wrote $dir/prometheusrule.yaml"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: bash scripts/check-monitoring.sh [--write]" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

generate >"$tmp/prometheusrule.yaml"
if ! diff -u "$dir/prometheusrule.yaml" "$tmp/prometheusrule.yaml" >&2; then
  die "$dir/prometheusrule.yaml does not match rules.yaml: run bash scripts/check-monitoring.sh --write"
fi
log "ok: prometheusrule.yaml holds the groups of rules.yaml"

if ! command -v promtool >/dev/null; then
  log "promtool is missing; installing Debian's prometheus package"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 prometheus >/dev/null
  command -v promtool >/dev/null || die "the prometheus package brought no promtool"
fi

promtool check rules "$dir/rules.yaml" || die "promtool check rules $dir/rules.yaml"

# Self-test: paused for 4 h is the threshold the tests pin; at 5 h the
# test that expects the alert at 4h30m must fail.
cp "$dir/rules.yaml" "$dir/rules.test.yaml" "$tmp/"
sed -i 's/state="paused"}) > 4 \* 3600/state="paused"}) > 5 * 3600/' "$tmp/rules.yaml"
cmp -s "$dir/rules.yaml" "$tmp/rules.yaml" && die "self-test: the edit did not change rules.yaml"
if (cd "$tmp" && promtool test rules rules.test.yaml) >/dev/null 2>&1; then
  die "self-test: rules with a changed threshold passed the unit tests"
fi
log "self-test ok: a changed threshold fails the unit tests"

(cd "$dir" && promtool test rules rules.test.yaml) || die "promtool test rules $dir/rules.test.yaml"

python3 -m json.tool "$dir/dashboard.json" >/dev/null || die "$dir/dashboard.json is not JSON"
log "ok: rules checked, every alert's unit tests pass, dashboard.json parses"
