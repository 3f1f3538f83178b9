#!/usr/bin/env bash
# The CUDA backend's device check: GPU kernel tests (elementwise, GEMV, paged FA2 prefill, split-K
# decode, AWQ int4 GEMV / dequant + cuBLAS, the paged K/V write / gather / re-rotation / plain
# attention), GPU-vs-CPU decoder tests (every dtype, AWQ), the engine on the device against the
# engine on the CPU (tests/gpu/test_engine_device.cpp, with TTFT under chunk reuse), tensor
# parallelism on the device (tests/gpu/test_tp_device.cpp), the layer streaming benchmark (bench/gpu_stream_bench.cpp, also on a 7B-shaped AWQ model with a
# quarter of its layers on the device) and FA2 vs naive attention at 4K/16K
# (bench/gpu_attention_bench.cpp), on a machine with an NVIDIA GPU. docs/gpu.md lists what each
# result shows.
#
#   scripts/gpu_check.sh stage   # here (a build machine with nvcc, no GPU needed): configure and
#                                # build build-cuda (-DKVBOOST_CUDA=ON), then gather the binaries, the
#                                # shared libraries they need beyond glibc/libstdc++/cuBLAS, and
#                                # stories260K into build-cuda/carry (~45 MB)
#   scripts/gpu_check.sh run     # on the GPU machine: runs everything from build-cuda/carry and
#                                # writes logs to $OUT (default /tmp/gpu_check)
#
# Environment for `run`: OUT (log folder), KVBOOST_GPU_CHECK_SMALL=1 (small benchmark models: a
# dry run of the script's logic on a machine without a GPU, where the GPU tests skip and the
# benchmark reports that no device is visible), KVBOOST_GPU_CHECK_BENCH=0 (tests only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode="${1:-run}"
carry=build-cuda/carry

if [[ "$mode" == "stage" ]]; then
  set -e
  [[ -f build-cuda/build.ninja ]] || cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_CUDA=ON
  ninja -C build-cuda -j"${KVBOOST_JOBS:-2}" test_gpu test_gpu_kernels test_nccl test_tp_device gpu_stream_bench gpu_attention_bench kvboost-fixture kvboost
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib" "$carry/shared/models"
  for b in tests/gpu/test_gpu tests/gpu/test_gpu_kernels tests/gpu/test_nccl tests/gpu/test_tp_device bench/gpu_stream_bench bench/gpu_attention_bench kvboost-fixture kvboost; do
    strip -o "$carry/bin/$(basename "$b")" "build-cuda/$b"
  done
  # Libraries a bare CUDA image may lack (Debian 12 sonames): everything the binaries resolve
  # outside glibc, libstdc++, libgcc and CUDA.
  ldd "$carry"/bin/* | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|libcublas|libcublasLt|libcudart)\.so' |
    while read -r lib; do cp -L "$lib" "$carry/lib/"; done
  cp -r models/stories260K "$carry/shared/models/"
  chmod -R u+w "$carry"
  du -sh "$carry"
  ls -l "$carry/lib"
  exit 0
fi

if [[ "$mode" != "run" ]]; then
  echo "usage: scripts/gpu_check.sh stage|run" >&2
  exit 2
fi

out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
log="$out/gpu_check.log"
exec > >(tee "$log") 2>&1
start=$SECONDS
step() { echo; echo "=== [$((SECONDS - start)) s] $*"; }

step "machine"
uname -a
nproc
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 || echo "nvidia-smi: none"
free -g | head -2

step "libraries"
bin="$PWD/$carry/bin"
libdirs="$PWD/$carry/lib"
cublas=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
         /usr/lib/x86_64-linux-gnu $(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib \
         /opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib /usr/local/lib/python3*/dist-packages/nvidia/cu*/lib 2>/dev/null); do
  if [[ -e "$d/libcublas.so.13" ]]; then cublas="$d"; break; fi
done
if [[ -z "$cublas" ]]; then
  cublas="$(dirname "$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)" 2>/dev/null)"
