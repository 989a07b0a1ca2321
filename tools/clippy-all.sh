#!/usr/bin/env bash
# Every clippy and fmt check `.ci/run` makes, in one command, to run before
# landing a change (a lint can fire only in one feature set or target).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -E '^(DEFMT_LOG=debug )?cargo (clippy|fmt)' .ci/run | while read -r line; do
    echo "+ $line"
    bash -c "$line" </dev/null
done
