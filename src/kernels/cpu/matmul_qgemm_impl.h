// Quantized prefill GEMM (kernels.h matmul over Q8_0 .. Q4_Z128 weights, many tokens): the one
// source of the AVX2 (vpmaddubsw) and VNNI (vpdpbusd, 256-bit: AVX-VNNI or AVX512-VNNI+VL)
// builds, included by matmul_qgemm_avx2.cpp / matmul_qgemm_vnni.cpp (native, one ISA each) and by
// tests/kernels/matmul_qgemm_emu.cpp (SIMDe's emulation of vpdpbusd on an AVX2 CPU).
//
// Before including, define
//   KVB_QG_NS      the namespace (inside kvboost::kernels::cpu) the kernels are put in
//   KVB_QG_VNNI    0: AVX2 maddubs/madd, 1: KVB_QG_DPBUSD(acc, u8, s8) (vpdpbusd semantics)
// and include <immintrin.h> (or SIMDe with native aliases).
//
// Scheme. Each work item repacks 8 weight rows (a panel) into a per-thread, L2-resident buffer,
// once per call: per 32-element block, the 8 rows' values as unsigned bytes u (Q4_*: the nibble,
// Q5_*: 5 bits, Q6_K: 6 bits, Q8_0: w + 128) interleaved in k-quads — 32-byte vector g holds
// k = 4g .. 4g + 3 of rows 0..7 (row r in bytes 4r .. 4r + 3) — and per row the f32 scale A and
// zero-point factor B with w = A * u + B' (B = B' / d_x-free form, below). For a token t whose
// activation block is q (int8, scale d_x, s = d_x * sum q) a block contributes
//     A * d_x * sum_k u_k q_k  +  B * s          (B = -A * zero point; K-quants: -dmin * min)
// The 4 bytes of q at k-quad g are broadcast to 8 lanes, so one maddubs / dpbusd multiplies them
// with the 8 rows at once; the weight vector is loaded once for MR tokens, the activation once
// for the 8 rows. AVX2: 4-bit values sum up to 8 maddubs results in int16 before one madd (pair
// sums <= 2 * 15 * 127, times 8 < 2^15); 5-bit 4, 6-bit 2. Q8_0 on AVX2 keeps the signed w (no
// zero point: u = w + 128 would overflow maddubs' int16 pairs) as two planes, |w| and the sign
// mask m (0xFF where w < 0), and flips the activation by xor instead of vpsignb:
//     q ^ m = q where w >= 0, -q - 1 where w < 0,   so   sum |w| (q ^ m) = sum w q - c,
// c = sum of |w| over the block's negative weights: a per-row constant of the weights, stored at
// pack time and used as the int32 sum's start value. vpsignb shares the multiply pipes with
// maddubs and madd on Zen 4 (three ops there per k-quad and token), the xor does not. Pairs stay
// within int16: |w| <= 128 and q ^ m in [-128, 127] (|q| <= 127 by the activation quantizer), so
// a pair is in [-32768, 32512]. Then madd into int32 per k-quad. VNNI: vpdpbusd sums into int32
// directly, one plane of u = w + 128.
// Q6_K's per-16 scales: AVX2 multiplies them in madd (mul, int16 lanes of row r = its scale,
// then A = d), VNNI keeps two int32 sums per block and scales them in f32 (Ah = d * scale);
// its zero point (32 * scale) differs per half, so it multiplies the half-block sums sh.
// Result: the integer dots are exact; the f32 scaling and sums are in a different order from
// the scalar reference (matmul_q_int_ref), which is the only difference (f32 rounding).
// (no include guard: each including file defines KVB_QG_NS and includes it once)

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kvboost/common.h"

