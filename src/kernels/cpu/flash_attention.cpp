// Paged attention: the baseline-ISA build of the FlashAttention-2 kernel, and the scalar
// reference that gathers each key through the block table and accumulates in double.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/flash_attention.h"
#include "cpu/flash_attention_impl.h"
#include "kvboost/kernels.h"

namespace kvboost::kernels {

namespace cpu {
void paged_attention_scalar(const float* q, const float* k_pool, const float* v_pool,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                            int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t n_splits, float* lse) {
  flash_scalar::paged_attention(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens,
                                block_size, n_heads, n_kv_heads, head_dim, window, scale, n_splits, lse);
}
}  // namespace cpu

void paged_attention_ref(const float* q, const float* k_pool, const float* v_pool,
                         const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                         int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale) {
  const int64_t group = n_heads / n_kv_heads;
  auto row = [&](const float* pool, int64_t t, int64_t kvh) {
    const int64_t phys = block_table[t / block_size];
    return pool + ((phys * block_size + t % block_size) * n_kv_heads + kvh) * head_dim;
  };
  std::vector<double> p(size_t(n_kv_tokens > 0 ? n_kv_tokens : 1));
  std::vector<double> o(static_cast<size_t>(head_dim));
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t pos = q_pos0 + i;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const float* qi = q + (i * n_heads + h) * head_dim;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n_kv_tokens; ++j) {
        p[j] = -std::numeric_limits<double>::infinity();
        if (j > pos || (window > 0 && pos - j >= window)) continue;
        const float* kj = row(k_pool, j, kvh);
        double s = 0;
        for (int64_t d = 0; d < head_dim; ++d) s += double(qi[d]) * kj[d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      double sum = 0;
      for (auto& x : o) x = 0;
      for (int64_t j = 0; j < n_kv_tokens; ++j) {
        if (std::isinf(p[j])) continue;  // masked: never read its value row
        const double w = std::exp(p[j] - mx);
        sum += w;
        const float* vj = row(v_pool, j, kvh);
        for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vj[d];
      }
      float* oi = out + (i * n_heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) oi[d] = float(sum > 0 ? o[d] / sum : 0.0);
    }
  }
}

}  // namespace kvboost::kernels
