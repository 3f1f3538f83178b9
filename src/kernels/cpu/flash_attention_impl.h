// Internal: paged causal GQA attention in the FlashAttention-2 style (Dao, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", 2023), with flash-decoding's
// split-K for few-query calls. Written once and compiled per ISA: baseline (flash_attention.cpp),
// AVX2+FMA (flash_attention_avx2.cpp) and AVX-512 (flash_attention_avx512.cpp, micro-kernels in
// flash_attention_avx512_kernels.h; the same AVX-512 source is also built on SIMDe's emulation
// for a test, tests/kernels/flash_attention_avx512_emu.cpp). Only the micro-kernels (score tile,
// exp, row max, P·V) differ between the builds; tiling, masking, the online softmax, split-K
// and the OpenMP schedule are shared.
//
// The namespace is per build (KVB_FA_NS): the builds of these inline functions must never be
// merged by the linker under the one-definition rule, or the scalar path could end up running
// AVX2 code (or the AVX2 path AVX-512 code, or the native AVX-512 path the emulated one).
//
// Work decomposition. For one kv head, the "rows" are the (query, head-in-group) pairs that read
// it: row r = query r / group, head kv_head * group + r % group. A work unit is a tile of up to
// kMaxRows consecutive rows (whole GQA groups where possible, so each K/V tile is read once per
// group and per several queries) over a contiguous key range. Keys stream through in tiles of
// kTileKeys tokens, gathered from the paged pools through the block table; each row keeps a
// running max m, running sum l and an unnormalised accumulator (the FA-2 online softmax, divided
// by l once at the end). Key tiles entirely above the causal diagonal or outside the window are
// never visited: a unit's key range is [first visible key of its first row, last visible key of
// its last row]; only tiles that straddle a boundary are masked element-wise.
//
// Split-K: when (kv heads × row tiles) gives too few units to keep every thread busy — decode,
// where n_q == 1, or a short chunk against a long prefix — each unit's key range is cut into
// n_splits chunks processed independently; their (m, l, acc) partials are merged with a
// log-sum-exp rescale. The partials live in a fixed buffer on the caller's stack
// (kSplitWsFloats), which caps n_splits; nothing is allocated.
//
// Extra memory per thread: one score tile (kMaxRows+1) × kTileKeys, one accumulator
// kAccFloats, and 2 × kTileKeys K/V pointers — O(tile), independent of the context length.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

#if defined(KVB_FA_AVX512_NS)
// The AVX-512 builds name their namespace and include the intrinsics themselves: <immintrin.h>
// (native) or <simde/x86/avx512.h> (emulated); both also provide the AVX2 helpers below.
#define KVB_FA_AVX512 1
#define KVB_FA_AVX2 0
#define KVB_FA_NS KVB_FA_AVX512_NS
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "cpu/exp_avx2.h"
#define KVB_FA_AVX512 0
#define KVB_FA_AVX2 1
#define KVB_FA_NS flash_avx2
#else
#define KVB_FA_AVX512 0
#define KVB_FA_AVX2 0
#define KVB_FA_NS flash_scalar
#endif

