// The quantized prefill GEMM (matmul_qgemm_impl.h) built for AVX2 (vpmaddubsw + vpmaddwd).
#include <immintrin.h>

#define KVB_QG_NS qgemm_avx2
#define KVB_QG_VNNI 0
#include "cpu/matmul_qgemm_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qgemm_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                       int64_t N, int64_t K) {
  check_quant_args(wt, K, "matmul");
  qgemm_avx2::matmul(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernels::cpu
