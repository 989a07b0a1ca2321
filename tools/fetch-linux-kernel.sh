#!/usr/bin/env bash
# Fetches and extracts Debian bookworm's 6.12 kernel (image, headers, kbuild)
# for the Linux guest tests (linux-tests), without installing it.
#
# usage: tools/fetch-linux-kernel.sh [DIR]   (default: target/linux-kernel)
#
# The current ABI is resolved from the meta package `linux-image-6.12-amd64`
# (superseded ABIs vanish from the archive). Result, under DIR/<KVER>/:
#   root/                 the extracted packages (boot/vmlinuz-*, usr/src/linux-headers-*)
#   modules/*.ko          the DRM modules the guest loads, decompressed
#   modules/order         their load order (dependencies first)
#   ok                    written last: the tree is complete
# and DIR/current holds KVER. A second run with the same ABI downloads
# nothing. Needs apt-get, dpkg-deb and xz (Debian); apt's lists must be
# current (`apt-get update`).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${CARGO_TARGET_DIR:-$PWD/target}/linux-kernel}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

KVER=$(apt-cache depends linux-image-6.12-amd64 2>/dev/null |
    sed -n 's/.*Depends: linux-image-\(6\.12\.[0-9]*+deb12-amd64\).*/\1/p' | head -n1 || true)
if [ -z "$KVER" ]; then
    if [ -f "$DIR/current" ] && [ -f "$DIR/$(cat "$DIR/current")/ok" ]; then
        echo "apt does not resolve linux-image-6.12-amd64; using the cached $(cat "$DIR/current")"
        exit 0
    fi
    echo "error: apt-cache cannot resolve linux-image-6.12-amd64; run 'apt-get update' first" >&2
    exit 1
fi
ABI=${KVER%-amd64}
K="$DIR/$KVER"
if [ -f "$K/ok" ]; then
    echo "$KVER" >"$DIR/current"
    echo "kernel $KVER already in $K"
    exit 0
fi

echo "fetching kernel $KVER into $K"
rm -rf "$K"
mkdir -p "$K/debs" "$K/root" "$K/modules"
(cd "$K/debs" && apt-get download -q \
    "linux-image-$KVER" "linux-headers-$KVER" "linux-headers-$ABI-common" "linux-kbuild-$ABI")
for d in "$K"/debs/*.deb; do
    dpkg-deb -x "$d" "$K/root"
done
H="$K/root/usr/src/linux-headers-$KVER"
# The headers' Makefile includes the -common tree by absolute path.
sed -i "s#include /usr/src/#include $K/root/usr/src/#" "$H/Makefile"

# The DRM modules our driver needs, decompressed, in load order.
M="$K/root/lib/modules/$KVER/kernel/drivers/gpu/drm"
: >"$K/modules/order"
for m in drm drm_kms_helper drm_shmem_helper scheduler/gpu-sched drm_exec drm_gpuvm; do
    n=$(basename "$m")
    xz -dc "$M/$m.ko.xz" >"$K/modules/$n.ko"
    echo "$n" >>"$K/modules/order"
done
# The image package is large and no longer needed once extracted.
rm -rf "$K/debs" "$K/root/lib/modules/$KVER/kernel/"{sound,net,fs,crypto,arch,lib,mm,virt}
echo "$KVER" >"$K/kver"
touch "$K/ok"
echo "$KVER" >"$DIR/current"
echo "kernel $KVER ready in $K"
