// AVX2 matmul over quantized weights (kernels.h WType Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, Q4_Z,
// Q4_Z128).
//
// Activations are quantized once per call to int8 blocks of 32 (quantize_act). A weight block
// is unpacked in registers to 32 small integers per 32-element sub-block, and each (token, row)
// pair costs one integer dot product per sub-block: _mm256_maddubs_epi16 (u8 x s8 -> pairs of
// s16) and _mm256_madd_epi16 (pairs -> s32, multiplied by Q6_K's per-16 scales on the way),
// then one f32 FMA with weight scale x activation scale. Q8_0 (signed) goes through the sign
// trick (|w| times x with w's sign); Q4_0 / Q4_Z / Q5_0 stay unsigned (nibbles; Q5_0's 0..31)
// and their zero point is subtracted as z times the activation block's integer sum; Q6_K stays
// unsigned (0..63) with its offset 32 taken out of the int16 pairs (tile_q6k); Q4_K / Q5_K are
// unsigned and their mins become one extra FMA per 256 elements against the activation block
// sums (the lanes of the accumulator are summed at the end, so the 8 sub-block
// min terms can sit in the 8 lanes).
//
// Tiles of MR tokens x NR rows: a weight sub-block is unpacked once for MR tokens, an activation
// sub-block loaded once for NR rows. M = 1 (decode) streams each row range once with linear
// prefetch of the next row group; 1 < M < kDequantMinM runs token tiles over L2-sized panels of
// rows, so a weight byte comes from memory once per call however many tokens there are; from
// kDequantMinM tokens on, panels are dequantized to f32 for the packed FMA tiles (below).
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "cpu/q5_avx2.h"
#include "kvboost/common.h"

namespace kvboost::kernels::cpu {

namespace {

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Low nibbles of 16 bytes -> lanes 0..15, high nibbles -> lanes 16..31 (Q4_0 / Q4_Z order): the
// 16 bytes loaded into both halves, the upper half shifted by 4, one mask (3 instructions).
inline __m256i nibbles16(const uint8_t* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Per-row state of one weight block: f32 scale per 32-element sub-block, the mins (Q4_K/Q5_K).
struct RowState {
  float fsc[8];
  __m256 minv;
  const uint8_t* b;
};

template <WType WT>
struct Q;

template <>
struct Q<WType::Q8_0> {
  static constexpr int kElems = 32, kBytes = 34, kSubs = 1;
  static constexpr bool kMin = false;
  static void prep(const uint8_t* b, RowState& r) { r.b = b, r.fsc[0] = h2f(b); }
  static __m256i unpack(const RowState& r, int) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b + 2));
  }
};

// Q4_0 and Q4_Z run in tile_z (below): unsigned nibbles, zero point z (8 for Q4_0) taken out
// afterwards; kQsOffset: where the 16 nibble bytes start in the block.
template <>
struct Q<WType::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18, kSubs = 1;
  static constexpr bool kMin = false;
  static void prep(const uint8_t* b, RowState& r) { r.b = b, r.fsc[0] = h2f(b); }
  static __m256i unpack(const RowState& r, int) { return nibbles16(r.b + 2); }
  static constexpr int kQsOffset = 2;
};

// Q5_0 also runs in tile_z: the 5-bit values unsigned (0..31), zero point 16.
template <>
struct Q<WType::Q5_0> {
  static constexpr int kElems = 32, kBytes = 22, kSubs = 1;
  static constexpr int kQsOffset = 6;
};

template <>
struct Q<WType::Q4_Z> {
  static constexpr int kElems = 32, kBytes = 20, kSubs = 1;
  static constexpr bool kMin = false;
  static void prep(const uint8_t* b, RowState& r) { r.b = b, r.fsc[0] = h2f(b); }
  static __m256i unpack(const RowState& r, int) { return nibbles16(r.b + 4); }
  static constexpr int kQsOffset = 4;
};

// Q4_Z128 runs in tile_z128 (below); only the block geometry is needed here.
template <>
struct Q<WType::Q4_Z128> {
  static constexpr int kElems = 128, kBytes = 68, kSubs = 4;
};

