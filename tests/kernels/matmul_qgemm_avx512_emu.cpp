// Test-only build of the 16-row quantized prefill GEMMs (src/kernels/cpu/matmul_qgemm_avx512_impl.h,
// the source matmul_qgemm_avx512vnni.cpp and matmul_qgemm_amx.cpp compile natively) on SIMDe's
// portable AVX-512 (512-bit vpdpbusd, masked loads and stores) and the scalar AMX emulator
// (amx_emu.h, tdpbusd), compiled for AVX2+FMA+F16C in its own namespace so that the linker never
// merges it with a native build.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "amx_emu.h"

#define KVB_QG_NS qgemm16_emu
#define KVB_QG16_AMX 1
#define KVB_QG_DPBUSD(acc, u, s) simde_mm256_dpbusd_epi32(acc, u, s)
#define KVB_AMX_THREAD_INIT() (void)0
#define KVB_QG16_PORTABLE 1  // SIMDe 0.7.4 lacks vcvtdq2ps zmm and masked ps loads/stores
#include "cpu/matmul_qgemm_avx512_impl.h"

namespace kvboost::kernel_test {

void matmul_qgemm_avx512vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                                 int64_t M, int64_t N, int64_t K) {
  kernels::cpu::qgemm16_emu::matmul16(x, w, wt, bias, y, M, N, K, /*amx=*/false);
}

void matmul_qgemm_amx_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y, int64_t M,
                          int64_t N, int64_t K) {
  kernels::cpu::qgemm16_emu::matmul16(x, w, wt, bias, y, M, N, K, /*amx=*/true);
}

}  // namespace kvboost::kernel_test
