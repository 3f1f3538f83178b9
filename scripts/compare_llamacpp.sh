#!/usr/bin/env bash
# Side-by-side prefill/decode tokens/s of llama.cpp's llama-bench and `kvboost bench model` on the
# same GGUF files (one per format: bf16, q8_0, q4_0, q4_k_m), printed as one markdown table:
#   format | file MiB | llama.cpp pp512 | ours pp512 | ratio | llama.cpp tg64 | ours tg64 | ratio
# ratio = ours / llama.cpp. Both sides run with the same thread count on the same file. Run it on a
# quiet machine: anything else running skews both columns.
#
# Usage: scripts/compare_llamacpp.sh LLAMA_BENCH GGUF_DIR [PEER2_BENCH]
#   LLAMA_BENCH  path to a llama-bench binary
#   PEER2_BENCH  optional second llama-bench-compatible binary (ik_llama.cpp's, from the
#                ik-llama-cpp-python 0.1.5 sdist: vendor/ik_llama.cpp; its sdist lacks
#                common/cmake/build-info-gen-cpp.cmake: create it empty and write
#                common/build-info.cpp from build-info.cpp.in, then ninja llama-bench as in step 1);
#                each row then also gets its pp/tg and ours / it (docs/kernels-vnni.md)
#   GGUF_DIR     directory holding one file per format, named *-<format>.gguf (or *_ / *. before
#                the format; case-insensitive), e.g. qwen2.5-0.5b-q4_k_m.gguf
# Environment:
#   KVBOOST   our binary (default: <repo>/build/kvboost)
#   THREADS   threads for both sides (default 2)
#   PP TG REPS  prompt tokens, generated tokens, repetitions (default 512, 64, 3)
#   FORMATS   formats to compare (default "bf16 q8_0 q4_0 q4_k_m")
#   SMOKE=1   quick check of the script itself: PP=16 TG=4 REPS=1 (numbers meaningless)
#   LOG_DIR   where the raw outputs of both tools go (default: a new mktemp -d directory)
#   AWQ_DIR   also run ours on this AutoAWQ checkpoint directory (4-bit, same shape) and print it
#             against llama.cpp's AWQ_VS row (default q4_0: 4.5 bits per weight against AWQ's
#             4.25 at group 128); make one with kvboost-fixture --quant awq (README, "AWQ 4-bit
#             checkpoints")
#
# What is measured:
#   llama.cpp: llama-bench -m F -p PP -n TG -t THREADS -r REPS -o md (pp = prompt of PP tokens
#     from an empty context; tg = TG tokens generated from an empty context; mean of REPS runs
#     after llama-bench's warm-up run).
#   ours: kvboost bench model -m F --threads THREADS --runs REPS --prefill PP --decode-context 1
#     --decode-tokens TG --no-reuse (prefill of PP random tokens with the prefix cache off; decode
#     of TG tokens after a 1-token prompt; medians of REPS runs).
#
# 1. Building llama-bench (not part of this repo; llama.cpp's sources come vendored in PyPI's
#    llama-cpp-python sdist, e.g. 0.3.36 = llama.cpp commit 0c1e57098):
#      python3 -m pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/llamacpp
#        (pip only needs the downloaded tarball; if it then spends ages building the sdist's build
#         dependencies from source, the .tar.gz is already under /tmp/pip-unpack-*/ : copy it)
#      cd /tmp/llamacpp && tar xzf llama_cpp_python-0.3.36.tar.gz
#      cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
#        -DGGML_NATIVE=ON -DGGML_AMX=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
#        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_COMMIT=0c1e57098
#      ninja -C build -j2 llama-bench          # -> /tmp/llamacpp/build/bin/llama-bench
# 2. Making the GGUF files (the same random Qwen2.5-0.5B-shaped weights in every format, with the
#    tokenizer embedded, which llama.cpp needs to load a file):
#      build/kvboost-fixture --preset qwen2.5-0.5b --dtype f32 \
#        --tokenizer /work/shared/tokenizers/qwen2.5 --out /tmp/q05f32
#      for t in bf16 q8_0 q4_0 q4_k_m; do
#        .venv/bin/python tools/oracle/gguf_fixture.py model --src /tmp/q05f32 --tokenizer \
#          --type $t --out /tmp/llamacpp/models/qwen2.5-0.5b-$t.gguf
#      done
#    (gguf_fixture.py's q4_k quantizer is a simple one, not llama.cpp's error-optimal search. Hidden
#    896 is not a multiple of 256, so as llama-quantize does its q4_k_m demotes the K-quants of
#    those rows to 32-blocks: q/k/o/gate/up Q5_0, attn_v and the tied token_embd Q8_0, ffn_down
#    (rows of 4864) Q6_K. Before 2026-12-04 it wrote F16 there and that row was mostly F16. Its
#    q4_0 stores token_embd (the tied lm_head) Q4_0 (llama-quantize: Q8_0). Both sides read the
#    same file.)
# 3. scripts/compare_llamacpp.sh /tmp/llamacpp/build/bin/llama-bench /tmp/llamacpp/models
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "compare_llamacpp: $*" >&2; exit 1; }

