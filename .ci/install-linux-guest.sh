#!/usr/bin/env bash
# Installs what the Linux guest tests (linux-tests) need and fetches the
# kernel: qemu-system-x86_64 (package qemu-system-x86, Debian
# bookworm-backports, as .ci/install-qemu.sh does for aarch64), the
# kernel's compiler gcc-12, make, pahole (dwarves: the module build
# generates BTF), xz (the modules are decompressed), cpio; then
# tools/fetch-linux-kernel.sh extracts Debian's 6.12 kernel, headers and
# kbuild under target/linux-kernel (cached: a second run downloads nothing).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive

need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v pahole >/dev/null 2>&1 || need+=(dwarves)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
command -v gcc-12 >/dev/null 2>&1 || need+=(gcc-12)
command -v make >/dev/null 2>&1 || need+=(make)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)

if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "adding bookworm-backports to apt sources"
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
# apt's lists must be current for the kernel's ABI lookup too.
$SUDO apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    $SUDO apt-get install -y -qq -t bookworm-backports --no-install-recommends "${need[@]}"
fi
qemu-system-x86_64 --version | head -n1
bash tools/fetch-linux-kernel.sh
