// Quantized prefill on AVX512-BF16 (vdpbf16ps) over bf16-dequantized panels (matmul_qbf16_impl.h
// explains the scheme), native build: -mavx512f/bw/vl/bf16 for this file only; dispatch.cpp calls
// it only where active_isa() >= Isa::Avx512Bf16.
#include <immintrin.h>

#include <atomic>

#include "kvboost/common.h"

#define KVB_MM512_NS qbf16avx512
#define KVB_MM_BF16 1
#include "cpu/matmul_packed_avx512_impl.h"
#include "cpu/matmul_qbf16_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qbf16_avx512bf16(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                             int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  qbf16avx512::matmul_qbf16(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernels::cpu