template <bool kFive>
struct QK45 {
  static constexpr int kElems = 256, kBytes = kFive ? 176 : 144, kSubs = 8;
  static constexpr bool kMin = true;
  static void prep(const uint8_t* b, RowState& r) {
    r.b = b;
    // The 8 six-bit scales and mins (k_scales_mins8), widened and scaled in one vector each.
    uint32_t sm[4];
    k_scales_mins8(b + 4, sm);
    const __m256i sv = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(sm[1]), int(sm[0])));
    const __m256i mv = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(sm[3]), int(sm[2])));
    _mm256_storeu_ps(r.fsc, _mm256_mul_ps(_mm256_cvtepi32_ps(sv), _mm256_set1_ps(h2f(b))));
    r.minv = _mm256_mul_ps(_mm256_cvtepi32_ps(mv), _mm256_set1_ps(h2f(b + 2)));
  }
  static __m256i unpack(const RowState& r, int j) {
    const uint8_t* qs = r.b + (kFive ? 48 : 16) + 32 * (j / 2);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m256i q = (j % 2) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m) : _mm256_and_si256(v, m);
    if constexpr (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b + 16));
      const __m256i bit = _mm256_set1_epi8(char(1 << j));
      const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                          _mm256_set1_epi8(0x10));
      q = _mm256_or_si256(q, hi);
    }
    return q;
  }
};
template <>
struct Q<WType::Q4_K> : QK45<false> {};
template <>
struct Q<WType::Q5_K> : QK45<true> {};

// Q6_K runs in tile_q6k (below); only the block geometry is needed here.
template <>
struct Q<WType::Q6_K> {
  static constexpr int kElems = 256, kBytes = 210, kSubs = 8;
};

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Element R of each 128-bit half, broadcast to all 8 lanes.
template <int R>
inline __m256 lane_bcast(__m256 v) {
  return _mm256_shuffle_ps(v, v, R * 0x55);
}

// A tile's outputs: y[m0 + t, n0 + r] = hsum(acc[t][r]) (+ lane r of zacc[t], the zero-point
// term of the Q4_Z tiles) (+ bias[n0 + r]). Shared by every tile below.
template <int MR, int NR>
inline void store_tile(const __m256 (&acc)[MR][NR], const __m128* zacc, const float* bias, float* y, int64_t m0,
                       int64_t n0, int64_t N) {
  for (int t = 0; t < MR; ++t) {
    alignas(16) float zl[4] = {0, 0, 0, 0};
    if (zacc) _mm_store_ps(zl, zacc[t]);
    for (int r = 0; r < NR; ++r) {
      const float s = zacc ? hsum(acc[t][r]) + zl[r] : hsum(acc[t][r]);
      y[(m0 + t) * N + n0 + r] = bias ? s + bias[n0 + r] : s;
    }
  }
}

