// Internal: the packed-weight GEMM kernels above AVX2 (matmul_packed_isa.h), one source compiled
// by several translation units, each in its own namespace (KVB_MM512_NS) so that the linker can
// never merge two builds of it:
//   - matmul_packed_avx512.cpp       (a) f32 FMA over Panel16 weights          -mavx512f/bw/vl
//   - matmul_packed_avx512bf16.cpp   (b) vdpbf16ps over Bf16Pairs, KVB_MM_BF16   + -mavx512bf16
//   - matmul_packed_amx.cpp          (c) AMX-BF16 tiles, KVB_MM_BF16 + KVB_MM_AMX + -mamx-tile/bf16
//   - tests/kernels/matmul_packed_isa_emu.cpp: all three on SIMDe's portable AVX-512 (an AVX2
//     build) and a scalar AMX emulator (tests/kernels/amx_emu.h), on CPUs without either.
// Hence only intrinsics SIMDe 0.7.4 (Debian 12) implements: no _mm512_cvtph_ps, cvtepu16_epi32,
// cvtne2ps_pbh (activations are rounded to bf16 by f32_to_bf16, which is also exactly the
// rounding the test reference applies), no masked stores (tails go through a stack row).
// AMX_NS builds define KVB_AMX_THREAD_INIT() (the native one asks the OS for the tile state).
#ifndef KVB_MM512_NS
#error "define KVB_MM512_NS before including matmul_packed_avx512_impl.h"
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/matmul_packed_isa.h"
#include "kvboost/common.h"

namespace kvboost::kernels::cpu::KVB_MM512_NS {

// Token tiles: up to 12 tokens x 32 features (two 16-feature panels) = 24 zmm accumulators,
// plus 2 weight vectors and a broadcast: 27 of the 32 registers. A block's tokens are covered
// by 12-token tiles, then 8/4/2/1 for the rest (31 = 12 + 12 + 4 + 2 + 1). Each output's sum
// runs over k in order whatever tile it lands in, so results do not depend on M.
constexpr int kMR = 12;

inline int next_tile(int64_t m_left) {
  return m_left >= 12 ? 12 : m_left >= 8 ? 8 : m_left >= 4 ? 4 : m_left >= 2 ? 2 : 1;
}

// y[0 .. n_valid) = v (+ bias): 16 features of one output row.
inline void store16(float* y, __m512 v, const float* bias, int64_t n_valid) {
  if (n_valid <= 0) return;
  if (n_valid >= 16) {
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_storeu_ps(y, v);
    return;
  }
  alignas(64) float t[16];
  _mm512_storeu_ps(t, v);
  for (int64_t i = 0; i < n_valid; ++i) y[i] = t[i] + (bias ? bias[i] : 0.0f);
}

// Work items: (pair of panels, token block). Token blocks are the whole M unless there are too
// few panel pairs to keep every thread busy (then ~4 items per thread), in units of `unit`.
struct Split {
  int64_t n_pairs, mb, n_mb;
};
inline Split split_work(int64_t M, int64_t n_panels, int64_t unit) {
  Split s;
  s.n_pairs = (n_panels + 1) / 2;
  const int64_t units = (M + unit - 1) / unit;
  const int64_t want = std::clamp<int64_t>((4 * num_threads() + s.n_pairs - 1) / s.n_pairs, 1, units);
  s.mb = (units + want - 1) / want * unit;
  s.n_mb = (M + s.mb - 1) / s.mb;
  return s;
}

// ---- (a) AVX-512 f32 FMA over the Panel16 layout (kernels.h): F32, F16, BF16 weights ----

template <WType WT>
constexpr int64_t p16_row_bytes() {
  return WT == WType::F32 ? 64 : 32;
}

// The 16 features of one k row of a Panel16 panel as f32, in feature order.
template <WType WT>
inline __m512 load_p16(const uint8_t* p) {
  if constexpr (WT == WType::BF16) {
    // 32-bit word i holds features i (low half) and 8 + i (high half). The 32 bytes go to both
    // 256-bit halves; the low half shifts the low bf16 up (features 0..7), the high half keeps
    // the high bf16 in place (8..15); the mask clears what is left below each.
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i sh = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_sllv_epi32(v, sh), _mm512_set1_epi32(int(0xffff0000u))));
  } else if constexpr (WT == WType::F16) {
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  }
}

