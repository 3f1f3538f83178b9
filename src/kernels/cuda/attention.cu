// Paged attention on the device (cuda_kernels.h): FlashAttention-2-style tiled prefill and
// split-K decode over the engine's paged K/V pools, K/V in f32, f16 or bf16, f32 math.
// head_dim is a run-time multiple of 32 up to 256 (lane d owns dims d, d + 32, ...: at most 8
// accumulators per query), which keeps one instantiation per K/V type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "cuda_kernels.h"
#include "warp.cuh"
#include "kvboost/common.h"

namespace kvboost::cuda {

namespace {

constexpr int kWarps = 4;           // per CTA
constexpr int kQueriesPerWarp = 4;  // prefill: 16 queries per CTA
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ int64_t i64max(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t i64min(int64_t a, int64_t b) { return a < b ? a : b; }


// Element (token t, kv head h, dim d) of a pool through the block table.
template <typename T>
__device__ __forceinline__ const T* kv_row(const T* pool, const int32_t* table, int64_t t, int bs, int n_kv, int h,
                                            int hd) {
  const int64_t blk = table[t / bs];
  return pool + ((blk * bs + t % bs) * n_kv + h) * int64_t(hd);
}

// One query's online-softmax state over a tile of scores held one per lane (lane j: key j).
struct Row {
  float m, l, o[kMaxDimsPerLane];
};

__device__ __forceinline__ void row_init(Row& r) {
  r.m = -INFINITY, r.l = 0;
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t) r.o[t] = 0;
}

// s: this lane's score (-inf when masked); vs: the tile's values in shared memory [bk][hd_pad].
__device__ __forceinline__ void row_update(Row& r, float s, const float* vs, int bk, int hd, int hd_pad, int lane) {
  const float mt = warp_max(s);
  const float m_new = fmaxf(r.m, mt);
  if (m_new == -INFINITY) return;  // nothing visible yet
  const float p = s == -INFINITY ? 0.0f : __expf(s - m_new);
  const float corr = r.m == -INFINITY ? 0.0f : __expf(r.m - m_new);
  r.l = r.l * corr + warp_sum(p);
  const int nt = hd >> 5;
#pragma unroll
  for (int t = 0; t < kMaxDimsPerLane; ++t)
    if (t < nt) r.o[t] *= corr;
  for (int j = 0; j < bk; ++j) {
    const float pj = __shfl_sync(0xffffffffu, p, j);
    if (pj == 0.0f) continue;  // uniform across the warp
    const float* v = vs + j * hd_pad;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t)
      if (t < nt) r.o[t] += pj * v[lane + 32 * t];
  }
  r.m = m_new;
}

// Prefill. grid (ceil(n_q / 16), n_heads); block 128; dynamic shared memory:
// q [16][hd] + k [bk][hd + 1] + v [bk][hd + 1] floats.
template <typename T>
__global__ void flash_prefill_kernel(const float* __restrict__ q, const T* __restrict__ kp, const T* __restrict__ vp,
                                     const int32_t* __restrict__ table, float* __restrict__ out, int n_q,
                                     int64_t q_pos0, int64_t n_kv_tokens, int bs, int n_heads, int n_kv, int hd,
                                     int64_t window, float scale, int bk) {
  extern __shared__ float smem[];
  const int hd_pad = hd + 1;  // k rows read one per lane: the pad spreads them over the banks
  float* qs = smem;
  float* ks = qs + kWarps * kQueriesPerWarp * hd;
  float* vs = ks + bk * hd_pad;
  const int head = blockIdx.y, kvh = head / (n_heads / n_kv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q0 = blockIdx.x * kWarps * kQueriesPerWarp;
  const int nq_cta = min(kWarps * kQueriesPerWarp, n_q - q0);
  for (int i = threadIdx.x; i < nq_cta * hd; i += blockDim.x) {
    const int qi = i / hd, d = i % hd;
    qs[i] = q[(int64_t(q0 + qi) * n_heads + head) * hd + d] * scale;
  }
  // Keys this CTA can see: [lo, hi).
  const int64_t first_pos = q_pos0 + q0, last_pos = q_pos0 + q0 + nq_cta - 1;
  const int64_t hi = i64min(n_kv_tokens, last_pos + 1);
  const int64_t lo = window > 0 ? i64max(0, first_pos - window + 1) : 0;
  Row rows[kQueriesPerWarp];
#pragma unroll
  for (int r = 0; r < kQueriesPerWarp; ++r) row_init(rows[r]);
  for (int64_t k0 = lo / bk * bk; k0 < hi; k0 += bk) {
    __syncthreads();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < bk * hd; i += blockDim.x) {
      const int j = i / hd, d = i % hd;
      const int64_t t = k0 + j;
      float kv_k = 0, kv_v = 0;
      if (t < hi) {
        kv_k = to_f(kv_row(kp, table, t, bs, n_kv, kvh, hd)[d]);
        kv_v = to_f(kv_row(vp, table, t, bs, n_kv, kvh, hd)[d]);
      }
      ks[j * hd_pad + d] = kv_k;
      vs[j * hd_pad + d] = kv_v;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kQueriesPerWarp; ++r) {
      const int qi = warp * kQueriesPerWarp + r;
      if (qi >= nq_cta) break;  // uniform in the warp
      const int64_t pos = q_pos0 + q0 + qi, t = k0 + lane;
      float s = -INFINITY;
      if (lane < bk && t <= pos && t < n_kv_tokens && (window <= 0 || pos - t < window)) {
        const float* kr = ks + lane * hd_pad;
        const float* qr = qs + qi * hd;
        float acc = 0;
        for (int d = 0; d < hd; ++d) acc += qr[d] * kr[d];
        s = acc;
      }
      row_update(rows[r], s, vs, bk, hd, hd_pad, lane);
    }
  }
  const int nt = hd >> 5;
#pragma unroll
  for (int r = 0; r < kQueriesPerWarp; ++r) {
    const int qi = warp * kQueriesPerWarp + r;
    if (qi >= nq_cta) break;
    float* o = out + (int64_t(q0 + qi) * n_heads + head) * hd;
    const float inv = rows[r].l > 0 ? 1.0f / rows[r].l : 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerLane; ++t)
      if (t < nt) o[lane + 32 * t] = rows[r].o[t] * inv;
  }
}

