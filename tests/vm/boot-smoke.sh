#!/usr/bin/env bash
# Boots the Debian 12 test root (build-root.sh) with systemd and cloud-init,
# seeded with USER_DATA, waits until multi-user.target is reached and
# cloud-init is done without errors, checks a marker file, and powers off.
#
#   tests/vm/boot-smoke.sh [USER_DATA]
#
# Without USER_DATA it uses smoke-user-data.yaml, whose runcmd writes
# /var/lib/lks-smoke/marker. Environment:
#   LKS_VM_EXPECT   path inside the VM that must exist after boot (default:
#                   the smoke marker with the default user-data, none otherwise)
#   LKS_VM_TIMEOUT  seconds to wait for the boot (default 300)
#   LKS_VM_CACHE, LKS_VM_KEEP, LKS_VM_ALLOW_DEGRADED: see lib.sh, build-root.sh
# Exits non-zero with one "vm: FAIL: …" line as the last line on failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

user_data=${1:-$here/smoke-user-data.yaml}
expect=${LKS_VM_EXPECT-}
if [ $# -eq 0 ] && [ -z "$expect" ]; then
  expect=/var/lib/lks-smoke/marker
fi

vm_start "$user_data"
vm_wait_boot "${LKS_VM_TIMEOUT:-300}"
if [ -n "$expect" ]; then
  vm_exec test -e "$expect" || vm_die "$expect does not exist in the VM after boot"
  vm_log "found $expect"
fi
vm_stop
vm_log "boot-smoke: OK"