namespace kvboost::kernels::cpu::KVB_FA_NS {

constexpr int64_t kTileKeys = 64;          // keys per K/V tile: 4 blocks of 16, 16 KiB of K at d=64
constexpr int64_t kMaxRows = 32;           // query rows per unit (queries × heads of one group)
constexpr int64_t kAccFloats = 8192;       // accumulator budget per thread: rows × padded head_dim
constexpr int64_t kSplitWsFloats = 32768;  // split-K partials, on the caller's stack (128 KiB)
constexpr int64_t kMinSplitKeys = 256;     // automatic split-K never makes chunks shorter than this
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Problem {
  const float* q;
  const float* k_pool;
  const float* v_pool;
  const int32_t* block_table;
  float* out;
  int64_t n_q, q_pos0, n_kv, block_size, n_heads, n_kv_heads, head_dim, window;
  float scale;
  int64_t group;   // query heads per kv head
  int64_t hd_pad;  // head_dim rounded up to a multiple of 8: accumulator row stride
  int64_t rows;    // rows per unit (the last unit of a kv head may have fewer)
  int64_t n_row_tiles;
  float* lse = nullptr;  // optional [n_q, n_heads]: log-sum-exp of each row's scaled scores

  int64_t pos_of_row(int64_t r) const { return q_pos0 + r / group; }
  // Keys [lo, hi) that some row of [r0, r1) may see. lo is rounded down to a whole key tile, so
  // that the tiles lie on one grid from key 0 whatever rows share the unit: a row's online
  // softmax then adds the same tiles in the same order however its call was cut (prefill
  // steps, a cached prefix), and its output is bit-identical (the keys the rounding adds are
  // masked out). Unaligned, a sliding window moved the grid with the unit's first row, and the
  // last-bit differences came back ~0.5 logits on Gemma 3 after its int8 activation blocks.
  void key_range(int64_t r0, int64_t r1, int64_t& lo, int64_t& hi) const {
    const int64_t p_first = pos_of_row(r0), p_last = pos_of_row(r1 - 1);
    hi = std::min(n_kv, p_last + 1);
    lo = window > 0 ? std::max<int64_t>(0, p_first - window + 1) / kTileKeys * kTileKeys : 0;
    if (hi < lo) hi = lo;
  }
};

// ---------------------------------------------------------------------------------------------
// Micro-kernels. S is a score tile with row stride kTileKeys.

#if KVB_FA_AVX2 || KVB_FA_AVX512  // 256-bit helpers; the AVX-512 sums fold to 256 bits first

inline __m256i tail_mask(int64_t n) {  // first n lanes on (0 < n < 8)
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), idx);
}

// Sums of eight vectors in one: {sum(a0), ..., sum(a7)}.
inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                    __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
  const __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#endif

#if KVB_FA_AVX512

#include "cpu/flash_attention_avx512_kernels.h"  // inside this namespace, on purpose

#elif KVB_FA_AVX2

using avx2_math::exp256;  // cpu/exp_avx2.h

// S[r][t] = scale * q_r · k_t for r < n_rows (rounded up to even: qrow[n_rows] must be valid)
// and t < n_keys4 (a multiple of 4: kp[] padded). 2 rows × 4 keys per step: 6 loads per 8 FMAs,
// eight accumulators reduced together by hsum8.
inline void score_tile(const float* const* qrow, int64_t n_rows, const float* const* kp,
                       int64_t n_keys4, int64_t hd, float scale, float* S) {
  const int64_t hd8 = hd & ~int64_t(7);
  const bool tail = hd8 != hd;
  const __m256i m = tail ? tail_mask(hd - hd8) : _mm256_setzero_si256();
  const __m256 vs = _mm256_set1_ps(scale);
  for (int64_t r = 0; r < n_rows; r += 2) {
    const float* q0 = qrow[r];
    const float* q1 = qrow[r + 1];
    for (int64_t t = 0; t < n_keys4; t += 4) {
      const float *k0 = kp[t], *k1 = kp[t + 1], *k2 = kp[t + 2], *k3 = kp[t + 3];
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int64_t d = 0; d < hd8; d += 8) {
        const __m256 qa = _mm256_loadu_ps(q0 + d), qb = _mm256_loadu_ps(q1 + d);
        const __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d);
        const __m256 x2 = _mm256_loadu_ps(k2 + d), x3 = _mm256_loadu_ps(k3 + d);
        a0 = _mm256_fmadd_ps(qa, x0, a0); a1 = _mm256_fmadd_ps(qa, x1, a1);
        a2 = _mm256_fmadd_ps(qa, x2, a2); a3 = _mm256_fmadd_ps(qa, x3, a3);
        a4 = _mm256_fmadd_ps(qb, x0, a4); a5 = _mm256_fmadd_ps(qb, x1, a5);
        a6 = _mm256_fmadd_ps(qb, x2, a6); a7 = _mm256_fmadd_ps(qb, x3, a7);
      }
      if (tail) {  // masked lanes load as 0 and are never touched in memory
        const __m256 qa = _mm256_maskload_ps(q0 + hd8, m), qb = _mm256_maskload_ps(q1 + hd8, m);
        const __m256 x0 = _mm256_maskload_ps(k0 + hd8, m), x1 = _mm256_maskload_ps(k1 + hd8, m);
        const __m256 x2 = _mm256_maskload_ps(k2 + hd8, m), x3 = _mm256_maskload_ps(k3 + hd8, m);
        a0 = _mm256_fmadd_ps(qa, x0, a0); a1 = _mm256_fmadd_ps(qa, x1, a1);
        a2 = _mm256_fmadd_ps(qa, x2, a2); a3 = _mm256_fmadd_ps(qa, x3, a3);
        a4 = _mm256_fmadd_ps(qb, x0, a4); a5 = _mm256_fmadd_ps(qb, x1, a5);
        a6 = _mm256_fmadd_ps(qb, x2, a6); a7 = _mm256_fmadd_ps(qb, x3, a7);
      }
      const __m256 s = _mm256_mul_ps(hsum8(a0, a1, a2, a3, a4, a5, a6, a7), vs);
      _mm_storeu_ps(S + r * kTileKeys + t, _mm256_castps256_ps128(s));
      _mm_storeu_ps(S + (r + 1) * kTileKeys + t, _mm256_extractf128_ps(s, 1));
    }
  }
}

