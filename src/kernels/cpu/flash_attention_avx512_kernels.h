// Internal: the AVX-512 micro-kernels of the paged FlashAttention-2 kernel (score tile, exp,
// row max, P·V; flash_attention_impl.h has the tiling, masking, online softmax and split-K they
// plug into). Included only by flash_attention_impl.h, inside its per-ISA namespace, when the
// including translation unit defines KVB_FA_AVX512_NS. Two translation units do:
//   - src/kernels/cpu/flash_attention_avx512.cpp: <immintrin.h>, -mavx512f -mavx512bw -mavx512vl
//     -mfma -mf16c, namespace flash_avx512; the path dispatch runs on AVX-512 CPUs;
//   - tests/kernels/flash_attention_avx512_emu.cpp: SIMDe's portable AVX-512 (libsimde-dev,
//     SIMDE_ENABLE_NATIVE_ALIASES) on an AVX2 build, namespace flash_avx512_emu, so that this
//     same source is tested on CPUs without AVX-512.
// Hence only intrinsics that SIMDe 0.7.4 (Debian 12) implements are used, plus the two it lacks,
// _mm512_maskz_loadu_ps and _mm512_mask_storeu_ps, which the emulated build defines lane by lane.
// Not used for that reason: _mm512_reduce_* (sums and maxima fold to 256 bits instead) and
// _mm512_cvtps_epi32 (2^n is built with the 1.5·2^23 magic-number trick).
//
// Tails (head_dim % 16, key counts % 16) use masked loads and stores: lanes outside the mask are
// never read or written, so no access goes past the end of a K/V row, a score row or an
// accumulator row.
#ifndef KVB_FA_AVX512_NS
#error "include only through flash_attention_impl.h, with KVB_FA_AVX512_NS defined"
#endif

inline __mmask16 first_lanes(int64_t n) { return __mmask16((1u << n) - 1u); }  // 0 <= n <= 16

