// Decode GEMV (a few tokens: decode, speculative verification) over Q8_0, Q4_0 and Q5_0 weights
// as stored, with 512-bit vpdpbusd:
// the one source of the native AVX512-VNNI build (gemv_q_avx512vnni.cpp) and of the SIMDe build
// tests/kernels/gemv_q_avx512_emu.cpp (define KVB_GV_PORTABLE there: no zmm cvtdq2ps in SIMDe
// 0.7.4). Define KVB_GV_NS (the namespace inside kvboost::kernels::cpu) before including.
//
// The AVX2 GEMV (matmul_q_avx2.cpp) spends ~9 instructions per 32-weight block and row (sign
// trick or nibble unpack, maddubs, madd, convert, FMA); decode of Q8_0 / Q4_0 files then runs at
// ~20 GB/s on a host that streams bf16 weights at 35 GB/s, i.e. it is instruction-bound. Here a
// zmm holds the same block of two rows, so one vpdpbusd, one convert and one FMA serve two rows:
//   Q8_0: the weights become unsigned (w + 128, one xor) and the activation block (signed q) is
//         broadcast to both halves; sum (w + 128) q = sum w q + 128 sum q, so per row the f32 term
//         128 d_w s (s = d_x sum q, QAct) is taken out at the end: y = sum_b d_w d_x dot_b - 128
//         sum_b d_w s_b.
//   Q4_0: the 16 bytes of each row's block give [row0 lo | row1 lo] and, shifted, [row0 hi | row1
//         hi] (nibbles 0..15, unsigned); the activation block is laid out to match once per call
//         ([x0..15 | x0..15 | x16..31 | x16..31]); zero point 8: y = sum d_w d_x dot - 8 sum d_w s.
//   Q5_0: as Q4_0, plus the fifth bits: the two rows' 32-bit qh words give the 64-bit byte mask of
//         that layout, and one masked byte add puts 16 where a bit is set (values 0..31); zero
//         point 16.
// Four rows per step (two zmm): the four f16 scales are gathered into one vector, converted and
// spread to the lanes of each row by one permute per pair; the rows' blocks are unpacked once for
// up to 6 tokens (per token and row pair: vpdpbusd, convert, multiply, FMA). The int32 dots are
// exact; only the order of the f32 sums differs from cpu::matmul_q_int_ref.
// (no include guard: each including file defines KVB_GV_NS and includes it once)

