// Attention: the scalar build of the shared implementation, and a naive reference that
// materialises the whole score row in double precision.
#include <cmath>
#include <limits>
#include <vector>

#define KVBOOST_ISA_NS scalar_impl
#include "cpu/attention_impl.h"
#include "cpu/cpu_kernels.h"

namespace kvboost::kernels {

namespace cpu {
void attention_scalar(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                      int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, int64_t window, float scale, float* scratch) {
  scalar_impl::attention(q, k, v, out, n_q, q_pos0, n_kv_tokens, n_heads, n_kv_heads, head_dim, window,
                  scale, scratch);
}
}  // namespace cpu

void attention_ref(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                   int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                   int64_t head_dim, int64_t window, float scale) {
  const int64_t group = n_heads / n_kv_heads;
  std::vector<double> p(size_t(n_kv_tokens > 0 ? n_kv_tokens : 1));
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t pos = q_pos0 + i;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n_kv_tokens; ++j) {
        const bool visible = j <= pos && (window <= 0 || pos - j < window);
        if (!visible) {
          p[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double s = 0;
        for (int64_t d = 0; d < head_dim; ++d)
          s += double(q[(i * n_heads + h) * head_dim + d]) *
               k[(j * n_kv_heads + kvh) * head_dim + d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      double sum = 0;
      for (int64_t j = 0; j < n_kv_tokens; ++j) {
        p[j] = std::isinf(p[j]) ? 0.0 : std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int64_t d = 0; d < head_dim; ++d) {
        double o = 0;
        for (int64_t j = 0; j < n_kv_tokens; ++j) o += p[j] * v[(j * n_kv_heads + kvh) * head_dim + d];
        out[(i * n_heads + h) * head_dim + d] = float(sum > 0 ? o / sum : 0.0);
      }
    }
  }
}

}  // namespace kvboost::kernels
