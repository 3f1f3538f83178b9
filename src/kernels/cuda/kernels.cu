// CUDA kernels of the GPU decoder: simple, correct versions of the small ops, a warp-per-row GEMV
// for decode (16-byte weight loads, f32 activations) and cuBLAS for everything else.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda_kernels.h"
#include "warp.cuh"
#include "kvboost/common.h"

namespace kvboost::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(e));
}
void check(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: ", what, ": status ", int(e));
}

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_w(const void* w, WType wt, int64_t i) {
  switch (wt) {
    case WType::F32: return static_cast<const float*>(w)[i];
    case WType::F16: return __half2float(static_cast<const __half*>(w)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
  }
}

// Block-wide sum/max; `red` holds 32 floats of shared memory; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // `red` may still be read from a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? red[lane] : (kMax ? -INFINITY : 0.0f);
  if (warp == 0) {
    r = kMax ? warp_max(r) : warp_sum(r);
    if (lane == 0) red[0] = r;
  }
  __syncthreads();
  return red[0];
}

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 65535 * 16)));
}

__global__ void embed_kernel(const int32_t* tokens, const void* table, WType wt, float* x, int64_t n, int64_t H) {
  const int64_t t = blockIdx.x;
  const int64_t row = tokens[t];
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) x[t * H + i] = load_w(table, wt, row * H + i);
}

__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_reduce<false>(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t n_tokens, int64_t n_heads,
                            int64_t hd) {
  const int64_t half = hd / 2, total = n_tokens * n_heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, th = idx / half, t = th / n_heads;
    float* p = x + th * hd;
    const float c = cos[t * half + i], s = sin[t * half + i];
    const float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
  }
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = g[i];
    y[i] = a / (1.0f + expf(-a)) * u[i];
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % n];
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void to_f16_kernel(const float* x, __half* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(x[i]);
}

// 8 consecutive 16-bit weights (one 16-byte load) as f32.
__device__ __forceinline__ void unpack8(uint4 v, bool bf16, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (bf16) {
      out[2 * j] = __uint_as_float(words[j] << 16);
      out[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    } else {
      out[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[j] & 0xffffu)));
      out[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[j] >> 16)));
    }
  }
}

// One warp per output feature n; each lane reads 16 bytes of the weight row per step (two steps
// in flight) and keeps one sum per token row (M <= 8, unrolled so the sums stay in registers).
__global__ void gemv_kernel(const float* __restrict__ x, const uint16_t* __restrict__ w, bool bf16,
                            const float* __restrict__ bias, float* __restrict__ y, int M, int64_t N, int64_t K) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  const uint16_t* wr = w + n * K;
  float acc[kGemvMaxM];
#pragma unroll
  for (int m = 0; m < kGemvMaxM; ++m) acc[m] = 0.0f;
  if (K % 8 == 0) {
    // Four 16-byte weight loads in flight per lane before the first use (a warp covers 1024
    // weights per step): one load at a time left decode latency-bound.
    constexpr int kUnroll = 4;
    for (int64_t k0 = int64_t(lane) * 8; k0 < K; k0 += 256 * kUnroll) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (k0 + u * 256 < K) raw[u] = __ldg(reinterpret_cast<const uint4*>(wr + k0 + u * 256));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + u * 256;
        if (kk >= K) break;
        float wf[8];
        unpack8(raw[u], bf16, wf);
#pragma unroll
        for (int m = 0; m < kGemvMaxM; ++m) {
          if (m < M) {
            const float4 a = *reinterpret_cast<const float4*>(x + m * K + kk);
            const float4 b = *reinterpret_cast<const float4*>(x + m * K + kk + 4);
            acc[m] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                      wf[6] * b.z + wf[7] * b.w;
          }
        }
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const uint16_t raw = wr[k];
      const float wf = bf16 ? __uint_as_float(uint32_t(raw) << 16) : __half2float(__ushort_as_half(raw));
#pragma unroll
      for (int m = 0; m < kGemvMaxM; ++m)
        if (m < M) acc[m] += wf * x[m * K + k];
    }
  }
