// Test-only build of the VNNI quantized prefill GEMM (src/kernels/cpu/matmul_qgemm_impl.h with
// KVB_QG_VNNI = 1, the source that matmul_qgemm_avxvnni.cpp and matmul_qgemm_avx512vnni.cpp
// compile natively) on SIMDe's portable vpdpbusd (libsimde-dev, native aliases), compiled for
// AVX2+FMA+F16C, in its own namespace so that the linker never merges it with a native build.
// AVX-VNNI's _mm256_dpbusd_avx_epi32 and AVX512-VNNI+VL's _mm256_dpbusd_epi32 compute the same
// thing; SIMDe implements the latter.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#define KVB_QG_NS qgemm_vnni_emu
#define KVB_QG_VNNI 1
#define KVB_QG_DPBUSD(acc, u, s) simde_mm256_dpbusd_epi32(acc, u, s)
#include "cpu/matmul_qgemm_impl.h"

namespace kvboost::kernel_test {

void matmul_qgemm_vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                           int64_t M, int64_t N, int64_t K) {
  kernels::cpu::qgemm_vnni_emu::matmul(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernel_test