namespace kvboost::kernels::cpu::KVB_GV_NS {

#ifndef KVB_GV_PORTABLE
inline __m512 gv_cvt(__m512i v) { return _mm512_cvtepi32_ps(v); }
#else
inline __m512 gv_cvt(__m512i v) {
  alignas(64) int32_t i[16];
  alignas(64) float f[16];
  _mm512_store_si512(i, v);
  for (int k = 0; k < 16; ++k) f[k] = float(i[k]);
  return _mm512_load_ps(f);
}
#endif

#ifndef KVB_GV_PORTABLE
// u + 16 in the bytes whose bit is set in mk.
inline __m512i gv_add16(__m512i u, uint64_t mk) {
  return _mm512_mask_add_epi8(u, __mmask64(mk), u, _mm512_set1_epi8(16));
}
#else
inline __m512i gv_add16(__m512i u, uint64_t mk) {
  alignas(64) uint8_t b[64];
  _mm512_store_si512(b, u);
  for (int i = 0; i < 64; ++i) b[i] = uint8_t(b[i] + ((mk >> i) & 1u ? 16 : 0));
  return _mm512_load_si512(b);
}
#endif

// 16 int8 as f32 (Q6_K's scales).
#ifndef KVB_GV_PORTABLE
inline __m512 gv_i8_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
inline __m512 gv_i8_ps(const uint8_t* p) {
  alignas(64) float f[16];
  for (int k = 0; k < 16; ++k) f[k] = float(int8_t(p[k]));
  return _mm512_load_ps(f);
}
#endif

inline uint16_t gv_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The weight types of this GEMV (template argument KIND); Q4 below: the nibble layout (Q4_0, Q5_0).
enum GvKind : int { kGvQ8 = 0, kGvQ4 = 1, kGvQ5 = 2 };
constexpr int gv_block_bytes(int kind) { return kind == kGvQ8 ? 34 : kind == kGvQ4 ? 18 : 22; }

// Lanes of the row pair (r, r + 1) for a 4-lane scale vector [s0 s1 s2 s3] broadcast to 16:
// Q8_0 layout: dwords 0..7 row r, 8..15 row r + 1.
// Q4_0 layout: dwords 0..3 row r (lo), 4..7 row r + 1 (lo), 8..11 row r (hi), 12..15 row r + 1 (hi).
template <bool Q4>
inline __m512i gv_lane_index(int pair) {
  const int a = 2 * pair, b = 2 * pair + 1;
  if constexpr (Q4)
    return _mm512_setr_epi32(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
  else
    return _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
}

// Rows [n0, n0 + nr) (nr = 1..4) of y for tokens [m0, m0 + MR) of `a`; xb: the activation
// blocks as the kernel reads them (Q8_0: a.q, 32 bytes per block; Q4_0: 64 bytes per block, the
// layout above), xs bytes per token. The rows' blocks are unpacked once for the MR tokens.
template <int KIND, int MR>
inline void gv_tile(const QAct& a, int64_t m0, const int8_t* xb, int64_t xs, const uint8_t* w, size_t rb,
                    int64_t n0, int nr, const float* bias, float* y, int64_t N, const uint8_t* pf) {
  constexpr bool Q4 = KIND != kGvQ8;
  constexpr int kB = gv_block_bytes(KIND);
  constexpr int kQs = KIND == kGvQ5 ? 6 : 2;  // offset of the quants in a block
  constexpr float kZero = KIND == kGvQ8 ? 128.0f : KIND == kGvQ4 ? 8.0f : 16.0f;
  const int64_t nb = a.nb;
  const uint8_t* row[4];
  for (int r = 0; r < 4; ++r) row[r] = w + size_t(n0 + std::min(r, nr - 1)) * rb;  // rows past nr repeat the last
  __m512 acc[MR][2];
  __m128 zacc[MR];
  for (int t = 0; t < MR; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps(), zacc[t] = _mm_setzero_ps();
  const __m512i idx0 = gv_lane_index<Q4>(0), idx1 = gv_lane_index<Q4>(1);
  const __m512i flip = _mm512_set1_epi8(char(0x80)), m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    if (pf)
      for (int o = 0; o < 4 * kB; o += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + b * 4 * kB + o), _MM_HINT_T0);
    const size_t off = size_t(b) * kB;
    const __m128i hdr = _mm_setr_epi16(short(gv_u16(row[0] + off)), short(gv_u16(row[1] + off)),
                                       short(gv_u16(row[2] + off)), short(gv_u16(row[3] + off)), 0, 0, 0, 0);
    const __m128 dw = _mm_cvtph_ps(hdr);
    const __m512 dw16 = _mm512_castps128_ps512(dw);
    const __m512 sc[2] = {_mm512_permutexvar_ps(idx0, dw16), _mm512_permutexvar_ps(idx1, dw16)};
    __m512i u[2];
    for (int p = 0; p < 2; ++p) {
      const uint8_t* r0 = row[2 * p] + off + kQs;
      const uint8_t* r1 = row[2 * p + 1] + off + kQs;
      if constexpr (Q4) {
        const __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1)), 1);
        u[p] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
        if constexpr (KIND == kGvQ5) {
          uint32_t h0, h1;
          std::memcpy(&h0, r0 - 4, 4);
          std::memcpy(&h1, r1 - 4, 4);
          // bytes 0..15: row 0 elements 0..15 (bits 0..15 of its qh), 16..31 row 1's, 32..47
          // row 0 elements 16..31 (bits 16..31), 48..63 row 1's
          const uint64_t mk = uint64_t(h0 & 0xFFFFu) | uint64_t(h1 & 0xFFFFu) << 16 | uint64_t(h0 >> 16) << 32 |
                              uint64_t(h1 >> 16) << 48;
          u[p] = gv_add16(u[p], mk);
        }
      } else {
        u[p] = _mm512_xor_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0))),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1)), 1),
            flip);
      }
    }
    for (int t = 0; t < MR; ++t) {
      const int64_t ab = (m0 + t) * nb + b;
      const int8_t* xt = xb + (m0 + t) * xs;
      __m512i x;
      if constexpr (Q4) x = _mm512_loadu_si512(xt + b * 64);
      else x = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + b * 32)));
      zacc[t] = _mm_fmadd_ps(dw, _mm_set1_ps(a.s[ab]), zacc[t]);
      const __m512 dx = _mm512_set1_ps(a.d[ab]);
      for (int p = 0; p < 2; ++p) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[p], x);
        acc[t][p] = _mm512_fmadd_ps(_mm512_mul_ps(gv_cvt(dot), sc[p]), dx, acc[t][p]);
      }
    }
  }
  for (int t = 0; t < MR; ++t) {
    alignas(64) float f[2][16];
    _mm512_store_ps(f[0], acc[t][0]);
    _mm512_store_ps(f[1], acc[t][1]);
    alignas(16) float z[4];
    _mm_store_ps(z, zacc[t]);
    for (int r = 0; r < nr; ++r) {
      const float* l = f[r / 2];
      const int h = r % 2;
      float s = 0.0f;
      if constexpr (Q4) {
        for (int k = 0; k < 4; ++k) s += l[4 * h + k] + l[8 + 4 * h + k];
      } else {
        for (int k = 0; k < 8; ++k) s += l[8 * h + k];
      }
      s -= kZero * z[r];
      y[(m0 + t) * N + n0 + r] = bias ? s + bias[n0 + r] : s;
    }
  }
}

