// AVX2 + FMA matmul over packed weights (kernels.h PackedWeight: panels of 16 features, [K][16]).
//
// Prefill: an outer-product register tile of MR = 6 tokens x 16 features: per k one 32-byte
// weight row (bf16: 1 load + shift + mask; f16: 2 loads + cvtph; f32: 2 loads), 6 broadcasts of
// x and 12 FMAs into 12 accumulators that stay in registers for the whole K (no horizontal sums,
// no partial-sum stores). A panel ([K][16], 28 KiB at K = 896 bf16) stays in L1/L2 while the
// token tiles pass over it. Work items are (panel, token block) pairs handed out dynamically,
// so the cores finish together; token blocks are split only when there are too few panels.
//
// Decode (M = 1): each thread streams a contiguous range of panels — one linear read per
// thread, which the hardware prefetcher follows — with 4 k-steps in flight (8 FMA chains).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels::cpu {

namespace {

constexpr int kMR = 6;
// Up to this many tokens the weights are streamed once from DRAM per call (small_m_panels).
constexpr int64_t kSmallM = 16;

template <WType WT>
inline void load_row16(const uint8_t* p, __m256& lo, __m256& hi) {
  if constexpr (WT == WType::BF16) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  } else if constexpr (WT == WType::F16) {
    lo = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16)));
  } else {
    lo = _mm256_load_ps(reinterpret_cast<const float*>(p));
    hi = _mm256_load_ps(reinterpret_cast<const float*>(p + 32));
  }
}

template <WType WT>
constexpr int64_t row_bytes() {
  return WT == WType::F32 ? 64 : 32;
}

// Stores a 16-feature row of results (plus bias) for the n_valid features that exist.
inline void store_row(float* y, __m256 lo, __m256 hi, const float* bias, int64_t n_valid) {
  if (bias) {
    if (n_valid == kPackedPanel) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
    } else {
      alignas(32) float b[kPackedPanel] = {};
      std::memcpy(b, bias, size_t(n_valid) * 4);
      lo = _mm256_add_ps(lo, _mm256_load_ps(b));
      hi = _mm256_add_ps(hi, _mm256_load_ps(b + 8));
    }
  }
  if (n_valid == kPackedPanel) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
  } else {
    alignas(32) float t[kPackedPanel];
    _mm256_store_ps(t, lo);
    _mm256_store_ps(t + 8, hi);
    std::memcpy(y, t, size_t(n_valid) * 4);
  }
}

// y[m0 .. m0 + MR, panel's features] over the full K.
// kPrefetch: software-prefetch the weight stream kPrefetchAhead bytes ahead (one cache line
// per 64 bytes of rows). Used where the panel comes from DRAM once (few tokens: batched decode);
// the hardware prefetcher alone does not run far enough ahead of a compute-heavy loop.
constexpr int64_t kPrefetchAhead = 2048;

template <WType WT, int MR, bool kPrefetch = false>
inline void tile(const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N,
                 const float* bias, int64_t n_valid) {
  // Every loop over i is unrolled so that the accumulators live in registers (otherwise GCC
  // keeps the arrays in memory and stores all 12 every k: 3x slower). One accumulator chain per
  // output over k in order, whatever MR: a token's result does not depend on the tile it lands
  // in, so a batch (or a prefix-cache hit's shorter chunk) gives bit-identical rows.
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 w0, w1;
    const uint8_t* row = panel + k * row_bytes<WT>();
    if constexpr (kPrefetch) {
      if (row_bytes<WT>() >= 64 || (reinterpret_cast<uintptr_t>(row) & 63) == 0)
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchAhead), _MM_HINT_T0);
    }
    load_row16<WT>(row, w0, w1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + i * K + k);
      c0[i] = _mm256_fmadd_ps(a, w0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, w1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) store_row(y + i * N, c0[i], c1[i], bias, n_valid);
}

// Token tiles of a call with m tokens: as few tiles as kMR allows, sizes as equal as possible
// (8 = 4 + 4, not 6 + 2: a 2-token tile has 4 accumulator chains, too few to hide the FMA
// latency — 2 units x 4 cycles want 8 — so 6 + 2 costs 10 FMA cycles per k where 4 + 4 costs 8).
inline int tile_size(int64_t m_left) {
  const int64_t n = (m_left + kMR - 1) / kMR;
  return int((m_left + n - 1) / n);
}

