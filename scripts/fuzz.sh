#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ (the clang build scripts/sanitize.sh uses too,
# scripts/sanitizer_build.sh: -fsanitize=fuzzer-no-link,address,undefined; after sanitize.sh only
# the targets are linked) and runs each for a bounded time on its seed corpus (fuzz/corpus/<target>,
# committed; new inputs go to a scratch copy, not the tree).
#
#   scripts/fuzz.sh [target...]        # default: every target
#
# Environment: FUZZ_SECONDS (per target, default 30), FUZZ_SEED (default 1; 0 = random), KVBOOST_FUZZ_NO_BUILD=1 (run what is built), KVBOOST_SANITIZE_BUILD_DIR (default
# build-san), KVBOOST_JOBS (default nproc), FUZZ_ARTIFACTS (crash inputs; default
# build-san/artifacts). Exits non-zero when a target crashes, leaks or trips a sanitizer; the
# input that did it is in FUZZ_ARTIFACTS (make it a regression test, then add it to the corpus).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/sanitizer_build.sh

seconds="${FUZZ_SECONDS:-30}"
build_dir="$san_build_dir"
artifacts="${FUZZ_ARTIFACTS:-$build_dir/artifacts}"
all=(fuzz_http_parser fuzz_openai_body fuzz_safetensors fuzz_gguf fuzz_config fuzz_tokenizer_json
     fuzz_tokenizer_encode fuzz_chat_template fuzz_chunk_file fuzz_grammar)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

start=$SECONDS
[[ "${KVBOOST_FUZZ_NO_BUILD:-0}" == "1" ]] || san_build "${targets[@]}"
echo "[fuzz] built ${#targets[@]} targets in $((SECONDS - start)) s"

mkdir -p "$artifacts"
failed=()
for t in "${targets[@]}"; do
  seeds="fuzz/corpus/$t"
  work="$build_dir/corpus/$t"
  mkdir -p "$work"
  [[ -d "$seeds" ]] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  # Binary seeds that our own writers make (fuzz_chunk_file, fuzz_tokenizer_json): -runs=0 only
  # writes them.
  KVBOOST_FUZZ_SEED_DIR="$work" "$build_dir/fuzz/$t" -runs=0 "$work" >/dev/null 2>&1 || true
  dict=()
  [[ -f "fuzz/$t.dict" ]] && dict=(-dict="fuzz/$t.dict")
  echo "[fuzz] $t: ${seconds} s"
  # detect_leaks=0: the loaders keep process-wide caches by design; leaks are not what we hunt.
  # -seed: a fixed mutation sequence (FUZZ_SEED, default 1), so a CI run explores what a local run
  # of the same length explored, and a finding reproduces; FUZZ_SEED=0 asks libFuzzer for a random one.
  if ! ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$build_dir/fuzz/$t" -max_total_time="$seconds" -seed="${FUZZ_SEED:-1}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$artifacts/$t-" -print_final_stats=1 "${dict[@]}" "$work" >"$build_dir/$t.log" 2>&1; then
    echo "[fuzz] $t FAILED (log: $build_dir/$t.log; inputs: $artifacts/$t-*)"
    tail -n 40 "$build_dir/$t.log"
    failed+=("$t")
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build_dir/$t.log" | tr '\n' ' ' || true
    echo
  fi
done
echo "[fuzz] ${#targets[@]} targets, ${#failed[@]} failed${failed:+: ${failed[*]}} ($((SECONDS - start)) s)"
echo "fuzz: $(( ${#targets[@]} - ${#failed[@]} )) passed, ${#failed[@]} failed"
((${#failed[@]} == 0))
