#!/usr/bin/env bash
# Builds the footprint probe (umd-core encoder + decoder behind extern "C"
# entry points, fat LTO, opt-level s) for the embedded targets, prints the
# section sizes of its own object (compiler-builtins excluded), and fails if
# a panic path survived optimisation (a function of ours that still
# references a core::panicking routine after fat LTO).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
printf '%-40s %-24s %8s %8s %8s %8s\n' build target .text .rodata .data .bss
for build in driver driver+conformance; do
    features=()
    [ "$build" = driver+conformance ] && features=(--features with-conformance)
    for t in thumbv7em-none-eabihf aarch64-unknown-none; do
        cargo build -q -p footprint --profile footprint --target "$t" "${features[@]}"
        lib="target/$t/footprint/libfootprint.a"
        sizes=$(llvm-size -A "$lib" | awk '
            /\(ex / { own = ($1 ~ /^footprint-/) ; next }
            own && $1 ~ /^\.text/   { t += $2 }
            own && $1 ~ /^\.rodata/ { r += $2 }
            own && $1 ~ /^\.data/   { d += $2 }
            own && $1 ~ /^\.bss/    { b += $2 }
            END { printf "%d %d %d %d", t, r, d, b }')
        read -r text rodata data bss <<<"$sizes"
        printf '%-40s %-24s %8s %8s %8s %8s\n' "$build" "$t" "$text" "$rodata" "$data" "$bss"
        # Code of ours (umd_core, the probe's entry points) that branches to
        # a panic routine means a panic path survived optimisation. The
        # conformance suite is test code and is not held to this.
        offenders=$(llvm-objdump -r "$lib" 2>/dev/null | awk '
            /^RELOCATION RECORDS FOR/ { sec = $4; next }
            sec ~ /^\[\.text\..*(umd_core|umd_fp_device|umd_fp_encode|umd_fp_decode|umd_fp_check)/ && $3 ~ /4core/ && $3 ~ /panicking|_fail|panic_/ { print sec " -> " $3 }' | sort -u)
        if [ -n "$offenders" ]; then
            echo "$t ($build): panic paths survive in umd-core:" >&2
            echo "$offenders" >&2
            status=1
        fi
    done
done
exit $status