// Lanes i and i + 8 added: the 512-bit vector folded to 256 bits (AVX512F only: no 32x8 extract,
// which needs AVX512DQ).
inline __m256 fold_add(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

inline float reduce_max(__m512 a) {
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(a),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// e^x, the same Cephes expf as the AVX2 build's exp256, lane for lane: clamp to
// +-88.376, Cody-Waite reduction by ln 2, degree-6 polynomial, ~1-2 ulp. Below the clamp
// (including -inf, the masked scores) the result is exactly +0.
inline __m512 exp512(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-88.3762626647949f);
  x = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  // floor. The parentheses matter: SIMDe 0.7.4's 512-bit roundscale pastes its imm8 unbracketed
  // into `imm8 >> 4`, which turns 0x01 | 0x08 into a scale of 2 (floor to halves).
  fx = _mm512_roundscale_ps(fx, (_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  // 2^fx, fx an integer in [-127, 128]: fx + (1.5·2^23 + 127) is exact and holds fx + 127 in
  // the low mantissa bits; shifting left by 23 moves them into the exponent field (and shifts
  // out the rest). fx == -127 (the lower clamp) encodes +0.
  const __m512i e =
      _mm512_slli_epi32(_mm512_castps_si512(_mm512_add_ps(fx, _mm512_set1_ps(12583039.0f))), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// S[r][t] = scale * q_r · k_t for r < n_rows (rounded up to even: qrow[n_rows] must be valid)
// and t < n_keys4 (a multiple of 4: kp[] padded). 2 rows × 4 keys per step, 16 lanes of head_dim
// at a time (the tail masked); the eight sums fold to 256 bits and reduce together in hsum8.
inline void score_tile(const float* const* qrow, int64_t n_rows, const float* const* kp,
                       int64_t n_keys4, int64_t hd, float scale, float* S) {
  const int64_t hd16 = hd & ~int64_t(15);
  const __mmask16 m = first_lanes(hd - hd16);  // 0: no tail
  const __m256 vs = _mm256_set1_ps(scale);
  for (int64_t r = 0; r < n_rows; r += 2) {
    const float* q0 = qrow[r];
    const float* q1 = qrow[r + 1];
    for (int64_t t = 0; t < n_keys4; t += 4) {
      const float *k0 = kp[t], *k1 = kp[t + 1], *k2 = kp[t + 2], *k3 = kp[t + 3];
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int64_t d = 0; d < hd16; d += 16) {
        const __m512 qa = _mm512_loadu_ps(q0 + d), qb = _mm512_loadu_ps(q1 + d);
        const __m512 x0 = _mm512_loadu_ps(k0 + d), x1 = _mm512_loadu_ps(k1 + d);
        const __m512 x2 = _mm512_loadu_ps(k2 + d), x3 = _mm512_loadu_ps(k3 + d);
        a0 = _mm512_fmadd_ps(qa, x0, a0); a1 = _mm512_fmadd_ps(qa, x1, a1);
        a2 = _mm512_fmadd_ps(qa, x2, a2); a3 = _mm512_fmadd_ps(qa, x3, a3);
        a4 = _mm512_fmadd_ps(qb, x0, a4); a5 = _mm512_fmadd_ps(qb, x1, a5);
        a6 = _mm512_fmadd_ps(qb, x2, a6); a7 = _mm512_fmadd_ps(qb, x3, a7);
      }
      if (m) {  // masked lanes load as 0
        const __m512 qa = _mm512_maskz_loadu_ps(m, q0 + hd16), qb = _mm512_maskz_loadu_ps(m, q1 + hd16);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, k0 + hd16), x1 = _mm512_maskz_loadu_ps(m, k1 + hd16);
        const __m512 x2 = _mm512_maskz_loadu_ps(m, k2 + hd16), x3 = _mm512_maskz_loadu_ps(m, k3 + hd16);
        a0 = _mm512_fmadd_ps(qa, x0, a0); a1 = _mm512_fmadd_ps(qa, x1, a1);
        a2 = _mm512_fmadd_ps(qa, x2, a2); a3 = _mm512_fmadd_ps(qa, x3, a3);
        a4 = _mm512_fmadd_ps(qb, x0, a4); a5 = _mm512_fmadd_ps(qb, x1, a5);
        a6 = _mm512_fmadd_ps(qb, x2, a6); a7 = _mm512_fmadd_ps(qb, x3, a7);
      }
      const __m256 s = _mm256_mul_ps(hsum8(fold_add(a0), fold_add(a1), fold_add(a2), fold_add(a3),
                                           fold_add(a4), fold_add(a5), fold_add(a6), fold_add(a7)),
                                     vs);
      _mm_storeu_ps(S + r * kTileKeys + t, _mm256_castps256_ps128(s));
      _mm_storeu_ps(S + (r + 1) * kTileKeys + t, _mm256_extractf128_ps(s, 1));
    }
  }
}

// s[t] = exp(s[t] - m) for t < n8 (a multiple of 8); returns the sum.
inline float exp_row(float* s, int64_t n8, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= n8; t += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), vm));
    _mm512_storeu_ps(s + t, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (t < n8) {
    const __mmask16 k = first_lanes(n8 - t);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), vm));
    _mm512_mask_storeu_ps(s + t, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  return hsum(fold_add(sum));
}

// max of s[0 .. n8), n8 a multiple of 8 (masked and padding entries hold -inf).
inline float row_max(const float* s, int64_t n8) {
  __m512 mx = _mm512_set1_ps(kNegInf);
  int64_t t = 0;
  for (; t + 16 <= n8; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
  if (t < n8) {
    const __mmask16 k = first_lanes(n8 - t);
    mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + t));
  }
  return reduce_max(mx);
}