namespace kvboost::kernels::cpu::KVB_QG_NS {

constexpr int kRows = 8;  // rows per panel

// The tile loops below must be unrolled completely: their accumulators then live in registers
// and the g % F tests fold away (GCC 12 at -O3 otherwise keeps a rolled, branchy loop that
// spills the f32 sums; measured in docs/measurements/2026-12-01-qgemm-avx2.md).
#ifndef KVB_QG_UNROLL
#define KVB_QG_UNROLL _Pragma("GCC unroll 8")
#endif

// Pins v in a register at this point of the sum chain. GCC's reassociation otherwise turns an
// unrolled chain of integer adds into a balanced tree over all 32 products of a block and tile,
// which needs 32 live vectors and spills them (seen in the Q8_0 tile's disassembly).
#if defined(__GNUC__) && !defined(KVB_QG_NO_ASM)
#define KVB_QG_KEEP(v) __asm__("" : "+x"(v))
#else
#define KVB_QG_KEEP(v) (void)0
#endif

inline float h2f(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | (uint16_t(p[1]) << 8))); }

// Per-type facts: bits of u, whether Q6_K-style per-half scales are used.
struct TypeInfo {
  int bits;
  bool halves;
};
inline TypeInfo type_info(WType wt) {
  switch (wt) {
    case WType::Q8_0: return {8, false};
    case WType::Q5_0: case WType::Q5_K: return {5, false};
    case WType::Q6_K: return {6, true};
    default: return {4, false};
  }
}
// Planes per block: Q8_0 on AVX2 has two, |w| and the sign mask (the xor flip above).
inline int planes_of(WType wt) { return (!KVB_QG_VNNI && type_info(wt).bits == 8) ? 2 : 1; }

// Byte layout of one packed block (8 rows x 32 k):
//   u      planes * 256 bytes: plane p, k-quad g at 256p + 32g
//   A[2][8] f32  (Ah: per half; both halves equal except Q6_K on VNNI)
//   B[2][8] f32  (zero-point factor per half; equal halves except Q6_K; Q8_0 on AVX2: int32
//                 c of each row in B[0][r], the xor flip's correction)
//   D[8]    f32  (Q6_K on AVX2: d, the scale applied after the int16 multipliers)
//   mul[2][16] int16 (Q6_K on AVX2: the per-16 scale of row r in lanes 2r, 2r + 1)
inline int64_t block_bytes(WType wt) { return 256 * planes_of(wt) + 64 + 64 + 32 + 64; }

// u values of sub-block j (32 elements) of the block at b; A, B (and Q6_K's per-half scales).
struct Sub {
  __m256i u;
  float a[2], bz[2], d;
  int16_t mul[2];
};

inline __m256i nib16(const uint8_t* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
inline __m256i q5_high(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(x)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

[[gnu::always_inline]] inline void decode_sub(WType wt, const uint8_t* b, int j, Sub& s) {
  s.mul[0] = s.mul[1] = 1;
  s.d = 0.0f;
  auto uni = [&](float a, float bz) { s.a[0] = s.a[1] = a, s.bz[0] = s.bz[1] = bz; };
  switch (wt) {
    case WType::Q8_0: {
      const float d = h2f(b);
#if KVB_QG_VNNI
      s.u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), _mm256_set1_epi8(char(0x80)));
      return uni(d, -128.0f * d);
#else
      s.u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));  // signed: the sign trick
      return uni(d, 0.0f);
#endif
    }
    case WType::Q4_0: {
      const float d = h2f(b);
      s.u = nib16(b + 2);
      return uni(d, -8.0f * d);
    }
    case WType::Q4_Z: {
      const float d = h2f(b);
      s.u = nib16(b + 4);
      return uni(d, -float(b[2]) * d);
    }
    case WType::Q5_0: {
      const float d = h2f(b);
      s.u = _mm256_or_si256(nib16(b + 6), q5_high(b + 2));
      return uni(d, -16.0f * d);
    }
    case WType::Q4_Z128: {
      const float d = h2f(b);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 4 + 32 * (j / 2)));
      const __m256i m4 = _mm256_set1_epi8(0x0F);
      s.u = (j % 2) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
      return uni(d, -float(b[2]) * d);
    }
    case WType::Q4_K: case WType::Q5_K: {
      const bool five = wt == WType::Q5_K;
      const uint8_t* qs = b + (five ? 48 : 16) + 32 * (j / 2);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      const __m256i m4 = _mm256_set1_epi8(0x0F);
      __m256i q = (j % 2) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
      if (five) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        const __m256i bit = _mm256_set1_epi8(char(1 << j));
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10)));
      }
      s.u = q;
      uint8_t sc, mn;
      k_scale_min(b + 4, j, sc, mn);
      return uni(h2f(b) * float(sc), -h2f(b + 2) * float(mn));
    }
    case WType::Q6_K: {
      const int h = j / 4, k = j % 4;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (k % 2)));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
      const __m256i l4 = (k / 2) ? _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4) : _mm256_and_si256(lo, m4);
      const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), m2);
      s.u = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = h2f(b + 208);
      s.d = d;
      for (int hh = 0; hh < 2; ++hh) {
        s.mul[hh] = sc[2 * j + hh];
        s.a[hh] = d * float(sc[2 * j + hh]);
        s.bz[hh] = -32.0f * d * float(sc[2 * j + hh]);
      }
      return;
    }
    default: return;
  }
}

