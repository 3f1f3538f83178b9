#!/usr/bin/env bash
# The README's first command: install dependencies, build, and generate text offline.
#   scripts/demo.sh                       # the generated demo model (random weights)
#   scripts/demo.sh --model DIR -p "..."  # any arguments go to `kvboost generate`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target kvboost
if [[ $# -eq 0 ]]; then set -- -p "Once upon a time" -n 48; fi
exec ./build/kvboost generate "$@"
