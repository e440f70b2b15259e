#!/usr/bin/env bash
# Fails when a C or C++ file of the repository is not formatted as
# .clang-format says (Debian's clang-format, from scripts/install-deps.sh).
# Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.cc' '*.h' |
                     while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! clang-format --dry-run --Werror "${files[@]}" 2>"$log"; then
  grep -E '^[^ ]+:[0-9]+:[0-9]+: error' "$log" | cut -d: -f1 | sort -u | sed 's/^/not formatted: /' >&2
  echo "check-format: run scripts/check-format.sh --fix (clang-format -i) and commit" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says"
