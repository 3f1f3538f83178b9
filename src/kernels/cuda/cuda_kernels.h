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


// ---- paged attention (attention.cu) ----
// Pools as kernels::paged_attention: [n_blocks][block_size][n_kv_heads][head_dim] of kv_type
// (F32, F16 or BF16; f32 math), block_table [ceil(n_kv_tokens / block_size)] on the device;
// q [n_q, n_heads, head_dim] f32 at positions q_pos0 .. q_pos0 + n_q - 1; out the same shape.
// Causal, optional sliding window (window > 0: keys with pos - key < window), GQA
// (n_heads % n_kv_heads == 0), head_dim a multiple of 32 in 32..256; a query that sees no key
// gets 0. CPU reference: kernels::paged_attention_ref on the pools converted to f32.
//
// FlashAttention-2 (Dao 2023) schedule without tensor cores: a CTA of 4 warps takes 16 queries
// of one head; key/value tiles of 32 (head_dim <= 128) or 16 keys go through shared memory; each
// warp keeps 4 queries' running max, sum and output (lane d owns dims d, d + 32, ...) and
// rescales them per tile (online softmax): O(tile) memory, never the score matrix. Tiles past
// the last query's position or before the first one's window are skipped.
void flash_attention_paged(const float* q, const void* k_pool, const void* v_pool, WType kv_type,
                           const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens,
                           int64_t block_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
                           float scale, cudaStream_t s);
// Split-K decode attention (FlashDecoding): the keys of each (query, head) are cut into
// n_splits ranges, one CTA each writes a normalized partial output and its log-sum-exp into
// `workspace`, and a second kernel merges them by log-sum-exp weights. n_splits 0 = automatic
// (about 2 CTAs per SM over n_q * n_heads, ranges of at least 256 keys). workspace: at least
// decode_workspace_floats(n_q, n_heads, head_dim, n_splits) floats on the device.
void decode_attention_paged(const float* q, const void* k_pool, const void* v_pool, WType kv_type,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens,
                            int64_t block_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
                            float scale, int64_t n_splits, float* workspace, cudaStream_t s);
int64_t decode_splits(int64_t n_q, int64_t n_heads, int64_t n_kv_tokens, int64_t n_splits);  // the count used
int64_t decode_workspace_floats(int64_t n_q, int64_t n_heads, int64_t head_dim, int64_t n_splits);

// ---- 4-bit weights (quant.cu): AWQ's groups as converted at load (Q4_Z, Q4_Z128) ----
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); x [M, K] f32, w [N, K] in Q4_Z (20 bytes / 32)
// or Q4_Z128 (68 bytes / 128), M <= kGemvMaxM: one warp per output row reads the packed row once
// (4 bits + header on the wire, the decode path). CPU reference: kernels::matmul_ref.
void gemv_q4(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
             cudaStream_t s);
// w [N, K] Q4_Z / Q4_Z128 -> out [N, K] BF16 (or F16 when out_type says so): x = d * (q - z),
// rounded once. CPU reference: kernels::to_f32 row by row.
void dequant_q4(const void* w, WType wt, void* out, WType out_type, int64_t N, int64_t K, cudaStream_t s);
// Any M: gemv_q4 when M <= kGemvMaxM, else dequant_q4 into `w_scratch` (N * K BF16) and
// matmul (cuBLAS GemmEx, bf16 inputs, f32 accumulation) with x rounded into xh.
void matmul_q4(cublasHandle_t h, const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
               int64_t N, int64_t K, void* w_scratch, void* xh, cudaStream_t s);

// ---- the engine's paged K/V on the device (paged_kv.cu) ----
// Pools as above, f32. slots [n] (device): each row's pool row, block * block_size + p % block_size.
// k, v [n, row] f32 -> k_pool[slots[i] * row ..], v_pool[...] (the pass's new K/V into their
// paged slots; CPU: kv::KvLayout::write_rows, one run of rows at a time).
void kv_write_slots(const float* k, const float* v, const int64_t* slots, float* k_pool, float* v_pool, int64_t n,
                    int64_t row, cudaStream_t s);
// CacheBlend's measure on the device: dev[i] = |k_i - K[slots[i]]|^2 / |k_i|^2 + |v_i - V[slots[i]]|^2 /
// |v_i|^2 (in double) of each fresh row k, v [n, row] against the row its slot holds in the
// pools (the cached K/V, before the fresh row is written). One warp per row. CPU reference:
// BlendSchedule::deviation (kvboost/model.h).
void kv_deviation(const float* k, const float* v, const int64_t* slots, const float* k_pool, const float* v_pool,
                  float* dev, int64_t n, int64_t row, cudaStream_t s);
// The four sums behind it, sums [n, 4] (|k - K|^2, |v - V|^2, |k|^2, |v|^2 as f32), for tensor
// parallelism: each rank's sums over its K/V heads are all-reduced, then combined on the host
// (BlendSchedule::deviation_of_sums). CPU reference: BlendSchedule::deviation_sums.
void kv_deviation_sums(const float* k, const float* v, const int64_t* slots, const float* k_pool, const float* v_pool,
                       float* sums, int64_t n, int64_t row, cudaStream_t s);
// y[i, :] = x[idx[i], :], i < n, rows of `width` floats; idx (device) int64.
void gather_rows(const float* x, const int64_t* idx, float* y, int64_t n, int64_t width, cudaStream_t s);
// As kernels::rope_shift with its cos / sin table of the shift precomputed on the host
// (float(cos(double(delta) * inv_freq[i])), [head_dim / 2] each, on the device): the keys of
// n_rows contiguous pool rows x [n_rows, n_heads, head_dim] rotated in place by delta positions.
void rope_shift(float* x, const float* cos, const float* sin, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                cudaStream_t s);
// Paged attention for any head_dim <= 256 (the tiled kernels take multiples of 32 only): one
// warp per (query, head), 32 keys scored per step (one per lane), online softmax. Same contract
// as flash_attention_paged with f32 pools. CPU reference: kernels::paged_attention_ref.
void paged_attention_simple(const float* q, const float* k_pool, const float* v_pool, const int32_t* block_table,
                            float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            cudaStream_t s);

}  // namespace kvboost::cuda
