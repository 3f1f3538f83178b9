// Quantized prefill GEMM on 16-row panels (kernels.h matmul over Q8_0 .. Q4_Z128 weights, many
// tokens): the one source of the AVX512-VNNI build (vpdpbusd on 512-bit vectors, masked tails)
// and the AMX-INT8 build (tdpbusd tiles), included by matmul_qgemm_avx512vnni.cpp,
// matmul_qgemm_amx.cpp (native) and tests/kernels/matmul_qgemm_avx512_emu.cpp (SIMDe's AVX-512
// and the scalar AMX emulator tests/kernels/amx_emu.h, on any AVX2 CPU).
//
// Before including, define
//   KVB_QG_NS       the namespace (inside kvboost::kernels::cpu)
//   KVB_QG16_AMX    0: AVX512-VNNI only, 1: also the AMX-INT8 kernel
//   KVB_QG_DPBUSD   (optional) the 256-bit vpdpbusd the 8-row header's decoders are built with
//   KVB_AMX_THREAD_INIT()  (AMX builds) what a thread does before its first tile instruction
// and include <immintrin.h> (or SIMDe with native aliases, plus amx_emu.h).
//
// Scheme (the 8-row header matmul_qgemm_impl.h explains the block algebra; its decoders are
// reused here). vpdpbusd multiplies unsigned bytes by signed ones (AMX: tdpbsud, signed by
// unsigned), so here the weights are the unsigned operand, exactly the 8-row header's u
// (0..255 for Q8_0: the stored int8 + 128; 0..15 / 0..31 / 0..63 for the 4-, 5- and 6-bit types),
// and the activations the signed one, the int8 block q itself (scale d_x, s = d_x * sum q).
// A block's weight is A * u + B per element (Q8_0: A = d, B = -128 d), so
//   y += A * d_x * dot(u, q) + B * s
// (Q6_K: per 16-element half, with the half sums s_h). The integer dot is exact (|values| <
// 2^24), so the only difference from the scalar reference is the order of the f32 operations.
// Panel layout, per 32-element block of 16 weight rows (kBlk16 bytes, 64-byte aligned):
//   u      8 k-quads x 64 bytes: k-quad g at 64 g, row r in bytes 4r .. 4r + 3 (the VNNI
//          operand, one zmm; also the AMX B tile of the block: 8 rows of 64 bytes, or 4 + 4 rows
//          for Q6_K's halves)
//   A[2][16], B[2][16]  f32 per half (equal halves except Q6_K)
// Work items are pairs of panels (32 rows): block b of panel j at (2 b + j) * kBlk16.
// AVX512-VNNI: a tile is MR tokens x 32 rows; each token's 4 bytes are broadcast to the 16 lanes
// and feed both panels' weight vectors. AMX: 32 tokens at a time (the A tiles tmm4, tmm5: 16 rows
// of q, K bytes apart, padded with zero rows past M), the pair's B tiles tmm6, tmm7; one tdpbsud
// per block (two for Q6_K) into tmm0..3, stored and scaled in f32 with AVX-512 (the per-block
// scales keep the sums from staying in the tiles).
// (no include guard: each including file defines KVB_QG_NS and includes it once)

#ifndef KVB_QG_DPBUSD
#define KVB_QG_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#endif
#define KVB_QG_VNNI 1
#include "cpu/matmul_qgemm_impl.h"

namespace kvboost::kernels::cpu::KVB_QG_NS {

constexpr int kRows16 = 16;
constexpr int64_t kBlk16 = 512 + 4 * 64;

// Packs rows [n0, n0 + 16) of w into a panel whose block b starts at buf + b * stride (rows past
// N are zeros: their results are never stored). One instance per type: decode_sub's switch
// folds away inside the block loop.
template <WType WT>
void pack_panel16_t(const uint8_t* w, int64_t N, int64_t K, int64_t n0, uint8_t* buf, int64_t stride) {
  constexpr WType wt = WT;
  const int64_t be = wtype_block_elems(wt), bb = wtype_block_bytes(wt), nb = K / 32;
  const size_t rb = size_t(K / be * bb);
  const int subs = int(be / 32);
  const float off = wt == WType::Q8_0 ? 128.0f : 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* o = buf + b * stride;
    float* A = reinterpret_cast<float*>(o + 512);
    float* B = A + 32;
    for (int h8 = 0; h8 < 2; ++h8) {
      __m256i v[8];
      for (int i = 0; i < 8; ++i) {
        const int r = 8 * h8 + i;
        if (n0 + r >= N) {
          v[i] = _mm256_setzero_si256();
          A[r] = A[16 + r] = B[r] = B[16 + r] = 0.0f;
          continue;
        }
        Sub s;
        decode_sub(wt, w + size_t(n0 + r) * rb + size_t(b / subs) * size_t(bb), int(b % subs), s);
        v[i] = s.u;
        A[r] = s.a[0], A[16 + r] = s.a[1];
        // Q8_0: B = -128 d, taken out of the integer dot instead (kEpiQ8): 0 here, exactly
        B[r] = s.bz[0] + off * s.a[0], B[16 + r] = s.bz[1] + off * s.a[1];
      }
      transpose8(v);  // v[g] = k-quad g of these 8 rows
      for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(o + 64 * g + 32 * h8), v[g]);
    }
  }
}

