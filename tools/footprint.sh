#!/usr/bin/env bash
# Builds the footprint probe (umd-core encoder + decoder behind extern "C"
# entry points, fat LTO, opt-level s) for the embedded targets, prints the
# section sizes of its own object (compiler-builtins excluded), and fails if
# a panic path survived optimisation (a function of ours that still
# references a core::panicking routine after fat LTO), or if the driver
# built without the mmu feature links the GPU VA allocator, or if a
# budgeted build's .text is above its budget (the fast one-generation
# driver with the MMU, 42 KiB; the smallest one-generation driver, 28 KiB),
# or if the MCU configuration's RAM (.data + .bss) is above its budget.
# FAST_MMU_BUDGET, SMALLEST_BUDGET and MCU_RAM_BUDGET (bytes) override the
# budgets, to show that the check fails.
#
# `tools/footprint.sh table` instead prints the per-configuration table of
# docs/perf.md: the direct-mode driver alone (probe without its `codec`
# entry points) on thumbv7em-none-eabihf, per generation feature set,
# encoder and optional part (umd-core's features hang-capture, trace,
# local-memory, mmu; without mmu the probe runs in MMU bypass), each with
# the folded encoder, with size-first and with the compact encoder, and
# where the bytes of the budgeted fast build with the MMU go (symbol
# sizes of the fat-LTO object, grouped by subsystem).
set -euo pipefail
cd "$(dirname "$0")/.."

