// Paged attention: the AVX-512 build of the FlashAttention-2 kernel (compiled with -mavx512f
// -mavx512bw -mavx512vl -mfma -mf16c; chosen at run time in dispatch.cpp). The micro-kernels are
// in flash_attention_avx512_kernels.h, which tests/kernels/flash_attention_avx512_emu.cpp also
// builds on SIMDe's emulated AVX-512, in its own namespace.
#include <immintrin.h>

#include "cpu/flash_attention.h"
#define KVB_FA_AVX512_NS flash_avx512
#include "cpu/flash_attention_impl.h"

namespace kvboost::kernels::cpu {

void paged_attention_avx512(const float* q, const float* k_pool, const float* v_pool,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                            int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t n_splits, float* lse) {
  flash_avx512::paged_attention(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens,
                                block_size, n_heads, n_kv_heads, head_dim, window, scale, n_splits,
                                lse);
}

}  // namespace kvboost::kernels::cpu