inline void pack_panel16(const uint8_t* w, WType wt, int64_t N, int64_t K, int64_t n0, uint8_t* buf,
                         int64_t stride) {
  switch (wt) {
    case WType::Q8_0: return pack_panel16_t<WType::Q8_0>(w, N, K, n0, buf, stride);
    case WType::Q4_0: return pack_panel16_t<WType::Q4_0>(w, N, K, n0, buf, stride);
    case WType::Q4_Z: return pack_panel16_t<WType::Q4_Z>(w, N, K, n0, buf, stride);
    case WType::Q5_0: return pack_panel16_t<WType::Q5_0>(w, N, K, n0, buf, stride);
    case WType::Q4_Z128: return pack_panel16_t<WType::Q4_Z128>(w, N, K, n0, buf, stride);
    case WType::Q4_K: return pack_panel16_t<WType::Q4_K>(w, N, K, n0, buf, stride);
    case WType::Q5_K: return pack_panel16_t<WType::Q5_K>(w, N, K, n0, buf, stride);
    case WType::Q6_K: return pack_panel16_t<WType::Q6_K>(w, N, K, n0, buf, stride);
    default: return;
  }
}

// Activations: QAct (its int8 q is the signed operand; the AMX build copies it into rows padded
// with zeros to a multiple of 32 tokens), and for Q6_K the half-block sums sh[m][2b + h].
struct Act16 {
  QAct a;
  const int8_t* q = nullptr;
  const float* sh = nullptr;
  const int32_t* i128 = nullptr;  // Q8_0: 128 * sum q per token and block
};

// The sums of the two 16-element halves of a 32-element int8 block.
inline void half_sums(const int8_t* q, int32_t& s0, int32_t& s1) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
  __m128i lo = _mm256_castsi256_si128(t), hi = _mm256_extracti128_si256(t, 1);
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0x4E));
  hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0x4E));
  lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0xB1));
  hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0xB1));
  s0 = _mm_cvtsi128_si32(lo);
  s1 = _mm_cvtsi128_si32(hi);
}

inline uint32_t load4u(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#ifndef KVB_QG16_PORTABLE
// Lanes [0, nv) of a 16-lane load or store: masked (the native builds).
inline __mmask16 lanes(int64_t nv) { return nv >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nv) - 1u); }
inline __m512 cvt16(__m512i v) { return _mm512_cvtepi32_ps(v); }
inline __m512 load_n(const float* p, int64_t nv) { return _mm512_maskz_loadu_ps(lanes(nv), p); }
inline void store_n(float* p, __m512 v, int64_t nv) { _mm512_mask_storeu_ps(p, lanes(nv), v); }
#else
// The same through memory, for SIMDe builds (SIMDe 0.7.4 has no vcvtdq2ps zmm and no masked
// ps loads/stores): exactly lanes [0, nv) are read or written.
inline __m512 cvt16(__m512i v) {
  alignas(64) int32_t i[16];
  alignas(64) float f[16];
  _mm512_store_si512(i, v);
  for (int k = 0; k < 16; ++k) f[k] = float(i[k]);
  return _mm512_load_ps(f);
}
inline __m512 load_n(const float* p, int64_t nv) {
  alignas(64) float f[16] = {};
  std::memcpy(f, p, size_t(std::min<int64_t>(nv, 16)) * 4);
  return _mm512_load_ps(f);
}
inline void store_n(float* p, __m512 v, int64_t nv) {
  alignas(64) float f[16];
  _mm512_store_ps(f, v);
  std::memcpy(p, f, size_t(std::min<int64_t>(nv, 16)) * 4);
}
#endif