// Q4_0 / Q4_Z / Q5_0 tile (same contract as tile below). Per block the nibbles stay unsigned (0..15,
// maddubs' u8 operand as they are) and the zero point z (Q4_Z's byte, 8 for Q4_0) is taken out
// afterwards in f32: sum_k d_w (q_k - z) d_x x_k = d_w d_x sum q x - d_w z (d_x sum x), where
// d_x sum x is the activation block's s (QAct). The NR rows' block headers (f16 d, z) are
// gathered into one vector: one f16 conversion, one multiply by d_x and one zero-point FMA per
// block serve all NR rows, and each row's scale is a lane broadcast. Against the sign-trick path
// of tile_generic this is ~12 instead of ~21 instructions per block and row in decode. Q5_0 is
// the same with its fifth bits OR-ed in (q5_high_bits) and z = 16: no sign trick, no per-row
// scale conversion (its header's first 4 bytes are d and half of qh; only d is picked).
template <WType WT, int MR, int NR>
inline void tile_z(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                   float* y, int64_t N, const uint8_t* pf) {
  static_assert(NR >= 1 && NR <= 4);
  using T = Q<WT>;
  const int64_t nblk = a.K / 32, K = a.K, nb = a.nb;
  __m256 acc[MR][NR];
  __m128 zacc[MR];  // lane r: row r's zero-point term
  for (int t = 0; t < MR; ++t) {
    zacc[t] = _mm_setzero_ps();
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i pick_d = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const uint8_t* row[NR];
  for (int r = 0; r < NR; ++r) row[r] = w + size_t(n0 + r) * rb;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (pf)
      for (int b = 0; b < NR * T::kBytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + blk * NR * T::kBytes + b), _MM_HINT_T0);
    const size_t off = size_t(blk) * T::kBytes;
    // First 4 bytes of each row's block: f16 d, then (Q4_Z) z and the reserved 0 byte.
    __m128i hdr = _mm_cvtsi32_si128(int(load_u32(row[0] + off)));
    if constexpr (NR > 1) hdr = _mm_insert_epi32(hdr, int(load_u32(row[1] + off)), 1);
    if constexpr (NR > 2) hdr = _mm_insert_epi32(hdr, int(load_u32(row[2] + off)), 2);
    if constexpr (NR > 3) hdr = _mm_insert_epi32(hdr, int(load_u32(row[3] + off)), 3);
    const __m128 dw = _mm_cvtph_ps(_mm_shuffle_epi8(hdr, pick_d));
    __m128 dz;
    if constexpr (WT == WType::Q4_Z)
      dz = _mm_mul_ps(dw, _mm_cvtepi32_ps(_mm_and_si128(_mm_srli_epi32(hdr, 16), _mm_set1_epi32(0xFF))));
    else
      dz = _mm_mul_ps(dw, _mm_set1_ps(WT == WType::Q5_0 ? 16.0f : 8.0f));
    __m256i wq[NR];
    for (int r = 0; r < NR; ++r) {
      wq[r] = nibbles16(row[r] + off + T::kQsOffset);
      if constexpr (WT == WType::Q5_0) wq[r] = _mm256_or_si256(wq[r], q5_high_bits(row[r] + off + 2));
    }
    for (int t = 0; t < MR; ++t) {
      const int64_t ab = (m0 + t) * nb + blk;
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (m0 + t) * K + blk * 32));
      zacc[t] = _mm_fnmadd_ps(dz, _mm_broadcast_ss(a.s + ab), zacc[t]);
      const __m128 s4 = _mm_mul_ps(dw, _mm_broadcast_ss(a.d + ab));
      const __m256 ss = _mm256_set_m128(s4, s4);
      __m256 f[NR];
      for (int r = 0; r < NR; ++r) f[r] = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xq), ones));
      acc[t][0] = _mm256_fmadd_ps(f[0], lane_bcast<0>(ss), acc[t][0]);
      if constexpr (NR > 1) acc[t][1] = _mm256_fmadd_ps(f[1], lane_bcast<1>(ss), acc[t][1]);
      if constexpr (NR > 2) acc[t][2] = _mm256_fmadd_ps(f[2], lane_bcast<2>(ss), acc[t][2]);
      if constexpr (NR > 3) acc[t][3] = _mm256_fmadd_ps(f[3], lane_bcast<3>(ss), acc[t][3]);
    }
  }
  store_tile<MR, NR>(acc, zacc, bias, y, m0, n0, N);
}

// Q8_0 tile (same contract as tile below): tile_generic's sign trick (|w| times x with w's sign; |-128|
// is 128 as maddubs' unsigned operand), with the NR rows' f16 scales gathered into one vector as
// tile_z does: one conversion and one multiply by d_x per block serve all rows, where tile_generic
// converts and broadcasts each row's scale on its own. The output head (Q8_0 by default for AWQ)
// is ~40% of an AWQ decode token's bytes.
template <int MR, int NR>
inline void tile_q8(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                    float* y, int64_t N, const uint8_t* pf) {
  static_assert(NR >= 1 && NR <= 4);
  constexpr int kB = Q<WType::Q8_0>::kBytes;
  const int64_t nblk = a.K / 32, K = a.K, nb = a.nb;
  __m256 acc[MR][NR];
  for (int t = 0; t < MR; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* row[NR];
  for (int r = 0; r < NR; ++r) row[r] = w + size_t(n0 + r) * rb;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (pf)
      for (int b = 0; b < NR * kB; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + blk * NR * kB + b), _MM_HINT_T0);
    const size_t off = size_t(blk) * kB;
    uint16_t h0;
    std::memcpy(&h0, row[0] + off, 2);
    __m128i hdr = _mm_cvtsi32_si128(h0);
    for (int r = 1; r < NR; ++r) {
      uint16_t h;
      std::memcpy(&h, row[r] + off, 2);
      switch (r) {
        case 1: hdr = _mm_insert_epi16(hdr, h, 1); break;
        case 2: hdr = _mm_insert_epi16(hdr, h, 2); break;
        default: hdr = _mm_insert_epi16(hdr, h, 3); break;
      }
    }
    const __m128 dw = _mm_cvtph_ps(hdr);
    __m256i wq[NR], wa[NR];
    for (int r = 0; r < NR; ++r) {
      wq[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + off + 2));
      wa[r] = _mm256_sign_epi8(wq[r], wq[r]);
    }
    for (int t = 0; t < MR; ++t) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (m0 + t) * K + blk * 32));
      const __m128 s4 = _mm_mul_ps(dw, _mm_broadcast_ss(a.d + (m0 + t) * nb + blk));
      const __m256 ss = _mm256_set_m128(s4, s4);
      __m256 f[NR];
      for (int r = 0; r < NR; ++r)
        f[r] = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xq, wq[r])), ones));
      acc[t][0] = _mm256_fmadd_ps(f[0], lane_bcast<0>(ss), acc[t][0]);
      if constexpr (NR > 1) acc[t][1] = _mm256_fmadd_ps(f[1], lane_bcast<1>(ss), acc[t][1]);
      if constexpr (NR > 2) acc[t][2] = _mm256_fmadd_ps(f[2], lane_bcast<2>(ss), acc[t][2]);
      if constexpr (NR > 3) acc[t][3] = _mm256_fmadd_ps(f[3], lane_bcast<3>(ss), acc[t][3]);
    }
  }
  store_tile<MR, NR>(acc, nullptr, bias, y, m0, n0, N);
}

