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
