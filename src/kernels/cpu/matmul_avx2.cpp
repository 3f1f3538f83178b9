// AVX2 + FMA matmul for f32 activations against f32 / f16 / bf16 weights (nn.Linear layout).
//
// A register-blocked micro-kernel computes an MR x NR tile of y (MR tokens x NR output
// features, at most 4 x 3 so the 12 accumulators, 3 weight vectors and 1 activation vector fit
// the 16 ymm registers), converting each weight vector to f32 once per MR tokens. Threads split
// the output features N into cache-sized panels: a panel of weight rows stays in L2 while every
// token tile passes over it. Decode (M = 1) is bandwidth bound: every weight byte is read once.
#include <immintrin.h>
#include <algorithm>
#include <climits>
#include <vector>

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
// pf (first token tile of a block only, else null): the rows after this tile's NR rows are
// contiguous in memory, so walking pf at NR * 8 elements per step prefetches the next tile's rows
// (as the GEMV does); the later token tiles find the block in L2.
template <WType WT, int MR, int NR>
inline void tile(const float* x, const void* w, const float* bias, float* y, int64_t m0,
                 int64_t n0, int64_t N, int64_t K, const char* pf = nullptr) {
  constexpr int64_t es = WT == WType::F32 ? 4 : 2;
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    if (pf) {
      for (int64_t b = 0; b < NR * 8 * es; b += 64) _mm_prefetch(pf + k * NR * es + b, _MM_HINT_T0);
    }
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
                      int64_t n_begin, int64_t n_end, int64_t N, int64_t K, bool prefetch) {
  constexpr int64_t es = WT == WType::F32 ? 4 : 2;
  const char* wb = static_cast<const char*>(w);
  int64_t n = n_begin;
  for (; n + 3 <= n_end; n += 3)
    tile<WT, MR, 3>(x, w, bias, y, m0, n, N, K, prefetch ? wb + (n + 3) * K * es : nullptr);
  for (; n < n_end; ++n) tile<WT, MR, 1>(x, w, bias, y, m0, n, N, K);
}

// Output rows go in blocks whose weights (~128 KiB) stay in L2 while every 4-token tile runs
// over them, so each weight is read from memory once per call rather than once per 4 tokens
// (batched decode of several sequences is otherwise bandwidth-bound twice over). Every output
// element is still computed by the same tile in the same order: results are unchanged.
template <WType WT>
void panel(const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t n_begin,
           int64_t n_end, int64_t N, int64_t K) {
  const int64_t es = WT == WType::F32 ? 4 : 2;
  const int64_t nb = std::max<int64_t>(3, (int64_t(128) << 10) / (K * es) / 3 * 3);
  for (int64_t b0 = n_begin; b0 < n_end; b0 += nb) {
    const int64_t b1 = std::min(n_end, b0 + nb);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) row_tiles<WT, 4>(x, w, bias, y, m, b0, b1, N, K, m == 0);
    switch (M - m) {
      case 3: row_tiles<WT, 3>(x, w, bias, y, m, b0, b1, N, K, m == 0); break;
      case 2: row_tiles<WT, 2>(x, w, bias, y, m, b0, b1, N, K, m == 0); break;
      case 1: row_tiles<WT, 1>(x, w, bias, y, m, b0, b1, N, K, m == 0); break;
      default: break;
    }
  }
}

// ---- Decode (M = 1): y = W·x, bound by the memory bandwidth ----
//
// Each thread streams one contiguous range of rows (an even split, boundaries on 16 rows so
// that no two threads write the same cache line of y). Rows go R = 4 at a time: per 16 columns,
// one 32-byte load per row and two FMAs, 8 independent accumulator chains. The four rows of a
// group are four short streams (a row of Qwen2.5-0.5B's q_proj is 1.8 KB), too short for the
// hardware prefetcher to train on, so the kernel prefetches the next group linearly while it
// computes this one: per 16 columns, R * 16 elements of the next group.
//
// bf16 without a conversion instruction: a 32-byte load holds 16 bf16 as 8 uint32 pairs; the
// low halves shifted left by 16 are the even elements as f32, the high halves masked are the
// odd ones. x is deinterleaved once per call to match (xp: per 16 columns, 8 even then 8 odd).
constexpr int kGemvRows = 4;
// From this many tokens on, packing each weight panel on the fly for the outer-product tiles
// (matmul_packed_avx2.cpp) beats the dot-product tiles below (README, issue 4 table).
constexpr int64_t kPackOnTheFlyMinM = 64;

template <WType WT>
inline void load16(const void* w, int64_t i, __m256& a, __m256& b) {
  if constexpr (WT == WType::BF16) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  } else {
    a = load8<WT>(w, i);
    b = load8<WT>(w, i + 8);
  }
}

