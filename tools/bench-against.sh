#!/usr/bin/env bash
# Runs the direct-mode submit benchmark (umd-core/benches/submit.rs) at a
# given revision and at the working tree, one after the other on this
# machine, and prints the per-submission costs side by side with their
# ratio (now / then). The earlier revision is checked out in a git
# worktree under target/bench-against/ with its own target directory.
#
#   tools/bench-against.sh REV     (e.g. tools/bench-against.sh 6e1e8ec)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: tools/bench-against.sh REV}
dir=target/bench-against/$rev
if [ ! -d "$dir" ]; then
    mkdir -p target/bench-against
    git worktree add --detach "$dir" "$rev" >/dev/null
fi
run() { (cd "$1" && cargo bench -q -p umd-core --bench submit 2>/dev/null) | awk '$1 ~ /^[0-9]+$/ { print $1, $3, $4 }'; }
then_=$(run "$dir")
now=$(run .)
printf '%8s | %12s %12s | %12s %12s | %8s %8s\n' packets "then on ns" "then off ns" "now on ns" "now off ns" "on x" "off x"
join <(echo "$then_") <(echo "$now") | while read -r p t_on t_off n_on n_off; do
    awk -v p="$p" -v a="$t_on" -v b="$t_off" -v c="$n_on" -v d="$n_off" \
        'BEGIN { printf "%8s | %12.0f %12.0f | %12.0f %12.0f | %8.2f %8.2f\n", p, a, b, c, d, c / a, d / b }'
done
