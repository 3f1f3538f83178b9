// Attention over key ranges merged by log-sum-exp equals attention over all keys (the basis of
// attending over K/V that are paged in range by range).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::kernels;

TEST(AttentionMerge, RangesMergedEqualFullAttention) {
  struct Case { int64_t n_q, pos0, n_kv, heads, kv_heads, hd, bs, window, range_blocks; };
  const Case cases[] = {{1, 99, 100, 8, 4, 8, 16, 0, 2},   {1, 300, 301, 14, 2, 64, 16, 0, 3},
                        {5, 60, 65, 4, 2, 16, 8, 0, 1},    {12, 0, 12, 4, 1, 8, 4, 0, 1},
                        {1, 200, 201, 8, 8, 32, 16, 50, 2}, {7, 40, 47, 6, 3, 24, 16, 9, 1}};
  for (Isa isa : {Isa::Scalar, Isa::Avx2}) {
    set_active_isa(isa);
    for (const auto& c : cases) {
      std::mt19937 rng(7);
      std::normal_distribution<float> nd;
      const int64_t n_blocks = (c.n_kv + c.bs - 1) / c.bs;
      std::vector<int32_t> table(n_blocks);
      for (int64_t i = 0; i < n_blocks; ++i) table[i] = int32_t(n_blocks - 1 - i);  // reversed pages
      std::vector<float> q(c.n_q * c.heads * c.hd), k(n_blocks * c.bs * c.kv_heads * c.hd), v(k.size());
      for (auto* vec : {&q, &k, &v})
        for (auto& x : *vec) x = nd(rng);
      const float scale = 1.0f / std::sqrt(float(c.hd));
      std::vector<float> full(q.size()), out(q.size()), part(q.size());
      paged_attention_ref(q.data(), k.data(), v.data(), table.data(), full.data(), c.n_q, c.pos0, c.n_kv, c.bs,
                          c.heads, c.kv_heads, c.hd, c.window, scale);
      const int64_t rows = c.n_q * c.heads;
      std::vector<float> lse(rows, -std::numeric_limits<float>::infinity()), lse_part(rows);
      for (int64_t b0 = 0; b0 < n_blocks; b0 += c.range_blocks) {
        const int64_t k0 = b0 * c.bs, k1 = std::min(c.n_kv, (b0 + c.range_blocks) * c.bs);
        paged_attention_lse(q.data(), k.data(), v.data(), table.data() + b0, part.data(), lse_part.data(), c.n_q,
                            c.pos0 - k0, k1 - k0, c.bs, c.heads, c.kv_heads, c.hd, c.window, scale);
        attention_merge(out.data(), lse.data(), part.data(), lse_part.data(), rows, c.hd);
      }
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], full[i], 2e-5f) << isa_name(isa) << " n_kv=" << c.n_kv << " i=" << i;
      // a row's lse equals log(sum(exp(scores))) over all its visible keys
      const int64_t i = c.n_q - 1, h = 0, pos = c.pos0 + i;
      double sum = 0;
      for (int64_t j = 0; j <= std::min(pos, c.n_kv - 1); ++j) {
        if (c.window > 0 && pos - j >= c.window) continue;
        double s = 0;
        const float* kj = &k[(table[j / c.bs] * c.bs + j % c.bs) * c.kv_heads * c.hd + (h / (c.heads / c.kv_heads)) * c.hd];
        for (int64_t d = 0; d < c.hd; ++d) s += double(q[(i * c.heads + h) * c.hd + d]) * kj[d];
        sum += std::exp(s * scale);
      }
      EXPECT_NEAR(lse[i * c.heads + h], std::log(sum), 1e-4);
    }
  }
  set_active_isa(Isa::Avx512);
}
