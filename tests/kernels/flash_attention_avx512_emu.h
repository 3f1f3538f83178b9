// The AVX-512 FlashAttention-2 kernel built on SIMDe's emulation (flash_attention_avx512_emu.cpp),
// with paged_attention_split's contract. Its code needs AVX2+FMA (SIMDe's 256-bit halves run
// natively): call it only where cpu_features() has them.
#pragma once
#include <cstdint>

namespace kvboost::kernel_test {

void paged_attention_avx512_emu(const float* q, const float* k_pool, const float* v_pool,
                                const int32_t* block_table, float* out, int64_t n_q,
                                int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size,
                                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                int64_t window, float scale, int64_t n_splits, float* lse);

}  // namespace kvboost::kernel_test
