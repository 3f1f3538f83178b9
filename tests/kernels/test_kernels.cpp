// Every fast kernel against its scalar reference, on every ISA path this CPU has.
#include <cmath>
#include <random>
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

// Weights stored in type wt; returns raw bytes.
std::vector<uint16_t> to_half(const std::vector<float>& v, WType wt) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = wt == WType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  return h;
}

}  // namespace

TEST(Kernels, MatmulMatchesReferenceAllTypesAndShapes) {
  IsaGuard g;
  const int64_t shapes[][3] = {{1, 1, 1},  {1, 7, 13},  {1, 64, 64},   {3, 10, 17},  {4, 3, 8},
                               {5, 172, 64}, {9, 33, 172}, {17, 96, 200}, {64, 130, 96}, {1, 1000, 896}};
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (WType wt : {WType::F32, WType::F16, WType::BF16}) {
      for (auto& s : shapes) {
        const int64_t M = s[0], N = s[1], K = s[2];
        auto x = randv(M * K, 1 + M);
        auto wf = randv(N * K, 2 + N, 0.1f);
        auto bias = randv(N, 3);
        auto wh = to_half(wf, wt);
        const void* w = wt == WType::F32 ? static_cast<const void*>(wf.data()) : wh.data();
        for (bool use_bias : {false, true}) {
          std::vector<float> y(M * N), yr(M * N);
          matmul(x.data(), w, wt, use_bias ? bias.data() : nullptr, y.data(), M, N, K);
          matmul_ref(x.data(), w, wt, use_bias ? bias.data() : nullptr, yr.data(), M, N, K);
          for (int64_t i = 0; i < M * N; ++i) {
            // f32 accumulation over K terms of size ~0.1: error grows like sqrt(K) * eps.
            ASSERT_NEAR(y[i], yr[i], 1e-5f * (1 + std::sqrt(float(K))) * (1 + std::fabs(yr[i])))
                << isa_name(isa) << " " << wtype_name(wt) << " M=" << M << " N=" << N << " K=" << K
                << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(Kernels, MatmulReferenceIsExactOnIntegers) {
  // Small integers make every product and sum exact, so the reference can be checked by hand.
  std::vector<float> x = {1, 2, 3, 4, 5, 6};   // [2, 3]
  std::vector<float> w = {1, 0, -1, 2, 2, 2};  // [2, 3]
  std::vector<float> b = {0.5f, -1};
  std::vector<float> y(4);
  matmul_ref(x.data(), w.data(), WType::F32, b.data(), y.data(), 2, 2, 3);
  EXPECT_EQ(y, (std::vector<float>{-1.5f, 11, -1.5f, 29}));
}

TEST(Kernels, RmsNormAndSiluMatchReference) {
  IsaGuard g;
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (int64_t dim : {1, 8, 63, 896}) {
      auto x = randv(3 * dim, 5), w = randv(dim, 6), y(x), yr(x);
      rms_norm(x.data(), w.data(), y.data(), 3, dim, 1e-5f);
      rms_norm_ref(x.data(), w.data(), yr.data(), 3, dim, 1e-5f);
      for (int64_t i = 0; i < 3 * dim; ++i) ASSERT_NEAR(y[i], yr[i], 1e-5f * (1 + std::fabs(yr[i])));
      // definition check: row has mean square 1 before weighting
      std::vector<float> ones(dim, 1.0f), z(dim);
      rms_norm(x.data(), ones.data(), z.data(), 1, dim, 0.0f);
      double ms = 0;
      for (float v : z) ms += double(v) * v;
      EXPECT_NEAR(ms / dim, 1.0, 1e-4);
      auto gte = randv(dim, 7, 3.0f), up = randv(dim, 8);
      std::vector<float> s(dim), sr(dim);
      silu_mul(gte.data(), up.data(), s.data(), dim);
      silu_mul_ref(gte.data(), up.data(), sr.data(), dim);
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(s[i], sr[i], 1e-5f * (1 + std::fabs(sr[i])));
        const double exact = double(gte[i]) / (1 + std::exp(-double(gte[i]))) * up[i];
        ASSERT_NEAR(s[i], exact, 1e-5 * (1 + std::fabs(exact)));
      }
      gelu_tanh_mul(gte.data(), up.data(), s.data(), dim);
      gelu_tanh_mul_ref(gte.data(), up.data(), sr.data(), dim);
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(s[i], sr[i], 1e-5f * (1 + std::fabs(sr[i])));
        const double g = gte[i];
        const double exact = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
        ASSERT_NEAR(s[i], exact, 1e-5 * (1 + std::fabs(exact)));
      }
      // Large |g| (the vector exp saturates): GELU(g) -> g or -0.
      auto big = randv(dim, 9, 60.0f);
      gelu_tanh_mul(big.data(), up.data(), s.data(), dim);
      gelu_tanh_mul_ref(big.data(), up.data(), sr.data(), dim);
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_TRUE(std::isfinite(s[i])) << big[i];
        ASSERT_NEAR(s[i], sr[i], 1e-5f * (1 + std::fabs(sr[i]))) << big[i];
      }
    }
  }
}

TEST(Kernels, RopeRotateHalfIsARotation) {
  const int64_t hd = 8, half = 4;
  auto x = randv(2 * 3 * hd, 9);
  auto orig = x;
  std::vector<float> c(2 * half), s(2 * half);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double ang = (t + 1) * std::pow(10000.0, -2.0 * i / hd);
      c[t * half + i] = float(std::cos(ang));
      s[t * half + i] = float(std::sin(ang));
    }
  rope_rotate_half(x.data(), c.data(), s.data(), 2, 3, hd);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const float* o = &orig[(t * 3 + h) * hd];
        const float* r = &x[(t * 3 + h) * hd];
        // norm of each (i, i+half) pair is preserved, and the angle matches
        EXPECT_NEAR(r[i] * r[i] + r[i + half] * r[i + half], o[i] * o[i] + o[i + half] * o[i + half], 1e-4);
        EXPECT_NEAR(r[i], o[i] * c[t * half + i] - o[i + half] * s[t * half + i], 1e-6);
      }
}

