// Fused element-wise kernels against the unfused sequences they replace in the decoder, on every
// ISA path and thread count: add_rms_norm (`x += d; y = rms_norm(x)`), and the threaded
// rms_norm / silu_mul (row or element ranges split over the pool) against one thread.
#include <cmath>
#include <limits>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kernel_test_util.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::kernels;

namespace {
using kernel_test::IsaGuard;
using kernel_test::isas;
using kernel_test::randv;

struct Shape {
  int64_t rows, dim;
};
// Small (one thread) and prefill-sized (split over the pool: rows * dim >= 32768) shapes.
const Shape kShapes[] = {{1, 1}, {3, 8}, {5, 63}, {1, 896}, {7, 896}, {64, 896}, {37, 2048}, {3, 8192}};

TEST(FusedKernels, AddRmsNormMatchesAddThenRmsNorm) {
  IsaGuard g;
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const Shape& s : kShapes) {
        const int64_t n = s.rows * s.dim;
        const auto x0 = randv(size_t(n), 11, 2.0f), d = randv(size_t(n), 12, 0.5f), w = randv(size_t(s.dim), 13);
        // Unfused, as the decoder ran it: the add loop, then rms_norm on this path and the reference.
        auto xu = x0;
        for (int64_t i = 0; i < n; ++i) xu[size_t(i)] += d[size_t(i)];
        std::vector<float> yu(static_cast<size_t>(n)), yr(static_cast<size_t>(n));
        rms_norm(xu.data(), w.data(), yu.data(), s.rows, s.dim, 1e-6f);
        rms_norm_ref(xu.data(), w.data(), yr.data(), s.rows, s.dim, 1e-6f);
        // Fused, into its own output and in place over d (the decoder's y == d).
        auto xf = x0, xa = x0, ya = d;
        std::vector<float> yf(static_cast<size_t>(n));
        add_rms_norm(xf.data(), d.data(), w.data(), yf.data(), s.rows, s.dim, 1e-6f);
        add_rms_norm(xa.data(), ya.data(), w.data(), ya.data(), s.rows, s.dim, 1e-6f);
        auto xr = x0;
        std::vector<float> yrf(static_cast<size_t>(n));
        add_rms_norm_ref(xr.data(), d.data(), w.data(), yrf.data(), s.rows, s.dim, 1e-6f);
        const std::string what = std::string(isa_name(isa)) + " threads " + std::to_string(threads) + " [" +
                                 std::to_string(s.rows) + ", " + std::to_string(s.dim) + "]";
        ASSERT_EQ(xf, xu) << what;  // the residual stream: the same f32 additions
        ASSERT_EQ(xa, xu) << what;
        ASSERT_EQ(xr, xu) << what;
        ASSERT_EQ(ya, yf) << what;  // aliasing y with d changes nothing
        for (int64_t i = 0; i < n; ++i) {
          const float tol = 2e-6f * (1 + std::fabs(yr[size_t(i)]));
          ASSERT_NEAR(yf[size_t(i)], yu[size_t(i)], tol) << what << " i=" << i;
          ASSERT_NEAR(yf[size_t(i)], yr[size_t(i)], 1e-5f * (1 + std::fabs(yr[size_t(i)]))) << what << " i=" << i;
          ASSERT_NEAR(yrf[size_t(i)], yr[size_t(i)], tol) << what << " i=" << i;
        }
      }
    }
  }
}

TEST(FusedKernels, ThreadedRmsNormEqualsOneThread) {
  IsaGuard g;
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (const Shape& s : kShapes) {
      const int64_t n = s.rows * s.dim;
      const auto x = randv(size_t(n), 21, 3.0f), w = randv(size_t(s.dim), 22);
      std::vector<float> y1(static_cast<size_t>(n)), y3(static_cast<size_t>(n)), yi = x;
      set_num_threads(1);
      rms_norm(x.data(), w.data(), y1.data(), s.rows, s.dim, 1e-5f);
      set_num_threads(3);
      rms_norm(x.data(), w.data(), y3.data(), s.rows, s.dim, 1e-5f);
      rms_norm(yi.data(), w.data(), yi.data(), s.rows, s.dim, 1e-5f);  // in place
      ASSERT_EQ(y1, y3) << isa_name(isa) << " [" << s.rows << ", " << s.dim << "]";  // rows are independent
      ASSERT_EQ(yi, y1) << isa_name(isa) << " [" << s.rows << ", " << s.dim << "]";
    }
  }
}

TEST(FusedKernels, SiluMulVectorExpMatchesReference) {
  IsaGuard g;
  // Lengths around the 8-lane vectors and the 16-float thread ranges, and one large enough to
  // be split over the pool (>= 32768).
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(17), int64_t(4864), int64_t(8 * 4864 + 5)}) {
        auto gate = randv(size_t(n), 31, 4.0f);
        const auto up = randv(size_t(n), 32);
        // The exp's edges: saturation on both sides, zeros, large magnitudes.
        const float edge[] = {0.0f, -0.0f, 88.0f, -88.0f, 88.5f, -88.5f, 100.0f, -100.0f, 1e-20f, -1e-20f, 20.0f, -20.0f};
        for (size_t i = 0; i < std::size(edge) && i < gate.size(); ++i) gate[i * gate.size() / std::size(edge)] = edge[i];
        std::vector<float> y(static_cast<size_t>(n)), yr(static_cast<size_t>(n));
        silu_mul(gate.data(), up.data(), y.data(), n);
        silu_mul_ref(gate.data(), up.data(), yr.data(), n);
        auto ya = gate;  // y aliasing gate
        silu_mul(ya.data(), up.data(), ya.data(), n);
        ASSERT_EQ(ya, y);
        for (int64_t i = 0; i < n; ++i) {
          const double gi = gate[size_t(i)], exact = gi / (1 + std::exp(-gi)) * up[size_t(i)];
          ASSERT_TRUE(std::isfinite(y[size_t(i)])) << isa_name(isa) << " g=" << gi;
          ASSERT_NEAR(y[size_t(i)], yr[size_t(i)], 1e-6f * (1 + std::fabs(yr[size_t(i)]))) << isa_name(isa) << " g=" << gi;
          ASSERT_NEAR(y[size_t(i)], exact, 1e-6 * (1 + std::fabs(exact))) << isa_name(isa) << " g=" << gi;
        }
      }
    }
  }
}

}  // namespace