own_sizes() {
    llvm-size -A "$1" | awk '
        /\(ex / { own = ($1 ~ /^footprint-/) ; next }
        own && $1 ~ /^\.text/   { t += $2 }
        own && $1 ~ /^\.rodata/ { r += $2 }
        own && $1 ~ /^\.data/   { d += $2 }
        own && $1 ~ /^\.bss/    { b += $2 }
        END { printf "%d %d %d %d", t, r, d, b }'
}

# Code of ours (umd_core, the probe's entry points) that branches to a
# panic routine means a panic path survived optimisation. The conformance
# suite is test code and is not held to this.
# The third argument, if given, is the pattern of section names checked
# instead (the C API's library: umd-core, umd-capi and its entry points).
panic_paths() {
    local offenders
    local pattern=${3:-umd_core|umd_fp_device|umd_fp_encode|umd_fp_decode|umd_fp_check}
    offenders=$(llvm-objdump -r "$1" 2>/dev/null | awk -v pat="$pattern" '
        /^RELOCATION RECORDS FOR/ { sec = $4; next }
        sec ~ ("^\\[\\.text\\..*(" pat ")") && $3 ~ /4core/ && $3 ~ /panicking|_fail|panic_/ { print sec " -> " $3 }' | sort -u)
    if [ -n "$offenders" ]; then
        echo "$2: panic paths survive (code of ours that calls a core::panicking routine):" >&2
        echo "$offenders" >&2
        return 1
    fi
}

# Without umd-core's mmu feature direct mode runs in MMU bypass, where a
# GPU address is the memory's own, and must link none of the GPU VA
# allocator (umd_core::mem::va; Backend::VA_ALLOCATOR is false there).
va_linked() {
    local dir syms
    dir=$(mktemp -d)
    (cd "$dir" && ar x "$OLDPWD/$1")
    syms=$(llvm-nm --demangle "$dir"/footprint-*.o | grep -F 'umd_core::mem::va::' || true)
    rm -rf "$dir"
    if [ -n "$syms" ]; then
        echo "$2: the GPU VA allocator is linked without the mmu feature:" >&2
        echo "$syms" >&2
        return 1
    fi
}

if [ "${1:-}" = table ]; then
    t=thumbv7em-none-eabihf
    lib="target/$t/footprint/libfootprint.a"
    all=hang-capture,trace,local-memory,mmu
    yn() { case ",$1," in *",$2,"*) echo yes ;; *) echo no ;; esac; }
    # One row per feature set: its .text with the folded (fast) encoder,
    # the same with size-first, and with the compact encoder. `build`
    # leaves the sizes in $sizes (not printed: an exit in a command
    # substitution would not stop the script).
    build() {
        cargo build -q -p footprint --profile footprint --target "$t" --no-default-features --features "$1"
        panic_paths "$lib" "$t ($1)" || exit 1
        [ "$(yn "$1" mmu)" = yes ] || va_linked "$lib" "$t ($1)" || exit 1
        sizes=$(own_sizes "$lib")
    }
    printf '| generations, entry points | hang capture | trace | local memory | MMU | .text | .text, `size-first` | .text, `compact-encoder` | .rodata |\n'
    printf '| --- | :-: | :-: | :-: | :-: | ---: | ---: | ---: | ---: |\n'
    for f in \
        gen1,gen2,codec,$all gen1,gen2,$all gen1,gen2,validation,$all gen1,$all gen2,$all \
        gen1,gen2,trace,local-memory,mmu gen1,gen2,hang-capture,local-memory,mmu \
        gen1,gen2,hang-capture,trace,mmu gen1,gen2,hang-capture,trace,local-memory gen1,gen2 \
        gen2,trace,local-memory,mmu gen2,hang-capture,local-memory,mmu \
        gen2,hang-capture,trace,mmu gen2,hang-capture,trace,local-memory gen1 gen2,mmu gen2; do
        build "$f"
        read -r fast rodata _ <<<"$sizes"
        build "$f,size-first"
        read -r sf _ <<<"$sizes"
        build "$f,compact-encoder"
        read -r compact _ <<<"$sizes"
        base=$(tr , '\n' <<<"$f" | grep -Ev '^(hang-capture|trace|local-memory|mmu)$' | paste -sd, -)
        printf '| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$base" "$(yn "$f" hang-capture)" "$(yn "$f" trace)" \
            "$(yn "$f" local-memory)" "$(yn "$f" mmu)" "$fast" "$sf" "$compact" "$rodata"
    done
    # Where the bytes of the budgeted fast build go (gen2, the folded
    # encoder, size-first, the MMU, none of the other optional parts), by
    # subsystem; a symbol counts in the first group whose pattern it
    # matches.
    build gen2,size-first,mmu
    dir=$(mktemp -d)
    (cd "$dir" && ar x "$OLDPWD/$lib")
    printf '\n| part of `gen2,size-first,mmu` (folded encoder; no hang capture, trace, local memory) | .text |\n| --- | ---: |\n'
    llvm-nm -S -t d --demangle "$dir"/footprint-*.o | awk '
        $3 ~ /^[tT]$/ {
            n = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", n); s = $2 + 0
            if      (n ~ /umd_core::cmd::|umd_core::hw::/)                        g = "encoder, command buffer"
            else if (n ~ /pagetable|tables::|Backend.::(map|unmap)|invalidate_tlb/) g = "MMU: page tables, map/unmap, TLB"
            else if (n ~ /hang::|debug::hang|record_failure|QueueCore.*failure|device_lost|FailureHistory/) g = "hang check, capture, recovery"
            else if (n ~ /trace/)                                                 g = "trace"
            else if (n ~ /residency|LocalMem/)                                    g = "local memory (residency)"
            else if (n ~ /mem::va::/)                                             g = "GPU VA allocator"
            else if (n ~ /mem::pool|mem::manager|mem::buffer|engine::buffers|Backer|alloc_mapped/) g = "buffers, pools"
            else if (n ~ /engine::submit|ibpool|ring::|engine::wait|sync::/)     g = "submit, rings, IB pool, wait, sync"
            else if (n ~ /engine::complete|engine::queue|Counters/)              g = "completion"
            else if (n ~ /umd_fp_device_smoke|lifecycle|direct::|drop_in_place/) g = "bring-up, teardown (inlined into the probe)"
            else                                                                   g = "other"
            sum[g] += s
        }
        END { for (g in sum) printf "| %s | %d |\n", g, sum[g] }' | sort -t'|' -k3 -nr
    rm -rf "$dir"
    exit 0
fi

status=0
printf '%-40s %-24s %8s %8s %8s %8s\n' build target .text .rodata .data .bss
for build in driver driver+conformance; do
    features=()
    [ "$build" = driver+conformance ] && features=(--features with-conformance)
    for t in thumbv7em-none-eabihf aarch64-unknown-none; do
        cargo build -q -p footprint --profile footprint --target "$t" "${features[@]}"
        lib="target/$t/footprint/libfootprint.a"
        sizes=$(own_sizes "$lib")
        read -r text rodata data bss <<<"$sizes"
        printf '%-40s %-24s %8s %8s %8s %8s\n' "$build" "$t" "$text" "$rodata" "$data" "$bss"
        panic_paths "$lib" "$t ($build)" || status=1
        # The probe's DeviceStorage static must stay all zeros (.bss): an
        # initialised one costs its whole size in flash too.
        if [ "$data" -gt 64 ]; then
            echo "$t ($build): $data bytes of .data: DeviceStorage::new() is no longer all zeros" >&2
            status=1
        fi
    done
