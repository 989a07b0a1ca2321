#!/usr/bin/env bash
# Installs Debian's bare-metal Arm C toolchain and C library
# (gcc-arm-none-eabi, picolibc-arm-none-eabi), which qemu-tests uses to
# build the C API's Cortex-M4 firmware (umd-capi/firmware/m4). Idempotent:
# does nothing when both are there.
set -euo pipefail

specs=/usr/lib/picolibc/arm-none-eabi/picolibc.specs
if command -v arm-none-eabi-gcc >/dev/null 2>&1 && [ -f "$specs" ]; then
    echo "arm-none-eabi-gcc and picolibc already installed: $(arm-none-eabi-gcc --version | head -n1)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends gcc-arm-none-eabi picolibc-arm-none-eabi make
arm-none-eabi-gcc --version | head -n1