template <WType WT, bool kPrefetch = false>
inline void tile_any(int mr, const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N,
                     const float* bias, int64_t n_valid) {
  switch (mr) {
    case 6: return tile<WT, 6, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    case 5: return tile<WT, 5, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    case 4: return tile<WT, 4, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    case 3: return tile<WT, 3, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    case 2: return tile<WT, 2, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    case 1: return tile<WT, 1, kPrefetch>(x, K, panel, y, N, bias, n_valid);
    default: return;
  }
}

template <WType WT>
void tiles(const float* x, int64_t m_begin, int64_t m_end, int64_t K, const uint8_t* panel,
           float* y, int64_t N, const float* bias, int64_t n_valid) {
  for (int64_t m = m_begin; m < m_end;) {
    const int mr = tile_size(m_end - m);
    tile_any<WT>(mr, x + m * K, K, panel, y + m * N, N, bias, n_valid);
    m += mr;
  }
}

// Few tokens (batched decode, short chunks): each thread streams a contiguous range of panels
// (one linear read per thread, as the GEMV does) and runs every token tile on a panel while it
// is in L1/L2; the first tile prefetches ahead (into the next panel at the end), the others
// re-read the panel from cache.
template <WType WT>
void small_m_panels(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t p_begin,
                    int64_t p_end, float* y, int64_t N, const float* bias) {
  const int64_t panel_bytes = K * row_bytes<WT>();
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* pw = w + p * panel_bytes;
    const int64_t n0 = p * kPackedPanel;
    const float* b = bias ? bias + n0 : nullptr;
    const int64_t nv = std::min<int64_t>(kPackedPanel, N - n0);
    for (int64_t m = 0; m < M;) {
      const int mr = tile_size(M - m);
      if (m == 0) tile_any<WT, true>(mr, x, K, pw, y + n0, N, b, nv);
      else tile_any<WT, false>(mr, x + m * K, K, pw, y + m * N + n0, N, b, nv);
      m += mr;
    }
  }
}

// Bytes ahead of the GEMV's read position that it prefetches. Quiet A/B on Qwen2.5-0.5B-shaped
// bf16 decode (5 rounds, medians): none 12.8 tok/s, 8 KiB 14.3, 16 KiB 14.6 (3 rounds), raw layout 14.1.
constexpr int64_t kGemvPrefetch = 8192;

template <WType WT>
void gemv_panels(const float* x, int64_t K, const uint8_t* w, int64_t p_begin, int64_t p_end,
                 float* y, int64_t N, const float* bias) {
  const int64_t panel_bytes = K * row_bytes<WT>();
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* pw = w + p * panel_bytes;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
      __m256 w0, w1;
      const uint8_t* r = pw + k * row_bytes<WT>();
      // One linear stream per thread: software prefetch keeps more lines in flight than the
      // hardware prefetcher does behind this FMA chain (as the raw-layout GEMV does).
      for (int64_t b = 0; b < 4 * row_bytes<WT>(); b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(r + kGemvPrefetch + b), _MM_HINT_T0);
      load_row16<WT>(r, w0, w1);
      __m256 s = _mm256_broadcast_ss(x + k);
      a0 = _mm256_fmadd_ps(s, w0, a0);
      a1 = _mm256_fmadd_ps(s, w1, a1);
      load_row16<WT>(r + row_bytes<WT>(), w0, w1);
      s = _mm256_broadcast_ss(x + k + 1);
      b0 = _mm256_fmadd_ps(s, w0, b0);
      b1 = _mm256_fmadd_ps(s, w1, b1);
      load_row16<WT>(r + 2 * row_bytes<WT>(), w0, w1);
      s = _mm256_broadcast_ss(x + k + 2);
      c0 = _mm256_fmadd_ps(s, w0, c0);
      c1 = _mm256_fmadd_ps(s, w1, c1);
      load_row16<WT>(r + 3 * row_bytes<WT>(), w0, w1);
      s = _mm256_broadcast_ss(x + k + 3);
      d0 = _mm256_fmadd_ps(s, w0, d0);
      d1 = _mm256_fmadd_ps(s, w1, d1);
    }
    for (; k < K; ++k) {
      __m256 w0, w1;
      load_row16<WT>(pw + k * row_bytes<WT>(), w0, w1);
      const __m256 s = _mm256_broadcast_ss(x + k);
      a0 = _mm256_fmadd_ps(s, w0, a0);
      a1 = _mm256_fmadd_ps(s, w1, a1);
    }
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(c0, d0));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a1, b1), _mm256_add_ps(c1, d1));
    const int64_t n0 = p * kPackedPanel;
    store_row(y + n0, lo, hi, bias ? bias + n0 : nullptr, std::min<int64_t>(kPackedPanel, N - n0));
  }
}