done
# The C API's static library (umd-capi, `docs/c-api.md`): no panic path in
# its own code (the `umd_*` entry points, `umd_capi::`) nor in the core's
# as the library links it; its `#[panic_handler]` calls the C hook
# `umd_panic_hook`, which this proves unreachable.
# Both builds: the default one and the one with the capture.
for t in thumbv7em-none-eabihf aarch64-unknown-none; do
    for f in "" capture; do
        cargo build -q -p umd-capi --profile footprint --target "$t" --features "$f"
        if panic_paths "target/$t/footprint/libumd_capi.a" "$t (umd-capi ${f:-default})" 'umd_'; then
            printf '%-40s %-24s ok\n' "C API: no panic path (${f:-default})" "$t"
        else
            status=1
        fi
    done
done
# The driver without the MMU (every other optional part on): no VA
# allocator code.
t=thumbv7em-none-eabihf
cargo build -q -p footprint --profile footprint --target "$t" --no-default-features \
    --features gen1,gen2,hang-capture,trace,local-memory
va_linked "target/$t/footprint/libfootprint.a" "$t (driver without mmu)" || status=1
# The size budgets (docs/perf.md, "Budgets"), both checked: the fast
# one-generation driver with the MMU (gen2, the folded encoder,
# size-first, mmu; what a firmware that wants protection and encoding
# speed links), whose goal is 24 KiB and whose budget is held at the
# figure reached so that no change adds to it unnoticed; and the
# smallest one-generation driver (gen2, compact encoder, none of the
# optional parts), the floor for a firmware without the MMU, within
# 28 KiB.
check_budget() {
    local features=$1 budget=$2 what=$3 text
    cargo build -q -p footprint --profile footprint --target "$t" --no-default-features --features "$features"
    panic_paths "target/$t/footprint/libfootprint.a" "$t ($features)" || status=1
    read -r text _ <<<"$(own_sizes "target/$t/footprint/libfootprint.a")"
    printf '%-40s %-24s %8s (budget %s)\n' "$what" "$t" "$text" "$budget"
    if [ "$text" -gt "$budget" ]; then
        echo "$t ($features): $text bytes of .text, above the budget of $budget" >&2
        status=1
    fi
}
check_budget gen2,size-first,mmu "${FAST_MMU_BUDGET:-43008}" "fast driver with the MMU"
check_budget gen2,compact-encoder "${SMALLEST_BUDGET:-28672}" "smallest one-generation driver"
# The MCU configuration's RAM (docs/memory.md, "Choosing the capacities";
# docs/perf.md, "Capacity and RAM per configuration"): the probe built
# with `mcu` (gen2, compact encoder, no optional part; its device and
# storage the MCU preset's, its board memory the bare-metal carve-out
# with the preset's node table), whose .data + .bss is the whole RAM the
# driver needs but the stack: the device, its storage, the carve-out and
# the driver's other statics. Held to MCU_RAM_BUDGET (bytes) at the figure
# reached; the goal is 16 KiB. Its statics are listed, largest first, and
# it must be panic-free too (the carve-out and the board functions
# included).
mcu=gen2,compact-encoder,mcu
mcu_budget=${MCU_RAM_BUDGET:-56320}
cargo build -q -p footprint --profile footprint --target "$t" --no-default-features --features "$mcu"
lib="target/$t/footprint/libfootprint.a"
panic_paths "$lib" "$t ($mcu)" 'umd_core|umd_fp_|board_|platform_baremetal' || status=1
read -r text _ data bss <<<"$(own_sizes "$lib")"
ram=$((data + bss))
printf '%-40s %-24s %8s (.text %s; budget %s)\n' "MCU configuration: RAM (.data + .bss)" "$t" "$ram" "$text" "$mcu_budget"
dir=$(mktemp -d)
(cd "$dir" && ar x "$OLDPWD/$lib")
llvm-nm -S -t d --size-sort --demangle "$dir"/footprint-*.o | awk '$3 ~ /^[bBdD]$/ { n = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ /, "", n); sub(/::h[0-9a-f]+$/, "", n); printf "    %8d  %s\n", $2, n }' | sort -nr
rm -rf "$dir"
if [ "$data" -gt 64 ]; then
    echo "$t ($mcu): $data bytes of .data: a static of the MCU configuration is not all zeros" >&2
    status=1
fi
if [ "$ram" -gt "$mcu_budget" ]; then
    echo "$t ($mcu): $ram bytes of RAM, above the budget of $mcu_budget" >&2
    status=1
fi
exit $status