// y[MR tokens, NP * 16 features] over the full K. p0/p1: the panels; nv0/nv1: valid features.
template <WType WT, int MR, int NP>
inline void p16_tile(const float* x, int64_t K, const uint8_t* p0, const uint8_t* p1, float* y,
                     int64_t N, const float* bias, int64_t nv0, int64_t nv1) {
  __m512 c[NP][MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) c[j][i] = _mm512_setzero_ps();
  constexpr int64_t rb = p16_row_bytes<WT>();
  for (int64_t k = 0; k < K; ++k) {
    __m512 w[NP];
    w[0] = load_p16<WT>(p0 + k * rb);
    if constexpr (NP == 2) w[1] = load_p16<WT>(p1 + k * rb);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(x[i * K + k]);
#pragma GCC unroll 2
      for (int j = 0; j < NP; ++j) c[j][i] = _mm512_fmadd_ps(a, w[j], c[j][i]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    store16(y + i * N, c[0][i], bias, nv0);
    if constexpr (NP == 2) store16(y + i * N + 16, c[1][i], bias ? bias + 16 : nullptr, nv1);
  }
}

template <WType WT, int NP>
inline void p16_tiles(const float* x, int64_t m0, int64_t m1, int64_t K, const uint8_t* p0,
                      const uint8_t* p1, float* y, int64_t N, const float* bias, int64_t nv0,
                      int64_t nv1) {
  for (int64_t m = m0; m < m1;) {
    const int mr = next_tile(m1 - m);
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (mr) {
      case 12: p16_tile<WT, 12, NP>(xm, K, p0, p1, ym, N, bias, nv0, nv1); break;
      case 8: p16_tile<WT, 8, NP>(xm, K, p0, p1, ym, N, bias, nv0, nv1); break;
      case 4: p16_tile<WT, 4, NP>(xm, K, p0, p1, ym, N, bias, nv0, nv1); break;
      case 2: p16_tile<WT, 2, NP>(xm, K, p0, p1, ym, N, bias, nv0, nv1); break;
      default: p16_tile<WT, 1, NP>(xm, K, p0, p1, ym, N, bias, nv0, nv1); break;
    }
    m += mr;
  }
}

template <WType WT>
void p16_run(const float* x, const PackedWeight& pw, const float* bias, float* y, int64_t M) {
  const int64_t N = pw.n(), K = pw.k();
  const int64_t n_panels = (N + kPackedPanel - 1) / kPackedPanel;
  const int64_t panel_bytes = K * p16_row_bytes<WT>();
  const uint8_t* w = static_cast<const uint8_t*>(pw.data());
  const Split s = split_work(M, n_panels, kMR);
  const bool parallel = s.n_pairs * s.n_mb > 1 && M * N * K >= (int64_t(1) << 17);
  parallel_for_dynamic(s.n_pairs * s.n_mb, parallel, [&](int64_t item, int) {
    const int64_t pp = item / s.n_mb, b = item % s.n_mb;
    const int64_t n0 = pp * 2 * kPackedPanel;
    const int64_t m0 = b * s.mb, m1 = std::min(M, m0 + s.mb);
    const uint8_t* p0 = w + 2 * pp * panel_bytes;
    const float* bb = bias ? bias + n0 : nullptr;
    const int64_t nv0 = std::min<int64_t>(16, N - n0), nv1 = std::min<int64_t>(16, N - n0 - 16);
    // The last pair of an odd panel count has one panel (the Panel16 layout does not pad N to 32).
    if (2 * pp + 1 < n_panels)
      p16_tiles<WT, 2>(x, m0, m1, K, p0, p0 + panel_bytes, y + n0, N, bb, nv0, nv1);
    else
      p16_tiles<WT, 1>(x, m0, m1, K, p0, nullptr, y + n0, N, bb, nv0, 0);
  });
}

inline void run_panel16(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M) {
  if (w.layout() != PackLayout::Panel16)
    fail("matmul_packed (avx512): the weight is in the ", pack_layout_name(w.layout()),
         " layout, this kernel reads Panel16");
  switch (w.wt()) {
    case WType::F32: return p16_run<WType::F32>(x, w, bias, y, M);
    case WType::F16: return p16_run<WType::F16>(x, w, bias, y, M);
    case WType::BF16: return p16_run<WType::BF16>(x, w, bias, y, M);
    default: fail("matmul_packed (avx512): ", wtype_name(w.wt()), " is not a plain type");
  }
}

#if defined(KVB_MM_BF16) || defined(KVB_MM_AMX)

// ---- activations for the bf16 kernels ----
// x [M, K] f32 -> [Mp, Kp] bf16 rows (RNE, f32_to_bf16), zero-padded to Mp = M rounded up to 32
// (AMX's two 16-row A tiles) and Kp = pairs_k_padded(K). Done once per call into the calling
// thread's buffer (grown, never shrunk), before the GEMM's work items read it.
struct ActBf16 {
  const uint16_t* data = nullptr;
  int64_t Mp = 0, Kp = 0;
};
inline ActBf16 act_to_bf16(const float* x, int64_t M, int64_t K) {
  thread_local std::vector<uint16_t> store;
  ActBf16 a;
  a.Mp = (M + 31) / 32 * 32;
  a.Kp = pairs_k_padded(K);
  const size_t need = size_t(a.Mp * a.Kp) + 32;
  if (store.size() < need) store.resize(need);
  uint16_t* buf = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t(63));
  const int64_t Kp = a.Kp;
  parallel_for(a.Mp, 1, M * K >= (int64_t(1) << 16) ? 2 : INT64_MAX, [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m) {
      uint16_t* o = buf + m * Kp;
      if (m >= M) {
        std::memset(o, 0, size_t(Kp) * 2);
        continue;
      }
      const float* xr = x + m * K;
      for (int64_t k = 0; k < K; ++k) o[k] = f32_to_bf16(xr[k]);
      for (int64_t k = K; k < Kp; ++k) o[k] = 0;
    }
  });
  a.data = buf;
  return a;
}