// Tokens [0, M) over one 4-row group: tiles of up to 6 tokens, the rows' blocks from L1 after
// the first tile.
template <int KIND>
inline void gv_group(const QAct& a, int64_t M, const int8_t* xb, int64_t xs, const uint8_t* w, size_t rb, int64_t n0,
                     int nr, const float* bias, float* y, int64_t N, const uint8_t* pf) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) gv_tile<KIND, 6>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, m == 0 ? pf : nullptr);
  const uint8_t* p = m == 0 ? pf : nullptr;
  switch (M - m) {
    case 5: gv_tile<KIND, 5>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, p); break;
    case 4: gv_tile<KIND, 4>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, p); break;
    case 3: gv_tile<KIND, 3>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, p); break;
    case 2: gv_tile<KIND, 2>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, p); break;
    case 1: gv_tile<KIND, 1>(a, m, xb, xs, w, rb, n0, nr, bias, y, N, p); break;
    default: break;
  }
}

// ---- K-quants (Q4_K, Q6_K): one row at a time ----
// A 256-element block is four zmm of 64 weights in element order, so the activation bytes are read
// as quantized (no relayout); lane l of chunk c (elements 64c + 4l .. + 3) belongs to activation
// block 2c + l/8 and 16-element group 4c + l/4.
//   Q4_K: qs[32c .. 32c + 31] low nibbles are sub-block 2c, high nibbles 2c + 1: [lo | hi] is chunk
//         c, unsigned 0..15. Lane scale d sc_j dx_j (one product of 8 floats per block and token,
//         spread by a permute per chunk); mins: y -= sum_j dmin m_j s_j (8 floats, one FMA).
//   Q6_K: ql's 64 bytes of each half give chunks 2h (low nibbles) and 2h + 1 (high), qh's 32 bytes
//         the two top bits of both (one shift, two masks, one or each); unsigned 0..63. The zero
//         point 32 is taken out by starting each dot at -32 sum_4 x (per token and lane, once per
//         call: xn). Lane scale d sc_g dx_j (16 floats per block and token).
// Four independent accumulators per token (one per chunk); the int32 dots are exact.
constexpr int kGvQ4K = 3, kGvQ6K = 4;

