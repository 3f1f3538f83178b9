// Test-only build of the AVX512-BF16 quantized prefill (src/kernels/cpu/matmul_qbf16_impl.h without
// AMX: vdpbf16ps tiles, the source matmul_qbf16_avx512bf16.cpp compiles natively) on SIMDe's
// portable AVX-512, compiled for AVX2+FMA+F16C in its own namespace.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <atomic>

#define KVB_MM512_NS qbf16_avx512_emu
#define KVB_MM_BF16 1
#define KVB_QBF16_PORTABLE 1  // SIMDe 0.7.4 lacks vcvtneps2bf16 and zmm gathers
#include "cpu/matmul_packed_avx512_impl.h"
#include "cpu/matmul_qbf16_impl.h"

namespace kvboost::kernel_test {

void matmul_qbf16_avx512bf16_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                                 int64_t M, int64_t N, int64_t K) {
  kernels::cpu::qbf16_avx512_emu::matmul_qbf16(x, w, wt, bias, y, M, N, K);
}

}  // namespace kvboost::kernel_test
