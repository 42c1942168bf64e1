#!/usr/bin/env bash
# The whole test suite: unit tests, property tests and the end-to-end tests
# that start the real server, agents and lksctl. This is the README's test
# command and what .ci/run runs after the linters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# End-to-end tests start the real binaries, so build them first.
cargo build --workspace --bins
cargo nextest run --workspace --no-fail-fast "$@"
# The vendored h2 (third_party/h2/LKSADMIN-PATCH.md): its own unit tests and
# the patch's. The HPACK fixture tests need files crates.io does not ship.
cargo test --manifest-path third_party/h2/Cargo.toml --target-dir target/h2-tests \
  --lib -q -- --skip hpack::test::fixture
# The vendored tonic (third_party/tonic/LKSADMIN-PATCH.md): its own unit
# tests (default features) and the patch's.
cargo test --manifest-path third_party/tonic/Cargo.toml --target-dir target/tonic-tests --lib -q
