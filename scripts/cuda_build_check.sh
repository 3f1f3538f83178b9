#!/usr/bin/env bash
# Compile-only check of the CUDA backend (-DKVBOOST_CUDA=ON), so that it cannot rot on machines
# without a GPU. By default it compiles the files that only a CUDA build compiles (the
# kernels, the GPU decoder, the engine's paged device runner and its weight layout, the device
# probe, NCCL, the attention benchmark, the kernel tests)
# and nothing else: test_gpu and gpu_stream_bench are
# the same sources in every build (the CPU build compiles them against the stub), and linking
# would first compile the ~40 files of common/kernels/tokenizer/model again. KVBOOST_CUDA_CHECK_FULL=1
# builds and links every CUDA target and runs the GPU tests (they skip without a device).
# Skips (exit 0) when no nvcc is found. Used by .ci/run; the GPU run itself is scripts/gpu_check.sh.
#
# Environment: KVBOOST_CUDA_BUILD_DIR (default: build-ci-cuda), KVBOOST_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

nvcc="$(command -v nvcc || true)"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc" ]]; then
  echo "[cuda] no nvcc: CUDA build check skipped"
  exit 0
fi
dir="${KVBOOST_CUDA_BUILD_DIR:-build-ci-cuda}"
jobs="${KVBOOST_JOBS:-$(nproc)}"
start=$SECONDS
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" > /dev/null
if [[ "${KVBOOST_CUDA_CHECK_FULL:-0}" == "1" ]]; then
  ninja -C "$dir" -j "$jobs" test_gpu test_gpu_kernels test_tp_device gpu_stream_bench gpu_attention_bench test_dist
  "$dir/tests/gpu/test_gpu_kernels" --gtest_brief=1
  "$dir/tests/gpu/test_gpu" --gtest_brief=1
  "$dir/tests/gpu/test_tp_device" --gtest_brief=1
  what="built the CUDA targets and ran the GPU tests (skipped without a device)"
else
  ninja -C "$dir" -j "$jobs" \
    src/gpu/CMakeFiles/kvboost_cuda_kernels.dir/__/kernels/cuda/kernels.cu.o \
    src/gpu/CMakeFiles/kvboost_cuda_kernels.dir/__/kernels/cuda/attention.cu.o \
    src/gpu/CMakeFiles/kvboost_cuda_kernels.dir/__/kernels/cuda/quant.cu.o \
    src/gpu/CMakeFiles/kvboost_cuda_kernels.dir/__/kernels/cuda/paged_kv.cu.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/gpu_decoder.cpp.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/device_weights.cpp.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/paged_runner.cpp.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/paged_blend.cpp.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/paged_stream.cpp.o \
    src/gpu/CMakeFiles/kvboost_gpu.dir/paged_spill.cpp.o \
    src/kernels/CMakeFiles/kvboost_kernels.dir/device.cpp.o \
    bench/CMakeFiles/gpu_attention_bench.dir/gpu_attention_bench.cpp.o \
    tests/gpu/CMakeFiles/test_gpu_kernels.dir/test_gpu_kernels.cpp.o \
    tests/gpu/CMakeFiles/test_nccl.dir/test_nccl.cpp.o
  # NCCL is optional (src/dist/CMakeLists.txt): its file is compiled where the toolkit has it.
  # (grep without -q reads all of ninja's output: -q would exit at the match, and under pipefail
  # ninja's SIGPIPE would fail the test and skip nccl.cpp.)
  if ninja -C "$dir" -t targets all | grep '^src/dist/CMakeFiles/kvboost_dist.dir/nccl.cpp.o:' > /dev/null; then
    ninja -C "$dir" -j "$jobs" src/dist/CMakeFiles/kvboost_dist.dir/nccl.cpp.o
  fi
  what="compiled the CUDA-only sources"
fi
echo "[cuda] $what in $((SECONDS - start)) s"
