#!/usr/bin/env bash
# The RUSTC_WRAPPER of scripts/fuzz.sh: adds the sanitizer-coverage
# instrumentation libFuzzer steers by (the flags `cargo fuzz` passes) to the
# crates under test, the fuzz targets and the parsers they call. The rest of
# the tree (tokio, tonic, rustls, …) needs no coverage feedback, and leaving
# it uninstrumented makes the cold build much shorter. Build scripts
# (`build_script_build`), proc macros and what they use are host units,
# compiled without `--target`, and never instrumented.
# Cargo does not see edits here: rm -rf fuzz/target after changing the list.
set -euo pipefail

# Crate names: the fuzz targets, the code under test, the parsers.
instrumented=(bundle_toml pb_manifest journal state lks_proto lks_bundle lks_wire
  lksadmin_agent serde_json toml toml_parser toml_datetime serde_spanned winnow prost bytes)

rustc=$1
shift
crate=""
host=1
prev=""
for arg in "$@"; do
  [ "$prev" = --crate-name ] && crate=$arg
  [ "$prev" = --target ] && host=0
  prev=$arg
done
[ "$host" = 1 ] && exec "$rustc" "$@"
for c in "${instrumented[@]}"; do
  if [ "$c" = "$crate" ]; then
    exec "$rustc" "$@" \
      -Cpasses=sancov-module \
      -Cllvm-args=-sanitizer-coverage-level=4 \
      -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
      -Cllvm-args=-sanitizer-coverage-pc-table \
      -Cllvm-args=-sanitizer-coverage-trace-compares \
      -Cllvm-args=-sanitizer-coverage-stack-depth
  fi
done
exec "$rustc" "$@"
