// Test-only build of the AVX-512 FlashAttention-2 micro-kernels on SIMDe's portable AVX-512
// (libsimde-dev), so that src/kernels/cpu/flash_attention_avx512_kernels.h — the very source
// flash_attention_avx512.cpp compiles natively — is tested on CPUs without AVX-512. Compiled with
// -mavx2 -mfma only (SIMDe then emulates each 512-bit operation on two 256-bit halves), in its
// own namespace (flash_avx512_emu), so the linker can never merge it with the native build.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>

// SIMDe 0.7.4 (Debian 12) implements every AVX-512 intrinsic the micro-kernels use except the
// masked float load and store. Here they follow Intel's definitions of VMOVUPS with a write
// mask, lane by lane: lanes off in k are never accessed (a load gives 0 there, a store leaves
// memory untouched), so AddressSanitizer sees exactly the accesses the instruction makes, and a
// tail mask that reached past the end of a row would be caught. A SIMDe that has them wins.
#ifndef _mm512_maskz_loadu_ps
namespace kvboost::kernels::cpu::flash_avx512_emu_gaps {
inline simde__m512 maskz_loadu_ps(simde__mmask16 k, const void* mem) {
  const float* f = static_cast<const float*>(mem);
  float lanes[16];
  for (int i = 0; i < 16; ++i) lanes[i] = (k >> i) & 1 ? f[i] : 0.0f;
  return simde_mm512_loadu_ps(lanes);
}
}  // namespace kvboost::kernels::cpu::flash_avx512_emu_gaps
#define _mm512_maskz_loadu_ps(k, mem) \
  ::kvboost::kernels::cpu::flash_avx512_emu_gaps::maskz_loadu_ps((k), (mem))
#endif
#ifndef _mm512_mask_storeu_ps
namespace kvboost::kernels::cpu::flash_avx512_emu_gaps {
inline void mask_storeu_ps(void* mem, simde__mmask16 k, simde__m512 a) {
  float lanes[16];
  simde_mm512_storeu_ps(lanes, a);
  float* f = static_cast<float*>(mem);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) f[i] = lanes[i];
}
}  // namespace kvboost::kernels::cpu::flash_avx512_emu_gaps
#define _mm512_mask_storeu_ps(mem, k, a) \
  ::kvboost::kernels::cpu::flash_avx512_emu_gaps::mask_storeu_ps((mem), (k), (a))
#endif

#define KVB_FA_AVX512_NS flash_avx512_emu
#include "cpu/flash_attention_impl.h"
#include "flash_attention_avx512_emu.h"

namespace kvboost::kernel_test {

void paged_attention_avx512_emu(const float* q, const float* k_pool, const float* v_pool,
                                const int32_t* block_table, float* out, int64_t n_q,
                                int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size,
                                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                int64_t window, float scale, int64_t n_splits, float* lse) {
  kernels::cpu::flash_avx512_emu::paged_attention(q, k_pool, v_pool, block_table, out, n_q, q_pos0,
                                                  n_kv_tokens, block_size, n_heads, n_kv_heads,
                                                  head_dim, window, scale, n_splits, lse);
}

}  // namespace kvboost::kernel_test