// 8 rows of 8 dwords (v[r] = row r's 32 bytes) -> v[g] = dword g of rows 0..7.
inline void transpose8(__m256i (&v)[8]) {
  __m256i t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);      // r0g0 r1g0 r0g1 r1g1 | g4 g5
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);  // g2 g3 | g6 g7
  }
  __m256i s[8];
  for (int i = 0; i < 2; ++i) {
    s[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);      // rows 4i..4i+3, g0 | g4
    s[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);      // g1 | g5
    s[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);  // g2 | g6
    s[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);  // g3 | g7
  }
  for (int g = 0; g < 4; ++g) {
    v[g] = _mm256_permute2x128_si256(s[g], s[4 + g], 0x20);
    v[g + 4] = _mm256_permute2x128_si256(s[g], s[4 + g], 0x31);
  }
}

// Packs rows [n0, n0 + 8) of w (raw [N, K] blocks) into buf; rows past N are zeros.
// One instance per type (WT): decode_sub's switch folds away inside the block loop.
template <WType WT>
void pack_panel_t(const uint8_t* w, int64_t N, int64_t K, int64_t n0, uint8_t* buf) {
  constexpr WType wt = WT;
  const int64_t be = wtype_block_elems(wt), bb = wtype_block_bytes(wt), nb = K / 32;
  const size_t rb = size_t(K / be * bb);
  const int64_t blk = block_bytes(wt);
  const int np = planes_of(wt);
  const int subs = int(be / 32);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = buf + b * blk;
    float* A = reinterpret_cast<float*>(o + 256 * np);
    float* B = A + 16;
    float* D = B + 16;
    int16_t* mul = reinterpret_cast<int16_t*>(D + 8);
    __m256i v[8];
    for (int r = 0; r < kRows; ++r) {
      if (n0 + r >= N) {
        v[r] = _mm256_setzero_si256();
        A[r] = A[8 + r] = B[r] = B[8 + r] = D[r] = 0.0f;
        mul[2 * r] = mul[2 * r + 1] = mul[16 + 2 * r] = mul[16 + 2 * r + 1] = 0;
        continue;
      }
      Sub s;
      decode_sub(wt, w + size_t(n0 + r) * rb + size_t(b / subs) * size_t(bb), int(b % subs), s);
      v[r] = s.u;
      A[r] = s.a[0], A[8 + r] = s.a[1], B[r] = s.bz[0], B[8 + r] = s.bz[1], D[r] = s.d;
      if (np == 2) {  // Q8_0 on AVX2: c = sum of |w| where w < 0 (psadbw: byte sums per 8 bytes)
        const __m256i neg = _mm256_and_si256(_mm256_abs_epi8(v[r]), _mm256_cmpgt_epi8(_mm256_setzero_si256(), v[r]));
        const __m256i sad = _mm256_sad_epu8(neg, _mm256_setzero_si256());
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        const int32_t c = int32_t(_mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 2));
        std::memcpy(B + r, &c, 4);
      }
      mul[2 * r] = mul[2 * r + 1] = s.mul[0];
      mul[16 + 2 * r] = mul[16 + 2 * r + 1] = s.mul[1];
    }
    transpose8(v);
    if (np == 1) {
      for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32 * g), v[g]);
    } else {
      for (int g = 0; g < 8; ++g) {  // Q8_0 on AVX2: |w|, then the sign mask
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32 * g), _mm256_abs_epi8(v[g]));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 256 + 32 * g), _mm256_cmpgt_epi8(_mm256_setzero_si256(), v[g]));
      }
    }
  }
}