template <int KIND, int MR>
inline void gvk_row(const QAct& a, int64_t m0, const int32_t* xn, const uint8_t* row, int64_t n, const float* bias,
                    float* y, int64_t N, const uint8_t* pf) {
  constexpr int kB = KIND == kGvQ4K ? 144 : 210;
  const int64_t K = a.K, nbk = K / 256;
  __m512 acc[MR][4];
  __m256 macc[MR];
  for (int t = 0; t < MR; ++t) {
    for (int c = 0; c < 4; ++c) acc[t][c] = _mm512_setzero_ps();
    macc[t] = _mm256_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  // lane -> its scale: Q4_K activation block 2c + l/8 of the 8; Q6_K group 4c + l/4 of the 16
  __m512i li[4];
  for (int c = 0; c < 4; ++c)
    li[c] = KIND == kGvQ4K ? _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1,
                                               2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                               2 * c + 1)
                           : _mm512_setr_epi32(4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1,
                                               4 * c + 1, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 3,
                                               4 * c + 3, 4 * c + 3, 4 * c + 3);
  const __m512i dxe = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);  // Q6_K: group -> block
  for (int64_t b = 0; b < nbk; ++b) {
    const uint8_t* blk = row + size_t(b) * kB;
    if (pf)
      for (int o = 0; o < kB; o += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + b * kB + o), _MM_HINT_T0);
    __m512i u[4];
    __m512 fs;      // Q4_K: lanes 0..7 d sc_j; Q6_K: lanes 0..15 d sc_g
    __m256 fm{};    // Q4_K: dmin m_j
    if constexpr (KIND == kGvQ4K) {
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(int(uint32_t(gv_u16(blk)) | uint32_t(gv_u16(blk + 2)) << 16)));
      uint32_t sm[4];
      k_scales_mins8(blk + 4, sm);
      const __m256i sc = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(sm[1]), int(sm[0])));
      const __m256i mn = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, int(sm[3]), int(sm[2])));
      const __m256 d8 = _mm256_broadcastss_ps(dd), dm8 = _mm256_broadcastss_ps(_mm_shuffle_ps(dd, dd, 1));
      fs = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtepi32_ps(sc), d8));
      fm = _mm256_mul_ps(_mm256_cvtepi32_ps(mn), dm8);
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
        u[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
      }
    } else {
      const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(int(gv_u16(blk + 208)))));
      fs = _mm512_mul_ps(gv_i8_ps(blk + 192), _mm512_set1_ps(d));
      for (int h = 0; h < 2; ++h) {
        const __m512i lo = _mm512_loadu_si512(blk + 64 * h);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 2), 1);
        u[2 * h] = _mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_and_si512(_mm512_slli_epi16(qq, 4), m30));
        u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), m4), _mm512_and_si512(qq, m30));
      }
    }
    for (int t = 0; t < MR; ++t) {
      const int64_t m = m0 + t, ab = m * a.nb + 8 * b;
      const __m256 dx = _mm256_loadu_ps(a.d + ab);
      __m512 comb;
      if constexpr (KIND == kGvQ4K) {
        comb = _mm512_castps256_ps512(_mm256_mul_ps(_mm512_castps512_ps256(fs), dx));
        macc[t] = _mm256_fmadd_ps(fm, _mm256_loadu_ps(a.s + ab), macc[t]);
      } else {
        comb = _mm512_mul_ps(fs, _mm512_permutexvar_ps(dxe, _mm512_castps256_ps512(dx)));
      }
      const int8_t* xq = a.q + m * K + 256 * b;
      for (int c = 0; c < 4; ++c) {
        const __m512i x = _mm512_loadu_si512(xq + 64 * c);
        const __m512i init = KIND == kGvQ6K ? _mm512_loadu_si512(xn + m * (K / 4) + 64 * b + 16 * c)
                                            : _mm512_setzero_si512();
        const __m512i dot = _mm512_dpbusd_epi32(init, u[c], x);
        acc[t][c] = _mm512_fmadd_ps(gv_cvt(dot), _mm512_permutexvar_ps(li[c], comb), acc[t][c]);
      }
    }
  }
  for (int t = 0; t < MR; ++t) {
    alignas(64) float f[16];
    _mm512_store_ps(f, _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3])));
    alignas(32) float z[8];
    _mm256_store_ps(z, macc[t]);
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += f[k];
    for (int k = 0; k < 8; ++k) s -= z[k];
    y[(m0 + t) * N + n] = bias ? s + bias[n] : s;
  }
}