// What a block's epilogue adds beside A * d_x * dot: B * s (any type), B_h * s_h per half (Q6_K),
// or nothing, the offset taken out of the integer dot (Q8_0: dot(u, q) - 128 sum q = sum v q
// exactly, where the f32 B * s would cancel 128 sum q against the dot's share of it).
enum Epi : int { kEpiB = 0, kEpiHalves = 1, kEpiQ8 = 2 };

// y[m0 .. m0 + MR, n0 .. n0 + 32) from a pair of panels (block b of panel j at
// pp + (2 b + j) * kBlk16): each broadcast activation quad feeds both panels' weight vectors, so
// a block reads half the activation bytes per row that a 16-row tile would, and each token has 2
// (halves: 4) independent vpdpbusd chains.
template <int MR, int EPI>
inline void tile32(const Act16& act, int64_t m0, const uint8_t* pp, float* y, int64_t N, int64_t n0, int64_t nv0,
                   int64_t nv1, const float* bias) {
  constexpr bool HALVES = EPI == kEpiHalves;
  constexpr int H = HALVES ? 2 : 1;
  const QAct& a = act.a;
  const int64_t K = a.K, nb = a.nb;
  __m512 accf[2][MR];
  for (int j = 0; j < 2; ++j)
    for (int t = 0; t < MR; ++t) accf[j][t] = _mm512_setzero_ps();
  const uint8_t* xr[MR];
  for (int t = 0; t < MR; ++t) xr[t] = reinterpret_cast<const uint8_t*>(act.q + (m0 + t) * K);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[2] = {pp + 2 * b * kBlk16, pp + (2 * b + 1) * kBlk16};
    __m512i s[2][H][MR];
    for (int j = 0; j < 2; ++j)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < MR; ++t) s[j][h][t] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      const int h = HALVES ? g / 4 : 0;
      const __m512i w0 = _mm512_load_si512(blk[0] + 64 * g);
      const __m512i w1 = _mm512_load_si512(blk[1] + 64 * g);
      for (int t = 0; t < MR; ++t) {
        const __m512i x = _mm512_set1_epi32(int(load4u(xr[t] + b * 32 + 4 * g)));
        s[0][h][t] = _mm512_dpbusd_epi32(s[0][h][t], w0, x);
        s[1][h][t] = _mm512_dpbusd_epi32(s[1][h][t], w1, x);
      }
    }
    if constexpr (EPI == kEpiQ8)
      for (int t = 0; t < MR; ++t) {
        const __m512i c = _mm512_set1_epi32(act.i128[(m0 + t) * nb + b]);
        s[0][0][t] = _mm512_sub_epi32(s[0][0][t], c);
        s[1][0][t] = _mm512_sub_epi32(s[1][0][t], c);
      }
    for (int j = 0; j < 2; ++j)
      for (int h = 0; h < H; ++h) {
        const float* A = reinterpret_cast<const float*>(blk[j] + 512) + 16 * h;
        const __m512 av = _mm512_load_ps(A), bv = _mm512_load_ps(A + 32);
        for (int t = 0; t < MR; ++t) {
          const int64_t ab = (m0 + t) * nb + b;
          accf[j][t] = _mm512_fmadd_ps(cvt16(s[j][h][t]), _mm512_mul_ps(av, _mm512_set1_ps(a.d[ab])), accf[j][t]);
          if constexpr (EPI != kEpiQ8) {
            const float zs = HALVES ? act.sh[(m0 + t) * 2 * nb + 2 * b + h] : a.s[ab];
            accf[j][t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(zs), accf[j][t]);
          }
        }
      }
  }
  for (int j = 0; j < 2; ++j) {
    const int64_t nv = j ? nv1 : nv0;
    if (nv <= 0) break;
    const __m512 bv = bias ? load_n(bias + n0 + 16 * j, nv) : _mm512_setzero_ps();
    for (int t = 0; t < MR; ++t) store_n(y + (m0 + t) * N + n0 + 16 * j, _mm512_add_ps(accf[j][t], bv), nv);
  }
}

template <int EPI>
inline void tiles32(const Act16& act, int64_t m_begin, int64_t m_end, const uint8_t* pp, float* y, int64_t N,
                    int64_t n0, int64_t nv0, int64_t nv1, const float* bias) {
  constexpr int MR = EPI == kEpiHalves ? 4 : 6;
  int64_t m = m_begin;
  for (; m + MR <= m_end; m += MR) tile32<MR, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias);
  switch (m_end - m) {
    case 5: if constexpr (MR > 5) tile32<5, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias); break;
    case 4: if constexpr (MR > 4) tile32<4, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias); break;
    case 3: tile32<3, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias); break;
    case 2: tile32<2, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias); break;
    case 1: tile32<1, EPI>(act, m, pp, y, N, n0, nv0, nv1, bias); break;
    default: break;
  }
}

