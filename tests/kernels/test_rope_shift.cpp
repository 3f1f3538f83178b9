// rope_shift against recomputing RoPE from scratch at the new position.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvboost/kernels.h"

namespace kvboost::kernels {
namespace {

// rope_rotate_half with tables evaluated as the model evaluates them (float angle, double cos).
void rotate_at(float* x, const std::vector<int64_t>& pos, int64_t heads, int64_t hd, const std::vector<float>& inv) {
  const int64_t n = int64_t(pos.size()), half = hd / 2;
  std::vector<float> c(size_t(n * half)), s(size_t(n * half));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = float(pos[size_t(t)]) * inv[size_t(i)];
      c[size_t(t * half + i)] = float(std::cos(double(ang)));
      s[size_t(t * half + i)] = float(std::sin(double(ang)));
    }
  rope_rotate_half(x, c.data(), s.data(), n, heads, hd);
}

TEST(RopeShift, EqualsRotationAtTheNewPosition) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t hd : {64, 80, 128}) {
    for (int64_t delta : {-700, -1, 1, 37, 1500}) {
      const int64_t heads = 2, n = 33, p0 = 800;
      std::vector<float> inv(size_t(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(1e6f, float(2 * i) / float(hd));
      std::vector<float> raw(size_t(n * heads * hd));
      for (auto& v : raw) v = nd(rng);
      std::vector<int64_t> pos(static_cast<size_t>(n)), moved(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = p0 + t, moved[size_t(t)] = p0 + t + delta;
      std::vector<float> shifted = raw, fresh = raw;
      rotate_at(shifted.data(), pos, heads, hd, inv);
      rope_shift(shifted.data(), n, heads, hd, inv.data(), delta);
      rotate_at(fresh.data(), moved, heads, hd, inv);
      double max_err = 0;
      for (size_t i = 0; i < raw.size(); ++i) max_err = std::max(max_err, double(std::abs(shifted[i] - fresh[i])));
      // float angles of positions ~2,300 carry ~1e-4 rad of rounding; the shift itself is exact.
      EXPECT_LT(max_err, 2e-3) << "hd " << hd << " delta " << delta;
      // and the shift is not the identity
      double moved_by = 0;
      std::vector<float> orig = raw;
      rotate_at(orig.data(), pos, heads, hd, inv);
      for (size_t i = 0; i < raw.size(); ++i) moved_by = std::max(moved_by, double(std::abs(shifted[i] - orig[i])));
      EXPECT_GT(moved_by, 1e-2);
    }
  }
}

TEST(RopeShift, ZeroDeltaLeavesKeysAlone) {
  std::vector<float> k(128, 0.5f), inv(32, 0.1f);
  rope_shift(k.data(), 1, 2, 64, inv.data(), 0);
  for (float v : k) EXPECT_EQ(v, 0.5f);
}

}  // namespace
}  // namespace kvboost::kernels
