#!/usr/bin/env bash
# Installs qemu-system-aarch64 and qemu-system-arm (the Cortex-M board,
# mps2-an386), both in package qemu-system-arm, from Debian
# bookworm-backports, for qemu-tests. Idempotent: does nothing when the
# binary is already there; adds the backports suite to apt's sources only if
# no source lists it yet.
#
# Why backports: this machine kind ships qemu-utils 10.0.2 from
# bookworm-backports; plain bookworm's qemu-system-arm (7.2) conflicts with
# it, and QEMU 10 is what the ivshmem-doorbell + GICv2m setup was tried on
# (docs/baremetal.md).
set -euo pipefail

if command -v qemu-system-aarch64 >/dev/null 2>&1 && command -v qemu-system-arm >/dev/null 2>&1; then
    echo "qemu-system-aarch64 and qemu-system-arm already installed: $(qemu-system-aarch64 --version | head -n1)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

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

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq -t bookworm-backports --no-install-recommends qemu-system-arm

qemu-system-aarch64 --version | head -n1
qemu-system-arm --version | head -n1
