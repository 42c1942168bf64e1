#!/usr/bin/env bash
# The table of RELIABILITY.md, from a real run: runs the fault and
# hostile-input tests one after another (--no-capture), collects the one
# summary line each prints (CRASH, RESFAULT, NETFAULT, HOSTILE), checks that
# every outcome that must be 0 is 0 and that no expected line is missing,
# and prints the table as markdown.
#
#   bash scripts/reliability.sh          # everything (root: network namespaces, tmpfs, nftables)
#   bash scripts/reliability.sh --fast   # without the network tests (~3 min; CI runs this)
#   bash scripts/reliability.sh --table LINES   # only render and check summary lines kept earlier
#
# The table also goes to target/reliability/table.md, the raw lines to
# target/reliability/lines.txt and the test output to target/reliability/run.log.
# Exit status: non-zero when a test failed, a line is missing, or a count
# that must be 0 is not.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0 lines_from=
case "${1:-}" in
  --fast) fast=1 ;;
  --table) lines_from=${2:?--table needs a file of summary lines} ;;
  "") ;;
  *) echo "usage: bash scripts/reliability.sh [--fast | --table LINES]" >&2; exit 2 ;;
esac

out=target/reliability
mkdir -p "$out"
log=$out/run.log
: >"$log"

# Each suite, with the number of summary lines it prints.
e2e=(--test hostile --test disk_full --test fd_limit --test server_crash --test server_crash_enrol --test server_crash_issue --test rollout_crash --test slow_client --test agent_retry --test trust_attacks)
expect_lines=$((6 + 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1))
if [ "$fast" = 0 ]; then
  e2e+=(--test net_faults)
  expect_lines=$((expect_lines + 3))
fi
expect_lines=$((expect_lines + 4)) # lksadmin-agent --test crash

status=0
if [ -n "$lines_from" ]; then
  grep -E '^(CRASH|RESFAULT|NETFAULT|HOSTILE) ' "$lines_from" >"$out/lines.txt" || true
  expect_lines=$(wc -l <"$out/lines.txt")
else
  cargo build --workspace --bins >&2
  echo "== agent crash matrix (lksadmin-agent/tests/crash/)" >&2
  cargo nextest run -p lksadmin-agent --features fault-injection --test crash --no-capture >>"$log" 2>&1 || status=1
  echo "== end-to-end faults and hostile input (tests/tests/)" >&2
  cargo nextest run -p lks-e2e "${e2e[@]}" --no-capture >>"$log" 2>&1 || status=1
  [ "$status" = 0 ] || echo "a test failed: see $log" >&2
  grep -E '^(CRASH|RESFAULT|NETFAULT|HOSTILE) ' "$log" >"$out/lines.txt" || true
fi

# Outcomes that must be 0 wherever a line reports them.
must_be_zero="mixed_files corrupt_files_seen accepted written panics internal other half_stored half_visible \
acknowledged_lost duplicate_applies double_applies skipped leaked staging_left left_over leftover_files \
counted_against_bundle failed outside_entries claim_counted unrecorded duplicate_nodes uses_over_granted short_file_ended_clean given_up_for_ever \
unverified_cached unverified_restored"

awk -v zero="$must_be_zero" -v expect="$expect_lines" -v table="$out/table.md" '
BEGIN {
  n = split(zero, z, " "); for (i = 1; i <= n; i++) bad[z[i]] = 1
  print "| kind | fault or input | counts | outcomes that must be 0 |" > table
  print "|---|---|---|---|" > table
}
{
  kind = $1; name = $2; sub(/:$/, "", name)
  counts = ""; zeros = ""; wrong = ""
  for (i = 3; i <= NF; i++) {
    # error="…" (the one line a refusal printed) is last and has spaces: it
    # stays in lines.txt, not in the table.
    if ($i ~ /^error=/) break
    if (split($i, kv, "=") != 2) { counts = counts " " $i; continue }
    if (kv[1] in bad) {
      zeros = zeros (zeros == "" ? "" : ", ") kv[1] "=" kv[2]
      if (kv[2] != "0") wrong = wrong " " kv[1] "=" kv[2]
    } else {
      counts = counts (counts == "" ? "" : ", ") kv[1] "=" kv[2]
    }
  }
  verdict = (wrong == "" ? "all 0" : "**NOT 0:" wrong "**")
  if (zeros == "") { zeros = "–"; verdict = "none reported" }
  if (wrong != "") failed++
  print "| " kind " | " name " | " counts " | " zeros " (" verdict ") |" > table
  lines++
}
END {
  if (lines != expect) { printf "expected %d summary lines, got %d\n", expect, lines > "/dev/stderr"; exit 1 }
  if (failed) { printf "%d line(s) report an outcome that must be 0\n", failed > "/dev/stderr"; exit 1 }
}' "$out/lines.txt" || status=1

cat "$out/table.md"
echo
echo "$(wc -l <"$out/lines.txt") summary lines in $out/lines.txt; test output in $log" >&2
exit "$status"