// Tokens [0, M) over one row: tiles of up to 4 tokens, the row's blocks from L1 after the first.
template <int KIND>
inline void gvk_rows(const QAct& a, int64_t M, const int32_t* xn, const uint8_t* w, size_t rb, int64_t n0, int64_t n1,
                     const float* bias, float* y, int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + size_t(n) * rb;
    const uint8_t* pf = n + 1 < N ? row + rb : nullptr;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) gvk_row<KIND, 4>(a, m, xn, row, n, bias, y, N, m == 0 ? pf : nullptr);
    const uint8_t* p = m == 0 ? pf : nullptr;
    switch (M - m) {
      case 3: gvk_row<KIND, 3>(a, m, xn, row, n, bias, y, N, p); break;
      case 2: gvk_row<KIND, 2>(a, m, xn, row, n, bias, y, N, p); break;
      case 1: gvk_row<KIND, 1>(a, m, xn, row, n, bias, y, N, p); break;
      default: break;
    }
  }
}

// y[M, N] = x[M, K] . w^T (+ bias) over Q4_K (kGvQ4K) or Q6_K (kGvQ6K) rows; K a multiple of 256.
inline void gemv_k(const float* x, const uint8_t* w, int kind, const float* bias, float* y, int64_t M, int64_t N,
                   int64_t K) {
  const QAct a = quantize_act(x, M, K, /*avx2=*/true);
  const size_t rb = size_t(K / 256) * size_t(kind == kGvQ4K ? 144 : 210);
  thread_local std::vector<int32_t> xnv;
  const int32_t* xn = nullptr;
  if (kind == kGvQ6K) {
    if (int64_t(xnv.size()) < M * (K / 4)) xnv.resize(size_t(M * (K / 4)));
    const __m512i z32 = _mm512_set1_epi8(32);
    for (int64_t i = 0; i < M * K; i += 64)
      _mm512_storeu_si512(xnv.data() + i / 4,
                          _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), z32, _mm512_loadu_si512(a.q + i))));
    xn = xnv.data();
  }
  parallel_for(N, 16, int64_t(rb) * N * M >= (int64_t(1) << 15) ? 16 : INT64_MAX, [&](int64_t nbeg, int64_t nend) {
    if (kind == kGvQ4K) gvk_rows<kGvQ4K>(a, M, xn, w, rb, nbeg, nend, bias, y, N);
    else gvk_rows<kGvQ6K>(a, M, xn, w, rb, nbeg, nend, bias, y, N);
  });
}

// y[M, N] = x[M, K] . w^T (+ bias), w of GvKind kind (Q8_0, Q4_0, Q5_0), a few tokens (decode,
// verification passes): one pass over the weights for all M tokens.
inline void gemv(const float* x, const uint8_t* w, int kind, const float* bias, float* y, int64_t M, int64_t N,
                 int64_t K) {
  const QAct a = quantize_act(x, M, K, /*avx2=*/true);
  const int64_t nb = a.nb;
  const bool q4 = kind != kGvQ8;
  const size_t rb = size_t(nb) * size_t(gv_block_bytes(kind));
  thread_local std::vector<int8_t> lay;
  const int8_t* xb = a.q;
  int64_t xs = K;
  if (q4) {
    if (int64_t(lay.size()) < 64 * nb * M) lay.resize(size_t(64 * nb * M));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < nb; ++b) {
        int8_t* o = lay.data() + 64 * (m * nb + b);
        const int8_t* q = a.q + m * K + 32 * b;
        std::memcpy(o, q, 16), std::memcpy(o + 16, q, 16), std::memcpy(o + 32, q + 16, 16), std::memcpy(o + 48, q + 16, 16);
      }
    xb = lay.data();
    xs = 64 * nb;
  }
  // Boundaries on 16 rows keep threads off each other's cache lines (as the AVX2 GEMV).
  parallel_for(N, 16, int64_t(rb) * N * M >= (int64_t(1) << 15) ? 32 : INT64_MAX, [&](int64_t nbeg, int64_t nend) {
    for (int64_t n = nbeg; n < nend; n += 4) {
      const int nr = int(std::min<int64_t>(4, nend - n));
      const uint8_t* pf = n + 20 <= N ? w + size_t(n + 16) * rb : nullptr;
      if (kind == kGvQ4) gv_group<kGvQ4>(a, M, xb, xs, w, rb, n, nr, bias, y, N, pf);
      else if (kind == kGvQ5) gv_group<kGvQ5>(a, M, xb, xs, w, rb, n, nr, bias, y, N, pf);
      else gv_group<kGvQ8>(a, M, xb, xs, w, rb, n, nr, bias, y, N, pf);
    }
  });
}

}  // namespace kvboost::kernels::cpu::KVB_GV_NS
