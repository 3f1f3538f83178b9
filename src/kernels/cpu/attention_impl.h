// Internal: causal GQA attention over a contiguous KV cache, written once and compiled for the
// baseline ISA (attention.cpp) and for AVX2 (attention_avx2.cpp). Work is split over
// (query, kv-head) pairs; the query heads of a group reuse the same K/V rows while they are hot.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kvboost/common.h"

// The includer defines KVBOOST_ISA_NS (scalar, avx2): each build gets its own namespace, so the
// linker can never merge the AVX2 and baseline copies of these inline functions (ODR).
namespace kvboost::kernels::cpu::KVBOOST_ISA_NS {

inline void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                      int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, int64_t window, float scale, float* scratch) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const int64_t n_items = n_q * n_heads;
  const bool parallel = n_items > 1 && n_items * n_kv_tokens * head_dim > (1 << 15);
  // scratch holds one row per thread: num_threads() rows (the kernels' pool) as documented.
  parallel_for_dynamic(n_items, parallel, [&](int64_t item, int tid) {
    const int64_t i = item / n_heads;
    const int64_t h = item % n_heads;
    const int64_t kvh = h / group;
    const int64_t pos = q_pos0 + i;
    const int64_t j_end = pos + 1 < n_kv_tokens ? pos + 1 : n_kv_tokens;
    const int64_t j_begin = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    float* sc = scratch + int64_t(tid) * n_kv_tokens;
    const float* qi = q + (i * n_heads + h) * head_dim;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float* kj = k + j * kv_stride + kvh * head_dim;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < head_dim; ++d) s += qi[d] * kj[d];
      s *= scale;
      sc[j] = s;
      mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
    for (int64_t j = j_begin; j < j_end; ++j) {
      sc[j] = std::exp(sc[j] - mx);
      sum += sc[j];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float* o = out + (i * n_heads + h) * head_dim;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float p = sc[j] * inv;
      const float* vj = v + j * kv_stride + kvh * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vj[d];
    }
  });
}

}  // namespace kvboost::kernels::cpu::KVBOOST_ISA_NS