#endif

#ifdef KVB_MM_BF16

// ---- (b) AVX512-BF16: vdpbf16ps over the Bf16Pairs layout ----

inline __m512bh as_bh(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// y[MR tokens, 32 features] over the k pairs [0, n_pairs): per pair, two 64-byte weight rows
// (one per panel) and one broadcast bf16 pair per token, 2 * MR dot products.
template <int MR>
inline void bf16_tile(const uint16_t* xb, int64_t Kp, int64_t n_pairs, const uint8_t* p0,
                      const uint8_t* p1, float* y, int64_t N, const float* bias, int64_t nv0,
                      int64_t nv1) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int64_t r = 0; r < n_pairs; ++r) {
    const __m512bh w0 = as_bh(_mm512_loadu_si512(p0 + r * 64));
    const __m512bh w1 = as_bh(_mm512_loadu_si512(p1 + r * 64));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, xb + i * Kp + 2 * r, 4);
      const __m512bh a = as_bh(_mm512_set1_epi32(pair));
      c0[i] = _mm512_dpbf16_ps(c0[i], a, w0);
      c1[i] = _mm512_dpbf16_ps(c1[i], a, w1);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    store16(y + i * N, c0[i], bias, nv0);
    store16(y + i * N + 16, c1[i], bias ? bias + 16 : nullptr, nv1);
  }
}

