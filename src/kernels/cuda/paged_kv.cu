// The engine's paged K/V on the device (cuda_kernels.h "the engine's paged K/V"): the K/V write
// into the pass's slots, row gathers (logit rows, probe rows), key re-rotation for chunk
// copy-in, and a plain paged attention for head dims the tiled kernels do not take.
#include <cmath>

#include "cuda_kernels.h"
#include "warp.cuh"
#include "kvboost/common.h"

namespace kvboost::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

// Grid-stride over n * row elements: element (i, j) of row i goes to pool row slots[i].
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                const int64_t* __restrict__ slots, float* __restrict__ kp, float* __restrict__ vp,
                                int64_t n, int64_t row) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * row; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / row, j = e % row, dst = slots[i] * row + j;
    kp[dst] = k[e];
    vp[dst] = v[e];
  }
}

__global__ void gather_kernel(const float* __restrict__ x, const int64_t* __restrict__ idx, float* __restrict__ y,
                              int64_t n, int64_t width) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * width; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = x[idx[e / width] * width + e % width];
}

__global__ void rope_shift_kernel(float* x, const float* __restrict__ c, const float* __restrict__ s, int64_t n_vecs,
                                  int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_vecs * half; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / half, i = e % half;
    float* xr = x + r * hd;
    const float a = xr[i], b = xr[i + half];
    // __fmul_rn / __fadd_rn: no FMA contraction, the CPU reference's unfused a*c - b*s.
    xr[i] = __fadd_rn(__fmul_rn(a, c[i]), -__fmul_rn(b, s[i]));
    xr[i + half] = __fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, s[i]));
  }
}


// grid (n_q, n_heads), block 32. Lane j scores key c + j of each 32-key step over the whole
// head (head_dim <= 256 floats of q in shared memory); lane d accumulates output dims d, d + 32, ...
__global__ void simple_attention_kernel(const float* __restrict__ q, const float* __restrict__ kp,
                                        const float* __restrict__ vp, const int32_t* __restrict__ table,
                                        float* __restrict__ out, int64_t q_pos0, int64_t n_kv_tokens, int64_t bs,
                                        int n_heads, int n_kv, int hd, int64_t window, float scale) {
  __shared__ float qs[256];
  const int qi = blockIdx.x, head = blockIdx.y, kvh = head / (n_heads / n_kv), lane = threadIdx.x;
  for (int d = lane; d < hd; d += 32) qs[d] = q[(int64_t(qi) * n_heads + head) * hd + d] * scale;
  __syncwarp();
  const int64_t pos = q_pos0 + qi;
  const int64_t hi = pos + 1 < n_kv_tokens ? pos + 1 : n_kv_tokens;
  const int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
  const int64_t row = int64_t(n_kv) * hd;
  float m = -INFINITY, l = 0, o[kMaxDimsPerLane];
#pragma unroll
  for (int u = 0; u < kMaxDimsPerLane; ++u) o[u] = 0;
  for (int64_t c = lo; c < hi; c += 32) {
    const int64_t t = c + lane;
    float s = -INFINITY;
    if (t < hi) {
      const float* kr = kp + (int64_t(table[t / bs]) * bs + t % bs) * row + int64_t(kvh) * hd;
      float acc = 0;
      for (int d = 0; d < hd; ++d) acc += qs[d] * kr[d];
      s = acc;
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float p = s == -INFINITY ? 0.0f : __expf(s - m_new);
    const float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int u = 0; u < kMaxDimsPerLane; ++u) o[u] *= corr;
    const int n_here = hi - c < 32 ? int(hi - c) : 32;
    for (int j = 0; j < n_here; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const int64_t tj = c + j;
      const float* vr = vp + (int64_t(table[tj / bs]) * bs + tj % bs) * row + int64_t(kvh) * hd;
#pragma unroll
      for (int u = 0; u < kMaxDimsPerLane; ++u)
        if (lane + 32 * u < hd) o[u] += pj * vr[lane + 32 * u];
    }
    m = m_new;
  }
  float* orow = out + (int64_t(qi) * n_heads + head) * hd;
  const float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int u = 0; u < kMaxDimsPerLane; ++u)
    if (lane + 32 * u < hd) orow[lane + 32 * u] = o[u] * inv;
}