// Q4_Z128 tile (same contract as tile below): tile_z's scheme with one (d, z) header per 128
// elements. The header gather, f16 conversion and the zero-point FMA (against the sum of the
// four activation blocks' s) are paid once per 128 elements; a row's 64 nibble bytes are two
// 32-byte loads, each giving two sub-blocks of 32 (mask, shift + mask): the four activation
// blocks keep their own scales d_x, so each sub-block still has one f32 FMA per row.
template <int MR, int NR>
inline void tile_z128(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                      float* y, int64_t N, const uint8_t* pf) {
  static_assert(NR >= 1 && NR <= 4);
  constexpr int kB = Q<WType::Q4_Z128>::kBytes;
  const int64_t nblk = a.K / 128, K = a.K, nb = a.nb;
  __m256 acc[MR][NR];
  __m128 zacc[MR];  // lane r: row r's zero-point term
  for (int t = 0; t < MR; ++t) {
    zacc[t] = _mm_setzero_ps();
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
  const __m128i pick_d = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const uint8_t* row[NR];
  for (int r = 0; r < NR; ++r) row[r] = w + size_t(n0 + r) * rb;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (pf)
      for (int b = 0; b < NR * kB; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + blk * NR * kB + b), _MM_HINT_T0);
    const size_t off = size_t(blk) * kB;
    __m128i hdr = _mm_cvtsi32_si128(int(load_u32(row[0] + off)));
    if constexpr (NR > 1) hdr = _mm_insert_epi32(hdr, int(load_u32(row[1] + off)), 1);
    if constexpr (NR > 2) hdr = _mm_insert_epi32(hdr, int(load_u32(row[2] + off)), 2);
    if constexpr (NR > 3) hdr = _mm_insert_epi32(hdr, int(load_u32(row[3] + off)), 3);
    const __m128 dw = _mm_cvtph_ps(_mm_shuffle_epi8(hdr, pick_d));
    const __m128 dz = _mm_mul_ps(dw, _mm_cvtepi32_ps(_mm_and_si128(_mm_srli_epi32(hdr, 16), _mm_set1_epi32(0xFF))));
    for (int t = 0; t < MR; ++t) {
      const float* s = a.s + (m0 + t) * nb + blk * 4;
      zacc[t] = _mm_fnmadd_ps(dz, _mm_set1_ps((s[0] + s[1]) + (s[2] + s[3])), zacc[t]);
    }
    for (int h = 0; h < 2; ++h) {
      __m256i v[NR];
      for (int r = 0; r < NR; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + off + 4 + 32 * h));
      for (int hi = 0; hi < 2; ++hi) {
        const int j = 2 * h + hi;  // sub-block: elements 32j .. 32j + 31 of the block
        __m256i wq[NR];
        for (int r = 0; r < NR; ++r)
          wq[r] = hi ? _mm256_and_si256(_mm256_srli_epi16(v[r], 4), m4) : _mm256_and_si256(v[r], m4);
        for (int t = 0; t < MR; ++t) {
          const int64_t ab = (m0 + t) * nb + blk * 4 + j;
          const __m256i xq =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (m0 + t) * K + blk * 128 + 32 * j));
          const __m128 s4 = _mm_mul_ps(dw, _mm_broadcast_ss(a.d + ab));
          const __m256 ss = _mm256_set_m128(s4, s4);
          __m256 f[NR];
          for (int r = 0; r < NR; ++r) f[r] = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xq), ones));
          acc[t][0] = _mm256_fmadd_ps(f[0], lane_bcast<0>(ss), acc[t][0]);
          if constexpr (NR > 1) acc[t][1] = _mm256_fmadd_ps(f[1], lane_bcast<1>(ss), acc[t][1]);
          if constexpr (NR > 2) acc[t][2] = _mm256_fmadd_ps(f[2], lane_bcast<2>(ss), acc[t][2]);
          if constexpr (NR > 3) acc[t][3] = _mm256_fmadd_ps(f[3], lane_bcast<3>(ss), acc[t][3]);
        }
      }
    }
  }
  store_tile<MR, NR>(acc, zacc, bias, y, m0, n0, N);
}

