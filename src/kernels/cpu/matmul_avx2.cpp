// AVX2 + FMA matmul for f32 activations against f32 / f16 / bf16 weights (nn.Linear layout).
//
// A register-blocked micro-kernel computes an MR x NR tile of y (MR tokens x NR output
// features, at most 4 x 3 so the 12 accumulators, 3 weight vectors and 1 activation vector fit
// the 16 ymm registers), converting each weight vector to f32 once per MR tokens. Threads split
// the output features N into cache-sized panels: a panel of weight rows stays in L2 while every
// token tile passes over it. Decode (M = 1) is bandwidth bound: every weight byte is read once.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels::cpu {

namespace {

template <WType WT>
inline __m256 load8(const void* w, int64_t i) {
  if constexpr (WT == WType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else if constexpr (WT == WType::F16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  } else {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <WType WT>
inline float load1(const void* w, int64_t i) {
  if constexpr (WT == WType::F32) return static_cast<const float*>(w)[i];
  else if constexpr (WT == WType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]);
  else return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

// y[m0..m0+MR, n0..n0+NR] over the full K.
template <WType WT, int MR, int NR>
inline void tile(const float* x, const void* w, const float* bias, float* y, int64_t m0,
                 int64_t n0, int64_t N, int64_t K) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load8<WT>(w, (n0 + j) * K + k);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + (m0 + i) * K + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t k = K8; k < K; ++k) s += x[(m0 + i) * K + k] * load1<WT>(w, (n0 + j) * K + k);
      if (bias) s += bias[n0 + j];
      y[(m0 + i) * N + n0 + j] = s;
    }
  }
}

template <WType WT, int MR>
inline void row_tiles(const float* x, const void* w, const float* bias, float* y, int64_t m0,
                      int64_t n_begin, int64_t n_end, int64_t N, int64_t K) {
  int64_t n = n_begin;
  for (; n + 3 <= n_end; n += 3) tile<WT, MR, 3>(x, w, bias, y, m0, n, N, K);
  for (; n < n_end; ++n) tile<WT, MR, 1>(x, w, bias, y, m0, n, N, K);
}

template <WType WT>
void panel(const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t n_begin,
           int64_t n_end, int64_t N, int64_t K) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) row_tiles<WT, 4>(x, w, bias, y, m, n_begin, n_end, N, K);
  switch (M - m) {
    case 3: row_tiles<WT, 3>(x, w, bias, y, m, n_begin, n_end, N, K); break;
    case 2: row_tiles<WT, 2>(x, w, bias, y, m, n_begin, n_end, N, K); break;
    case 1: row_tiles<WT, 1>(x, w, bias, y, m, n_begin, n_end, N, K); break;
    default: break;
  }
}

// Decode (M = 1): y[n0..n0+R) = w[n0..n0+R) · x. Two accumulators per row (k and k + 8) give
// 2R independent FMA chains, so the loop is bound by loads, not by FMA latency.
template <WType WT, int R>
inline void gemv_rows(const float* x, const void* w, const float* bias, float* y, int64_t n0,
                      int64_t K) {
  __m256 acc0[R], acc1[R];
  for (int j = 0; j < R; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  const int64_t K16 = K & ~int64_t(15), K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K16; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int j = 0; j < R; ++j) {
      acc0[j] = _mm256_fmadd_ps(x0, load8<WT>(w, (n0 + j) * K + k), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(x1, load8<WT>(w, (n0 + j) * K + k + 8), acc1[j]);
    }
  }
  if (K16 < K8) {
    const __m256 x0 = _mm256_loadu_ps(x + K16);
    for (int j = 0; j < R; ++j) acc0[j] = _mm256_fmadd_ps(x0, load8<WT>(w, (n0 + j) * K + K16), acc0[j]);
  }
  for (int j = 0; j < R; ++j) {
    float s = hsum(_mm256_add_ps(acc0[j], acc1[j]));
    for (int64_t k = K8; k < K; ++k) s += x[k] * load1<WT>(w, (n0 + j) * K + k);
    y[n0 + j] = bias ? s + bias[n0 + j] : s;
  }
}

template <WType WT>
void gemv(const float* x, const void* w, const float* bias, float* y, int64_t N, int64_t K) {
  // Row panels of 16: small enough to balance the two cores, large enough to amortise the
  // scheduling; each thread streams a contiguous range of rows.
  constexpr int64_t kPanel = 16;
  const int64_t n_panels = (N + kPanel - 1) / kPanel;
  const bool parallel = N * K >= (1 << 16) && n_panels > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < n_panels; ++p) {
    int64_t n = p * kPanel;
    const int64_t end = std::min(N, n + kPanel);
    for (; n + 4 <= end; n += 4) gemv_rows<WT, 4>(x, w, bias, y, n, K);
    for (; n < end; ++n) gemv_rows<WT, 1>(x, w, bias, y, n, K);
  }
}

template <WType WT>
void run(const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t N,
         int64_t K) {
  if (M == 1) return gemv<WT>(x, w, bias, y, N, K);
  // Panel height: ~96 KiB of weights, a multiple of the 3-row tile, so a panel stays in L2
  // while all token tiles pass over it. Decode uses small panels so both cores share the rows.
  const int64_t row_bytes = K * wtype_size(WT);
  int64_t rows = std::max<int64_t>(3, (96 * 1024 / std::max<int64_t>(row_bytes, 1)) / 3 * 3);
  if (M == 1) rows = std::min<int64_t>(rows, 24);
  const int64_t n_panels = (N + rows - 1) / rows;
  const bool parallel = M * N * K >= (1 << 16) && n_panels > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < n_panels; ++p) {
    int64_t n0 = p * rows;
    int64_t n1 = std::min(N, n0 + rows);
    panel<WT>(x, w, bias, y, M, n0, n1, N, K);
  }
}

}  // namespace

void matmul_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) {
  switch (wt) {
    case WType::F32: return run<WType::F32>(x, w, bias, y, M, N, K);
    case WType::F16: return run<WType::F16>(x, w, bias, y, M, N, K);
    case WType::BF16: return run<WType::BF16>(x, w, bias, y, M, N, K);
  }
}

}  // namespace kvboost::kernels::cpu