// s[t] = exp(s[t] - m) for t < n8 (a multiple of 8); returns the sum.
inline float exp_row(float* s, int64_t n8, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < n8; t += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum(sum);
}

// max of s[0 .. n8), n8 a multiple of 8 (masked and padding entries hold -inf).
inline float row_max(const float* s, int64_t n8) {
  __m256 mx = _mm256_set1_ps(kNegInf);
  for (int64_t t = 0; t < n8; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

inline void scale_row(float* a, int64_t hd_pad, float alpha) {
  const __m256 va = _mm256_set1_ps(alpha);
  for (int64_t d = 0; d < hd_pad; d += 8) _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), va));
}

// acc[r][d0 .. d0+8*NV) += sum_t P[r][t] * v_t[d0 ..], for NR rows at once.
template <int NR, int NV, bool MASKED>
inline void pv_block(const float* P, float* acc, int64_t hd_pad, const float* const* vp,
                     int64_t n_keys, int64_t d0, __m256i m) {
  __m256 c[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = _mm256_loadu_ps(acc + r * hd_pad + d0 + 8 * v);
  for (int64_t t = 0; t < n_keys; ++t) {
    const float* vt = vp[t] + d0;
    __m256 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = MASKED ? _mm256_maskload_ps(vt + 8 * v, m) : _mm256_loadu_ps(vt + 8 * v);
    for (int r = 0; r < NR; ++r) {
      const __m256 p = _mm256_broadcast_ss(P + r * kTileKeys + t);
      for (int v = 0; v < NV; ++v) c[r][v] = _mm256_fmadd_ps(p, x[v], c[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc + r * hd_pad + d0 + 8 * v, c[r][v]);
}

template <int NR>
inline void pv_rows(const float* P, float* acc, int64_t hd, int64_t hd_pad, const float* const* vp,
                    int64_t n_keys) {
  int64_t d = 0;
  for (; d + 32 <= hd; d += 32) pv_block<NR, 4, false>(P, acc, hd_pad, vp, n_keys, d, __m256i{});
  for (; d + 8 <= hd; d += 8) pv_block<NR, 1, false>(P, acc, hd_pad, vp, n_keys, d, __m256i{});
  if (d < hd) pv_block<NR, 1, true>(P, acc, hd_pad, vp, n_keys, d, tail_mask(hd - d));
}

// acc[r] += P[r] · V_tile for r < n_rows; 2 rows × 32 columns per step (8 accumulators).
inline void pv_tile(const float* P, int64_t n_rows, const float* const* vp, int64_t n_keys,
                    int64_t hd, int64_t hd_pad, float* acc) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    pv_rows<2>(P + r * kTileKeys, acc + r * hd_pad, hd, hd_pad, vp, n_keys);
  if (r < n_rows) pv_rows<1>(P + r * kTileKeys, acc + r * hd_pad, hd, hd_pad, vp, n_keys);
}

#else  // baseline build: plain loops, std::exp

inline void score_tile(const float* const* qrow, int64_t n_rows, const float* const* kp,
                       int64_t n_keys4, int64_t hd, float scale, float* S) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t t = 0; t < n_keys4; ++t) {
      const float* qr = qrow[r];
      const float* kt = kp[t];
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < hd; ++d) s += qr[d] * kt[d];
      S[r * kTileKeys + t] = s * scale;
    }
}