#pragma unroll
  for (int m = 0; m < kGemvMaxM; ++m) {
    if (m < M) {
      const float v = warp_sum(acc[m]);
      if (lane == 0) y[m * N + n] = v + (bias ? bias[n] : 0.0f);
    }
  }
}

constexpr int kAttnThreads = 128;

// One block per (head, query). Scores of the visible keys in shared memory, block softmax, then
// out = P·V with the threads split into G groups of head_dim (group g sums keys g, g + G, ...).
__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                 const float* __restrict__ v, float* __restrict__ out, int64_t q_pos0,
                                 int64_t n_kv, int64_t n_heads, int64_t n_kv_heads, int64_t hd, int64_t window,
                                 float scale) {
  extern __shared__ float smem[];
  const int64_t h = blockIdx.x, i = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
  const int64_t p = q_pos0 + i;
  const int64_t hi = p + 1 < n_kv ? p + 1 : n_kv;
  const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  float* red = smem;            // 32
  float* qs = smem + 32;        // hd
  float* part = qs + hd;        // G * hd
  const int64_t G = hd <= blockDim.x ? blockDim.x / hd : 1;
  float* sc = part + G * hd;    // hi - lo
  const float* qr = q + (i * n_heads + h) * hd;
  float* o = out + (i * n_heads + h) * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qr[d];
  __syncthreads();
  if (hi <= lo) {  // no visible key
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
    return;
  }
  const int64_t n = hi - lo, kstride = n_kv_heads * hd;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float* kr = k + (lo + j) * kstride + kvh * hd;
    float dot = 0;
    for (int64_t d = 0; d < hd; ++d) dot += qs[d] * kr[d];
    dot *= scale;
    sc[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_reduce<true>(mx, red);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);  // its barriers also publish sc[]
  const float inv = 1.0f / sum;
  if (G > 1) {
    const int64_t g = threadIdx.x / hd, d = threadIdx.x % hd;
    if (g < G) {
      float acc = 0;
      for (int64_t j = g; j < n; j += G) acc += sc[j] * v[(lo + j) * kstride + kvh * hd + d];
      part[g * hd + d] = acc;
    }
    __syncthreads();
    for (int64_t dd = threadIdx.x; dd < hd; dd += blockDim.x) {
      float acc = 0;
      for (int64_t gg = 0; gg < G; ++gg) acc += part[gg * hd + dd];
      o[dd] = acc * inv;
    }
  } else {
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      float acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += sc[j] * v[(lo + j) * kstride + kvh * hd + d];
      o[d] = acc * inv;
    }
  }
}

size_t attention_smem(int64_t hd, int64_t n_keys) {
  const int64_t G = hd <= kAttnThreads ? kAttnThreads / hd : 1;
  return size_t(32 + hd + G * hd + n_keys) * sizeof(float);
}

constexpr size_t kAttnSmemLimit = 160 * 1024;  // raised once per device with cudaFuncSetAttribute

void launch_check(const char* what) { check(cudaGetLastError(), what); }

}  // namespace

void embed(const int32_t* tokens, const void* table, WType wt, float* x, int64_t n, int64_t H, cudaStream_t s) {
  if (n <= 0) return;
  embed_kernel<<<unsigned(n), kThreads, 0, s>>>(tokens, table, wt, x, n, H);
  launch_check("embed");
}

void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim, float eps, cudaStream_t s) {
  if (n_rows <= 0) return;
  rms_norm_kernel<<<unsigned(n_rows), dim >= 256 ? 256 : 64, 0, s>>>(x, w, y, dim, eps);
  launch_check("rms_norm");
}