#if KVB_QG16_AMX

// The 64-byte tile configuration (Intel SDM, LDTILECFG), every byte written before use.
struct alignas(64) QTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(QTileConfig) == 64, "LDTILECFG reads exactly 64 bytes");

// ks: k per tdpbsud (32: one block; 16: a Q6_K half). C tiles 0..3 16 x 16 int32; A tiles 4, 5
// 16 tokens x ks bytes; B tiles 6, 7 ks / 4 k-quads x 64 bytes.
inline QTileConfig qgemm_tile_config(int ks) {
  QTileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette_id = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = uint16_t(ks);
  for (int t = 6; t < 8; ++t) c.rows[t] = uint8_t(ks / 4), c.colsb[t] = 64;
  return c;
}

// As in matmul_packed_avx512_impl.h: GCC 12's _tile_loadconfig declares only 8 of the 64 bytes
// read; the empty asm makes every store of the configuration come before LDTILECFG.
inline void load_qtile_config(const QTileConfig& c) {
  __asm__ volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
}

// Tokens [m0, m1) (m0 a multiple of 32) x rows [n0, n0 + 32) from the pair buffer pp (block b of
// panel j at pp + (2 b + j) * kBlk16).
inline void amx_item16(const Act16& act, bool halves, int64_t m0, int64_t m1, int64_t M, const uint8_t* pp, float* y,
                       int64_t N, int64_t n0, const float* bias) {
  alignas(64) int32_t cb[4][16][16];
  alignas(64) float acc[32][32];
  const QAct& a = act.a;
  const int64_t K = a.K, nb = a.nb;
  const int subs = halves ? 2 : 1;
  for (int64_t m = m0; m < m1; m += 32) {
    std::memset(acc, 0, sizeof acc);
    const int8_t* x0 = act.q + m * K;
    const int8_t* x1 = x0 + 16 * K;
    const int tv = int(std::min<int64_t>(32, M - m));  // tokens of this group that exist
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk0 = pp + 2 * b * kBlk16;
      const uint8_t* blk1 = blk0 + kBlk16;
      for (int h = 0; h < subs; ++h) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, x0 + 32 * b + 16 * h, K);
        _tile_loadd(5, x1 + 32 * b + 16 * h, K);
        _tile_loadd(6, blk0 + 256 * h, 64);
        _tile_loadd(7, blk1 + 256 * h, 64);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(1, 4, 7);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
        _tile_stored(0, cb[0], 64);
        _tile_stored(1, cb[1], 64);
        _tile_stored(2, cb[2], 64);
        _tile_stored(3, cb[3], 64);
        for (int j = 0; j < 2; ++j) {
          const float* A = reinterpret_cast<const float*>((j ? blk1 : blk0) + 512) + 16 * h;
          const __m512 av = _mm512_load_ps(A), zv = _mm512_load_ps(A + 32);
          for (int tt = 0; tt < tv; ++tt) {
            const int64_t t = m + tt;
            __m512i ci = _mm512_load_si512(cb[2 * (tt / 16) + j][tt % 16]);
            if (act.i128) ci = _mm512_sub_epi32(ci, _mm512_set1_epi32(act.i128[t * nb + b]));
            const float zs = halves ? act.sh[t * 2 * nb + 2 * b + h] : a.s[t * nb + b];
            __m512 r = _mm512_load_ps(acc[tt] + 16 * j);
            r = _mm512_fmadd_ps(cvt16(ci), _mm512_mul_ps(av, _mm512_set1_ps(a.d[t * nb + b])), r);
            r = _mm512_fmadd_ps(zv, _mm512_set1_ps(zs), r);
            _mm512_store_ps(acc[tt] + 16 * j, r);
          }
        }
      }
    }
    for (int j = 0; j < 2; ++j) {
      const int64_t nv = std::min<int64_t>(16, N - n0 - 16 * j);
      if (nv <= 0) break;
      const __m512 bv = bias ? load_n(bias + n0 + 16 * j, nv) : _mm512_setzero_ps();
      for (int tt = 0; tt < tv; ++tt)
        store_n(y + (m + tt) * N + n0 + 16 * j, _mm512_add_ps(_mm512_load_ps(acc[tt] + 16 * j), bv), nv);
    }
  }
}

#endif  // KVB_QG16_AMX