// Decode, phase 1. grid (n_heads, n_splits, n_q); block 128. Each warp walks 32-key chunks of
// the split's range (lane j scores key j straight from the pool); the 4 warps' states are then
// merged in shared memory into one normalized partial output + log-sum-exp per CTA.
template <typename T>
__global__ void decode_split_kernel(const float* __restrict__ q, const T* __restrict__ kp, const T* __restrict__ vp,
                                    const int32_t* __restrict__ table, float* __restrict__ part_o,
                                    float* __restrict__ part_lse, int64_t q_pos0, int64_t n_kv_tokens, int bs,
                                    int n_heads, int n_kv, int hd, int64_t window, float scale, int n_splits) {
  __shared__ float qs[256];
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wo[kWarps][256];
  const int head = blockIdx.x, split = blockIdx.y, qi = blockIdx.z;
  const int kvh = head / (n_heads / n_kv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(int64_t(qi) * n_heads + head) * hd + d] * scale;
  __syncthreads();
  const int64_t pos = q_pos0 + qi;
  const int64_t hi = i64min(n_kv_tokens, pos + 1), lo = window > 0 ? i64max(0, pos - window + 1) : 0;
  const int64_t span = i64max(0, hi - lo), per = (span + n_splits - 1) / n_splits;
  const int64_t s0 = lo + int64_t(split) * per, s1 = i64min(hi, s0 + per);
  Row r;
  row_init(r);
  const int nt = hd >> 5;
  for (int64_t c = s0 + int64_t(warp) * 32; c < s1; c += 32 * kWarps) {
    const int64_t t = c + lane;
    float s = -INFINITY;
    if (t < s1) {
      const T* kr = kv_row(kp, table, t, bs, n_kv, kvh, hd);
      float acc = 0;
      for (int d = 0; d < hd; ++d) acc += qs[d] * to_f(kr[d]);
      s = acc;
    }
    const float mt = warp_max(s), m_new = fmaxf(r.m, mt);
    if (m_new == -INFINITY) continue;
    const float p = s == -INFINITY ? 0.0f : __expf(s - m_new);
    const float corr = r.m == -INFINITY ? 0.0f : __expf(r.m - m_new);
    r.l = r.l * corr + warp_sum(p);
#pragma unroll
    for (int u = 0; u < kMaxDimsPerLane; ++u)
      if (u < nt) r.o[u] *= corr;
    const int n_here = int(i64min(32, s1 - c));
    for (int j = 0; j < n_here; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj == 0.0f) continue;
      const T* vr = kv_row(vp, table, c + j, bs, n_kv, kvh, hd);
#pragma unroll
      for (int u = 0; u < kMaxDimsPerLane; ++u)
        if (u < nt) r.o[u] += pj * to_f(vr[lane + 32 * u]);
    }
    r.m = m_new;
  }
  if (lane == 0) wm[warp] = r.m, wl[warp] = r.l;