inline void pack_panel(const uint8_t* w, WType wt, int64_t N, int64_t K, int64_t n0, uint8_t* buf) {
  switch (wt) {
    case WType::Q8_0: return pack_panel_t<WType::Q8_0>(w, N, K, n0, buf);
    case WType::Q4_0: return pack_panel_t<WType::Q4_0>(w, N, K, n0, buf);
    case WType::Q4_Z: return pack_panel_t<WType::Q4_Z>(w, N, K, n0, buf);
    case WType::Q5_0: return pack_panel_t<WType::Q5_0>(w, N, K, n0, buf);
    case WType::Q4_Z128: return pack_panel_t<WType::Q4_Z128>(w, N, K, n0, buf);
    case WType::Q4_K: return pack_panel_t<WType::Q4_K>(w, N, K, n0, buf);
    case WType::Q5_K: return pack_panel_t<WType::Q5_K>(w, N, K, n0, buf);
    case WType::Q6_K: return pack_panel_t<WType::Q6_K>(w, N, K, n0, buf);
    default: return;
  }
}

// Activations for the kernel: QAct plus, for Q6_K, the half-block sums sh[m][2b + h] = d_x *
// (sum of q over elements 16h .. 16h + 15 of block b).
struct Act {
  QAct a;
  const float* sh = nullptr;
};

// Dword q of each 128-bit lane of xv in all four dwords of that lane (q: a constant once the
// callers' loops are unrolled).
inline __m256i quad_of(__m256i xv, int q) {
  switch (q) {
    case 0: return _mm256_shuffle_epi32(xv, 0x00);
    case 1: return _mm256_shuffle_epi32(xv, 0x55);
    case 2: return _mm256_shuffle_epi32(xv, 0xAA);
    default: return _mm256_shuffle_epi32(xv, 0xFF);
  }
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// y[m0 .. m0 + MR, n0 .. n0 + nv) from the packed panel pb. BITS/HALVES/NP: the type's facts.
template <int MR, int BITS, bool HALVES, int NP>
inline void tile(const Act& act, int64_t m0, const uint8_t* pb, int64_t blk_bytes, float* y, int64_t N,
                 int64_t n0, int64_t nv, const float* bias) {
  const QAct& a = act.a;
  const int64_t K = a.K, nb = a.nb;
  __m256 accf[MR];
  KVB_QG_UNROLL
  for (int t = 0; t < MR; ++t) accf[t] = _mm256_setzero_ps();
  const int8_t* xr[MR];
  KVB_QG_UNROLL
  for (int t = 0; t < MR; ++t) xr[t] = a.q + (m0 + t) * K;
  for (int64_t b = 0; b < nb; ++b, pb += blk_bytes) {
    const float* A = reinterpret_cast<const float*>(pb + 256 * NP);
    const float* B = A + 16;
    const float* D = B + 16;
    const int16_t* mul = reinterpret_cast<const int16_t*>(D + 8);
    (void)mul, (void)D;
#if KVB_QG_VNNI
    if constexpr (HALVES) {
      __m256i s0[MR], s1[MR];
      KVB_QG_UNROLL
      for (int t = 0; t < MR; ++t) s0[t] = s1[t] = _mm256_setzero_si256();
      KVB_QG_UNROLL
      for (int g = 0; g < 8; ++g) {
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 32 * g));
        KVB_QG_UNROLL
        for (int t = 0; t < MR; ++t) {
          const __m256i x = _mm256_set1_epi32(load4(xr[t] + b * 32 + 4 * g));
          if (g < 4) s0[t] = KVB_QG_DPBUSD(s0[t], w, x);
          else s1[t] = KVB_QG_DPBUSD(s1[t], w, x);
        }
      }
      const __m256 a0 = _mm256_load_ps(A), a1 = _mm256_load_ps(A + 8);
      const __m256 b0 = _mm256_load_ps(B), b1 = _mm256_load_ps(B + 8);
      KVB_QG_UNROLL
      for (int t = 0; t < MR; ++t) {
        const __m256 dx = _mm256_broadcast_ss(a.d + (m0 + t) * nb + b);
        const float* sh = act.sh + (m0 + t) * 2 * nb + 2 * b;
        accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[t]), _mm256_mul_ps(a0, dx), accf[t]);
        accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[t]), _mm256_mul_ps(a1, dx), accf[t]);
        accf[t] = _mm256_fmadd_ps(b0, _mm256_broadcast_ss(sh), accf[t]);
        accf[t] = _mm256_fmadd_ps(b1, _mm256_broadcast_ss(sh + 1), accf[t]);
      }
      continue;
    }
    __m256i s32[MR];
    KVB_QG_UNROLL
    for (int t = 0; t < MR; ++t) s32[t] = _mm256_setzero_si256();
    KVB_QG_UNROLL
    for (int g = 0; g < 8; ++g) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 32 * g));
      KVB_QG_UNROLL
      for (int t = 0; t < MR; ++t)
        s32[t] = KVB_QG_DPBUSD(s32[t], w, _mm256_set1_epi32(load4(xr[t] + b * 32 + 4 * g)));
    }
    const __m256 av = _mm256_load_ps(A), bv = _mm256_load_ps(B);
    KVB_QG_UNROLL
    for (int t = 0; t < MR; ++t) {
      const int64_t ab = (m0 + t) * nb + b;
      accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[t]), _mm256_mul_ps(av, _mm256_broadcast_ss(a.d + ab)), accf[t]);
      accf[t] = _mm256_fmadd_ps(bv, _mm256_broadcast_ss(a.s + ab), accf[t]);
    }
