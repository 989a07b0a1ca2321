#!/usr/bin/env bash
# Regression gate on instruction counts (docs/perf.md, "Instruction counts").
#
# Runs the callgrind benchmarks of umd-core/benches/icount.rs (gungraun)
# and compares each benchmark's instruction count (callgrind's Ir) with the
# committed baseline, umd-core/benches/icount-baseline.txt. Prints a table
# and fails if any benchmark costs more than the tolerance above its
# baseline (default 3 %, PERF_GATE_TOLERANCE_PCT to change), or if a
# baselined benchmark no longer runs. Improvements beyond the tolerance are
# reported (commit a new baseline with --update, and say so in the commit).
#
#   tools/perf-gate.sh            compare against the baseline
#   tools/perf-gate.sh --update   run, then rewrite the baseline
#
# Needs valgrind and gungraun-runner 0.18.2 (the version of the gungraun
# dev-dependency); installs them when missing (apt as root, cargo install).
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=umd-core/benches/icount-baseline.txt
tolerance=${PERF_GATE_TOLERANCE_PCT:-3}
runner_version=0.18.2
update=0
case "${1:-}" in
    --update) update=1 ;;
    "") ;;
    *) echo "usage: tools/perf-gate.sh [--update]" >&2; exit 2 ;;
esac

need_apt() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "perf-gate: $1 is missing; install it (apt-get install $1)" >&2
        exit 1
    fi
    apt-get update -qq && apt-get install -y -qq "$1" >/dev/null
}
command -v valgrind >/dev/null || need_apt valgrind
command -v jq >/dev/null || need_apt jq
if [ "$(gungraun-runner --version 2>/dev/null | awk '{print $2}')" != "$runner_version" ]; then
    cargo install -q gungraun-runner --version "$runner_version" --locked
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# One JSON object per benchmark; the new run's Ir is the left (or only) value.
cargo bench -q -p umd-core --bench icount -- --output-format=json >"$out"
now=$(jq -r '"\(.function_name)/\(.id) \(.profiles[0].summaries.total.summary.Callgrind.Ir.metrics
          | (.Left // .Both[0]) | .Int)"' "$out" | sort)
[ -n "$now" ] || { echo "perf-gate: the benchmark printed no results" >&2; exit 1; }

toolchain="$(rustc --version), $(valgrind --version), gungraun $runner_version"
if [ "$update" = 1 ]; then
    {
        echo "# Instruction counts (callgrind Ir) of umd-core/benches/icount.rs, one benchmark a line."
        echo "# Checked by tools/perf-gate.sh (tolerance ${tolerance} %); rewritten by tools/perf-gate.sh --update."
        echo "# Measured with: $toolchain"
        echo "$now"
    } >"$baseline"
    echo "perf-gate: baseline rewritten ($baseline)"
    cat "$baseline"
    exit 0
fi

[ -f "$baseline" ] || { echo "perf-gate: no baseline ($baseline); run with --update" >&2; exit 1; }
recorded=$(sed -n 's/^# Measured with: //p' "$baseline")
if [ "$recorded" != "$toolchain" ]; then
    echo "perf-gate: note: baseline measured with '$recorded', now '$toolchain';"
    echo "perf-gate: a compiler change moves counts: re-baseline (--update) in a commit of its own if it does."
fi

printf '%-28s %14s %14s %8s  %s\n' benchmark baseline now "now/base" status
fail=0
while read -r name base; do
    case "$name" in '#'* | '') continue ;; esac
    cur=$(awk -v n="$name" '$1 == n { print $2 }' <<<"$now")
    if [ -z "$cur" ]; then
        printf '%-28s %14s %14s %8s  %s\n' "$name" "$base" - - "MISSING (not run)"
        fail=1
        continue
    fi
    verdict=$(awk -v b="$base" -v c="$cur" -v t="$tolerance" 'BEGIN {
        r = c / b; s = "ok";
        if (r > 1 + t / 100) s = "REGRESSION";
        else if (r < 1 - t / 100) s = "improved";
        printf "%.3f %s", r, s }')
    printf '%-28s %14s %14s %8s  %s\n' "$name" "$base" "$cur" ${verdict}
    case "$verdict" in *REGRESSION) fail=1 ;; esac
done <"$baseline"
while read -r name cur; do
    grep -q "^$name " "$baseline" || printf '%-28s %14s %14s %8s  %s\n' "$name" - "$cur" - "new (not in baseline)"
done <<<"$now"

if [ "$fail" = 1 ]; then
    echo "perf-gate: FAILED: instruction count above baseline + ${tolerance} % (or a benchmark missing)." >&2
    echo "perf-gate: if the cost is intended, run tools/perf-gate.sh --update and say why in the commit." >&2
    exit 1
fi
echo "perf-gate: ok (tolerance ${tolerance} %)"
