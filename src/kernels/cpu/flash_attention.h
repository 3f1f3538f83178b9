// Internal: per-ISA entry points of the paged FlashAttention-2 kernel (flash_attention_impl.h).
// Only dispatch.cpp chooses among them. n_splits: 0 = automatic split-K, 1 = unsplit, > 1 forced.
#pragma once
#include <cstdint>

namespace kvboost::kernels::cpu {

void paged_attention_scalar(const float* q, const float* k_pool, const float* v_pool,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                            int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t n_splits, float* lse);
void paged_attention_avx2(const float* q, const float* k_pool, const float* v_pool,
                          const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                          int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                          int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                          int64_t n_splits, float* lse);
void paged_attention_avx512(const float* q, const float* k_pool, const float* v_pool,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                            int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t n_splits, float* lse);

}  // namespace kvboost::kernels::cpu
