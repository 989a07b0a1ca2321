#!/usr/bin/env bash
# Checks that .ci/run proves the README's fresh-machine promise:
#  - it runs the README's test command verbatim;
#  - nothing before that command installs anything (Rust targets or
#    components, Debian packages, the repository's install scripts, cargo
#    tools), so the command must set itself up;
#  - the step that removes what a fresh machine lacks comes first.
# Exit status 1 with the offending line when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# The README's test command: the first line of the sh block after "Tests".
cmd=$(awk '/^Tests/ {t=1} t && /^```sh/ {getline; print; exit}' README.md)
if [ -z "$cmd" ]; then
    echo "check-fresh-path: README.md has no test command (a \`\`\`sh block after \"Tests\")" >&2
    exit 1
fi
line=$(grep -nxF "$cmd" .ci/run | head -n1 | cut -d: -f1 || true)
if [ -z "$line" ]; then
    echo "check-fresh-path: .ci/run does not run the README's test command '$cmd' on a line of its own" >&2
    exit 1
fi
bad=$(head -n "$((line - 1))" .ci/run | grep -v '^[[:space:]]*#' |
    grep -nE 'rustup (\+[^ ]+ )?(target|component|toolchain) (add|install)|apt-get (-[^ ]+ )*install|apt install|install-[a-z-]+\.sh|cargo (\+[^ ]+ )?install|fetch-linux-kernel' || true)
if [ -n "$bad" ]; then
    echo "check-fresh-path: .ci/run installs something before the README's test command (line $line):" >&2
    echo "$bad" >&2
    exit 1
fi
if ! head -n "$((line - 1))" .ci/run | grep -q 'rustup target remove'; then
    echo "check-fresh-path: .ci/run does not remove the Rust targets the machine image lacks before '$cmd'" >&2
    exit 1
fi
echo "check-fresh-path: .ci/run runs '$cmd' (line $line) with nothing installed before it"