#pragma unroll
  for (int u = 0; u < kMaxDimsPerLane; ++u)
    if (u < nt) wo[warp][lane + 32 * u] = r.o[u];
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, wm[w]);
  float l = 0;
  for (int w = 0; w < kWarps; ++w) l += wm[w] == -INFINITY ? 0.0f : wl[w] * __expf(wm[w] - m);
  const int64_t base = (int64_t(qi) * n_heads + head) * n_splits + split;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0;
    for (int w = 0; w < kWarps; ++w)
      if (wm[w] != -INFINITY) o += wo[w][d] * __expf(wm[w] - m);
    part_o[base * hd + d] = l > 0 ? o / l : 0.0f;
  }
  if (threadIdx.x == 0) part_lse[base] = l > 0 ? m + logf(l) : -INFINITY;
}

// Decode, phase 2: grid n_q * n_heads, block hd (<= 256).
__global__ void decode_merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                                    float* __restrict__ out, int n_splits, int hd) {
  const int64_t row = blockIdx.x;
  const float* lse = part_lse + row * n_splits;
  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, lse[s]);
  const int d = threadIdx.x;
  if (d >= hd) return;
  if (m == -INFINITY) {
    out[row * hd + d] = 0;
    return;
  }
  float num = 0, den = 0;
  for (int s = 0; s < n_splits; ++s) {
    if (lse[s] == -INFINITY) continue;
    const float w = __expf(lse[s] - m);
    num += w * part_o[(row * n_splits + s) * hd + d];
    den += w;
  }
  out[row * hd + d] = num / den;
}

void check_shapes(const char* what, WType kv_type, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                  int64_t block_size) {
  if (kv_type != WType::F32 && kv_type != WType::F16 && kv_type != WType::BF16)
    fail(what, ": K/V type ", kernels::wtype_name(kv_type), " (F32, F16 or BF16)");
  if (head_dim < 32 || head_dim > 256 || head_dim % 32 != 0)
    fail(what, ": head_dim ", head_dim, " (a multiple of 32 in 32..256)");
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail(what, ": ", n_heads, " heads over ", n_kv_heads, " K/V heads");
  if (block_size <= 0) fail(what, ": block_size ", block_size);
}

template <typename T>
void launch_prefill(const float* q, const void* k, const void* v, const int32_t* table, float* out, int64_t n_q,
                    int64_t q_pos0, int64_t n_kv, int64_t bs, int64_t nh, int64_t nkv, int64_t hd, int64_t window,
                    float scale, cudaStream_t s) {
  const int bk = hd <= 128 ? 32 : 16;
  const size_t smem = sizeof(float) * size_t(kWarps * kQueriesPerWarp * hd + 2 * bk * (hd + 1));
  // Above the default 48 KiB (head_dim 256: 49,280 bytes) the kernel must opt in, up to the
  // device's limit (sm_90: 227 KiB; sm_75: 64 KiB): raised to what this tile needs, once per
  // device and thread, and an Error naming both sizes where the card cannot give it.
  if (smem > 48 * 1024) {
    static thread_local size_t raised[64] = {};
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= 64) fail("flash_attention_paged: device index ", dev, " (0..63)");
    if (raised[dev] < smem) {
      int optin = 0;
      check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
            "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
      if (size_t(optin) < smem)
        fail("flash_attention_paged: head_dim ", hd, " needs ", smem, " bytes of shared memory per block; device cuda:",
             dev, " allows ", optin);
      check(cudaFuncSetAttribute(flash_prefill_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
            "cudaFuncSetAttribute(flash_prefill_kernel)");
      raised[dev] = smem;
    }
  }
  const dim3 grid{unsigned((n_q + kWarps * kQueriesPerWarp - 1) / (kWarps * kQueriesPerWarp)), unsigned(nh)};
  flash_prefill_kernel<T><<<grid, kWarps * 32, smem, s>>>(
      q, static_cast<const T*>(k), static_cast<const T*>(v), table, out, int(n_q), q_pos0, n_kv, int(bs), int(nh),
      int(nkv), int(hd), window, scale, bk);
  check(cudaGetLastError(), "flash_prefill_kernel");
}

