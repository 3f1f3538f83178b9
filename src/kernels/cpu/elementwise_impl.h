// Internal: element-wise kernels written once, compiled twice — into elementwise.cpp for the
// baseline ISA (the scalar reference) and into elementwise_avx2.cpp with AVX2 enabled, where
// the `omp simd` loops vectorise.
#pragma once
#include <cmath>
#include <cstdint>

// The includer defines KVBOOST_ISA_NS (scalar, avx2): each build gets its own namespace, so the
// linker can never merge the AVX2 and baseline copies of these inline functions (ODR).
namespace kvboost::kernels::cpu::KVBOOST_ISA_NS {

inline void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim,
                     float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

// x += d, then y = rms_norm(x) * w, row by row in one pass over x and d: the same f32
// operations as the loop `x[i] += d[i]` followed by rms_norm above, so the results agree up to
// the order in which the vectorised sum of squares is added (bit-identical with GCC here). y may
// alias d (a row of d is consumed before that row of y is written), not x.
inline void add_rms_norm(float* x, const float* d, const float* w, float* y, int64_t n_rows,
                         int64_t dim, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* xr = x + r * dim;
    const float* dr = d + r * dim;
    float* yr = y + r * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) {
      const float v = xr[i] + dr[i];
      xr[i] = v;
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

inline void silu_mul(const float* gate, const float* up, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// GELU, tanh approximation (ggml_gelu_f32, PyTorch gelu(approximate="tanh")), times up.
inline void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCoef = 0.044715f;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoef * g * g))) * up[i];
  }
}

}  // namespace kvboost::kernels::cpu::KVBOOST_ISA_NS