void rope_rotate_half(float* x, const float* cos, const float* sin, int64_t n_tokens, int64_t n_heads,
                      int64_t head_dim, cudaStream_t s) {
  const int64_t total = n_tokens * n_heads * (head_dim / 2);
  if (total <= 0) return;
  rope_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, cos, sin, n_tokens, n_heads, head_dim);
  launch_check("rope_rotate_half");
}

void silu_mul(const float* gate, const float* up, float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, y, n);
  launch_check("silu_mul");
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  launch_check("add_inplace");
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n, cudaStream_t s) {
  if (n_rows * n <= 0) return;
  add_bias_kernel<<<blocks_for(n_rows * n), kThreads, 0, s>>>(y, b, n_rows * n, n);
  launch_check("add_bias");
}

void to_half(const float* x, void* y, WType wt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (wt == WType::BF16)
    to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<__nv_bfloat16*>(y), n);
  else if (wt == WType::F16)
    to_f16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<__half*>(y), n);
  else
    fail("to_half: weight type ", kernels::wtype_name(wt), " is not a 16-bit type");
  launch_check("to_half");
}

void gemv(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
          cudaStream_t s) {
  if (wt != WType::BF16 && wt != WType::F16) fail("gemv: weight type ", kernels::wtype_name(wt), " (BF16 or F16)");
  if (M < 1 || M > kGemvMaxM) fail("gemv: M = ", M, " outside [1, ", kGemvMaxM, "]");
  if (N <= 0) return;
  constexpr int warps = 8;
  gemv_kernel<<<unsigned((N + warps - 1) / warps), warps * 32, 0, s>>>(x, static_cast<const uint16_t*>(w),
                                                                        wt == WType::BF16, bias, y, int(M), N, K);
  launch_check("gemv");
}

void matmul(cublasHandle_t h, const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
            int64_t N, int64_t K, void* xh, cudaStream_t s) {
  if (M <= 0 || N <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[M, N] = x[M, K] w[N, K]^T is column-major y^T[N, M] = w^T x^T: w is a
  // column-major [K, N] matrix used transposed, x a column-major [K, M] one.
  if (wt == WType::F32) {
    check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, static_cast<const float*>(w),
                      int(K), x, int(K), &zero, y, int(N)),
          "cublasSgemm");
  } else if (M <= kGemvMaxM) {
    gemv(x, w, wt, bias, y, M, N, K, s);
    return;
  } else {
    to_half(x, xh, wt, M * K, s);
    const cudaDataType_t dt = wt == WType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w, dt, int(K), xh, dt, int(K),
                       &zero, y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  if (bias) add_bias(y, bias, M, N, s);
}

int64_t attention_max_tokens(int64_t head_dim) {
  return int64_t(kAttnSmemLimit / sizeof(float)) - int64_t(attention_smem(head_dim, 0) / sizeof(float));
}

void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0,
               int64_t n_kv_tokens, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t window,
               float scale, cudaStream_t s) {
  if (n_q <= 0) return;
  if (n_kv_tokens > attention_max_tokens(head_dim))
    fail("GPU attention: ", n_kv_tokens, " keys exceed the shared-memory limit of ", attention_max_tokens(head_dim));
  if (n_heads % n_kv_heads) fail("GPU attention: n_heads ", n_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
  if (n_q > 65535) fail("GPU attention: ", n_q, " queries in one call (at most 65535)");
  static thread_local int raised_device = -1;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (raised_device != dev) {
    check(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kAttnSmemLimit)),
          "cudaFuncSetAttribute(attention)");
    raised_device = dev;
  }
  const dim3 grid{unsigned(n_heads), unsigned(n_q), 1u};
  attention_kernel<<<grid, kAttnThreads, attention_smem(head_dim, n_kv_tokens), s>>>(
      q, k, v, out, q_pos0, n_kv_tokens, n_heads, n_kv_heads, head_dim, window, scale);
  launch_check("attention");
}

}  // namespace kvboost::cuda
