#!/usr/bin/env bash
# Validate packaging/kubernetes/ without a cluster:
#  1. every manifest, and the `kubectl kustomize` rendering of the directory,
#     against the OpenAPI schemas of pinned Kubernetes versions, strictly
#     (an unknown or misspelt field fails), with a pinned kubernetes-validate
#     from PyPI in a throwaway venv;
#  2. a self-test first: a deliberately broken copy must fail, so a validator
#     that silently passes everything cannot turn this check green.
# The rendering needs kubectl; when it is missing the script installs
# Debian's kubernetes-client if apt offers it, and otherwise says it skipped
# that part. Exits non-zero on any failure. Needs python3 with venv and
# network access to PyPI (and to Debian's mirror when installing).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# kubernetes-validate bundles the schemas of Kubernetes 1.25 to 1.37.
KV_VERSION=1.37.0
# The oldest Kubernetes kube0 may run and the newest the validator knows.
KUBE_VERSIONS=(1.30.0 1.37.0)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

log() { echo "validate.sh: $*"; }
die() { echo "validate.sh: FAIL: $*" >&2; exit 1; }

apt_install() {
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    return 1
  fi
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- the validator ------------------------------------------------------------
if ! python3 -m venv "$tmp/probe-venv" >/dev/null 2>&1; then
  log "python3 -m venv does not work; installing python3-venv"
  apt_install python3-venv || die "python3 -m venv is unavailable and python3-venv cannot be installed"
fi
rm -rf "$tmp/probe-venv"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check \
  "kubernetes-validate==$KV_VERSION" || die "pip install kubernetes-validate==$KV_VERSION"

# validate FILE...: every resource in the files against every pinned version.
# kubernetes-validate exits 0 with a WARN for a kind it has no schema for
# (a misspelt kind, say), so any WARN or ERROR line fails too.
validate() {
  local k out status
  for k in "${KUBE_VERSIONS[@]}"; do
    status=0
    out=$("$tmp/venv/bin/kubernetes-validate" --strict -k "$k" "$@" 2>&1) || status=$?
    if [[ $status -ne 0 ]] || grep -qE '^(WARN|ERROR)' <<<"$out"; then
      echo "$out" >&2
      return 1
    fi
  done
}

# --- the renderer -------------------------------------------------------------
kubectl_bin=""
if command -v kubectl >/dev/null; then
  kubectl_bin=kubectl
elif apt_install kubernetes-client 2>/dev/null && command -v kubectl >/dev/null; then
  kubectl_bin=kubectl
else
  log "kubectl is missing and Debian's kubernetes-client could not be installed: SKIPPING the kustomize rendering"
fi

# check DIR: every manifest in DIR, then its kustomize rendering.
check() {
  local dir=$1 f
  local manifests=()
  for f in "$dir"/*.yaml; do
    [[ $(basename "$f") == kustomization.yaml ]] || manifests+=("$f")
  done
  [[ ${#manifests[@]} -gt 0 ]] || { echo "no manifests in $dir" >&2; return 1; }
  validate "${manifests[@]}" || return 1
  if [[ -n $kubectl_bin ]]; then
    "$kubectl_bin" kustomize "$dir" >"$tmp/rendered.yaml" || return 1
    validate "$tmp/rendered.yaml" || return 1
  fi
}

# --- self-test: each broken copy must be refused --------------------------------
# break_copy NAME SED-EXPRESSION FILE: a copy of the directory with one edit.
break_copy() {
  local name=$1 expr=$2 file=$3
  mkdir -p "$tmp/broken"
  rm -rf "${tmp:?}/broken/$name"
  cp -r "$here" "$tmp/broken/$name"
  sed -i "$expr" "$tmp/broken/$name/$file"
  if cmp -s "$here/$file" "$tmp/broken/$name/$file"; then
    die "self-test $name: the edit did not change $file"
  fi
  echo "$tmp/broken/$name"
}

selftest() {
  local name=$1 expr=$2 file=$3 dir
  dir=$(break_copy "$name" "$expr" "$file")
  if check "$dir" >/dev/null 2>&1; then
    die "self-test: a broken copy ($name) passed validation"
  fi
  log "self-test ok: broken copy refused ($name)"
}

# A misspelt field (strictness), a wrong type, a misspelt kind.
selftest unknown-field 's/^\( *\)readOnlyRootFilesystem: true$/\1readOnlyRootFileSystem: true/' statefulset.yaml
selftest wrong-type 's/minAvailable: 2/minAvailable: [2]/' poddisruptionbudget.yaml
selftest unknown-kind 's/^kind: Service$/kind: Servise/' service-agents.yaml
if [[ -n $kubectl_bin ]]; then
  # A resource the kustomization names but that does not exist.
  selftest kustomize-missing 's/^  - configmap.yaml$/  - configmaps.yaml/' kustomization.yaml
fi

# --- the real thing -------------------------------------------------------------
check "$here" || die "packaging/kubernetes manifests do not validate (output above)"
# What the server needs in each tenant cluster (applied there, not in kube0).
validate "$here"/tenant/*.yaml || die "packaging/kubernetes/tenant manifests do not validate (output above)"
# The custom resources of lks-kube-controller (generated; a unit test keeps
# them equal to the Rust types, tests/tests/kube_crds.rs applies them).
validate "$here"/crds/*.yaml || die "packaging/kubernetes/crds do not validate (output above)"
validate "$here"/controller/*.yaml || die "packaging/kubernetes/controller manifests do not validate (output above)"
# monitoring/ is not validated here: its PrometheusRule is a custom resource
# of the Prometheus Operator, whose schema kubernetes-validate does not have.
# scripts/check-monitoring.sh checks it instead (generated from rules.yaml,
# which promtool checks and unit-tests).
log "ok: manifests valid against Kubernetes ${KUBE_VERSIONS[*]} (strict)${kubectl_bin:+, kustomize rendering too}"