template <WType WT>
void run(const float* x, const PackedWeight& pw, const float* bias, float* y, int64_t M) {
  const int64_t N = pw.n(), K = pw.k();
  const int64_t n_panels = (N + kPackedPanel - 1) / kPackedPanel;
  const uint8_t* w = static_cast<const uint8_t*>(pw.data());
  const int64_t panel_bytes = K * row_bytes<WT>();
  if (M == 1) {
    // Even contiguous split: each panel's 16 outputs are one cache line of y.
    parallel_for(n_panels, 1, N * K >= (int64_t(1) << 16) ? 2 : INT64_MAX,
                 [&](int64_t b, int64_t e) { gemv_panels<WT>(x, K, w, b, e, y, N, bias); });
    return;
  }
  if (M <= kSmallM && n_panels >= 2 * num_threads()) {
    parallel_for(n_panels, 1, M * N * K >= (int64_t(1) << 17) ? 2 : INT64_MAX,
                 [&](int64_t b, int64_t e) { small_m_panels<WT>(x, M, K, w, b, e, y, N, bias); });
    return;
  }
  const int nt = num_threads();
  // Token blocks: whole M unless there are too few panels to keep every thread busy.
  const int64_t m_tiles = (M + kMR - 1) / kMR;
  const int64_t want_blocks = std::min<int64_t>(m_tiles, (4 * nt + n_panels - 1) / n_panels);
  const int64_t mb = (m_tiles + want_blocks - 1) / want_blocks * kMR;
  const int64_t n_mb = (M + mb - 1) / mb;
  const int64_t n_items = n_panels * n_mb;
  const bool parallel = n_items > 1 && M * N * K >= (int64_t(1) << 17);
  parallel_for_dynamic(n_items, parallel, [&](int64_t item, int) {
    const int64_t p = item / n_mb, b = item % n_mb;
    const int64_t n0 = p * kPackedPanel;
    const int64_t m0 = b * mb, m1 = std::min(M, m0 + mb);
    tiles<WT>(x, m0, m1, K, w + p * panel_bytes, y + n0, N, bias ? bias + n0 : nullptr,
              std::min<int64_t>(kPackedPanel, N - n0));
  });
}

// Packs panel p of a raw [N, K] weight into buf ([K][16], the PackedWeight layout).
template <WType WT>
void pack_panel(const uint8_t* w, int64_t N, int64_t K, int64_t p, uint8_t* buf) {
  using T = std::conditional_t<WT == WType::F32, uint32_t, uint16_t>;
  const T* rows[kPackedPanel];
  static const T zeros[1] = {0};
  for (int pos = 0; pos < kPackedPanel; ++pos) {
    const int64_t n = p * kPackedPanel + packed_feature(WT, pos);
    rows[pos] = n < N ? reinterpret_cast<const T*>(w) + n * K : nullptr;
  }
  T* out = reinterpret_cast<T*>(buf);
  const bool full = (p + 1) * kPackedPanel <= N;
  for (int64_t k = 0; k < K; ++k) {
    T* o = out + k * kPackedPanel;
    if (full) {
#pragma GCC unroll 16
      for (int pos = 0; pos < kPackedPanel; ++pos) o[pos] = rows[pos][k];
    } else {
      for (int pos = 0; pos < kPackedPanel; ++pos) o[pos] = rows[pos] ? rows[pos][k] : zeros[0];
    }
  }
}

// Panel p of a quantized [N, K] weight (kernels.h WType Q8_0 .. Q4_Z) dequantized to f32 and
// packed ([K][16], the F32 PackedWeight layout): 16 rows through dequantize_wrow, then a
// transpose. Rows past N are zeros.
void pack_panel_quant(const uint8_t* w, WType wt, int64_t N, int64_t K, int64_t p, uint8_t* buf) {
  thread_local std::vector<float> rows;
  if (int64_t(rows.size()) < kPackedPanel * K) rows.resize(size_t(kPackedPanel * K));
  const size_t rb = size_t(wtype_row_bytes(wt, K));
  for (int pos = 0; pos < kPackedPanel; ++pos) {
    const int64_t n = p * kPackedPanel + pos;
    float* r = rows.data() + pos * K;
    if (n < N) dequantize_wrow(w + size_t(n) * rb, wt, r, K);
    else std::fill(r, r + K, 0.0f);
  }
  float* out = reinterpret_cast<float*>(buf);
  for (int64_t k0 = 0; k0 < K; k0 += 64)  // in strips, so the 16 source rows stay in L1
    for (int pos = 0; pos < kPackedPanel; ++pos) {
      const float* r = rows.data() + pos * K;
      for (int64_t k = k0; k < std::min(K, k0 + 64); ++k) out[k * kPackedPanel + pos] = r[k];
    }
}