inline float exp_row(float* s, int64_t n8, float m) {
  float sum = 0.0f;
  for (int64_t t = 0; t < n8; ++t) {
    s[t] = std::exp(s[t] - m);
    sum += s[t];
  }
  return sum;
}

inline float row_max(const float* s, int64_t n8) {
  float mx = kNegInf;
  for (int64_t t = 0; t < n8; ++t) mx = s[t] > mx ? s[t] : mx;
  return mx;
}

inline void scale_row(float* a, int64_t hd_pad, float alpha) {
  for (int64_t d = 0; d < hd_pad; ++d) a[d] *= alpha;
}

inline void pv_tile(const float* P, int64_t n_rows, const float* const* vp, int64_t n_keys,
                    int64_t hd, int64_t hd_pad, float* acc) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* a = acc + r * hd_pad;
    for (int64_t t = 0; t < n_keys; ++t) {
      const float p = P[r * kTileKeys + t];
      const float* vt = vp[t];
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) a[d] += p * vt[d];
    }
  }
}

#endif

// ---------------------------------------------------------------------------------------------

// One unit: rows [r0, r1) of kv head kvh over keys [k_begin, k_end). Leaves the unnormalised
// state in acc (row stride hd_pad), m and l.
inline void run_unit(const Problem& P, int64_t kvh, int64_t r0, int64_t r1, int64_t k_begin,
                     int64_t k_end, float* acc, float* m, float* l) {
  const int64_t n_rows = r1 - r0, hd = P.head_dim;
  const float* qrow[kMaxRows + 1];
  int64_t pos[kMaxRows];
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t g = r0 + r;
    qrow[r] = P.q + ((g / P.group) * P.n_heads + kvh * P.group + g % P.group) * hd;
    pos[r] = P.pos_of_row(g);
    m[r] = kNegInf;
    l[r] = 0.0f;
    for (int64_t d = 0; d < P.hd_pad; ++d) acc[r * P.hd_pad + d] = 0.0f;
  }
  qrow[n_rows] = qrow[n_rows - 1];  // the pair-wise score kernel may read one row past the end

  alignas(32) float S[(kMaxRows + 1) * kTileKeys];
  const float* kp[kTileKeys];
  const float* vp[kTileKeys];
  const int64_t kv_stride = P.n_kv_heads * hd;
  const int64_t bs = P.block_size;

  for (int64_t t0 = k_begin; t0 < k_end; t0 += kTileKeys) {
    const int64_t t1 = std::min(t0 + kTileKeys, k_end), nt = t1 - t0;
    // Gather the tile's K/V row pointers through the block table (token t: block t / bs, slot t % bs).
    int64_t bi = t0 / bs, slot = t0 % bs;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t off = (int64_t(P.block_table[bi]) * bs + slot) * kv_stride + kvh * hd;
      kp[t] = P.k_pool + off;
      vp[t] = P.v_pool + off;
      if (++slot == bs) { slot = 0; ++bi; }
    }
    const int64_t nt4 = (nt + 3) & ~int64_t(3), nt8 = (nt + 7) & ~int64_t(7);
    for (int64_t t = nt; t < nt4; ++t) kp[t] = kp[nt - 1];  // scored, then masked out below

    score_tile(qrow, n_rows, kp, nt4, hd, P.scale, S);

    // Whole tile visible to every row: below the diagonal of the first row, inside the window
    // of the last one. Otherwise mask per row.
    const bool full = t1 - 1 <= pos[0] && (P.window <= 0 || pos[n_rows - 1] - t0 < P.window);
    for (int64_t r = 0; r < n_rows; ++r) {
      float* s = S + r * kTileKeys;
      int64_t vis_lo = 0, vis_hi = nt;  // visible keys, tile-relative
      if (!full) {
        vis_hi = std::clamp<int64_t>(pos[r] + 1 - t0, 0, nt);
        if (P.window > 0) vis_lo = std::clamp<int64_t>(pos[r] - P.window + 1 - t0, 0, nt);
        if (vis_hi < vis_lo) vis_hi = vis_lo;
      }
      if (vis_lo == vis_hi) {  // nothing visible for this row in this tile
        for (int64_t t = 0; t < nt; ++t) s[t] = 0.0f;
        continue;
      }
      for (int64_t t = 0; t < vis_lo; ++t) s[t] = kNegInf;
      for (int64_t t = vis_hi; t < nt8; ++t) s[t] = kNegInf;
      const float mt = row_max(s, nt8);  // finite: at least one key is visible
      const float m_new = std::max(m[r], mt);
      const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
      const float sum = exp_row(s, nt8, m_new);  // masked entries become exactly 0
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      if (alpha != 1.0f) scale_row(acc + r * P.hd_pad, P.hd_pad, alpha);
    }

    pv_tile(S, n_rows, vp, nt, hd, P.hd_pad, acc);
  }
}

