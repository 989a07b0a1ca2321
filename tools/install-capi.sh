#!/usr/bin/env bash
# Builds the C API's host static library (umd-capi with the `host` feature:
# the in-process model's platform constructor included) and installs it
# with its header and a pkg-config file under PREFIX:
#   PREFIX/lib/libumd_capi.a, PREFIX/include/umd.h,
#   PREFIX/lib/pkgconfig/umd-capi.pc
# Then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs --static umd-capi
# UMD_CAPI_PROFILE picks the cargo profile (release by default);
# CARGO_TARGET_DIR is honoured. docs/c-api.md, "On a Linux host".
set -euo pipefail
prefix=${1:?usage: tools/install-capi.sh PREFIX}
cd "$(dirname "$0")/.."
profile=${UMD_CAPI_PROFILE:-release}
cargo build -q -p umd-capi --features host --profile "$profile"
case $profile in dev) dir=debug ;; *) dir=$profile ;; esac
target=${CARGO_TARGET_DIR:-target}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
install -D -m 644 "$target/$dir/libumd_capi.a" "$prefix/lib/libumd_capi.a"
install -D -m 644 umd-capi/include/umd.h "$prefix/include/umd.h"
mkdir -p "$prefix/lib/pkgconfig"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" umd-capi/umd-capi.pc.in >"$prefix/lib/pkgconfig/umd-capi.pc"
echo "installed umd-capi $version under $prefix"
