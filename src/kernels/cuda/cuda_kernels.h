// CUDA kernels of the GPU decoder (built only with -DKVBOOST_CUDA=ON). Free functions over plain
// device pointers and explicit shapes, launched on the given stream; no allocation, no sync.
// Each has a CPU reference in kvboost/kernels.h with the same shape contract, and tests/gpu
// compares them (tests/gpu/test_gpu_kernels.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvboost/kernels.h"

namespace kvboost::cuda {

using kernels::WType;

// Throws kvboost::Error naming the call and CUDA's message when `e` is an error.
void check(cudaError_t e, const char* what);
void check(cublasStatus_t e, const char* what);

// x[t, :] = table[tokens[t], :] as f32. tokens: [n] (already checked < vocab); table: [vocab, H].
void embed(const int32_t* tokens, const void* table, WType wt, float* x, int64_t n, int64_t H, cudaStream_t s);

// As kernels::rms_norm: y = x / sqrt(mean(x^2) + eps) * w; x, y: [n_rows, dim]; x == y allowed.
void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps, cudaStream_t s);

// As kernels::rope_rotate_half: x [n_tokens, n_heads, head_dim] in place; cos/sin [n_tokens, head_dim/2].
void rope_rotate_half(float* x, const float* cos, const float* sin, int64_t n_tokens, int64_t n_heads,
                      int64_t head_dim, cudaStream_t s);

// As kernels::silu_mul: y[i] = silu(gate[i]) * up[i]; y may alias gate.
void silu_mul(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s);

// y[i] += x[i], i < n (the residual stream).
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s);

// y[r, i] += b[i]; y: [n_rows, n].
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n, cudaStream_t s);

// x f32 [n] -> y [n] in wt (BF16 or F16, round to nearest even).
void to_half(const float* x, void* y, WType wt, int64_t n, cudaStream_t s);

// As kernels::matmul for small M (decode): y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) with f32
// activations and f32 accumulation; x [M, K] f32, w [N, K] BF16 or F16, M <= kGemvMaxM.
constexpr int64_t kGemvMaxM = 8;
void gemv(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
          cudaStream_t s);

// As kernels::matmul, any M: F32 weights through cuBLAS SGEMM (no TF32); BF16/F16 weights through
// gemv when M <= kGemvMaxM, else cublasGemmEx with x rounded to the weight type into `xh`
// (at least M * K elements of 2 bytes) and f32 accumulation. The handle is bound to stream s.
void matmul(cublasHandle_t h, const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
            int64_t N, int64_t K, void* xh, cudaStream_t s);

// As kernels::attention_ref over a contiguous cache: q [n_q, n_heads, hd] at positions
// q_pos0 .. q_pos0 + n_q - 1; k, v [n_kv_tokens, n_kv_heads, hd] (token t at position t);
// out [n_q, n_heads, hd]. Causal, optional sliding window, f32 softmax. The scores of one
// query live in shared memory: n_kv_tokens <= attention_max_tokens().
void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0,
               int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
               float scale, cudaStream_t s);
int64_t attention_max_tokens(int64_t head_dim);

}  // namespace kvboost::cuda
