// AVX2 dequantization of ggml blocks. Same f32 operations as the scalar reference (multiply,
// then subtract; compiled with -ffp-contract=off so nothing is fused), so the results are
// bit-identical to it and to the gguf Python package.
#include <immintrin.h>

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

// 32 uint8 / int8 values -> 4 x 8 floats, scaled: y = d * q - m (m may be zero).
template <bool Signed>
inline void store32(__m256i q, __m256 d, __m256 m, float* y) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int i = 0; i < 4; ++i) {
    const __m256i w = Signed ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]);
    _mm256_storeu_ps(y + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(w)), m));
  }
}

// 16 int8 values -> 2 x 8 floats times d.
inline void store16_signed(__m128i q, __m256 d, float* y) {
  _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
}

void deq_q8_0(const uint8_t* b, float* y, int64_t nb) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(h2f(b));
    store32<true>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), d, zero, y);
  }
}

void deq_q4_0(const uint8_t* b, float* y, int64_t nb) {
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const __m256 d = _mm256_set1_ps(h2f(b));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);
    store16_signed(lo, d, y);
    store16_signed(hi, d, y + 16);
  }
}

void deq_q5_0(const uint8_t* b, float* y, int64_t nb) {
  const __m128i mask = _mm_set1_epi8(0x0F), k16 = _mm_set1_epi8(16);
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const __m256 d = _mm256_set1_ps(h2f(b));
    const __m256i hb = q5_high_bits(b + 2);  // 0x10 where element j has its 5th bit
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
    const __m128i lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(q, mask), _mm256_castsi256_si128(hb)), k16);
    const __m128i hi = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm256_extracti128_si256(hb, 1)), k16);
    store16_signed(lo, d, y);
    store16_signed(hi, d, y + 16);
  }
}

template <bool Q5>
void deq_q45_k(const uint8_t* b, float* y, int64_t nb) {
  const __m256i mask = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const int64_t bytes = Q5 ? 176 : 144;
  for (int64_t i = 0; i < nb; ++i, b += bytes, y += 256) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t* sc = b + 4;
    const uint8_t* qs = b + (Q5 ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (Q5) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      for (int s = 0; s < 2; ++s) {
        const int j = 2 * c + s;
        uint8_t scale, min;
        k_scale_min(sc, j, scale, min);
        __m256i v = _mm256_and_si256(s ? _mm256_srli_epi16(q, 4) : q, mask);
        if constexpr (Q5) {
          // bit j of each qh byte (a 16-bit shift keeps bit j of both bytes at their bit 0)
          const __m256i hbit = _mm256_and_si256(_mm256_srli_epi16(qh, j), one);
          v = _mm256_or_si256(v, _mm256_slli_epi16(hbit, 4));
        }
        store32<false>(v, _mm256_set1_ps(d * float(scale)), _mm256_set1_ps(dmin * float(min)), y + 32 * j);
      }
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y, int64_t nb) {
  const __m256i mask = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i, b += 210, y += 256) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = h2f(b + 208);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const __m256i l = k % 2 ? ql1 : ql0;
        const __m256i lo = _mm256_and_si256(k / 2 ? _mm256_srli_epi16(l, 4) : l, mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), three);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), k32);
        const int e = 128 * h + 32 * k;
        const __m256 d0 = _mm256_set1_ps(d * float(sc[e / 16])), d1 = _mm256_set1_ps(d * float(sc[e / 16 + 1]));
        // elements e..e+15 use scale e/16, e+16..e+31 the next one
        const __m128i qlo = _mm256_castsi256_si128(q), qhi = _mm256_extracti128_si256(q, 1);
        store16_signed(qlo, d0, y + e);
        store16_signed(qhi, d1, y + e + 16);
      }
    }
  }
}

}  // namespace

void dequantize_row_avx2(const void* src, GgmlType t, float* dst, int64_t n) {
  check_dequant_args(t, n);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i))));
      for (; i < n; ++i) dst[i] = h2f(s + 2 * i);
      return;
    }
    case GgmlType::BF16: {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
      for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case GgmlType::Q8_0: return deq_q8_0(s, dst, n / 32);
    case GgmlType::Q4_0: return deq_q4_0(s, dst, n / 32);
    case GgmlType::Q5_0: return deq_q5_0(s, dst, n / 32);
    case GgmlType::Q4_K: return deq_q45_k<false>(s, dst, n / 256);
    case GgmlType::Q5_K: return deq_q45_k<true>(s, dst, n / 256);
    case GgmlType::Q6_K: return deq_q6_k(s, dst, n / 256);
  }
}

}  // namespace kvboost::kernels::cpu