// a[0 .. hd_pad) *= alpha, hd_pad a multiple of 8.
inline void scale_row(float* a, int64_t hd_pad, float alpha) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t d = 0;
  for (; d + 16 <= hd_pad; d += 16) _mm512_storeu_ps(a + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), va));
  if (d < hd_pad) {
    const __mmask16 k = first_lanes(hd_pad - d);
    _mm512_mask_storeu_ps(a + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + d), va));
  }
}

// acc[r][d0 .. d0 + 16 NV) += sum_t P[r][t] * v_t[d0 ..], for NR rows at once. MASKED: the last
// of the NV vectors covers only the lanes in `last` (the head_dim tail), in V and in acc.
template <int NR, int NV, bool MASKED>
inline void pv_block(const float* P, float* acc, int64_t hd_pad, const float* const* vp,
                     int64_t n_keys, int64_t d0, __mmask16 last) {
  auto load = [&](const float* p, int v) {
    return MASKED && v == NV - 1 ? _mm512_maskz_loadu_ps(last, p) : _mm512_loadu_ps(p);
  };
  __m512 c[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = load(acc + r * hd_pad + d0 + 16 * v, v);
  for (int64_t t = 0; t < n_keys; ++t) {
    const float* vt = vp[t] + d0;
    __m512 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load(vt + 16 * v, v);
    for (int r = 0; r < NR; ++r) {
      const __m512 p = _mm512_set1_ps(P[r * kTileKeys + t]);
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(p, x[v], c[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* a = acc + r * hd_pad + d0 + 16 * v;
      if (MASKED && v == NV - 1) _mm512_mask_storeu_ps(a, last, c[r][v]);
      else _mm512_storeu_ps(a, c[r][v]);
    }
}

// The columns [d, hd) left after the 64-wide blocks: 1 to 4 vectors.
template <int NR, bool MASKED>
inline void pv_rest(const float* P, float* acc, int64_t hd_pad, const float* const* vp,
                    int64_t n_keys, int64_t d, int64_t nv, __mmask16 last) {
  switch (nv) {
    case 1: return pv_block<NR, 1, MASKED>(P, acc, hd_pad, vp, n_keys, d, last);
    case 2: return pv_block<NR, 2, MASKED>(P, acc, hd_pad, vp, n_keys, d, last);
    case 3: return pv_block<NR, 3, MASKED>(P, acc, hd_pad, vp, n_keys, d, last);
    default: return pv_block<NR, 4, MASKED>(P, acc, hd_pad, vp, n_keys, d, last);
  }
}

template <int NR>
inline void pv_rows(const float* P, float* acc, int64_t hd, int64_t hd_pad, const float* const* vp,
                    int64_t n_keys) {
  int64_t d = 0;
  for (; d + 64 <= hd; d += 64) pv_block<NR, 4, false>(P, acc, hd_pad, vp, n_keys, d, 0);
  const int64_t rest = hd - d;
  if (rest == 0) return;
  const int64_t nv = (rest + 15) / 16, tail = rest - 16 * (nv - 1);
  if (tail == 16) pv_rest<NR, false>(P, acc, hd_pad, vp, n_keys, d, nv, 0);
  else pv_rest<NR, true>(P, acc, hd_pad, vp, n_keys, d, nv, first_lanes(tail));
}

// acc[r] += P[r] · V_tile for r < n_rows; 4 rows × 64 columns per step (16 accumulators of the
// 32 vector registers, each V load feeding four FMAs).
inline void pv_tile(const float* P, int64_t n_rows, const float* const* vp, int64_t n_keys,
                    int64_t hd, int64_t hd_pad, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4)
    pv_rows<4>(P + r * kTileKeys, acc + r * hd_pad, hd, hd_pad, vp, n_keys);
  if (r + 2 <= n_rows) {
    pv_rows<2>(P + r * kTileKeys, acc + r * hd_pad, hd, hd_pad, vp, n_keys);
    r += 2;
  }
  if (r < n_rows) pv_rows<1>(P + r * kTileKeys, acc + r * hd_pad, hd, hd_pad, vp, n_keys);
}
