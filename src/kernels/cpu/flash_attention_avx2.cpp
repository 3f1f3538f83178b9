// Paged attention: the AVX2+FMA build of the FlashAttention-2 kernel (compiled with
// -mavx2 -mfma -mf16c; chosen at run time in dispatch.cpp).
#include "cpu/flash_attention.h"
#include "cpu/flash_attention_impl.h"

namespace kvboost::kernels::cpu {

void paged_attention_avx2(const float* q, const float* k_pool, const float* v_pool,
                          const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                          int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                          int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                          int64_t n_splits, float* lse) {
  flash_avx2::paged_attention(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens,
                              block_size, n_heads, n_kv_heads, head_dim, window, scale, n_splits, lse);
}

}  // namespace kvboost::kernels::cpu
