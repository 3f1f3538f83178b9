// (b) AVX512-BF16 GEMM (vdpbf16ps) over Bf16Pairs packed weights, bf16 activations
// (matmul_packed_avx512_impl.h). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16
// -mfma -mf16c for this file only; dispatch.cpp calls it only where active_isa() >= Avx512Bf16.
#include <immintrin.h>

#define KVB_MM512_NS mm512bf16
#define KVB_MM_BF16 1
#include "cpu/matmul_packed_avx512_impl.h"

namespace kvboost::kernels::cpu {

void matmul_packed_avx512bf16(const float* x, const PackedWeight& w, const float* bias, float* y,
                              int64_t M) {
  mm512bf16::run_bf16(x, w, bias, y, M);
}

}  // namespace kvboost::kernels::cpu
