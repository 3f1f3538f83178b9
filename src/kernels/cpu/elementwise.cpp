// Scalar references of the element-wise kernels, RoPE, and the sampling math.
#include <cmath>
#include <limits>

#include "cpu/cpu_kernels.h"
#define KVBOOST_ISA_NS scalar_impl
#include "cpu/elementwise_impl.h"

namespace kvboost::kernels {

void rms_norm_ref(const float* x, const float* w, float* y, int64_t n_rows, int64_t dim,
                  float eps) {
  cpu::scalar_impl::rms_norm(x, w, y, n_rows, dim, eps);
}

void add_rms_norm_ref(float* x, const float* d, const float* w, float* y, int64_t n_rows, int64_t dim,
                      float eps) {
  cpu::scalar_impl::add_rms_norm(x, d, w, y, n_rows, dim, eps);
}

void silu_mul_ref(const float* gate, const float* up, float* y, int64_t n) {
  cpu::scalar_impl::silu_mul(gate, up, y, n);
}

void gelu_tanh_mul_ref(const float* gate, const float* up, float* y, int64_t n) {
  cpu::scalar_impl::gelu_tanh_mul(gate, up, y, n);
}

void rope_rotate_half(float* x, const float* cos, const float* sin, int64_t n_tokens,
                      int64_t n_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // HF: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void softmax(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  if (mx == -std::numeric_limits<float>::infinity()) {  // everything masked: uniform
    for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / float(n);
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

int64_t argmax_ref(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace kvboost::kernels