#else
    // int16 sums of F maddubs results fit (see the header); then one madd into int32.
    constexpr int F = BITS <= 4 || BITS == 8 ? 8 : BITS == 5 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s32[MR];
    if constexpr (NP == 2) {
      // Q8_0, the xor flip: plane 0 |w|, plane 1 the sign mask, the int32 sums start at c (B).
      // Quad-major: the two weight vectors of a k-quad are loaded once for the MR tokens and
      // each token's quad comes by a dword broadcast from memory (a load, no shuffle).
      // Token-major with a 16-byte load and vpshufd per quad (the other types' loop below) ran
      // out of the 16 ymm registers here (two planes are twice the weight vectors): GCC kept
      // the 16 weight vectors across the tokens and spilled them, and each quad cost one more
      // ALU op (the shuffle).
      const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(B));
      KVB_QG_UNROLL
      for (int t = 0; t < MR; ++t) s32[t] = c;
      KVB_QG_UNROLL
      for (int g = 0; g < 8; ++g) {
        const __m256i wa = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 32 * g));
        const __m256i ws = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 256 + 32 * g));
        KVB_QG_UNROLL
        for (int t = 0; t < MR; ++t) {
          const __m256i x = _mm256_set1_epi32(load4(xr[t] + b * 32 + 4 * g));
          const __m256i p = _mm256_maddubs_epi16(wa, _mm256_xor_si256(x, ws));
          s32[t] = _mm256_add_epi32(s32[t], _mm256_madd_epi16(p, ones));
          KVB_QG_KEEP(s32[t]);
        }
      }
    } else {
      // Activation quads from one 16-byte load per half block, spread by vpshufd: a dword
      // broadcast from memory per quad (vpbroadcastd m32) runs ~20% slower on Zen 3 (the
      // measurement log); the weight vectors are re-read from L1 per token instead.
      __m256i s16[MR];
      KVB_QG_UNROLL
      for (int t = 0; t < MR; ++t) s32[t] = s16[t] = _mm256_setzero_si256();
      KVB_QG_UNROLL
      for (int h = 0; h < 2; ++h) {
        KVB_QG_UNROLL
        for (int t = 0; t < MR; ++t) {
          const __m256i xv = _mm256_broadcastsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[t] + b * 32 + 16 * h)));
          KVB_QG_UNROLL
          for (int q = 0; q < 4; ++q) {
            const int g = 4 * h + q;
            const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb + 32 * g));
            const __m256i p = _mm256_maddubs_epi16(w, quad_of(xv, q));
            s16[t] = g % F == 0 ? p : _mm256_add_epi16(s16[t], p);
            KVB_QG_KEEP(s16[t]);
            if (g % F == F - 1) {
              __m256i m;
              if constexpr (HALVES) m = _mm256_madd_epi16(s16[t], _mm256_load_si256(reinterpret_cast<const __m256i*>(mul + 16 * (g / 4))));
              else m = _mm256_madd_epi16(s16[t], ones);
              s32[t] = F == 8 ? m : _mm256_add_epi32(s32[t], m);
            }
          }
        }
      }
    }
    const __m256 av = _mm256_load_ps(HALVES ? D : A), bv = _mm256_load_ps(B);
    KVB_QG_UNROLL
    for (int t = 0; t < MR; ++t) {
      const int64_t ab = (m0 + t) * nb + b;
      accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[t]), _mm256_mul_ps(av, _mm256_broadcast_ss(a.d + ab)), accf[t]);
      if constexpr (HALVES) {
        const float* sh = act.sh + (m0 + t) * 2 * nb + 2 * b;
        accf[t] = _mm256_fmadd_ps(bv, _mm256_broadcast_ss(sh), accf[t]);
        accf[t] = _mm256_fmadd_ps(_mm256_load_ps(B + 8), _mm256_broadcast_ss(sh + 1), accf[t]);
      } else if constexpr (NP == 1) {  // Q8_0's signed weights have no zero point (B = 0)
        accf[t] = _mm256_fmadd_ps(bv, _mm256_broadcast_ss(a.s + ab), accf[t]);
      }
    }
