// Issue 4 kernels against their scalar references on every ISA path this CPU runs: packed-weight
// matmul (prefill tiles and decode GEMV, every weight type, ragged shapes), the raw-layout GEMV
// and GEMM at model shapes, and the thread pool under the kernels (thread counts 1..3).
#include <cmath>
#include <limits>
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

// Raw weight bytes of type wt for the f32 values v (rounded to wt).
std::vector<uint8_t> to_type(const std::vector<float>& v, WType wt) {
  std::vector<uint8_t> out(v.size() * wtype_size(wt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (wt == WType::F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = wt == WType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// |a - b| within f32 accumulation error over K terms (weights ~0.1, x ~1).
void expect_close(const std::vector<float>& y, const std::vector<float>& ref, int64_t K,
                  const std::string& what) {
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], ref[i], 2e-5f * (1 + std::sqrt(float(K))) * (1 + std::fabs(ref[i])))
        << what << " i=" << i;
}

}  // namespace

TEST(FastKernels, PackedMatmulMatchesRawReference) {
  IsaGuard g;
  // M: decode (1), every tail of the 6-token tile, several tiles; N: panel tails; K: odd.
  const int64_t shapes[][3] = {{1, 1, 1},    {1, 16, 8},    {1, 17, 13},  {1, 100, 896},
                               {2, 33, 7},   {5, 16, 64},   {6, 48, 100}, {7, 31, 33},
                               {13, 130, 96}, {64, 40, 200}, {3, 1000, 64},
                               {8, 200, 96}, {16, 100, 40}, {4, 64, 33}, {17, 70, 20}};
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (WType wt : {WType::F32, WType::F16, WType::BF16}) {
      for (auto& s : shapes) {
        const int64_t M = s[0], N = s[1], K = s[2];
        const auto x = randv(M * K, 11 + M);
        const auto w = to_type(randv(N * K, 12 + N, 0.1f), wt);
        const auto bias = randv(N, 13);
        const PackedWeight pw = pack_weight(w.data(), wt, N, K);
        ASSERT_EQ(pw.n(), N);
        ASSERT_EQ(pw.k(), K);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(pw.data()) % 64, 0u);
        for (bool use_bias : {false, true}) {
          const float* b = use_bias ? bias.data() : nullptr;
          std::vector<float> y(M * N, NAN), yp(M * N, NAN), yr(M * N);
          matmul_ref(x.data(), w.data(), wt, b, yr.data(), M, N, K);
          matmul_packed(x.data(), pw, b, y.data(), M);
          matmul_packed_ref(x.data(), pw, b, yp.data(), M);
          const std::string what = std::string(isa_name(isa)) + " " + wtype_name(wt) +
                                   " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                   " K=" + std::to_string(K);
          expect_close(yp, yr, K, what + " (packed ref)");
          expect_close(y, yr, K, what);
        }
      }
    }
  }
}

TEST(FastKernels, MatmulAtModelShapesAndThreadCounts) {
  IsaGuard g;
  // Qwen2.5-0.5B / Llama-3.2-1B-like shapes, trimmed so the scalar reference stays quick.
  const int64_t shapes[][3] = {{1, 896, 896}, {1, 128, 896}, {1, 200, 4864}, {1, 2048, 64},
                               {19, 128, 896}, {40, 96, 2048}};
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (Isa isa : isas()) {
      set_active_isa(isa);
      for (WType wt : {WType::BF16, WType::F16, WType::F32}) {
        for (auto& s : shapes) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const auto x = randv(M * K, 21);
          const auto w = to_type(randv(N * K, 22, 0.05f), wt);
          std::vector<float> y(M * N), yp(M * N), yr(M * N);
          matmul_ref(x.data(), w.data(), wt, nullptr, yr.data(), M, N, K);
          matmul(x.data(), w.data(), wt, nullptr, y.data(), M, N, K);
          const PackedWeight pw = pack_weight(w.data(), wt, N, K);
          matmul_packed(x.data(), pw, nullptr, yp.data(), M);
          const std::string what = std::string(isa_name(isa)) + " " + wtype_name(wt) +
                                   " threads=" + std::to_string(threads) + " M=" +
                                   std::to_string(M) + " N=" + std::to_string(N) +
                                   " K=" + std::to_string(K);
          expect_close(y, yr, K, what);
          expect_close(yp, yr, K, what + " packed");
        }
      }
    }
  }
}

