// 4-bit weights on the device (cuda_kernels.h): AWQ's int4 groups in the layouts the loader
// converts them to (kvboost/kernels.h WType::Q4_Z, Q4_Z128), read packed: decode GEMV straight
// from the 4-bit rows, prefill through a dequantization to bf16 and cuBLAS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "cuda_kernels.h"
#include "warp.cuh"
#include "kvboost/common.h"

namespace kvboost::cuda {

namespace {


// Header of a block: f16 d, uint8 z (then one reserved byte, then the nibbles).
__device__ __forceinline__ void block_header(const uint8_t* b, float& d, float& z) {
  d = __half2float(*reinterpret_cast<const __half*>(b));
  z = float(b[2]);
}

// Q4_Z128 (68 bytes / 128): byte i (0..31) = elements i (low), 32 + i (high); byte 32 + i =
// 64 + i (low), 96 + i (high). Q4_Z (20 bytes / 32): byte i (0..15) = elements i, 16 + i.
template <int kElems>
__device__ __forceinline__ float q4_elem(const uint8_t* blk, int e) {
  float d, z;
  block_header(blk, d, z);
  const uint8_t* qs = blk + 4;
  int q;
  if (kElems == 128) {
    const int byte = (e & 31) + (e >= 64 ? 32 : 0);
    q = ((e & 63) < 32) ? (qs[byte] & 15) : (qs[byte] >> 4);
  } else {
    q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
  }
  return d * (float(q) - z);
}

// One warp per output row n; blockDim 128 (4 rows). Q4_Z128: the warp reads one block per
// step, lane i its bytes i and 32 + i (elements i, 32 + i, 64 + i, 96 + i); Q4_Z: two blocks
// per step, lane i byte i % 16 of block i / 16.
template <int kElems, int kBytes>
__global__ void gemv_q4_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ y, int M, int64_t N, int64_t K) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t nb = K / kElems;
  const uint8_t* row = w + n * nb * kBytes;
  float acc[kGemvMaxM];
#pragma unroll
  for (int m = 0; m < kGemvMaxM; ++m) acc[m] = 0;
  if (kElems == 128) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * kBytes;
      float d, z;
      block_header(blk, d, z);
      const uint8_t lo = blk[4 + lane], hi = blk[4 + 32 + lane];
      const float w0 = d * (float(lo & 15) - z), w1 = d * (float(lo >> 4) - z);
      const float w2 = d * (float(hi & 15) - z), w3 = d * (float(hi >> 4) - z);
      const int64_t k0 = b * 128 + lane;
#pragma unroll
      for (int m = 0; m < kGemvMaxM; ++m) {
        if (m >= M) break;
        const float* xr = x + int64_t(m) * K + k0;
        acc[m] += w0 * xr[0] + w1 * xr[32] + w2 * xr[64] + w3 * xr[96];
      }
    }
  } else {
    for (int64_t b0 = 0; b0 < nb; b0 += 2) {
      const int64_t b = b0 + (lane >> 4);
      if (b >= nb) continue;  // the odd last block: half the warp idles (no shuffles below)
      const uint8_t* blk = row + b * kBytes;
      float d, z;
      block_header(blk, d, z);
      const int j = lane & 15;
      const uint8_t q = blk[4 + j];
      const float w0 = d * (float(q & 15) - z), w1 = d * (float(q >> 4) - z);
      const int64_t k0 = b * 32 + j;
#pragma unroll
      for (int m = 0; m < kGemvMaxM; ++m) {
        if (m >= M) break;
        const float* xr = x + int64_t(m) * K + k0;
        acc[m] += w0 * xr[0] + w1 * xr[16];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kGemvMaxM; ++m) {
    if (m >= M) break;
    const float v = warp_sum(acc[m]);
    if (lane == 0) y[int64_t(m) * N + n] = v + (bias ? bias[n] : 0.0f);
  }
}

template <int kElems, int kBytes, typename Out>
__global__ void dequant_q4_kernel(const uint8_t* __restrict__ w, Out* __restrict__ out, int64_t N, int64_t K) {
  const int64_t total = N * K;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    const uint8_t* blk = w + (n * (K / kElems) + k / kElems) * kBytes;
    const float v = q4_elem<kElems>(blk, int(k % kElems));
    if constexpr (sizeof(Out) == 2 && std::is_same_v<Out, __half>) out[i] = __float2half_rn(v);
    else out[i] = __float2bfloat16_rn(v);
  }
}

void check_q4(const char* what, WType wt, int64_t K) {
  if (wt != WType::Q4_Z && wt != WType::Q4_Z128) fail(what, ": weight type ", kernels::wtype_name(wt), " (Q4_Z or Q4_Z128)");
  const int64_t blk = wt == WType::Q4_Z ? 32 : 128;
  if (K % blk != 0) fail(what, ": K = ", K, " is not a multiple of the ", blk, "-element block of ", kernels::wtype_name(wt));
}

}  // namespace

void gemv_q4(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
             cudaStream_t s) {
  check_q4("gemv_q4", wt, K);
  if (M <= 0 || N <= 0) return;
  if (M > kGemvMaxM) fail("gemv_q4: M = ", M, " rows (at most ", kGemvMaxM, ")");
  const unsigned grid = unsigned((N + 3) / 4);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (wt == WType::Q4_Z128) gemv_q4_kernel<128, 68><<<grid, 128, 0, s>>>(x, wb, bias, y, int(M), N, K);
  else gemv_q4_kernel<32, 20><<<grid, 128, 0, s>>>(x, wb, bias, y, int(M), N, K);
  check(cudaGetLastError(), "gemv_q4_kernel");
}

void dequant_q4(const void* w, WType wt, void* out, WType out_type, int64_t N, int64_t K, cudaStream_t s) {
  check_q4("dequant_q4", wt, K);
  if (out_type != WType::BF16 && out_type != WType::F16) fail("dequant_q4: output type ", kernels::wtype_name(out_type));
  if (N <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>((N * K + 255) / 256, 65535 * 8));
  const auto* wb = static_cast<const uint8_t*>(w);
  if (out_type == WType::F16) {
    if (wt == WType::Q4_Z128) dequant_q4_kernel<128, 68, __half><<<grid, 256, 0, s>>>(wb, static_cast<__half*>(out), N, K);
    else dequant_q4_kernel<32, 20, __half><<<grid, 256, 0, s>>>(wb, static_cast<__half*>(out), N, K);
  } else {
    auto* o = static_cast<__nv_bfloat16*>(out);
    if (wt == WType::Q4_Z128) dequant_q4_kernel<128, 68, __nv_bfloat16><<<grid, 256, 0, s>>>(wb, o, N, K);
    else dequant_q4_kernel<32, 20, __nv_bfloat16><<<grid, 256, 0, s>>>(wb, o, N, K);
  }
  check(cudaGetLastError(), "dequant_q4_kernel");
}

void matmul_q4(cublasHandle_t h, const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
               int64_t N, int64_t K, void* w_scratch, void* xh, cudaStream_t s) {
  if (M <= kGemvMaxM) return gemv_q4(x, w, wt, bias, y, M, N, K, s);
  dequant_q4(w, wt, w_scratch, WType::BF16, N, K, s);
  matmul(h, x, w_scratch, WType::BF16, bias, y, M, N, K, xh, s);
}

}  // namespace kvboost::cuda
