// The 16-row quantized prefill GEMM (matmul_qgemm_avx512_impl.h) built for AVX512-VNNI (vpdpbusd on
// 512-bit vectors, masked tails; Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4).
#include <immintrin.h>

#define KVB_QG_NS qgemm_avx512vnni
#define KVB_QG16_AMX 0
#include "cpu/matmul_qgemm_avx512_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qgemm_avx512vnni(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                             int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  qgemm_avx512vnni::matmul16(x, w, wt, bias, y, M, N, K, /*amx=*/false);
}

}  // namespace kvboost::kernels::cpu
