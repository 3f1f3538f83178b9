// Internal: vector e^x for the AVX2+FMA builds (flash attention's softmax, SiLU). Include only
// from translation units compiled with -mavx2 -mfma: the namespace holds AVX2 code only, so the
// linker can never merge it into a baseline build.
#pragma once
#include <immintrin.h>

namespace kvboost::kernels::cpu::avx2_math {

// e^x, Cephes expf: Cody-Waite reduction by ln 2 and a degree-6 polynomial, ~1-2 ulp. Inputs
// are clamped to +-88.376 (127.5 ln 2): below, including -inf, the result is +0; at the top the
// exponent field may overflow to +inf where expf is still finite (~2e38; expf overflows from
// 88.72 on). NaN is clamped, not propagated.
inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  // 2^fx through the exponent field; fx == -127 (the clamp) encodes +0.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace kvboost::kernels::cpu::avx2_math