#endif
  }
  KVB_QG_UNROLL
  for (int t = 0; t < MR; ++t) {
    float* yr = y + (m0 + t) * N + n0;
    __m256 v = accf[t];
    if (nv == kRows) {
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
      _mm256_storeu_ps(yr, v);
    } else {
      alignas(32) float tmp[kRows];
      _mm256_store_ps(tmp, v);
      for (int64_t r = 0; r < nv; ++r) yr[r] = tmp[r] + (bias ? bias[n0 + r] : 0.0f);
    }
  }
}

// Token tiles: up to kMaxMR at a time (6 where the int16 sums need no second accumulator).
template <int BITS, bool HALVES, int NP>
constexpr int max_mr() {
  return (KVB_QG_VNNI ? !HALVES : (NP == 1 && (BITS <= 4))) ? 6 : 4;
}

template <int BITS, bool HALVES, int NP>
inline void tiles(const Act& act, int64_t m_begin, int64_t m_end, const uint8_t* pb, int64_t blk, float* y,
                  int64_t N, int64_t n0, int64_t nv, const float* bias) {
  constexpr int MR = max_mr<BITS, HALVES, NP>();
  int64_t m = m_begin;
  for (; m + MR <= m_end; m += MR) tile<MR, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias);
  switch (m_end - m) {
    case 5: if constexpr (MR > 5) tile<5, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias); break;
    case 4: if constexpr (MR > 4) tile<4, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias); break;
    case 3: tile<3, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias); break;
    case 2: tile<2, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias); break;
    case 1: tile<1, BITS, HALVES, NP>(act, m, pb, blk, y, N, n0, nv, bias); break;
    default: break;
  }
}