// Every token's row comes out bit-identical whatever the batch around it (2..20 tokens: the
// streamed few-token path and the tiled path, any tile split): a batched decode step or a
// prefix-cache hit's shorter chunk computes exactly what a longer call computes for that row.
TEST(FastKernels, PackedMatmulRowsDoNotDependOnBatch) {
  IsaGuard g;
  const int64_t N = 200, K = 96, Mmax = 20;
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (WType wt : {WType::BF16, WType::F32}) {
      const auto x = randv(Mmax * K, 31);
      const auto w = to_type(randv(N * K, 32, 0.1f), wt);
      const PackedWeight pw = pack_weight(w.data(), wt, N, K);
      std::vector<float> full(Mmax * N);
      matmul_packed(x.data(), pw, nullptr, full.data(), Mmax);
      for (int64_t M = 2; M < Mmax; ++M) {
        std::vector<float> y(M * N);
        matmul_packed(x.data(), pw, nullptr, y.data(), M);
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(y[i], full[i]) << isa_name(isa) << " " << wtype_name(wt) << " M=" << M
                                   << " i=" << i;
      }
    }
  }
}

TEST(FastKernels, PackWeightRejectsEmpty) {
  std::vector<float> w(4);
  EXPECT_THROW(pack_weight(w.data(), WType::F32, 0, 4), Error);
  EXPECT_THROW(pack_weight(w.data(), WType::F32, 4, 0), Error);
}

// argmax: the vector path gives the reference's index (the first of the largest values) over
// ragged lengths, ties, -inf masks (a grammar's), NaNs and Gemma 3's 262k-entry vocabulary.
TEST(FastKernels, ArgmaxMatchesReference) {
  IsaGuard g;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> cases;
  for (int64_t n : {1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 1000, 262144}) {
    cases.push_back(randv(n, 40 + n));
    std::vector<float> ties(size_t(n), 0.5f);  // all equal: index 0
    cases.push_back(ties);
    std::vector<float> late = randv(n, 50 + n);  // the maximum twice, near the end
    late[size_t(n - 1)] = 9.0f;
    if (n > 3) late[size_t(n - 3)] = 9.0f;
    cases.push_back(late);
    std::vector<float> masked(size_t(n), -inf);  // everything masked but one value
    masked[size_t(n / 2)] = -3.0f;
    cases.push_back(masked);
    std::vector<float> nans = randv(n, 60 + n);  // NaNs never win (except at 0)
    for (int64_t i = 1; i < n; i += 5) nans[size_t(i)] = nan;
    cases.push_back(nans);
    std::vector<float> zeros(size_t(n), -0.0f);  // -0 and +0 are equal: the first
    if (n > 4) zeros[4] = 0.0f;
    cases.push_back(zeros);
  }
  std::vector<float> nan0 = randv(40, 7);
  nan0[0] = nan;
  cases.push_back(nan0);
  std::vector<float> all_inf(50, -inf);
  cases.push_back(all_inf);
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto& x = cases[c];
      ASSERT_EQ(argmax(x.data(), int64_t(x.size())), argmax_ref(x.data(), int64_t(x.size())))
          << isa_name(isa) << " case " << c << " n=" << x.size();
    }
  }
  // Known answers, independent of the reference.
  const float v[] = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f, 2.9f, 3.0f, 1.0f, 0.0f, 2.0f};
  EXPECT_EQ(argmax(v, 10), 1);
  std::vector<float> big(262144, -1.0f);
  big[200001] = 5.0f;
  big[262143] = 5.0f;
  EXPECT_EQ(argmax(big.data(), int64_t(big.size())), 200001);
}
