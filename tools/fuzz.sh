#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time on its checked-in seed
# corpus (fuzz/corpus/<target>, never modified: new inputs go to
# target/fuzz-corpus/<target>) and prints executions and coverage.
# Usage: tools/fuzz.sh [SECONDS per target, default 60] [TARGET...]
# A crash, or one input running longer than 30 s (a hang), fails the run;
# libFuzzer leaves the input in fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(decode roundtrip va_alloc driver model protocol)
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
cargo +nightly fuzz build
for t in "${targets[@]}"; do
    work="../target/fuzz-corpus/$t"
    mkdir -p "$work"
    log="../target/fuzz-$t.log"
    if ! cargo +nightly fuzz run "$t" "$work" "corpus/$t" -- -max_total_time="$secs" -timeout=30 -print_final_stats=1 >"$log" 2>&1; then
        # The panic message and the first frames, then libFuzzer's summary.
        grep -m1 -A12 -E 'panicked at|ERROR: (AddressSanitizer|libFuzzer)' "$log" || true
        tail -25 "$log"
        echo "fuzz target $t failed (input in fuzz/artifacts/$t)" >&2
        exit 1
    fi
    done_line=$(grep -E '^#[0-9]+.*DONE' "$log" | tail -1)
    echo "$t: ${secs}s: $done_line"
done