inline void run_tiles(WType wt, const Act& act, int64_t m0, int64_t m1, const uint8_t* pb, int64_t blk, float* y,
                      int64_t N, int64_t n0, int64_t nv, const float* bias) {
  const TypeInfo ti = type_info(wt);
  const int np = planes_of(wt);
  if (ti.halves) return tiles<6, true, 1>(act, m0, m1, pb, blk, y, N, n0, nv, bias);
  if (np == 2) return tiles<8, false, 2>(act, m0, m1, pb, blk, y, N, n0, nv, bias);
  switch (ti.bits) {
    case 4: return tiles<4, false, 1>(act, m0, m1, pb, blk, y, N, n0, nv, bias);
    case 5: return tiles<5, false, 1>(act, m0, m1, pb, blk, y, N, n0, nv, bias);
    default: return tiles<8, false, 1>(act, m0, m1, pb, blk, y, N, n0, nv, bias);
  }
}

// The whole matmul: y[M, N] = x[M, K] . w^T (+ bias). Activations quantized once (quantize_act,
// AVX2), the half sums for Q6_K; work items (8-row panel, token block) handed out dynamically;
// a thread repacks a panel only when its item is of a different panel than the last one.
inline void matmul(const float* x, const void* wv, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                   int64_t K) {
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  Act act;
  act.a = quantize_act(x, M, K, /*avx2=*/true);
  const int64_t nb = K / 32;
  thread_local std::vector<float> shbuf;
  if (type_info(wt).halves) {
    if (int64_t(shbuf.size()) < 2 * M * nb) shbuf.resize(size_t(2 * M * nb));
    float* sh = shbuf.data();
    const QAct& a = act.a;
    parallel_for(M, 1, M * K >= (int64_t(1) << 16) ? 2 : INT64_MAX, [&](int64_t mb, int64_t me) {
      const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
      for (int64_t m = mb; m < me; ++m)
        for (int64_t b = 0; b < nb; ++b) {
          // Sums of the two 16-byte halves: maddubs(1, q) pairs, madd pairs, then lanes 0..3 / 4..7.
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + m * K + 32 * b));
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
          __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
          lo = _mm_hadd_epi32(lo, hi);  // [l01 l23 h01 h23]
          lo = _mm_hadd_epi32(lo, lo);  // [l h l h]
          const float d = a.d[m * nb + b];
          sh[m * 2 * nb + 2 * b] = d * float(_mm_cvtsi128_si32(lo));
          sh[m * 2 * nb + 2 * b + 1] = d * float(_mm_extract_epi32(lo, 1));
        }
    });
    act.sh = sh;
  }
  const int64_t n_panels = (N + kRows - 1) / kRows;
  const int nt = num_threads();
  constexpr int64_t kMB = 6 * 4;  // token blocks in multiples of both tile heights (6 and 4)
  const int64_t m_units = (M + kMB - 1) / kMB;
  const int64_t want_blocks = std::min<int64_t>(m_units, (4 * nt + n_panels - 1) / n_panels);
  const int64_t mb = (m_units + want_blocks - 1) / want_blocks * kMB;
  const int64_t n_mb = (M + mb - 1) / mb;
  const int64_t n_items = n_panels * n_mb;
  const int64_t blk = block_bytes(wt);
  const size_t buf_bytes = size_t(nb * blk);
  const bool parallel = n_items > 1 && M * N * K >= (int64_t(1) << 17);
  static std::atomic<uint64_t> next_call{1};
  const uint64_t call = next_call.fetch_add(1, std::memory_order_relaxed);
  parallel_for_dynamic(n_items, parallel, [&](int64_t item, int) {
    thread_local std::vector<uint8_t> store;
    thread_local uint64_t packed_call = 0;
    thread_local int64_t packed_panel = -1;
    if (store.size() < buf_bytes + 64) store.resize(buf_bytes + 64);
    uint8_t* buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t(63));
    const int64_t p = item / n_mb, bm = item % n_mb;
    if (packed_call != call || packed_panel != p) pack_panel(w, wt, N, K, p * kRows, buf);
    packed_call = call;
    packed_panel = p;
    const int64_t n0 = p * kRows;
    run_tiles(wt, act, bm * mb, std::min(M, bm * mb + mb), buf, blk, y, N, n0, std::min<int64_t>(kRows, N - n0), bias);
  });
}

}  // namespace kvboost::kernels::cpu::KVB_QG_NS