fi
echo "cuBLAS: ${cublas:-not found}"
[[ -n "$cublas" ]] && libdirs="$libdirs:$cublas"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$bin"/*; do
  missing="$(ldd "$b" | grep 'not found')"
  [[ -n "$missing" ]] && echo "$(basename "$b"): $missing"
done
echo "ldd done"

export KVBOOST_SHARED_DIR="$PWD/$carry/shared"
export KVBOOST_MODELS_DIR="$PWD/$carry/shared/models"
export KVBOOST_REQUIRE_ORACLES=1
rc=0

step "test_gpu_kernels (CUDA kernels vs CPU references)"
timeout 120 "$bin/test_gpu_kernels" --gtest_output="xml:$out/test_gpu_kernels.xml" || rc=1

step "test_nccl (NCCL all-reduce / all-gather / barrier, one rank per visible GPU)"
timeout 120 "$bin/test_nccl" --gtest_output="xml:$out/test_nccl.xml" || rc=1

step "test_gpu (GPU decoder vs CPU decoder, stories260K greedy, streamed == resident)"
timeout 180 "$bin/test_gpu" --gtest_filter='-EngineDevice.*' --gtest_output="xml:$out/test_gpu.xml" || rc=1

# Issue 29: the engine on the device (gpu::PagedRunner under the scheduler, prefix cache,
# continuous batching, chunk copy-in with re-rotation, layer streaming under a VRAM budget:
# tests/gpu/test_engine_stream.cpp) against the engine on the CPU, and the
# TTFT with chunk reuse on the GPU (EngineDevice.TtftWithChunkReusePrinted prints it).
step "test_gpu EngineDevice.* (the engine on cuda vs on cpu; TTFT with chunk reuse)"
timeout 300 "$bin/test_gpu" --gtest_filter='EngineDevice.*' --gtest_output="xml:$out/test_engine_device.xml" \
  | tee "$out/test_engine_device.txt" || rc=1

# Issue 29: tensor parallelism on the device (tests/gpu/test_tp_device.cpp): TP=2 over shared
# memory (two processes on GPU 0) and, with two GPUs, over NCCL, against TP=1 on the device and
# the CPU forward (llama / qwen2 / qwen3 fixtures, stories260K, AWQ shards).
step "test_tp_device (TP=2 on the device vs TP=1 and the CPU)"
timeout 300 "$bin/test_tp_device" --gtest_output="xml:$out/test_tp_device.xml" | tee "$out/test_tp_device.txt" || rc=1