// One warp per row (8 rows per 256-thread block): the four sums of BlendSchedule::deviation in
// double, lanes striding the row. kSums: the sums themselves (dev [n, 4], tensor parallelism);
// otherwise the deviation (dev [n]).
template <bool kSums>
__global__ void deviation_kernel(const float* k, const float* v, const int64_t* slots, const float* kp,
                                 const float* vp, float* dev, int64_t n, int64_t row) {
  const int64_t i = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= n) return;  // the whole warp leaves together
  const float* fk = k + i * row;
  const float* fv = v + i * row;
  const float* ck = kp + slots[i] * row;
  const float* cv = vp + slots[i] * row;
  double dk2 = 0, dv2 = 0, k2 = 0, v2 = 0;
  for (int64_t j = lane; j < row; j += 32) {
    const double kk = fk[j], vv = fv[j], dk = kk - double(ck[j]), dv = vv - double(cv[j]);
    dk2 += dk * dk, dv2 += dv * dv, k2 += kk * kk, v2 += vv * vv;
  }
  dk2 = warp_sum(dk2), dv2 = warp_sum(dv2), k2 = warp_sum(k2), v2 = warp_sum(v2);
  if (lane != 0) return;
  if constexpr (kSums) {
    dev[i * 4] = float(dk2), dev[i * 4 + 1] = float(dv2), dev[i * 4 + 2] = float(k2), dev[i * 4 + 3] = float(v2);
  } else {
    dev[i] = float(dk2 / fmax(k2, 1e-30) + dv2 / fmax(v2, 1e-30));
  }
}

}  // namespace

void kv_write_slots(const float* k, const float* v, const int64_t* slots, float* k_pool, float* v_pool, int64_t n,
                    int64_t row, cudaStream_t s) {
  if (n <= 0 || row <= 0) return;
  kv_write_kernel<<<grid_for(n * row), kThreads, 0, s>>>(k, v, slots, k_pool, v_pool, n, row);
  check(cudaGetLastError(), "kv_write_slots");
}

namespace {
template <bool kSums>
void launch_deviation(const float* k, const float* v, const int64_t* slots, const float* k_pool, const float* v_pool,
                      float* out, int64_t n, int64_t row, cudaStream_t s, const char* what) {
  if (n <= 0 || row <= 0) return;
  if (n > 0x7fffffff) fail(what, ": ", n, " rows");
  deviation_kernel<kSums><<<unsigned((n + 7) / 8), 256, 0, s>>>(k, v, slots, k_pool, v_pool, out, n, row);
  check(cudaGetLastError(), what);
}
}  // namespace

void kv_deviation(const float* k, const float* v, const int64_t* slots, const float* k_pool, const float* v_pool,
                  float* dev, int64_t n, int64_t row, cudaStream_t s) {
  launch_deviation<false>(k, v, slots, k_pool, v_pool, dev, n, row, s, "kv_deviation");
}

void kv_deviation_sums(const float* k, const float* v, const int64_t* slots, const float* k_pool, const float* v_pool,
                       float* sums, int64_t n, int64_t row, cudaStream_t s) {
  launch_deviation<true>(k, v, slots, k_pool, v_pool, sums, n, row, s, "kv_deviation_sums");
}

void gather_rows(const float* x, const int64_t* idx, float* y, int64_t n, int64_t width, cudaStream_t s) {
  if (n <= 0 || width <= 0) return;
  gather_kernel<<<grid_for(n * width), kThreads, 0, s>>>(x, idx, y, n, width);
  check(cudaGetLastError(), "gather_rows");
}

void rope_shift(float* x, const float* cos, const float* sin, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                cudaStream_t s) {
  const int64_t n_vecs = n_rows * n_heads;
  if (n_vecs <= 0 || head_dim < 2) return;
  rope_shift_kernel<<<grid_for(n_vecs * (head_dim / 2)), kThreads, 0, s>>>(x, cos, sin, n_vecs, head_dim);
  check(cudaGetLastError(), "rope_shift");
}

void paged_attention_simple(const float* q, const float* k_pool, const float* v_pool, const int32_t* block_table,
                            float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv_tokens, int64_t block_size,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            cudaStream_t s) {
  if (head_dim < 1 || head_dim > 256) fail("paged_attention_simple: head_dim ", head_dim, " (1..256)");
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail("paged_attention_simple: ", n_heads, " heads over ", n_kv_heads, " K/V heads");
  if (n_q <= 0) return;
  if (n_q > 0x7fffffff || n_heads > 65535) fail("paged_attention_simple: ", n_q, " queries x ", n_heads, " heads");
  const dim3 grid{unsigned(n_q), unsigned(n_heads)};
  simple_attention_kernel<<<grid, 32, 0, s>>>(q, k_pool, v_pool, block_table, out, q_pos0, n_kv_tokens, block_size,
                                              int(n_heads), int(n_kv_heads), int(head_dim), window, scale);
  check(cudaGetLastError(), "paged_attention_simple");
}

}  // namespace kvboost::cuda