[[ $# -eq 2 || $# -eq 3 ]] || die "usage: $0 LLAMA_BENCH GGUF_DIR [PEER2_BENCH] (see the header of this script)"
llama_bench="$1"
gguf_dir="$2"
peer2="${3:-}"
[[ -z "$peer2" || ( -f "$peer2" && -x "$peer2" ) ]] || die "second peer binary not found or not executable: '$peer2'"
kvboost="${KVBOOST:-$repo/build/kvboost}"
threads="${THREADS:-2}"
if [[ "${SMOKE:-0}" == "1" ]]; then
  pp="${PP:-16}" tg="${TG:-4}" reps="${REPS:-1}"
else
  pp="${PP:-512}" tg="${TG:-64}" reps="${REPS:-3}"
fi
formats="${FORMATS:-bf16 q8_0 q4_0 q4_k_m}"

# Refuse before running anything if a binary or a file is missing.
[[ -f "$llama_bench" && -x "$llama_bench" ]] || die "llama-bench not found or not executable: '$llama_bench' (build it: see step 1 in the header of $0)"
[[ -f "$kvboost" && -x "$kvboost" ]] || die "kvboost not found or not executable: '$kvboost' (build the repo, or set KVBOOST)"
[[ -d "$gguf_dir" ]] || die "not a directory: '$gguf_dir' (make the GGUF files: see step 2 in the header of $0)"
declare -A file
missing=()
shopt -s nullglob nocaseglob
for f in $formats; do
  matches=("$gguf_dir"/*[-_.]"$f".gguf)
  if [[ ${#matches[@]} -eq 0 ]]; then
    missing+=("$f")
  elif [[ ${#matches[@]} -gt 1 ]]; then
    die "$gguf_dir holds ${#matches[@]} files for $f (${matches[*]}): keep one"
  else
    file[$f]="${matches[0]}"
  fi
done
shopt -u nullglob nocaseglob
[[ ${#missing[@]} -eq 0 ]] || die "no *-<format>.gguf in '$gguf_dir' for: ${missing[*]} (make them: see step 2 in the header of $0)"

log_dir="${LOG_DIR:-$(mktemp -d /tmp/compare_llamacpp.XXXXXX)}"
mkdir -p "$log_dir"
echo "compare_llamacpp: pp$pp tg$tg, $threads threads, $reps reps; raw outputs in $log_dir" >&2

# Column of a llama-bench markdown table by header name; prints "<test> <mean t/s>" per row.
parse_llama() {
  awk -F'|' '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    /^\|/ && !hdr { for (i = 2; i < NF; ++i) { h = trim($i); if (h == "test") ct = i; if (h == "t/s") cs = i }; hdr = 1; next }
    /^\|/ && hdr && ct && cs { t = trim($ct); v = trim($cs); if (t ~ /^-+:?$/) next; split(v, a, " "); print t, a[1] }
  ' "$1"
}
# "<tokens/s>" of the first row of our table whose label starts with $2 ("prefill 512 tokens" or
# "decode at context 1 "; later labels add " (pp512)" / " (tg64)").
parse_ours() {
  awk -F'|' -v key="$2" '{ l = $2; sub(/^[ \t]+/, "", l) } index(l, key) == 1 { v = $3; gsub(/[ \t]/, "", v); print v; exit }' "$1"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", b / a; else print "n/a" }'; }

awq_dir="${AWQ_DIR:-}"
awq_vs="${AWQ_VS:-q4_0}"
if [[ -n "$awq_dir" ]]; then
  [[ -f "$awq_dir/config.json" ]] || die "AWQ_DIR '$awq_dir' has no config.json"
  [[ " $formats " == *" $awq_vs "* ]] || die "AWQ_VS '$awq_vs' is not among FORMATS ($formats)"
fi

# Ours on model $1 (file or directory) into $2; prints "<pp tok/s> <tg tok/s>".
run_ours() {
  if ! "$kvboost" bench model -m "$1" --threads "$threads" --runs "$reps" --prefill "$pp" \
      --decode-context 1 --decode-tokens "$tg" --no-reuse > "$2" 2> "${2%.md}.err"; then
    echo "compare_llamacpp: kvboost bench model failed on $1 (see ${2%.md}.err)" >&2
  fi
  echo "$(parse_ours "$2" "prefill $pp tokens") $(parse_ours "$2" "decode at context 1 ")"
}

rows=()
declare -A lpp_of ltg_of
for f in $formats; do
  g="${file[$f]}"
  mib=$(awk -v s="$(stat -L -c %s "$g")" 'BEGIN { printf "%.0f", s / 1048576 }')
  echo "compare_llamacpp: $f: llama-bench on $g" >&2
  lb_log="$log_dir/llama-bench-$f.md"
  if ! "$llama_bench" -m "$g" -p "$pp" -n "$tg" -t "$threads" -r "$reps" -o md > "$lb_log" 2> "$log_dir/llama-bench-$f.err"; then
    echo "compare_llamacpp: llama-bench failed on $g (see $log_dir/llama-bench-$f.err)" >&2
  fi
  lpp=$(parse_llama "$lb_log" | awk -v t="pp$pp" '$1 == t { print $2 }')
  ltg=$(parse_llama "$lb_log" | awk -v t="tg$tg" '$1 == t { print $2 }')
  lpp_of[$f]="${lpp:-}" ltg_of[$f]="${ltg:-}"
  echo "compare_llamacpp: $f: kvboost bench model on $g" >&2
  read -r opp otg < <(run_ours "$g" "$log_dir/kvboost-$f.md")
  extra=""
  if [[ -n "$peer2" ]]; then
    echo "compare_llamacpp: $f: second peer ($peer2) on $g" >&2
    p2_log="$log_dir/peer2-bench-$f.md"
    "$peer2" -m "$g" -p "$pp" -n "$tg" -t "$threads" -r "$reps" -o md > "$p2_log" 2> "$log_dir/peer2-bench-$f.err" ||
      echo "compare_llamacpp: the second peer failed on $g (see $log_dir/peer2-bench-$f.err)" >&2
    ppp=$(parse_llama "$p2_log" | awk -v t="pp$pp" '$1 == t { print $2 }')
    ptg=$(parse_llama "$p2_log" | awk -v t="tg$tg" '$1 == t { print $2 }')
    extra=" ${ppp:-n/a} | $(ratio "${ppp:-0}" "${opp:-0}") | ${ptg:-n/a} | $(ratio "${ptg:-0}" "${otg:-0}") |"
  fi
  rows+=("| $f | $mib | ${lpp:-n/a} | ${opp:-n/a} | $(ratio "${lpp:-0}" "${opp:-0}") | ${ltg:-n/a} | ${otg:-n/a} | $(ratio "${ltg:-0}" "${otg:-0}") |$extra")
done

if [[ -n "$awq_dir" ]]; then
  mib=$(du -sm --apparent-size "$awq_dir" | cut -f1)
  echo "compare_llamacpp: AWQ: kvboost bench model on $awq_dir" >&2
  read -r opp otg < <(run_ours "$awq_dir" "$log_dir/kvboost-awq.md")
  lpp="${lpp_of[$awq_vs]}" ltg="${ltg_of[$awq_vs]}"
  rows+=("| ours AWQ vs llama.cpp $awq_vs | $mib | ${lpp:-n/a} | ${opp:-n/a} | $(ratio "${lpp:-0}" "${opp:-0}") | ${ltg:-n/a} | ${otg:-n/a} | $(ratio "${ltg:-0}" "${otg:-0}") |")
fi

build=$(grep -h '^build:' "$log_dir"/llama-bench-*.md 2>/dev/null | head -1 || true)
echo
echo "llama.cpp ${build:-build: unknown} vs kvboost ($kvboost, repo at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')), $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); tokens/s (llama.cpp: mean of $reps; ours: median of $reps); ratio = ours / llama.cpp"
echo
if [[ -n "$peer2" ]]; then
  echo "(peer 2: $peer2; its ratios are ours / peer 2)"
  echo "| format | file MiB | llama.cpp pp$pp | ours pp$pp | ratio | llama.cpp tg$tg | ours tg$tg | ratio | peer2 pp$pp | ratio | peer2 tg$tg | ratio |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
else
  echo "| format | file MiB | llama.cpp pp$pp | ours pp$pp | ratio | llama.cpp tg$tg | ours tg$tg | ratio |"
  echo "|---|---|---|---|---|---|---|---|"
fi
printf '%s\n' "${rows[@]}"