// The whole matmul: y[M, N] = x[M, K] . w^T (+ bias) on the AVX512-VNNI tiles, or (amx) on the
// AMX-INT8 tiles. Work items: (16-row panel, or AMX's pair of panels; token block), handed out
// dynamically; a thread repacks only when its item is of another panel than its last one.
inline void matmul16(const float* x, const void* wv, WType wt, const float* bias, float* y, int64_t M, int64_t N,
                     int64_t K, bool amx) {
#if !KVB_QG16_AMX
  (void)amx;
  constexpr bool kAmx = false;
#else
  const bool kAmx = amx;
#endif
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  Act16 act;
  act.a = quantize_act(x, M, K, /*avx2=*/true);
  const QAct& a = act.a;
  const int64_t nb = K / 32;
  const bool halves = type_info(wt).halves;
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> shbuf;
  act.q = a.q;
  if (kAmx && M % 32 != 0) {  // the A tiles read 32 rows at a time: zero rows past M
    const int64_t Mp = (M + 31) / 32 * 32;
    if (int64_t(qbuf.size()) < Mp * K) qbuf.resize(size_t(Mp * K));
    std::memcpy(qbuf.data(), a.q, size_t(M * K));
    std::memset(qbuf.data() + M * K, 0, size_t((Mp - M) * K));
    act.q = qbuf.data();
  }
  const bool q8 = wt == WType::Q8_0;
  thread_local std::vector<int32_t> ibuf;
  if (halves && int64_t(shbuf.size()) < 2 * M * nb) shbuf.resize(size_t(2 * M * nb));
  if (q8 && int64_t(ibuf.size()) < M * nb) ibuf.resize(size_t(M * nb));
  float* sh = shbuf.data();
  int32_t* i128 = ibuf.data();
  if (halves || q8)
    parallel_for(M, 1, M * K >= (int64_t(1) << 16) ? 2 : INT64_MAX, [&](int64_t mb, int64_t me) {
      for (int64_t m = mb; m < me; ++m)
        for (int64_t b = 0; b < nb; ++b) {
          int32_t s0, s1;
          half_sums(a.q + m * K + 32 * b, s0, s1);
          if (q8) {
            i128[m * nb + b] = 128 * (s0 + s1);
            continue;
          }
          const float d = a.d[m * nb + b];
          sh[m * 2 * nb + 2 * b] = d * float(s0);
          sh[m * 2 * nb + 2 * b + 1] = d * float(s1);
        }
    });
  act.i128 = q8 ? i128 : nullptr;
  act.sh = halves ? sh : nullptr;
  const int64_t rows = 2 * kRows16;
  const int64_t n_panels = (N + rows - 1) / rows;
  const int nt = num_threads();
  const int64_t kMB = kAmx ? 32 : 48;  // token blocks in multiples of the tile heights (AMX 32; VNNI 6 and 4)
  const int64_t m_units = (M + kMB - 1) / kMB;
  const int64_t want_blocks = std::min<int64_t>(m_units, (4 * nt + n_panels - 1) / n_panels);
  const int64_t mb = (m_units + want_blocks - 1) / want_blocks * kMB;
  const int64_t n_mb = (M + mb - 1) / mb;
  const int64_t n_items = n_panels * n_mb;
  const size_t buf_bytes = size_t(nb * kBlk16 * 2);
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
    const int64_t n0 = p * rows;
    if (packed_call != call || packed_panel != p) {
      pack_panel16(w, wt, N, K, n0, buf, 2 * kBlk16);
      pack_panel16(w, wt, N, K, n0 + kRows16, buf + kBlk16, 2 * kBlk16);
    }
    packed_call = call;
    packed_panel = p;
    const int64_t m0 = bm * mb, m1 = std::min(M, m0 + mb);
#if KVB_QG16_AMX
    if (kAmx) {
      KVB_AMX_THREAD_INIT();
      load_qtile_config(qgemm_tile_config(halves ? 16 : 32));
      amx_item16(act, halves, m0, m1, M, buf, y, N, n0, bias);
      _tile_release();
      return;
    }
#endif
    const int64_t nv0 = std::min<int64_t>(kRows16, N - n0), nv1 = std::min<int64_t>(kRows16, N - n0 - kRows16);
    if (halves) tiles32<kEpiHalves>(act, m0, m1, buf, y, N, n0, nv0, nv1, bias);
    else if (q8) tiles32<kEpiQ8>(act, m0, m1, buf, y, N, n0, nv0, nv1, bias);
    else tiles32<kEpiB>(act, m0, m1, buf, y, N, n0, nv0, nv1, bias);
  });
}

}  // namespace kvboost::kernels::cpu::KVB_QG_NS
