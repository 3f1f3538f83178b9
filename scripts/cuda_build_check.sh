#!/usr/bin/env bash
# Compile-only check of the CUDA backend (-DKVBOOST_CUDA=ON), so that it cannot rot on machines
# without a GPU: builds only the CUDA targets (kernels, GPU decoder, their tests, the streaming
# benchmark) and runs the GPU tests, which skip without a device except the no-device API test.
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
start=$SECONDS
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" > /dev/null
cmake --build "$dir" -j "${KVBOOST_JOBS:-$(nproc)}" --target kvboost_cuda_kernels kvboost_gpu test_gpu test_gpu_kernels gpu_stream_bench
"$dir/tests/gpu/test_gpu_kernels" --gtest_brief=1
"$dir/tests/gpu/test_gpu" --gtest_brief=1
echo "[cuda] CUDA targets built and GPU tests run (skipped without a device) in $((SECONDS - start)) s"