// Q6_K tile (same contract as tile below). The 6-bit values stay unsigned (0..63) and the
// offset of 32 is taken out in the int16 pairs: maddubs(q, x) - maddubs(32, x), the second term
// once per token and sub-block for all NR rows (no sign trick). A row's 16 int8 scales are
// widened to int16 once per block; sub-block j's multipliers (lanes 0..7: scale 2j, 8..15: 2j+1)
// are one dword broadcast (vpermd) and one byte shuffle. Sub-block j = 4h + k holds elements
// 128h + 32k + l: low nibbles of ql[64h + 32(k % 2) + l] (shifted by 4 for k >= 2), two bits of
// qh[32h + l] at 2k (dequant.cpp deq_q6_k).
template <int MR, int NR>
inline void tile_q6k(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                     float* y, int64_t N, const uint8_t* pf) {
  constexpr int kBytes = 210;
  const int64_t nblk = a.K / 256, K = a.K, nb = a.nb;
  __m256 acc[MR][NR];
  for (int t = 0; t < MR; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), c32 = _mm256_set1_epi8(32);
  const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                                        2, 3, 2, 3, 2, 3);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (pf)
      for (int b = 0; b < NR * kBytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + blk * NR * kBytes + b), _MM_HINT_T0);
    const uint8_t* b[NR];
    __m256i sc[NR];
    __m256 dw[NR];
    for (int r = 0; r < NR; ++r) {
      b[r] = w + size_t(n0 + r) * rb + size_t(blk) * kBytes;
      sc[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[r] + 192)));
      dw[r] = _mm256_set1_ps(h2f(b[r] + 208));
    }
    for (int h = 0; h < 2; ++h) {
      __m256i lo0[NR], lo1[NR], hb[NR];
      for (int r = 0; r < NR; ++r) {
        lo0[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[r] + 64 * h));
        lo1[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[r] + 64 * h + 32));
        hb[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[r] + 128 + 32 * h));
      }
      for (int k = 0; k < 4; ++k) {
        const int j = 4 * h + k;
        __m256i wq[NR], ms[NR];
        for (int r = 0; r < NR; ++r) {
          const __m256i lo = (k % 2) ? lo1[r] : lo0[r];
          const __m256i l4 = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(lo, 4) : lo, m4);
          const __m256i h2 = _mm256_and_si256(_mm256_srli_epi16(hb[r], 2 * k), m2);
          wq[r] = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
          ms[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc[r], _mm256_set1_epi32(j)), pick);
        }
        const int64_t ab = blk * 8 + j;
        for (int t = 0; t < MR; ++t) {
          const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (m0 + t) * K + ab * 32));
          const __m256i x32 = _mm256_maddubs_epi16(c32, xq);
          const __m256 dx = _mm256_broadcast_ss(a.d + (m0 + t) * nb + ab);
          for (int r = 0; r < NR; ++r) {
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(wq[r], xq), x32);
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ms[r]));
            acc[t][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw[r], dx), acc[t][r]);
          }
        }
      }
    }
  }
  store_tile<MR, NR>(acc, nullptr, bias, y, m0, n0, N);
}

// The K-quant tile (Q4_K, Q5_K), below.
template <WType WT, int MR, int NR>
inline void tile_generic(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                         float* y, int64_t N, const uint8_t* pf);

