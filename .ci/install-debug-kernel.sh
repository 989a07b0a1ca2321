#!/usr/bin/env bash
# Installs what building the Linux guests' debug kernel needs
# (tools/build-debug-kernel.sh), beyond .ci/install-linux-guest.sh: Debian's
# kernel source package linux-source-6.12 (the same 6.12 stable release as
# the stock guest kernel) and the kernel's build tools (gcc-12, make, flex,
# bison, bc, libelf-dev, libssl-dev, xz). Idempotent. The build itself runs
# unprivileged (tools/build-debug-kernel.sh, or the harness on first use).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive

need=()
[ -f /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
command -v gcc-12 >/dev/null 2>&1 || need+=(gcc-12)
command -v make >/dev/null 2>&1 || need+=(make)
command -v flex >/dev/null 2>&1 || need+=(flex)
command -v bison >/dev/null 2>&1 || need+=(bison)
command -v bc >/dev/null 2>&1 || need+=(bc)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)

if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
dpkg-query -W -f='linux-source-6.12 ${Version}\n' linux-source-6.12