template <WType WT, int R>
inline void gemv_rows(const float* x, const float* xp, const void* w, const float* bias, float* y,
                      int64_t n0, int64_t K, const char* pf) {
  constexpr int64_t es = WT == WType::F32 ? 4 : 2;
  __m256 acc0[R], acc1[R];
  for (int j = 0; j < R; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  const int64_t K16 = K & ~int64_t(15);
  for (int64_t k = 0; k < K16; k += 16) {
    // R * 16 * es bytes of the next group per step: 1 line (f16/bf16, R = 4 -> 2 lines) ...
    for (int64_t b = 0; b < R * 16 * es; b += 64) _mm_prefetch(pf + k * R * es + b, _MM_HINT_T0);
    const __m256 x0 = _mm256_loadu_ps(xp + k), x1 = _mm256_loadu_ps(xp + k + 8);
    for (int j = 0; j < R; ++j) {
      __m256 a, b;
      load16<WT>(w, (n0 + j) * K + k, a, b);
      acc0[j] = _mm256_fmadd_ps(x0, a, acc0[j]);
      acc1[j] = _mm256_fmadd_ps(x1, b, acc1[j]);
    }
  }
  for (int j = 0; j < R; ++j) {
    float s = hsum(_mm256_add_ps(acc0[j], acc1[j]));
    for (int64_t k = K16; k < K; ++k) s += x[k] * load1<WT>(w, (n0 + j) * K + k);
    y[n0 + j] = bias ? s + bias[n0 + j] : s;
  }
}

template <WType WT>
void gemv_range(const float* x, const float* xp, const void* w, const float* bias, float* y,
                int64_t n_begin, int64_t n_end, int64_t K) {
  constexpr int64_t es = WT == WType::F32 ? 4 : 2;
  const char* wb = static_cast<const char*>(w);
  int64_t n = n_begin;
  for (; n + kGemvRows <= n_end; n += kGemvRows)
    gemv_rows<WT, kGemvRows>(x, xp, w, bias, y, n, K, wb + (n + kGemvRows) * K * es);
  for (; n < n_end; ++n) gemv_rows<WT, 1>(x, xp, w, bias, y, n, K, wb + (n + 1) * K * es);
}

// xp for bf16: x deinterleaved per 16 columns. Grown, never shrunk: no allocation per call
// once the largest K has been seen on this thread.
const float* gemv_prepare_x(const float* x, int64_t K) {
  thread_local std::vector<float> buf;
  const int64_t K16 = K & ~int64_t(15);
  if (int64_t(buf.size()) < K16) buf.resize(size_t(K16));
  for (int64_t k = 0; k < K16; k += 16)
    for (int i = 0; i < 8; ++i) {
      buf[size_t(k + i)] = x[k + 2 * i];
      buf[size_t(k + 8 + i)] = x[k + 2 * i + 1];
    }
  return buf.data();
}

template <WType WT>
void gemv(const float* x, const void* w, const float* bias, float* y, int64_t N, int64_t K) {
  const float* xp = WT == WType::BF16 ? gemv_prepare_x(x, K) : x;
  // Below ~64K weights one core finishes before a second would start.
  parallel_for(N, 16, N * K >= (int64_t(1) << 16) ? 32 : INT64_MAX, [&](int64_t b, int64_t e) {
    gemv_range<WT>(x, xp, w, bias, y, b, e, K);
  });
}

template <WType WT>
void run(const float* x, const void* w, const float* bias, float* y, int64_t M, int64_t N,
         int64_t K) {
  if (M == 1) return gemv<WT>(x, w, bias, y, N, K);
  if (M >= kPackOnTheFlyMinM) return matmul_raw_tiles_avx2(x, w, WT, bias, y, M, N, K);
  // Panel height: ~96 KiB of weights, a multiple of the 3-row tile, so a panel stays in L2
  // while all token tiles pass over it. Panels are handed out one at a time (dynamic), so
  // both cores finish together even when another process takes a slice of one.
  const int64_t row_bytes = K * wtype_size(WT);
  const int64_t rows = std::max<int64_t>(3, (96 * 1024 / std::max<int64_t>(row_bytes, 1)) / 3 * 3);
  const int64_t n_panels = (N + rows - 1) / rows;
  const bool parallel = M * N * K >= (1 << 16) && n_panels > 1;
  parallel_for_dynamic(n_panels, parallel, [&](int64_t p, int) {
    const int64_t n0 = p * rows;
    const int64_t n1 = std::min(N, n0 + rows);
    panel<WT>(x, w, bias, y, M, n0, n1, N, K);
  });
}

}  // namespace

void matmul_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) {
  switch (wt) {
    case WType::F32: return run<WType::F32>(x, w, bias, y, M, N, K);
    case WType::F16: return run<WType::F16>(x, w, bias, y, M, N, K);
    case WType::BF16: return run<WType::BF16>(x, w, bias, y, M, N, K);
    default: fail("matmul_avx2: ", wtype_name(wt), " weights go to matmul_q_avx2");
  }
}

}  // namespace kvboost::kernels::cpu
