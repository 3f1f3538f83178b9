// Internal: per-ISA kernel entry points. Only dispatch.cpp chooses among them.
#pragma once
#include "kvboost/kernels.h"

namespace kvboost::kernels::cpu {

void matmul_avx2(const float* x, const void* w, WType wt, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K);

void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps);
void silu_mul_avx2(const float* gate, const float* up, float* y, int64_t n);

void attention_avx2(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                    int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, int64_t window, float scale, float* scratch);
void attention_scalar(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                      int64_t q_pos0, int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, int64_t window, float scale, float* scratch);

}  // namespace kvboost::kernels::cpu
