// Quantized prefill on AMX-BF16 tiles over bf16-dequantized panels (matmul_qbf16_impl.h explains
// the scheme), native build: -mamx-tile -mamx-bf16 -mavx512f/bw/vl/bf16 for this file only;
// dispatch.cpp calls it only where active_isa() >= Isa::AmxBf16 (the OS granted the tile state;
// each pool thread asks again before its first tile instruction).
#include <immintrin.h>

#include <atomic>

#include "kvboost/common.h"

#define KVB_MM512_NS qbf16amx
#define KVB_MM_AMX 1
#define KVB_AMX_THREAD_INIT() (void)::kvboost::amx_request_permission()
#include "cpu/matmul_packed_avx512_impl.h"
#include "cpu/matmul_qbf16_impl.h"

namespace kvboost::kernels::cpu {

void matmul_qbf16_amx(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                      int64_t K) {
  check_quant_args(wt, K, "matmul");
  qbf16amx::matmul_qbf16(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernels::cpu
