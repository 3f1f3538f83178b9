// The quantized prefill GEMM (matmul_qgemm_impl.h) built for AVX512-VNNI + AVX512VL (EVEX vpdpbusd on 256-bit vectors; Cascade Lake, Ice Lake, Zen 4).
#include <immintrin.h>

#define KVB_QG_NS qgemm_avx512vnni
#define KVB_QG_VNNI 1
#define KVB_QG_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#include "cpu/matmul_qgemm_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qgemm_avx512vnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                       int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  qgemm_avx512vnni::matmul(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernels::cpu