// Tokens [m0, m1) x the 32 rows of panels p0, p1 (y, bias at the pair's first row; nv0, nv1 rows
// of each panel stored), over the k pairs [0, n_pairs), in 12/8/4/2/1-token tiles.
inline void bf16_item(const ActBf16& a, int64_t m0, int64_t m1, int64_t n_pairs, const uint8_t* p0,
                      const uint8_t* p1, float* y, int64_t N, const float* bias, int64_t nv0, int64_t nv1) {
  for (int64_t m = m0; m < m1;) {
    const int mr = next_tile(m1 - m);
    const uint16_t* xm = a.data + m * a.Kp;
    float* ym = y + m * N;
    switch (mr) {
      case 12: bf16_tile<12>(xm, a.Kp, n_pairs, p0, p1, ym, N, bias, nv0, nv1); break;
      case 8: bf16_tile<8>(xm, a.Kp, n_pairs, p0, p1, ym, N, bias, nv0, nv1); break;
      case 4: bf16_tile<4>(xm, a.Kp, n_pairs, p0, p1, ym, N, bias, nv0, nv1); break;
      case 2: bf16_tile<2>(xm, a.Kp, n_pairs, p0, p1, ym, N, bias, nv0, nv1); break;
      default: bf16_tile<1>(xm, a.Kp, n_pairs, p0, p1, ym, N, bias, nv0, nv1); break;
    }
    m += mr;
  }
}

inline void run_bf16(const float* x, const PackedWeight& pw, const float* bias, float* y,
                     int64_t M) {
  if (pw.layout() != PackLayout::Bf16Pairs)
    fail("matmul_packed (avx512bf16): the weight is in the ", pack_layout_name(pw.layout()),
         " layout, this kernel reads Bf16Pairs");
  const int64_t N = pw.n(), K = pw.k();
  const ActBf16 a = act_to_bf16(x, M, K);
  const int64_t n_panels = pairs_n_panels(N);  // even
  const int64_t panel_bytes = pairs_panel_bytes(K);
  const int64_t n_pairs = (K + 1) / 2;  // the zero pairs past K add nothing: skip them
  const uint8_t* w = static_cast<const uint8_t*>(pw.data());
  const Split s = split_work(M, n_panels, kMR);
  const bool parallel = s.n_pairs * s.n_mb > 1 && M * N * K >= (int64_t(1) << 17);
  parallel_for_dynamic(s.n_pairs * s.n_mb, parallel, [&](int64_t item, int) {
    const int64_t pp = item / s.n_mb, b = item % s.n_mb;
    const int64_t n0 = pp * 32;
    const int64_t m0 = b * s.mb, m1 = std::min(M, m0 + s.mb);
    const uint8_t* p0 = w + 2 * pp * panel_bytes;
    bf16_item(a, m0, m1, n_pairs, p0, p0 + panel_bytes, y + n0, N, bias ? bias + n0 : nullptr,
              std::min<int64_t>(16, N - n0), std::min<int64_t>(16, N - n0 - 16));
  });
}

#endif  // KVB_MM_BF16

#ifdef KVB_MM_AMX

// ---- (c) AMX-BF16 over the Bf16Pairs layout ----
// Tiles (palette 1; every tile 16 rows x 64 bytes):
//   A: tmm4, tmm5  16 tokens x 32 k of the bf16 activations (rows Kp * 2 bytes apart)
//   B: tmm6, tmm7  32 k x 16 features of panels 2pp, 2pp + 1: 16 rows of 64 bytes (pairs of k
//                  in each 32-bit word), 1 KiB contiguous in the Bf16Pairs layout
//   C: tmm0..tmm3  16 tokens x 16 features f32: C[2 * a + b] += A[a] . B[b] (tdpbf16ps)
// A work item is (pair of panels, token block); 32 tokens at a time, K in steps of 32.

// The 64-byte tile configuration (Intel SDM, LDTILECFG), every byte written before use.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];  // must be 0
  uint16_t colsb[16];    // bytes per row of tile t (palette 1 has tiles 0..7; the rest 0)
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads exactly 64 bytes");

inline TileConfig gemm_tile_config() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

