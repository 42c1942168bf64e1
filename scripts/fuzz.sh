#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ (libFuzzer, coverage-guided, AddressSanitizer)
# with the installed stable toolchain and runs each for a bounded time.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]          run every (or the named) target SECONDS
#                                                       each (default 30), on fuzz/corpus/<target>/
#   bash scripts/fuzz.sh --merge [SECONDS] [TARGET...]  the same, then add the inputs that reach
#                                                       new coverage to fuzz/corpus/ (to commit)
#   bash scripts/fuzz.sh --repro TARGET FILE            run one input again (a crash artifact)
#   bash scripts/fuzz.sh --seed                         regenerate the seeds the agent and the
#                                                       example bundles give (fuzz/corpus/)
#
# New inputs go to a temporary directory: a run leaves the repository's corpus
# alone unless --merge is given. A crash, a failed assertion, a timeout or a
# sanitizer report fails the run; the input is kept in fuzz/artifacts/<target>/
# and the command to reproduce it is printed.
#
# Sanitizer coverage and -Zsanitizer are unstable rustc flags: RUSTC_BOOTSTRAP=1
# lets the stable compiler accept them for this build only (fuzz/target/). No
# shipped binary is built this way.
#
# LKS_FUZZ_JOBS: targets run at once (default: the number of CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

mode=run
case "${1:-}" in
  --merge) mode=merge; shift ;;
  --repro) mode=repro; shift ;;
  --seed) mode=seed; shift ;;
  -h | --help) usage ;;
esac

triple=$(rustc -vV | sed -n 's/^host: //p')
target_dir=$PWD/fuzz/target
bin_dir=$target_dir/$triple/release
all_targets=()
for f in fuzz/fuzz_targets/*.rs; do
  all_targets+=("$(basename "$f" .rs)")
done

# What `cargo fuzz build` passes, minus -Zbuild-std (the prebuilt stable std
# is used uninstrumented): AddressSanitizer, debug assertions and overflow
# checks everywhere; the coverage instrumentation only where
# fuzz/rustc-wrapper.sh adds it. --target keeps these flags off build
# scripts and proc macros.
rustflags=(--cfg fuzzing -Zsanitizer=address -Cdebug-assertions -Coverflow-checks)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"

build() {
  echo "fuzz: building ${*:-all targets} ($triple, release, sancov + ASan)" >&2
  local bins=(--bins)
  if (($#)); then
    bins=()
    for t in "$@"; do bins+=(--bin "$t"); done
  fi
  RUSTC_BOOTSTRAP=1 RUSTFLAGS="${rustflags[*]} ${RUSTFLAGS:-}" RUSTC_WRAPPER=$PWD/fuzz/rustc-wrapper.sh \
    cargo build --manifest-path fuzz/Cargo.toml --target-dir "$target_dir" \
    --release --target "$triple" ${LKS_FUZZ_TIMINGS:+--timings} "${bins[@]}"
}

known() {
  local t
  for t in "${all_targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  echo "fuzz: no target '$1' (targets: ${all_targets[*]})" >&2
  exit 2
}

if [ "$mode" = seed ]; then
  # The agent's own crash test writes real journal, state and desired-state
  # files (and the signed example bundles); bundle.toml seeds are the examples.
  seeds=$(mktemp -d)
  trap 'rm -rf "$seeds"' EXIT
  LKS_FUZZ_SEEDS=$seeds cargo test -q -p lksadmin-agent --features fault-injection --test crash -- \
    --ignored --exact write_fuzz_seeds
  # Signed releases and trust roots for pb_release.
  LKS_FUZZ_SEEDS=$seeds cargo test -q -p lks-bundle --lib -- --ignored --exact release::wire::tests::write_fuzz_seeds
  for t in journal state pb_manifest pb_release; do
    mkdir -p "fuzz/corpus/$t"
    cp "$seeds/$t"/* "fuzz/corpus/$t/"
  done
  mkdir -p fuzz/corpus/bundle_toml
  for b in examples/bundles/*/bundle.toml; do
    cp "$b" "fuzz/corpus/bundle_toml/$(basename "$(dirname "$b")").toml"
  done
  echo "fuzz: seeds written to fuzz/corpus/" >&2
  exit 0
fi

if [ "$mode" = repro ]; then
  [ $# -eq 2 ] || usage
  known "$1"
  build "$1"
  exec "$bin_dir/$1" "$2"
fi

secs=30
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  secs=$1
  shift
fi
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do known "$t"; done

build "${targets[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs_max=${LKS_FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1 rc=0
  mkdir -p "$work/new/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t"
  # The first directory receives new inputs; the repository's corpus is only read.
  "$bin_dir/$t" -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" "$work/new/$t" "fuzz/corpus/$t" \
    >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n || true; done
  echo "fuzz: $t running for ${secs}s" >&2
  fuzz_one "$t" &
done
wait

failed=()
for t in "${targets[@]}"; do
  if [ "$(cat "$work/$t.rc")" = 0 ]; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
    cov=$(grep -o 'cov: [0-9]*' "$work/$t.log" | tail -n1 | cut -d' ' -f2)
    echo "fuzz: $t: ${runs:-?} runs in ${secs}s, coverage ${cov:-?}," \
      "corpus $(find "fuzz/corpus/$t" -type f | wc -l) + $(find "$work/new/$t" -type f | wc -l) new, no failure"
  else
    failed+=("$t")
    echo "fuzz: $t FAILED:"
    grep -m1 -A12 -E 'panicked at|==ERROR|ERROR: libFuzzer' "$work/$t.log" || true
    echo "…"
    tail -n 8 "$work/$t.log"
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$work/$t.log" | tail -n1)
    if [ -n "$artifact" ]; then
      echo "fuzz: $t: failing input: $artifact"
      echo "fuzz: $t: reproduce with: bash scripts/fuzz.sh --repro $t $artifact"
    fi
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi

if [ "$mode" = merge ]; then
  for t in "${targets[@]}"; do
    before=$(find "fuzz/corpus/$t" -type f | wc -l)
    # Additive merge: every input already in the corpus stays, a new one is
    # added only if it reaches an edge the corpus does not (hit counts do not
    # count, which keeps the committed corpus small).
    "$bin_dir/$t" -merge=1 -use_counters=0 "fuzz/corpus/$t" "$work/new/$t" >"$work/$t.merge.log" 2>&1 || {
      tail -n 20 "$work/$t.merge.log"
      exit 1
    }
    echo "fuzz: $t: corpus $before -> $(find "fuzz/corpus/$t" -type f | wc -l) inputs"
  done
fi