// y[m0 .. m0 + MR, n0 .. n0 + NR) over all of K. pf: the bytes to prefetch, linearly, while
// this tile runs (the next row group in decode; nullptr for none).

template <WType WT, int MR, int NR>
inline void tile(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                 float* y, int64_t N, const uint8_t* pf) {
  if constexpr (WT == WType::Q4_0 || WT == WType::Q4_Z || WT == WType::Q5_0) {
    return tile_z<WT, MR, NR>(a, m0, w, rb, n0, bias, y, N, pf);
  } else if constexpr (WT == WType::Q4_Z128) {
    return tile_z128<MR, NR>(a, m0, w, rb, n0, bias, y, N, pf);
  } else if constexpr (WT == WType::Q8_0) {
    return tile_q8<MR, NR>(a, m0, w, rb, n0, bias, y, N, pf);
  } else if constexpr (WT == WType::Q6_K) {
    return tile_q6k<MR, NR>(a, m0, w, rb, n0, bias, y, N, pf);
  } else {
    return tile_generic<WT, MR, NR>(a, m0, w, rb, n0, bias, y, N, pf);
  }
}

template <WType WT, int MR, int NR>
inline void tile_generic(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, int64_t n0, const float* bias,
                 float* y, int64_t N, const uint8_t* pf) {
  {
  using T = Q<WT>;
  static_assert(T::kMin, "tile_generic: the K-quants with mins (Q4_K, Q5_K)");
  const int64_t nblk = a.K / T::kElems, K = a.K, nb = a.nb;
  __m256 acc[MR][NR];
  for (int t = 0; t < MR; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    if (pf)
      for (int b = 0; b < NR * T::kBytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + blk * NR * T::kBytes + b), _MM_HINT_T0);
    RowState rs[NR];
    for (int r = 0; r < NR; ++r) T::prep(w + size_t(n0 + r) * rb + size_t(blk) * T::kBytes, rs[r]);
    for (int t = 0; t < MR; ++t) {
      const __m256 sv = _mm256_loadu_ps(a.s + (m0 + t) * nb + blk * 8);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_fnmadd_ps(rs[r].minv, sv, acc[t][r]);
    }
    for (int j = 0; j < T::kSubs; ++j) {
      __m256i wq[NR];
      for (int r = 0; r < NR; ++r) wq[r] = T::unpack(rs[r], j);
      const int64_t ab = blk * T::kSubs + j;
      for (int t = 0; t < MR; ++t) {
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (m0 + t) * K + ab * 32));
        const __m256 dx = _mm256_broadcast_ss(a.d + (m0 + t) * nb + ab);
        for (int r = 0; r < NR; ++r) {
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], xq), ones));
          acc[t][r] = _mm256_fmadd_ps(f, _mm256_mul_ps(_mm256_set1_ps(rs[r].fsc[j]), dx), acc[t][r]);
        }
      }
    }
  }
  store_tile<MR, NR>(acc, nullptr, bias, y, m0, n0, N);
  }
}

// Decode: rows [n_begin, n_end) for the one token, kGemvRows at a time.
constexpr int kGemvRows = 4;

template <WType WT>
void gemv_range(const QAct& a, const uint8_t* w, size_t rb, const float* bias, float* y, int64_t n_begin,
                int64_t n_end) {
  int64_t n = n_begin;
  for (; n + kGemvRows <= n_end; n += kGemvRows)
    tile<WT, 1, kGemvRows>(a, 0, w, rb, n, bias, y, 0, w + size_t(n + kGemvRows) * rb);
  for (; n < n_end; ++n) tile<WT, 1, 1>(a, 0, w, rb, n, bias, y, 0, nullptr);
}

// Prefill / batched decode: token tiles of 4 over row pairs.
constexpr int kTileM = 4, kTileN = 2;


template <WType WT, int MR>
void rows_for_tokens(const QAct& a, int64_t m0, const uint8_t* w, size_t rb, const float* bias, float* y,
                     int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kTileN <= n1; n += kTileN) tile<WT, MR, kTileN>(a, m0, w, rb, n, bias, y, N, nullptr);
  for (; n < n1; ++n) tile<WT, MR, 1>(a, m0, w, rb, n, bias, y, N, nullptr);
}

