#!/usr/bin/env bash
# The native check of the packed-weight GEMM paths above AVX2 (README, "AVX-512, AVX512-BF16 and
# AMX-BF16 paths"): on this repo's development VM (AVX2 only) they were tested only under
# emulation (SIMDe + tests/kernels/amx_emu.h). Run this on an AVX-512 / Sapphire Rapids host:
#   1. which levels the CPU and OS give (cpu flags; `kvboost bench roofline` names the CPU class);
#   2. the kernel tests with KVBOOST_ISA forced to each level (test_matmul_packed_isa's Native.*
#      tests run the native kernels through matmul_packed; test_fast_kernels and test_kernels
#      cover the rest of each path);
#   3. the AMX object: the tile configuration's stores must come before LDTILECFG (GCC 12's
#      _tile_loadconfig declares only 8 of its 64 bytes read; see matmul_packed_avx512_impl.h);
#   4. `kvboost bench roofline` (GEMM GFLOP/s of every path) and `kvboost bench model` prefill
#      with each level, on a Qwen2.5-0.5B-shaped bf16 model (generated), and the logit error of
#      each path against the scalar reference.
#
# Usage: scripts/native_isa_check.sh [BUILD_DIR]    (default: build; configured and built here)
# Environment: MODEL (default /tmp/q05, generated with kvboost-fixture if missing), QMODEL (a
#              quantized GGUF: also `bench model` per KVBOOST_QUANT_GEMM path),
#              PREFILL (default 128,512), RUNS (default 3), SKIP_BENCH=1 (tests only).
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
MODEL=${MODEL:-/tmp/q05}
PREFILL=${PREFILL:-128,512}
RUNS=${RUNS:-3}
LEVELS="scalar avx2 avx512 avx512bf16 amx"
fail=0

echo "## CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
echo "load: $(uptime)"

cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
ninja -C "$B" kvboost kvboost-fixture test_matmul_packed_isa test_fast_kernels test_kernels \
  test_quant_matmul quant_gemm_bench || exit 1

echo; echo "## Kernel tests per KVBOOST_ISA (a level the CPU lacks is clamped to the best it has)"
for isa in $LEVELS; do
  for t in test_matmul_packed_isa test_fast_kernels test_kernels; do
    if KVBOOST_ISA=$isa "$B/tests/kernels/$t" --gtest_brief=1 >"/tmp/native_isa_${t}_$isa.log" 2>&1; then
      echo "PASS  KVBOOST_ISA=$isa $t"
    else
      echo "FAIL  KVBOOST_ISA=$isa $t (log: /tmp/native_isa_${t}_$isa.log)"; fail=1
    fi
  done
done
echo "Native tests that ran (not skipped):"
"$B/tests/kernels/test_matmul_packed_isa" --gtest_filter='Native.*' 2>&1 | grep -E '^\[ +(OK|FAILED|SKIPPED) +\]'

echo; echo "## Quantized matmul (docs/kernels-vnni.md): every KVBOOST_QUANT_GEMM path vs the scalar reference"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx_vnni|avx512_vnni|amx_int8|amx_tile)$' | tr '\n' ' ')"
for q in off avx2 avxvnni avx512vnni amxint8 amxbf16; do
  if KVBOOST_QUANT_GEMM=$q "$B/tests/kernels/test_quant_matmul" --gtest_brief=1 --gtest_filter=-QuantGemm.DispatchAndEnvCap:QuantGemm.KernelPathSpellings >"/tmp/native_isa_quant_$q.log" 2>&1; then
    echo "PASS  KVBOOST_QUANT_GEMM=$q test_quant_matmul"
  else
    echo "FAIL  KVBOOST_QUANT_GEMM=$q test_quant_matmul (log: /tmp/native_isa_quant_$q.log)"; fail=1
  fi
done
"$B/tests/kernels/test_quant_matmul" --gtest_filter='Native.*' 2>&1 | grep -E '^\[ +(OK|FAILED|SKIPPED) +\]'

echo; echo "## AMX object: the instructions before each ldtilecfg"
obj=$(find "$B" -name 'matmul_packed_amx.cpp.o' | head -1)
objdump -d --no-show-raw-insn -C "$obj" | grep -B12 ldtilecfg | cut -c1-110
echo "(the configuration is built in matmul_packed_amx: 64 zero bytes, palette 1 at +0, colsb at +16, rows at +48:)"
objdump -d --no-show-raw-insn -C "$obj" | awk '/<kvboost::kernels::cpu::matmul_packed_amx\(.*>:$/{p=1} p' \
  | sed -n 1,120p | grep -E 'movb +\$0x1,|movabs +\$0x1010101010101010|mov +%rax,-0x|vmovdqa +%xmm0,|vmovdqa64 %zmm0,' | cut -c1-110

[ "${SKIP_BENCH:-0}" = 1 ] && exit $fail
if [ ! -f "$MODEL/model.safetensors" ]; then
  tok=../shared/tokenizers/qwen2.5
  [ -d "$tok" ] && tokarg=(--tokenizer "$tok") || tokarg=()
  "$B/kvboost-fixture" --preset qwen2.5-0.5b "${tokarg[@]}" --out "$MODEL" || exit 1
fi
echo; echo "## kvboost bench roofline (GEMM GFLOP/s of every path this CPU runs)"
"$B/kvboost" bench roofline
for isa in $LEVELS; do
  [ "$isa" = scalar ] && continue
  echo; echo "## kvboost bench model, KVBOOST_ISA=$isa"
  KVBOOST_ISA=$isa "$B/kvboost" bench model -m "$MODEL" --runs "$RUNS" --prefill "$PREFILL" \
    --decode-context 128 --no-reuse || fail=1
done
echo; echo "## Quantized prefill GEMM paths, GFLOP/s at Qwen2.5-0.5B MLP shapes, M = 512 (bench/quant_gemm_bench)"
"$B/bench/quant_gemm_bench" 512 3 || fail=1
if [ -n "${QMODEL:-}" ]; then  # a quantized GGUF (scripts/compare_llamacpp.sh step 2)
  for q in off avx2 avxvnni avx512vnni amxint8 amxbf16; do
    echo; echo "## kvboost bench model $QMODEL, KVBOOST_QUANT_GEMM=$q"
    KVBOOST_QUANT_GEMM=$q "$B/kvboost" bench model -m "$QMODEL" --runs "$RUNS" --prefill "$PREFILL" \
      --decode-context 1 --decode-tokens 64 --no-reuse || fail=1
  done
fi
echo; echo "## Logit error of each path vs the scalar reference (bf16 paths round activations)"
"$B/kvboost" bench logits -m "$MODEL" --tokens 64 --greedy 4 || fail=1
exit $fail