// GCC 12's _tile_loadconfig tells the compiler that LDTILECFG reads only the first 8 bytes of
// the configuration (its asm operand is "m"(*(const void **)config)), so stores to the other 56
// bytes of a local configuration may be removed as dead: llama.cpp's AMX path then faults
// (SIGILL) on GCC 12. The empty asm below takes all 64 bytes as an input and clobbers memory,
// so every store is emitted before LDTILECFG (checked with objdump: README, kernels).
inline void load_tile_config(const TileConfig& c) {
  __asm__ volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
}

inline void amx_item(const ActBf16& a, int64_t m0, int64_t m1, int64_t M, const uint8_t* p0,
                     const uint8_t* p1, float* y, int64_t N, const float* bias, int64_t nv0,
                     int64_t nv1) {
  alignas(64) float cbuf[4][16][16];
  const int64_t stride = a.Kp * 2;
  for (int64_t m = m0; m < m1; m += 32) {
    const uint16_t* x0 = a.data + m * a.Kp;
    const uint16_t* x1 = x0 + 16 * a.Kp;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < a.Kp; k += 32) {
      _tile_loadd(4, x0 + k, stride);
      _tile_loadd(5, x1 + k, stride);
      _tile_loadd(6, p0 + k * 32, 64);  // k / 2 rows of 64 bytes
      _tile_loadd(7, p1 + k * 32, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, cbuf[0], 64);
    _tile_stored(1, cbuf[1], 64);
    _tile_stored(2, cbuf[2], 64);
    _tile_stored(3, cbuf[3], 64);
    for (int t = 0; t < 4; ++t) {
      const int half = t >> 1, panel = t & 1;
      const int64_t nv = panel ? nv1 : nv0;
      const float* b = bias ? bias + 16 * panel : nullptr;
      for (int r = 0; r < 16; ++r) {
        const int64_t row = m + 16 * half + r;
        if (row >= M) break;  // the zero rows past M
        store16(y + row * N + 16 * panel, _mm512_load_ps(cbuf[t][r]), b, nv);
      }
    }
  }
}

// cfg is gemm_tile_config() (the tests pass broken ones to check that they are caught).
inline void run_amx_cfg(const float* x, const PackedWeight& pw, const float* bias, float* y,
                        int64_t M, const TileConfig& cfg) {
  if (pw.layout() != PackLayout::Bf16Pairs)
    fail("matmul_packed (amx): the weight is in the ", pack_layout_name(pw.layout()),
         " layout, this kernel reads Bf16Pairs");
  const int64_t N = pw.n(), K = pw.k();
  const ActBf16 a = act_to_bf16(x, M, K);
  const int64_t n_panels = pairs_n_panels(N);
  const int64_t panel_bytes = pairs_panel_bytes(K);
  const uint8_t* w = static_cast<const uint8_t*>(pw.data());
  const Split s = split_work(M, n_panels, 32);
  const bool parallel = s.n_pairs * s.n_mb > 1 && M * N * K >= (int64_t(1) << 17);
  parallel_for_dynamic(s.n_pairs * s.n_mb, parallel, [&](int64_t item, int) {
    KVB_AMX_THREAD_INIT();
    load_tile_config(cfg);
    const int64_t pp = item / s.n_mb, b = item % s.n_mb;
    const int64_t n0 = pp * 32;
    const int64_t m0 = b * s.mb, m1 = std::min(M, m0 + s.mb);
    const uint8_t* p0 = w + 2 * pp * panel_bytes;
    amx_item(a, m0, m1, M, p0, p0 + panel_bytes, y + n0, N, bias ? bias + n0 : nullptr,
             std::min<int64_t>(16, N - n0), std::min<int64_t>(16, N - n0 - 16));
    _tile_release();  // the thread's tile state back to INIT (smaller context switches)
  });
}

inline void run_amx(const float* x, const PackedWeight& pw, const float* bias, float* y, int64_t M) {
  run_amx_cfg(x, pw, bias, y, M, gemm_tile_config());
}

#endif  // KVB_MM_AMX

}  // namespace kvboost::kernels::cpu::KVB_MM512_NS
