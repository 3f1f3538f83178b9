// (a) AVX-512 f32-FMA GEMM over Panel16 packed weights (matmul_packed_avx512_impl.h). Compiled
// with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c for this file only; dispatch.cpp calls it
// only where active_isa() >= Isa::Avx512.
#include <immintrin.h>

#define KVB_MM512_NS mm512
#include "cpu/matmul_packed_avx512_impl.h"

namespace kvboost::kernels::cpu {

void matmul_packed_avx512(const float* x, const PackedWeight& w, const float* bias, float* y,
                          int64_t M) {
  mm512::run_panel16(x, w, bias, y, M);
}

}  // namespace kvboost::kernels::cpu
