// The 16-row quantized prefill GEMM (matmul_qgemm_avx512_impl.h) built for AMX-INT8 (tdpbusd tiles,
// scaled with AVX-512; Sapphire Rapids and later). The tile state is asked of the OS per thread.
#include <immintrin.h>

#include "kvboost/common.h"

#define KVB_QG_NS qgemm_amx
#define KVB_QG16_AMX 1
#define KVB_AMX_THREAD_INIT() (void)::kvboost::amx_request_permission()
#include "cpu/matmul_qgemm_avx512_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qgemm_amx(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                      int64_t K) {
  check_quant_args(wt, K, "matmul");
  qgemm_amx::matmul16(x, w, wt, bias, y, M, N, K, /*amx=*/true);
}

}  // namespace kvboost::kernels::cpu
