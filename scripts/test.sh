#!/usr/bin/env bash
# The whole test suite: unit tests, property tests and the end-to-end tests
# that start the real server, agents and lksctl. This is the README's test
# command and what .ci/run runs after the linters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# End-to-end tests start the real binaries, so build them first.
cargo build --workspace --bins
rm -f target/nextest/default/junit.xml
rc=0
cargo nextest run --workspace --no-fail-fast "$@" || rc=$?
# The tail of the log names each failed test and its panic (a failing
# end-to-end test prints every log of what it started above it), and each
# failover test that passed only on its retry.
# The summary only reports: a report it cannot read never fails the run.
if [ -f target/nextest/default/junit.xml ]; then
  python3 scripts/test-failures.py target/nextest/default/junit.xml || true
fi
[ "$rc" -eq 0 ] || exit "$rc"
# The vendored h2 (third_party/h2/LKSADMIN-PATCH.md): its own unit tests and
# the patch's. The HPACK fixture tests need files crates.io does not ship.
cargo test --manifest-path third_party/h2/Cargo.toml --target-dir target/h2-tests \
  --lib -q -- --skip hpack::test::fixture
# The vendored tonic (third_party/tonic/LKSADMIN-PATCH.md): its own unit
# tests (default features) and the patch's.
cargo test --manifest-path third_party/tonic/Cargo.toml --target-dir target/tonic-tests --lib -q