TEST(Kernels, AttentionMatchesNaiveReference) {
  IsaGuard g;
  struct Case { int64_t n_q, pos0, n_kv, heads, kv_heads, hd, window; };
  const Case cases[] = {{1, 0, 1, 1, 1, 8, 0},    {5, 0, 5, 8, 4, 8, 0},     {1, 20, 21, 4, 1, 64, 0},
                        {7, 3, 10, 6, 2, 80, 0},  {13, 0, 13, 8, 8, 96, 4},  {1, 40, 41, 14, 2, 64, 8},
                        {33, 0, 33, 16, 2, 128, 0}, {9, 0, 9, 3, 3, 8, 1}};
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (const auto& c : cases) {
      auto q = randv(c.n_q * c.heads * c.hd, 10);
      auto k = randv(c.n_kv * c.kv_heads * c.hd, 11);
      auto v = randv(c.n_kv * c.kv_heads * c.hd, 12);
      std::vector<float> o(q.size()), oref(q.size());
      std::vector<float> scratch(num_threads() * c.n_kv);
      const float scale = 1.0f / std::sqrt(float(c.hd));
      attention(q.data(), k.data(), v.data(), o.data(), c.n_q, c.pos0, c.n_kv, c.heads, c.kv_heads,
                c.hd, c.window, scale, scratch.data());
      attention_ref(q.data(), k.data(), v.data(), oref.data(), c.n_q, c.pos0, c.n_kv, c.heads,
                    c.kv_heads, c.hd, c.window, scale);
      for (size_t i = 0; i < o.size(); ++i)
        ASSERT_NEAR(o[i], oref[i], 1e-5f) << isa_name(isa) << " case n_q=" << c.n_q << " i=" << i;
    }
  }
  // window 1: every query sees only itself, so the output is its own value row
  {
    auto q = randv(4 * 2 * 8, 1), k = randv(4 * 1 * 8, 2), v = randv(4 * 1 * 8, 3);
    std::vector<float> o(q.size()), scratch(num_threads() * 4);
    attention(q.data(), k.data(), v.data(), o.data(), 4, 0, 4, 2, 1, 8, 1, 0.3f, scratch.data());
    for (int t = 0; t < 4; ++t)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 8; ++d) EXPECT_NEAR(o[(t * 2 + h) * 8 + d], v[t * 8 + d], 1e-6);
  }
}

TEST(Kernels, SoftmaxAndArgmax) {
  std::vector<float> x = {1, 3, 3, -INFINITY};
  EXPECT_EQ(argmax(x.data(), 4), 1);
  softmax(x.data(), 4);
  EXPECT_NEAR(x[0] + x[1] + x[2] + x[3], 1.0, 1e-6);
  EXPECT_EQ(x[3], 0.0f);
  EXPECT_NEAR(x[1], std::exp(2.0) / (1 + 2 * std::exp(2.0)), 1e-6);
}
