#include <immintrin.h>

#include <cmath>

#include "cpu/cpu_kernels.h"
#include "cpu/exp_avx2.h"
#define KVBOOST_ISA_NS avx2_impl
#include "cpu/elementwise_impl.h"

namespace kvboost::kernels::cpu {

void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim,
                   float eps) {
  avx2_impl::rms_norm(x, w, y, n_rows, dim, eps);
}

void add_rms_norm_avx2(float* x, const float* d, const float* w, float* y, int64_t n_rows, int64_t dim,
                       float eps) {
  avx2_impl::add_rms_norm(x, d, w, y, n_rows, dim, eps);
}

// silu(g) * u = g / (1 + e^-g) * u with the vector exp (GCC does not vectorise std::exp without
// -ffast-math: the `omp simd` loop of elementwise_impl.h calls expf once per element, ~10 ns,
// which made SwiGLU of a 512-token prefill cost as much as a small matmul).
void silu_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, avx2_math::exp256(_mm256_sub_ps(zero, g))));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// GELU(tanh) as g * sigmoid(2u) = g / (1 + e^-2u), u = sqrt(2/pi) (g + 0.044715 g^3)
// (0.5 (1 + tanh u) = sigmoid(2u)), with the vector exp: the `omp simd` loop called tanhf per
// element, which took ~a fifth of a Gemma 3 prefill (docs/measurements/2026-12-01-qgemm-avx2.md).
// Large |g|: e^-2u saturates (+inf or 0), giving -0 or g, as the reference does.
void gelu_tanh_mul_avx2(const float* gate, const float* up, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(0.044715f);
  const __m256 m2k = _mm256_set1_ps(-2.0f * 0.79788456080286535588f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_mul_ps(_mm256_mul_ps(m2k, g), _mm256_fmadd_ps(_mm256_mul_ps(c, g), g, one));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, avx2_math::exp256(inner)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  if (i < n) avx2_impl::gelu_tanh_mul(gate + i, up + i, y + i, n - i);
}

// The reference's answer in two passes: the largest value (MAXPS returns its second operand
// when either is NaN, so NaNs never enter the running maximum), then the first index that holds
// it. The scalar loop's branch on every element cost ~0.4 ms per token over Gemma 3's 262k-entry
// vocabulary; these passes read the row at memory speed.
int64_t argmax_avx2(const float* x, int64_t n) {
  if (n <= 0) return 0;
  if (!(x[0] == x[0])) return 0;  // NaN at 0: nothing compares greater (the reference)
  __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
  __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  float best = _mm_cvtss_f32(h);
  for (; i < n; ++i)
    if (x[i] > best) best = x[i];
  const __m256 b = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
    if (mask) return i + __builtin_ctz(unsigned(mask));
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // (not reached: best is one of the values)
}

}  // namespace kvboost::kernels::cpu
