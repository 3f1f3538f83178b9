// Test-only build of the 512-bit VNNI decode GEMV (src/kernels/cpu/gemv_q_avx512_impl.h, the source
// gemv_q_avx512vnni.cpp compiles natively) on SIMDe's portable AVX-512, compiled for AVX2+FMA+F16C
// in its own namespace.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

#define KVB_GV_NS gemv512_emu
#define KVB_GV_PORTABLE 1  // SIMDe 0.7.4 lacks vcvtdq2ps zmm
#include "cpu/gemv_q_avx512_impl.h"

namespace kvboost::kernel_test {

void gemv_q_avx512vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y, int64_t M,
                           int64_t N, int64_t K) {
  namespace g = kernels::cpu::gemv512_emu;
  if (wt == kernels::WType::Q4_K || wt == kernels::WType::Q6_K)
    return g::gemv_k(x, static_cast<const uint8_t*>(w), wt == kernels::WType::Q4_K ? g::kGvQ4K : g::kGvQ6K, bias, y,
                     M, N, K);
  const int kind = wt == kernels::WType::Q4_0 ? g::kGvQ4 : wt == kernels::WType::Q5_0 ? g::kGvQ5 : g::kGvQ8;
  g::gemv(x, static_cast<const uint8_t*>(w), kind, bias, y, M, N, K);
}

}  // namespace kvboost::kernel_test
