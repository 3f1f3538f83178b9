#define KVBOOST_ISA_NS avx2_impl
#include "cpu/attention_impl.h"
#include "cpu/cpu_kernels.h"

namespace kvboost::kernels::cpu {

void attention_avx2(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                    int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, int64_t window, float scale, float* scratch) {
  avx2_impl::attention(q, k, v, out, n_q, q_pos0, n_kv_tokens, n_heads, n_kv_heads, head_dim, window,
                  scale, scratch);
}

}  // namespace kvboost::kernels::cpu