template <WType WT>
void panel(const QAct& a, int64_t M, const uint8_t* w, size_t rb, const float* bias, float* y, int64_t N,
           int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + kTileM <= M; m += kTileM) rows_for_tokens<WT, kTileM>(a, m, w, rb, bias, y, N, n0, n1);
  switch (M - m) {
    case 3: rows_for_tokens<WT, 3>(a, m, w, rb, bias, y, N, n0, n1); break;
    case 2: rows_for_tokens<WT, 2>(a, m, w, rb, bias, y, N, n0, n1); break;
    case 1: rows_for_tokens<WT, 1>(a, m, w, rb, bias, y, N, n0, n1); break;
    default: break;
  }
}

template <WType WT>
void run(const float* x, const uint8_t* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  if (M >= kDequantMinM) return matmul_raw_tiles_avx2(x, w, WT, bias, y, M, N, K);
  const QAct a = quantize_act(x, M, K, /*avx2=*/true);
  const size_t rb = size_t(K / Q<WT>::kElems * Q<WT>::kBytes);
  if (M == 1) {
    // y is written by row; boundaries on 16 rows keep threads off each other's cache lines.
    parallel_for(N, 16, int64_t(rb) * N >= (int64_t(1) << 15) ? 32 : INT64_MAX, [&](int64_t b, int64_t e) {
      gemv_range<WT>(a, w, rb, bias, y, b, e);
    });
    return;
  }
  // Panels of ~64 KiB of weights (an even number of rows): every token tile passes over a
  // panel while it is in L2; panels are handed out one at a time so both cores end together.
  const int64_t rows = std::max<int64_t>(kTileN, int64_t((64 << 10) / rb) / kTileN * kTileN);
  const int64_t n_panels = (N + rows - 1) / rows;
  const bool parallel = M * N * K >= (1 << 16) && n_panels > 1;
  parallel_for_dynamic(n_panels, parallel, [&](int64_t p, int) {
    const int64_t n0 = p * rows;
    panel<WT>(a, M, w, rb, bias, y, N, n0, std::min(N, n0 + rows));
  });
}

}  // namespace

void quantize_act_avx2(const float* x, int64_t m_begin, int64_t m_end, int64_t K, int8_t* q, float* d,
                       float* s) {
  const int64_t nb = K / kActBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = m_begin; m < m_end; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kActBlock;
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 mx = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
      mx = _mm_max_ss(mx, _mm_movehdup_ps(mx));
      const float am = _mm_cvtss_f32(mx);
      const float db = am / 127.0f, id = db > 0.0f ? 127.0f / am : 0.0f;
      const __m256 idv = _mm256_set1_ps(id);
      __m256i i32[4];
      for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));  // nearest even
      // Sum of the 32 integers before packing (packs reorders lanes; the sum does not care).
      const __m256i sum4 = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      // packs works within 128-bit halves: (0,1) -> 16-bit [0a 1a 0b 1b], then bytes; a final
      // permute of 32-bit groups restores element order.
      const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]), p23 = _mm256_packs_epi32(i32[2], i32[3]);
      const __m256i p = _mm256_packs_epi16(p01, p23);
      const __m256i out = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + m * K + b * kActBlock), out);
      d[m * nb + b] = db;
      s[m * nb + b] = db * float(_mm_cvtsi128_si32(s4));
    }
}

void matmul_q_avx2(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                   int64_t K) {
  check_quant_args(wt, K, "matmul");
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  switch (wt) {
    case WType::Q8_0: return run<WType::Q8_0>(x, wb, bias, y, M, N, K);
    case WType::Q4_0: return run<WType::Q4_0>(x, wb, bias, y, M, N, K);
    case WType::Q5_0: return run<WType::Q5_0>(x, wb, bias, y, M, N, K);
    case WType::Q4_Z: return run<WType::Q4_Z>(x, wb, bias, y, M, N, K);
    case WType::Q4_Z128: return run<WType::Q4_Z128>(x, wb, bias, y, M, N, K);
    case WType::Q4_K: return run<WType::Q4_K>(x, wb, bias, y, M, N, K);
    case WType::Q5_K: return run<WType::Q5_K>(x, wb, bias, y, M, N, K);
    case WType::Q6_K: return run<WType::Q6_K>(x, wb, bias, y, M, N, K);
    default: fail("matmul: ", wtype_name(wt), " is not quantized");
  }
}

}  // namespace kvboost::kernels::cpu