if [[ "${KVBOOST_GPU_CHECK_BENCH:-1}" == "1" ]]; then
  models=/tmp/kvboost_gpu_models
  mkdir -p "$models"
  if [[ "${KVBOOST_GPU_CHECK_SMALL:-0}" == "1" ]]; then
    q05=(--preset qwen2.5-0.5b --layers 4 --hidden 128 --intermediate 256 --heads 2 --vocab 1000)
    q15=(--preset qwen2.5-0.5b --layers 4 --hidden 256 --intermediate 384 --heads 4 --vocab 1000)
  else
    q05=(--preset qwen2.5-0.5b)
    # Qwen2.5-1.5B's shape: hidden 1536, intermediate 8960, 28 layers, 12 heads, 2 KV heads, tied.
    q15=(--preset qwen2.5-0.5b --hidden 1536 --intermediate 8960 --layers 28 --heads 12 --kv-heads 2)
  fi
  step "fixtures (bf16, random weights)"
  timeout 150 "$bin/kvboost-fixture" "${q05[@]}" --tokenizer-kind none --out "$models/q05" &
  p1=$!
  timeout 150 "$bin/kvboost-fixture" "${q15[@]}" --tokenizer-kind none --out "$models/q15" &
  p2=$!
  wait $p1 || rc=1
  wait $p2 || rc=1
  du -sh "$models"/*

  step "gpu_stream_bench (resident vs streamed with a quarter of the layers)"
  timeout 240 "$bin/gpu_stream_bench" --model "$models/q05" --model "$models/q15" --prompt 512 --context 128 \
    --decode 32 --reps 3 --slots 0 --slots 2 | tee "$out/gpu_stream_bench.txt" || rc=1

  # Issue 29: FlashAttention-2-style paged prefill / split-K decode vs the naive kernel.
  step "gpu_attention_bench (FA2 vs naive at 4K and 16K tokens)"
  if [[ "${KVBOOST_GPU_CHECK_SMALL:-0}" == "1" ]]; then att=(--tokens 512 --tokens 1024 --reps 2); else att=(--tokens 4096 --tokens 16384 --reps 5); fi
  timeout 180 "$bin/gpu_attention_bench" "${att[@]}" | tee "$out/gpu_attention_bench.txt" || rc=1

  # Issue 29: a 7B-shaped AWQ (4-bit, group 128) model, resident vs streamed with a quarter of
  # its layers on the device (gpu_stream_bench --slots 0 = n_layers / 4 slots); the bench prints
  # the pinned H2D bandwidth and the streamed decode's fraction of bandwidth / bytes per token
  # (goal: >= 0.6). KVBOOST_GPU_CHECK_AWQ_LAYERS (default 32, Llama-2-7B's) trims the depth.
  step "AWQ 7B-shaped fixture and resident vs streamed decode"
  if [[ "${KVBOOST_GPU_CHECK_SMALL:-0}" == "1" ]]; then
    a7=(--preset tiny --hidden 256 --intermediate 512 --layers 8 --heads 4 --kv-heads 4 --vocab 1000)
  else
    a7=(--preset tiny --arch llama --hidden 4096 --intermediate 11008 --layers "${KVBOOST_GPU_CHECK_AWQ_LAYERS:-32}" --head-dim 128
        --heads 32 --kv-heads 32 --vocab 32000 --no-tie)
  fi
  timeout 300 "$bin/kvboost-fixture" "${a7[@]}" --dtype f16 --quant awq --group-size 128 --tokenizer-kind none \
    --out "$models/awq7b" || rc=1
  du -sh "$models/awq7b"
  timeout 300 "$bin/gpu_stream_bench" --model "$models/awq7b" --prompt 256 --context 128 --decode 16 --reps 3 \
    --slots 0 | tee "$out/gpu_stream_bench_awq7b.txt" || rc=1

  # TTFT with chunk reuse on the GPU: printed by EngineDevice.TtftWithChunkReusePrinted above,
  # and the reuse benchmark itself on the device (every mode, CacheBlend included) beside the
  # same run on the host CPU, on stories260K (512 positions: short RAG prompts).
  grep '^TTFT on' "$out/test_engine_device.txt" || echo "TTFT with chunk reuse: not printed (see the EngineDevice step)"
  step "kvboost bench reuse --device cuda vs cpu (stories260K, RAG)"
  for d in cuda cpu; do
    timeout 120 "$bin/kvboost" bench reuse --model "$PWD/$carry/shared/models/stories260K" --device "$d" --scenarios rag --runs 5 \
      --docs 3 --pool 6 --doc-words 25 --sys-words 20 --chunk 32 | tee "$out/bench_reuse_$d.txt" || rc=1
  done
fi

if [[ "${KVBOOST_GPU_CHECK_SANITIZE:-1}" == "1" ]]; then
  san="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
  step "compute-sanitizer memcheck (kernels; bf16 decoder, streamed) ${san:-not found}"
  if [[ -n "$san" ]]; then
    timeout 100 "$san" --tool memcheck --error-exitcode 3 "$bin/test_gpu_kernels" --gtest_brief=1 || rc=1
    timeout 100 "$san" --tool memcheck --error-exitcode 3 "$bin/test_gpu" --gtest_brief=1 \
      --gtest_filter='GpuDecoder.Qwen2Bf16BiasMatchesCpu:GpuDecoder.StreamedIsBitIdenticalToResident' || rc=1
    timeout 200 "$san" --tool memcheck --error-exitcode 3 "$bin/test_gpu" --gtest_brief=1 \
      --gtest_filter='EngineDevice.Stories260KGreedyAndLogitsMatchCpu:EngineDevice.ReorderedChunkCopyInOnTheDevice:EngineDevice.ContinuousBatchingOnTheDevice' || rc=1
  fi
fi

step "done, rc=$rc"
exit $rc
