// (c) AMX-BF16 GEMM over Bf16Pairs packed weights, bf16 activations
// (matmul_packed_avx512_impl.h). Compiled with -mamx-tile -mamx-bf16 -mavx512f -mavx512bw
// -mavx512vl -mavx512bf16 -mfma -mf16c for this file only; dispatch.cpp calls it only where
// active_isa() >= Isa::AmxBf16, which needs the OS to have granted the tile state. Each pool
// thread asks again before its first tile instruction (idempotent, cached per thread).
#include <immintrin.h>

#define KVB_MM512_NS mm512amx
#define KVB_MM_AMX 1
#define KVB_AMX_THREAD_INIT() (void)::kvboost::amx_request_permission()
#include "cpu/matmul_packed_avx512_impl.h"

namespace kvboost::kernels::cpu {

void matmul_packed_amx(const float* x, const PackedWeight& w, const float* bias, float* y,
                       int64_t M) {
  mm512amx::run_amx(x, w, bias, y, M);
}

}  // namespace kvboost::kernels::cpu