inline void write_rows(const Problem& P, int64_t kvh, int64_t r0, int64_t r1, const float* acc,
                       const float* m, const float* l) {
  for (int64_t r = 0; r < r1 - r0; ++r) {
    const int64_t g = r0 + r;
    const int64_t row = (g / P.group) * P.n_heads + kvh * P.group + g % P.group;
    if (P.lse) P.lse[row] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
    float* o = P.out + row * P.head_dim;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // l == 0: the row sees no key
    for (int64_t d = 0; d < P.head_dim; ++d) o[d] = acc[r * P.hd_pad + d] * inv;
  }
}

// n_splits: 1 = unsplit, 0 = automatic, > 1 = that many key chunks per unit (capped by the
// split-K workspace). Assumes n_heads % n_kv_heads == 0 and block_table covering n_kv tokens.
inline void paged_attention(const float* q, const float* k_pool, const float* v_pool,
                            const int32_t* block_table, float* out, int64_t n_q, int64_t q_pos0,
                            int64_t n_kv_tokens, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, int64_t window, float scale,
                            int64_t n_splits, float* lse) {
  if (n_q <= 0 || n_heads <= 0 || head_dim <= 0) return;
  Problem P{q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size, n_heads,
            n_kv_heads, head_dim, window, scale, n_heads / n_kv_heads, (head_dim + 7) & ~int64_t(7),
            0, 0, lse};
  if (P.hd_pad > kAccFloats) {  // beyond the per-thread accumulator: not a real model shape
    paged_attention_ref(q, k_pool, v_pool, block_table, out, n_q, q_pos0, n_kv_tokens, block_size,
                        n_heads, n_kv_heads, head_dim, window, scale);
    if (lse) fail("paged_attention: log-sum-exp output needs head_dim <= ", kAccFloats);
    return;
  }
  const int64_t row_cap = std::min(kMaxRows, kAccFloats / P.hd_pad);
  const int64_t total_rows = n_q * P.group;
  P.rows = P.group <= row_cap ? (row_cap / P.group) * P.group : row_cap;
  P.rows = std::min(P.rows, total_rows);
  P.n_row_tiles = (total_rows + P.rows - 1) / P.rows;
  const int64_t n_items = n_kv_heads * P.n_row_tiles;

  // Split-K sizing.
  const int64_t n_threads = num_threads();
  const int64_t unit_ws = P.rows * (P.hd_pad + 2);
  const int64_t max_splits = std::max<int64_t>(1, kSplitWsFloats / (n_items * unit_ws));
  int64_t lo_last, hi_last;  // the last row tile has the longest key range under the causal mask
  P.key_range((P.n_row_tiles - 1) * P.rows, total_rows, lo_last, hi_last);
  if (n_splits <= 0) {
    n_splits = 1;
    if (n_threads > 1 && n_items < 2 * n_threads) {
      const int64_t want = (4 * n_threads + n_items - 1) / n_items;
      n_splits = std::max<int64_t>(1, std::min(want, (hi_last - lo_last) / kMinSplitKeys));
    }
  }
  n_splits = std::min(n_splits, max_splits);

  const int64_t n_units = n_items * n_splits;
  const int64_t keys = window > 0 ? std::min(window, n_kv_tokens) : n_kv_tokens;
  const bool parallel = n_units > 1 && n_q * n_heads * keys * head_dim > (int64_t(1) << 16);

  // Unit u -> (row tile, kv head, split). Row tiles run last-first: they have the most keys.
  auto decode_unit = [&](int64_t u, int64_t& kvh, int64_t& r0, int64_t& r1, int64_t& k0, int64_t& k1) {
    const int64_t item = u / n_splits, split = u % n_splits;
    const int64_t rt = P.n_row_tiles - 1 - item / n_kv_heads;
    kvh = item % n_kv_heads;
    r0 = rt * P.rows;
    r1 = std::min(r0 + P.rows, total_rows);
    int64_t lo, hi;
    P.key_range(r0, r1, lo, hi);
    // Chunks are whole key tiles so that splitting does not add partial tiles.
    int64_t chunk = (hi - lo + n_splits - 1) / n_splits;
    chunk = (chunk + kTileKeys - 1) / kTileKeys * kTileKeys;
    k0 = std::min(hi, lo + split * chunk);
    k1 = std::min(hi, k0 + chunk);
  };

  if (n_splits == 1) {
    parallel_for_dynamic(n_units, parallel, [&](int64_t u, int) {
      int64_t kvh, r0, r1, k0, k1;
      decode_unit(u, kvh, r0, r1, k0, k1);
      alignas(32) float acc[kAccFloats];
      float m[kMaxRows], l[kMaxRows];
      run_unit(P, kvh, r0, r1, k0, k1, acc, m, l);
      write_rows(P, kvh, r0, r1, acc, m, l);
    });
    return;
  }

  // Split-K: partials of unit u at ws + u * unit_ws: acc [rows][hd_pad], then m [rows], l [rows].
  alignas(32) float ws[kSplitWsFloats];
  {
    parallel_for_dynamic(n_units, parallel, [&](int64_t u, int) {
      int64_t kvh, r0, r1, k0, k1;
      decode_unit(u, kvh, r0, r1, k0, k1);
      float* acc = ws + u * unit_ws;
      run_unit(P, kvh, r0, r1, k0, k1, acc, acc + P.rows * P.hd_pad, acc + P.rows * (P.hd_pad + 1));
    });
    // Log-sum-exp merge: m = max m_s, l = sum l_s e^(m_s - m), acc = sum acc_s e^(m_s - m).
    parallel_for_dynamic(n_items, parallel, [&](int64_t item, int) {
      int64_t kvh, r0, r1, k0, k1;
      decode_unit(item * n_splits, kvh, r0, r1, k0, k1);
      for (int64_t r = 0; r < r1 - r0; ++r) {
        float mx = kNegInf;
        for (int64_t s = 0; s < n_splits; ++s)
          mx = std::max(mx, ws[(item * n_splits + s) * unit_ws + P.rows * P.hd_pad + r]);
        const int64_t g = r0 + r;
        const int64_t row = (g / P.group) * n_heads + kvh * P.group + g % P.group;
        float* o = out + row * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
        if (lse) lse[row] = kNegInf;
        if (mx == kNegInf) continue;  // no split saw a key: the row is 0, as in the reference
        float lsum = 0.0f;
        for (int64_t s = 0; s < n_splits; ++s) {
          const float* part = ws + (item * n_splits + s) * unit_ws;
          const float ms = part[P.rows * P.hd_pad + r];
          if (ms == kNegInf) continue;
          const float w = std::exp(ms - mx);
          lsum += w * part[P.rows * (P.hd_pad + 1) + r];
          for (int64_t d = 0; d < head_dim; ++d) o[d] += w * part[r * P.hd_pad + d];
        }
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
        if (lse && lsum > 0.0f) lse[row] = mx + std::log(lsum);
      }
    });
  }
}

}  // namespace kvboost::kernels::cpu::KVB_FA_NS

#undef KVB_FA_NS
#undef KVB_FA_AVX2
#undef KVB_FA_AVX512
