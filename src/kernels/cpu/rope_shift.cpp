// rope_shift: one rotation by delta per (i, i + head_dim/2) pair. Memory-bound and run once per
// reused chunk and layer, so a single scalar version (the compiler vectorises the inner loop).
#include <cmath>
#include <vector>

#include "kvboost/kernels.h"

namespace kvboost::kernels {

void rope_shift(float* k, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* inv_freq,
                int64_t delta) {
  if (delta == 0) return;
  const int64_t half = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double ang = double(delta) * double(inv_freq[i]);
    c[size_t(i)] = float(std::cos(ang));
    s[size_t(i)] = float(std::sin(ang));
  }
  for (int64_t r = 0; r < n_tokens * n_heads; ++r) {
    float* x = k + r * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * c[size_t(i)] - b * s[size_t(i)];
      x[i + half] = b * c[size_t(i)] + a * s[size_t(i)];
    }
  }
}

}  // namespace kvboost::kernels
