#!/usr/bin/env bash
# Builds the debug kernel for the Linux guest tests (linux-tests) from
# Debian's `linux-source-6.12` package: `tinyconfig` plus
# linux-tests/debug-kernel.config (lockdep, KASAN, kmemleak, DEBUG_OBJECTS,
# DMA-API debugging, failslab; see docs/reliability.md, "The debug kernel").
#
# usage: tools/build-debug-kernel.sh [CACHE]
#   CACHE defaults to $REFGPU_DEBUG_KERNEL_CACHE, else
#   ~/.cache/refgpu/debug-kernel (outside the clone: a second clone or a
#   fresh target/ reuses the build).
#
# Result, under CACHE/<source version>-<hash of the fragment and this
# script's commands>/:
#   build/                the configured, built source tree (the KDIR the
#                         module is built against; object files and unused
#                         sources removed)
#   bzImage               the kernel
#   modules/order         empty: the DRM helpers are built in
#   kver                  the kernel release (uname -r)
#   build.log, time       the build's log and its wall/user/sys seconds
#   ok                    written last: the tree is complete
# The last line the script prints on stdout is that directory's path
# (what linux-tests boots: each run takes the kernel its own fragment and
# script name, so runs with different configurations do not race on a
# shared pointer). The build runs under
# `flock CACHE/.lock` (two test processes do not build it twice), with
# `nice` and -j$(nproc). Needs the package `linux-source-6.12` and the
# kernel's build tools (.ci/install-debug-kernel.sh installs them).
#
# The DRM helpers refgpu.ko uses (drm_sched, drm_gpuvm, drm_exec,
# drm_gem_shmem_helper) are hidden Kconfig symbols that only a driver
# selects: the script appends to the extracted drivers/gpu/drm/Kconfig one
# symbol, DRM_REFGPU_DEPS, that selects them (and devcoredump), and the
# fragment turns it on.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FRAGMENT=$ROOT/linux-tests/debug-kernel.config
TARBALL=/usr/src/linux-source-6.12.tar.xz
CACHE=${1:-${REFGPU_DEBUG_KERNEL_CACHE:-$HOME/.cache/refgpu/debug-kernel}}

if [ ! -f "$TARBALL" ]; then
    echo "error: $TARBALL missing; run as root: bash .ci/install-debug-kernel.sh" >&2
    exit 1
fi
VERSION=$(dpkg-query -W -f='${Version}' linux-source-6.12)
# The cache key: the fragment and this script without its comment and
# echo lines (an edit of what it says does not rebuild).
HASH=$({ grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*echo ' "$0"; cat "$FRAGMENT"; } | sha256sum | cut -c1-12)
NAME="${VERSION//[^A-Za-z0-9.+-]/_}-$HASH"
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
OUT=$CACHE/$NAME

exec 9>"$CACHE/.lock"
flock 9
if [ -f "$OUT/ok" ]; then
    echo "debug kernel $(cat "$OUT/kver") already in:"
    echo "$OUT"
    exit 0
fi

echo "building the debug kernel $NAME in $OUT (load: $(cut -d' ' -f1-3 /proc/loadavg))"
rm -rf "$OUT"
mkdir -p "$OUT/build" "$OUT/modules"
tar -xf "$TARBALL" -C "$OUT/build" --strip-components=1
B=$OUT/build
cat >>"$B/drivers/gpu/drm/Kconfig" <<'KCONFIG'

config DRM_REFGPU_DEPS
	bool "DRM helpers of the out-of-tree refgpu driver"
	depends on DRM && MMU
	select DRM_SCHED
	select DRM_GPUVM
	select DRM_EXEC
	select DRM_GEM_SHMEM_HELPER
	select WANT_DEV_COREDUMP
	help
	  Builds in the hidden helpers the refgpu driver (kmd/) links against.
KCONFIG

export KBUILD_BUILD_USER=refgpu KBUILD_BUILD_HOST=refgpu
MAKE=(nice make -C "$B" -j"$(nproc)" CC=gcc-12 HOSTCC=gcc-12)
start=$(date +%s)
{
    "${MAKE[@]}" tinyconfig
    (cd "$B" && ARCH=x86 scripts/kconfig/merge_config.sh -m .config "$FRAGMENT")
    "${MAKE[@]}" olddefconfig
    # Every line of the fragment must have survived olddefconfig (a
    # dependency missing silently drops a symbol).
    missing=0
    while IFS= read -r line; do
        case "$line" in
        CONFIG_*=n)
            ! grep -Eq "^${line%%=*}=(y|m)$" "$B/.config" || { echo "fragment: $line but .config has it on"; missing=1; } ;;
        CONFIG_*)
            grep -qx "$line" "$B/.config" || { echo "fragment: $line not in .config (has: $(grep "^${line%%=*}=" "$B/.config" || echo unset))"; missing=1; } ;;
        esac
    done <"$FRAGMENT"
    [ "$missing" -eq 0 ]
    /usr/bin/time -f '%e %U %S' -o "$OUT/time" "${MAKE[@]}" bzImage modules
} 2>&1 | tee "$OUT/build.log"
"${MAKE[@]}" -s kernelrelease >"$OUT/kver"
cp "$B/arch/x86/boot/bzImage" "$OUT/bzImage"
: >"$OUT/modules/order"
# External modules need the configured tree, its tools and Module.symvers:
# not the objects, nor the sources of what is not built (the Kconfig
# files they hold are read only when configuring).
find "$B" -name '*.o' -delete
rm -rf "$B"/Documentation "$B"/sound "$B"/drivers/gpu/drm/amd "$B"/drivers/net "$B"/drivers/media
find "$B/arch" -mindepth 1 -maxdepth 1 -type d ! -name x86 -exec rm -rf {} +
echo "built in $(($(date +%s) - start)) s (wall user sys: $(cat "$OUT/time")); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/build.log"
touch "$OUT/ok"
echo "debug kernel $(cat "$OUT/kver") ready ($(du -sh "$OUT" | cut -f1)) in:"
echo "$OUT"
