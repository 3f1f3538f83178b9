#!/usr/bin/env bash
# Runs every ```sh block that follows a <!-- quickstart --> line in README.md, from the source
# root, with the build's kvboost first on PATH. Each block must exit 0 and print something on
# stdout. These are the commands that need no network (they use models/stories260K).
#   readme_quickstart.sh README.md BUILD_DIR
set -euo pipefail
readme="$1"
bin_dir="$2"
cd "$(dirname "$readme")"
export PATH="$bin_dir:$PATH"
export NO_COLOR=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
awk -v dir="$tmp" '
  /<!-- quickstart -->/ { want = 1; next }
  want && /^```sh/ { n++; file = sprintf("%s/block%02d.sh", dir, n); inblock = 1; want = 0; next }
  inblock && /^```/ { inblock = 0; close(file); next }
  inblock { print > file }
' "$readme"
shopt -s nullglob
blocks=("$tmp"/block*.sh)
if ((${#blocks[@]} == 0)); then
  echo "readme_quickstart: no <!-- quickstart --> blocks in $readme" >&2
  exit 1
fi
fail=0
for b in "${blocks[@]}"; do
  echo "=== $(basename "$b"):"
  cat "$b"
  if ! out="$(bash -euo pipefail "$b" 2>"$b.err")"; then
    echo "FAILED (exit status): $(basename "$b")" >&2
    cat "$b.err" >&2
    fail=1
  elif [[ -z "$out" ]]; then
    echo "FAILED (no output): $(basename "$b")" >&2
    cat "$b.err" >&2
    fail=1
  else
    printf '%s\n' "$out" | head -20
  fi
done
echo "readme_quickstart: ${#blocks[@]} blocks, $([[ $fail == 0 ]] && echo all passed || echo FAILURES)"
exit $fail