// Raw-layout weights, many tokens: each work item packs its panel into a per-thread buffer
// (L1/L2-resident, [K][16]) and runs the packed tiles over its tokens. Packing costs 16·K
// element copies per item against 2·16·K·tokens FLOPs: ~5% at 64 tokens, less above.
// WT: the packed element type; src_wt: the weight's own type (WT itself, or a quantized type
// whose panels are dequantized to f32: WT = F32).
template <WType WT>
void run_raw(const float* x, const void* wv, const float* bias, float* y, int64_t M, int64_t N,
             int64_t K, WType src_wt = WT) {
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  const int64_t n_panels = (N + kPackedPanel - 1) / kPackedPanel;
  const int nt = num_threads();
  const int64_t m_tiles = (M + kMR - 1) / kMR;
  const int64_t want_blocks = std::min<int64_t>(m_tiles, (4 * nt + n_panels - 1) / n_panels);
  const int64_t mb = (m_tiles + want_blocks - 1) / want_blocks * kMR;
  const int64_t n_mb = (M + mb - 1) / mb;
  const int64_t n_items = n_panels * n_mb;
  const size_t buf_bytes = size_t(K) * row_bytes<WT>();
  const bool parallel = n_items > 1 && M * N * K >= (int64_t(1) << 17);
  // A fresh id per call: a thread reuses its packed copy only within the call that made it.
  static std::atomic<uint64_t> next_call{1};
  const uint64_t call = next_call.fetch_add(1, std::memory_order_relaxed);
  parallel_for_dynamic(n_items, parallel, [&](int64_t item, int) {
    // Grown, never shrunk: no allocation per call once the largest K has been seen.
    thread_local std::vector<uint8_t> store;
    thread_local uint64_t packed_call = 0;
    thread_local int64_t packed_panel = -1;
    if (store.size() < buf_bytes + 64) store.resize(buf_bytes + 64);
    uint8_t* buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t(63));
    const int64_t p = item / n_mb, b = item % n_mb;
    // Consecutive items of one panel (its token blocks) reuse the packed copy.
    if (packed_call != call || packed_panel != p) {
      if (src_wt != WT) pack_panel_quant(w, src_wt, N, K, p, buf);
      else pack_panel<WT>(w, N, K, p, buf);
    }
    packed_call = call;
    packed_panel = p;
    const int64_t n0 = p * kPackedPanel;
    const int64_t m0 = b * mb, m1 = std::min(M, m0 + mb);
    tiles<WT>(x, m0, m1, K, buf, y + n0, N, bias ? bias + n0 : nullptr,
              std::min<int64_t>(kPackedPanel, N - n0));
  });
}

}  // namespace

void matmul_raw_tiles_avx2(const float* x, const void* w, WType wt, const float* bias, float* y,
                           int64_t M, int64_t N, int64_t K) {
  switch (wt) {
    case WType::F32: return run_raw<WType::F32>(x, w, bias, y, M, N, K);
    case WType::F16: return run_raw<WType::F16>(x, w, bias, y, M, N, K);
    case WType::BF16: return run_raw<WType::BF16>(x, w, bias, y, M, N, K);
    default:
      if (wtype_is_quantized(wt)) return run_raw<WType::F32>(x, w, bias, y, M, N, K, wt);
      fail("matmul (raw tiles): ", wtype_name(wt), " is not a weight type");
  }
}

void matmul_packed_avx2(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M) {
  if (w.layout() != PackLayout::Panel16)
    fail("matmul_packed (avx2): the weight is in the ", pack_layout_name(w.layout()),
         " layout, this kernel reads Panel16");
  switch (w.wt()) {
    case WType::F32: return run<WType::F32>(x, w, bias, y, M);
    case WType::F16: return run<WType::F16>(x, w, bias, y, M);
    case WType::BF16: return run<WType::BF16>(x, w, bias, y, M);
    default: fail("matmul_packed: ", wtype_name(w.wt()), " is not a plain type");
  }
}

}  // namespace kvboost::kernels::cpu