template <typename T>
void launch_decode(const float* q, const void* k, const void* v, const int32_t* table, float* out, int64_t n_q,
                   int64_t q_pos0, int64_t n_kv, int64_t bs, int64_t nh, int64_t nkv, int64_t hd, int64_t window,
                   float scale, int64_t splits, float* ws, cudaStream_t s) {
  float* part_o = ws;
  float* part_lse = ws + n_q * nh * splits * hd;
  const dim3 grid{unsigned(nh), unsigned(splits), unsigned(n_q)};
  decode_split_kernel<T><<<grid, kWarps * 32, 0, s>>>(q, static_cast<const T*>(k), static_cast<const T*>(v), table,
                                                     part_o, part_lse, q_pos0, n_kv, int(bs), int(nh), int(nkv),
                                                     int(hd), window, scale, int(splits));
  check(cudaGetLastError(), "decode_split_kernel");
  decode_merge_kernel<<<unsigned(n_q * nh), unsigned(hd), 0, s>>>(part_o, part_lse, out, int(splits), int(hd));
  check(cudaGetLastError(), "decode_merge_kernel");
}

}  // namespace

void flash_attention_paged(const float* q, const void* k_pool, const void* v_pool, WType kv_type,
                           const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens,
                           int64_t block_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
                           float scale, cudaStream_t s) {
  check_shapes("flash_attention_paged", kv_type, n_heads, n_kv_heads, head_dim, block_size);
  if (n_q <= 0) return;
  switch (kv_type) {
    case WType::F16:
      return launch_prefill<__half>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size, n_heads,
                                    n_kv_heads, head_dim, window, scale, s);
    case WType::BF16:
      return launch_prefill<__nv_bfloat16>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size,
                                           n_heads, n_kv_heads, head_dim, window, scale, s);
    default:
      return launch_prefill<float>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size, n_heads,
                                   n_kv_heads, head_dim, window, scale, s);
  }
}

int64_t decode_splits(int64_t n_q, int64_t n_heads, int64_t n_kv_tokens, int64_t n_splits) {
  if (n_splits > 0) return n_splits;
  // About 2 CTAs per SM on a 132-SM part, each range at least 256 keys.
  const int64_t want = std::max<int64_t>(1, 264 / std::max<int64_t>(1, n_q * n_heads));
  return std::clamp<int64_t>(std::min(want, (n_kv_tokens + 255) / 256), 1, 64);
}

int64_t decode_workspace_floats(int64_t n_q, int64_t n_heads, int64_t head_dim, int64_t n_splits) {
  return n_q * n_heads * n_splits * (head_dim + 1);
}

void decode_attention_paged(const float* q, const void* k_pool, const void* v_pool, WType kv_type,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens,
                            int64_t block_size, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
                            float scale, int64_t n_splits, float* workspace, cudaStream_t s) {
  check_shapes("decode_attention_paged", kv_type, n_heads, n_kv_heads, head_dim, block_size);
  if (n_q <= 0) return;
  const int64_t sp = decode_splits(n_q, n_heads, n_kv_tokens, n_splits);
  switch (kv_type) {
    case WType::F16:
      return launch_decode<__half>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size, n_heads,
                                   n_kv_heads, head_dim, window, scale, sp, workspace, s);
    case WType::BF16:
      return launch_decode<__nv_bfloat16>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size,
                                          n_heads, n_kv_heads, head_dim, window, scale, sp, workspace, s);
    default:
      return launch_decode<float>(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size, n_heads,
                                  n_kv_heads, head_dim, window, scale, sp, workspace, s);
  }
}

}  // namespace kvboost::cuda
