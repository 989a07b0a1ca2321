#!/usr/bin/env bash
# talc's own allocator benchmarks (tools/talc-bench: SFBdragon/talc's
# benches/ with umd-core's VaAllocator added as one more arena allocator)
# and a summary: each allocator's score as a ratio to talc v5's in the
# same run. Needs the nightly toolchain (the suite uses
# #![feature(iter_intersperse)]); ~1.5 min for random_actions, ~10 s for
# the others. docs/perf.md ("VA allocator on talc's benchmark suite").
#
#   tools/talc-bench.sh [random_actions|random_actions_no_realloc|microbench|heap_efficiency ...]
#
# random_actions_no_realloc is the suite's own `--no-realloc` run (the
# same actions without reallocation; not in the default set).
set -euo pipefail
cd "$(dirname "$0")/talc-bench"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/../../target/talc-bench}
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(random_actions microbench heap_efficiency)
cargo +nightly build -q --release
mkdir -p results
# random_actions NAME LABEL [ARGS...]: one run of the suite's random_actions
# into results/NAME.csv, printed as ratios to talc v5.
random_actions() {
    local name=$1 label=$2
    shift 2
    cargo +nightly run -q --release --bin random_actions -- --name "$name" "$@" 2>/dev/null
    echo "random_actions$label (ops in 200 ms, mean of 7 trials; ratio to Talc (v5) per max size):"
    awk -F, 'NR == 1 { n = NF; for (i = 2; i <= NF; i++) h[i] = $i; next }
             { name[NR] = $1; for (i = 2; i <= NF; i++) v[NR, i] = $i; if ($1 == "Talc") t = NR; last = NR }
             END { printf "%-18s", "max size"; for (i = 2; i <= n; i++) printf "%10s", h[i]; print "";
                   for (r = 2; r <= last; r++) { printf "%-18s", name[r];
                     for (i = 2; i <= n; i++) printf "%10.2f", v[r, i] / v[t, i]; print "" } }' \
        "results/$name.csv"
}
for b in "${benches[@]}"; do
    case "$b" in
        random_actions)
            random_actions random-actions "" ;;
        random_actions_no_realloc)
            random_actions random-actions-no-realloc ", no reallocation" --no-realloc ;;
        microbench)
            cargo +nightly run -q --release --bin microbench 2>/dev/null
            echo "microbench (alloc + free ticks: p1 p25 median p75 p99; median and p99 ratio to Talc):"
            awk -F, '{ name[NR] = $1; for (i = 2; i <= 6; i++) v[NR, i] = $i; if ($1 == "Talc") t = NR }
                     END { for (r = 1; r <= NR; r++) printf "%-18s %6.0f %6.0f %6.0f %6.0f %6.0f   median %5.2fx  p99 %5.2fx\n",
                           name[r], v[r,2], v[r,3], v[r,4], v[r,5], v[r,6], v[r,4] / v[t,4], v[r,6] / v[t,6] }' \
                results/microbench.csv ;;
        heap_efficiency)
            cargo +nightly run -q --release --bin heap_efficiency 2>/dev/null
            echo "heap_efficiency (% of the arena in use when an allocation first fails, mean of 300 fills):"
            awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) h[i] = $i; next }
                     { for (i = 1; i <= NF; i++) printf "%-18s %6.2f\n", h[i], $i }' results/heap-efficiency.csv ;;
        *) echo "unknown benchmark $b" >&2; exit 2 ;;
    esac
done
