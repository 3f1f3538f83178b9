// LoadOptions::pack_weights: plain matrices repacked at load into kernels::PackedWeight panels
// (the stored copy dropped) against the same checkpoint loaded as stored.
//
// The packed matmuls sum in another order than the raw ones (GEMV: 4 k-phases per panel; 2+
// tokens: one chain per output over k in order), so logits agree to float tolerance, not bits:
// max |Δ| relative to the largest |logit|, over every position of a prefill (M = prompt length:
// the packed tile path) and of single-token decode steps (M = 1: the packed GEMV), plus greedy
// tokens. The embedding lookup of a tied table reads the packed panels (kernels::packed_row),
// exactly. The decoder's batched decode step keeps each sequence's logits bit-identical whatever
// the batch around it (2..16 rows: the packed small-M path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "../kernels/kernel_test_util.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
using kernels::WType;

namespace {

// Qwen2-shaped (QKV bias), with feature counts that are not multiples of the 16-feature panel
// (intermediate 344, vocab 300) so that padded panels are exercised.
FixtureSpec spec(const std::string& dtype, bool tie) {
  FixtureSpec s;
  s.arch = "qwen2", s.dtype = dtype, s.tokenizer_kind = "";
  s.hidden = 128, s.intermediate = 344, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.vocab = 300;
  s.tie = tie, s.init_std = 0.05f, s.seed = 11;
  return s;
}

LoadOptions pack(bool on) {
  LoadOptions o;
  o.pack_weights = on;
  return o;
}

std::vector<int32_t> prompt(int n, uint32_t seed, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) seed = seed * 1664525u + 1013904223u, ids.push_back(int32_t((seed >> 8) % uint32_t(vocab)));
  return ids;
}

// All logits of a prefill of `ids`, then `steps` greedy decode steps (one token each).
struct Result {
  std::vector<float> prefill, decode;
  std::vector<int32_t> tokens;
};
Result run(const Model& m, const std::vector<int32_t>& ids, int steps) {
  const int64_t V = m.config().vocab_size;
  KvCache kv(m.config(), int64_t(ids.size()) + steps + 1);
  Result r;
  r.prefill.resize(ids.size() * size_t(V));
  m.forward(ids.data(), int64_t(ids.size()), kv, r.prefill.data(), /*all_logits=*/true);
  const float* last = &r.prefill[(ids.size() - 1) * size_t(V)];
  int32_t t = int32_t(std::max_element(last, last + V) - last);
  std::vector<float> l(static_cast<size_t>(V));
  for (int s = 0; s < steps; ++s) {
    r.tokens.push_back(t);
    m.forward(&t, 1, kv, l.data());
    r.decode.insert(r.decode.end(), l.begin(), l.end());
    t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  }
  r.tokens.push_back(t);
  return r;
}

double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return d / scale;
}

class PackWeights : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// The packed layouts read by f32-activation kernels (Panel16). On a CPU with AVX512-BF16, bf16
// weights are packed as Bf16Pairs for kernels that round activations to bf16 by design
// (kernels.h): this test then runs under the AVX-512 f32 path, and BF16PairsStayWithinTheirBound
// checks the bf16-activation path against its own bound.

TEST_P(PackWeights, LogitsMatchTheStoredLayoutWithinFloatTolerance) {
  const auto [dtype, tie] = GetParam();
  const std::string dir = test::make_temp_dir("pack_" + dtype + (tie ? "_tied" : "_untied"));
  write_fixture_model(dir, spec(dtype, tie));
  kernel_test::IsaGuard isa;  // restores the ISA
  if (active_isa() > Isa::Avx512) set_active_isa(Isa::Avx512);
  auto raw = Model::load(dir, pack(false));
  auto packed = Model::load(dir, pack(true));
  const ModelConfig& c = packed->config();
  // Every layer matrix and the head; a tied table is packed once for both uses.
  EXPECT_EQ(raw->n_packed(), 0);
  EXPECT_EQ(packed->n_packed(), 7 * c.n_layers + 1);
  ASSERT_NE(packed->lm_head().packed, nullptr);
  EXPECT_EQ(packed->lm_head().packed->wt(), raw->lm_head().type);
  if (tie) {
    EXPECT_EQ(packed->embedding().packed, packed->lm_head().packed);
    EXPECT_EQ(packed->embedding().data, packed->lm_head().data);
  } else {
    EXPECT_EQ(packed->embedding().packed, nullptr);  // the lookup reads the stored rows
  }
  EXPECT_EQ(packed->weight_bytes(), raw->weight_bytes());
  EXPECT_EQ(packed->decode_weight_bytes(), raw->decode_weight_bytes());
  for (uint32_t seed : {1u, 2u}) {
    const auto ids = prompt(int(20 + 9 * seed), seed, c.vocab_size);
    const Result a = run(*packed, ids, 6), b = run(*raw, ids, 6);
    const double dp = rel_max_diff(a.prefill, b.prefill), dd = rel_max_diff(a.decode, b.decode);
    std::printf("%s %s seed %u: prefill max|d|/max|logit| %.2e, decode %.2e\n", dtype.c_str(),
                tie ? "tied" : "untied", seed, dp, dd);
    // f32 sums of ~hundreds of terms in another order: a few ulps of the logit scale.
    EXPECT_LT(dp, 1e-5);
    EXPECT_LT(dd, 1e-5);
    EXPECT_EQ(a.tokens, b.tokens);
  }
}

// Where the CPU has AVX512-BF16 (natively: the default path there), bf16 weights packed as
// Bf16Pairs: the logits move by the rounding of the activations to bf16 (kernels.h: each
// output by at most 2^-8 * sum_k |x * w| more), a few thousandths of the logit scale on this
// model (measured on a Xeon with AVX512-BF16: 2.3e-3 - 4.2e-3), far from f32 rounding.
TEST(PackWeights, Bf16PairsStayWithinTheirBound) {
  if (active_isa() < Isa::Avx512Bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU (emulated: test_bf16_act_logits)";
  const std::string dir = test::make_temp_dir("pack_bf16_pairs");
  write_fixture_model(dir, spec("bf16", true));
  auto raw = Model::load(dir, pack(false));
  auto packed = Model::load(dir, pack(true));
  ASSERT_EQ(packed->lm_head().packed->layout(), kernels::PackLayout::Bf16Pairs);
  for (uint32_t seed : {1u, 2u}) {
    const auto ids = prompt(int(20 + 9 * seed), seed, packed->config().vocab_size);
    const Result a = run(*packed, ids, 6), b = run(*raw, ids, 6);
    const double dp = rel_max_diff(a.prefill, b.prefill), dd = rel_max_diff(a.decode, b.decode);
    std::printf("bf16 pairs seed %u: prefill max|d|/max|logit| %.2e, decode %.2e\n", seed, dp, dd);
    EXPECT_LT(dp, 2e-2);
    EXPECT_LT(dd, 2e-2);
    EXPECT_GT(dp, 1e-5) << "the bf16 rounding should show: is the Bf16Pairs kernel running?";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PackWeights,
                         ::testing::Values(std::make_tuple("bf16", true), std::make_tuple("bf16", false),
                                           std::make_tuple("f16", true), std::make_tuple("f32", false)));

TEST(PackWeightsRow, PackedRowIsTheSourceRowExactly) {
  for (WType wt : {WType::F32, WType::F16, WType::BF16}) {
    const int64_t N = 37, K = 24;  // N: two full panels and a padded one
    std::vector<float> src(size_t(N * K));
    for (size_t i = 0; i < src.size(); ++i) src[i] = float(std::sin(double(i) * 0.37)) * 3.0f;
    std::vector<uint8_t> w(size_t(N * K) * size_t(kernels::wtype_size(wt)));
    for (size_t i = 0; i < src.size(); ++i) {
      if (wt == WType::F32) std::memcpy(&w[i * 4], &src[i], 4);
      const uint16_t h = wt == WType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
      if (wt != WType::F32) std::memcpy(&w[i * 2], &h, 2);
    }
    const kernels::PackedWeight pw = kernels::pack_weight(w.data(), wt, N, K);
    std::vector<float> want(static_cast<size_t>(K)), got(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      kernels::to_f32(w.data() + size_t(n * K) * size_t(kernels::wtype_size(wt)), wt, want.data(), K);
      kernels::packed_row(pw, n, got.data());
      ASSERT_EQ(std::memcmp(want.data(), got.data(), size_t(K) * 4), 0) << kernels::wtype_name(wt) << " row " << n;
    }
  }
}

// The batched decode step (one token of each of B sequences in one forward_batch): a
// sequence's logits are bit-identical whether 2, 3 or 6 sequences share the step.
TEST(PackWeightsBatch, BatchedDecodeRowsAreBitIdenticalForAnyBatchOfTwoOrMore) {
  const std::string dir = test::make_temp_dir("pack_batch");
  write_fixture_model(dir, spec("bf16", true));
  auto m = Model::load(dir);
  ASSERT_GT(m->n_packed(), 0);
  const ModelConfig& c = m->config();
  const int64_t V = c.vocab_size;
  const int kSeqs = 6;
  std::vector<std::unique_ptr<KvCache>> kv;
  std::vector<std::vector<int32_t>> ids;
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int s = 0; s < kSeqs; ++s) {
    ids.push_back(prompt(10 + 3 * s, uint32_t(40 + s), V));
    kv.push_back(std::make_unique<KvCache>(c, 64));
    m->forward(ids.back().data(), int64_t(ids.back().size()), *kv.back(), scratch.data());
  }
  // Batch of the first b sequences, one new token each; the caches are not advanced, so every
  // batch computes the same step.
  auto step = [&](int b) {
    std::vector<float> out(size_t(b) * size_t(V));
    std::vector<SeqBatch> sb(static_cast<size_t>(b));
    std::vector<int32_t> tok(static_cast<size_t>(b));
    for (int s = 0; s < b; ++s) {
      tok[size_t(s)] = int32_t((7 * s + 3) % V);
      sb[size_t(s)].tokens = &tok[size_t(s)], sb[size_t(s)].n = 1, sb[size_t(s)].kv = kv[size_t(s)]->view();
      sb[size_t(s)].logits = &out[size_t(s) * size_t(V)];
    }
    m->forward_batch(sb.data(), b);
    return out;
  };
  const std::vector<float> b2 = step(2), b3 = step(3), b6 = step(kSeqs);
  EXPECT_EQ(std::memcmp(b2.data(), b6.data(), b2.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b3.data(), b6.data(), b3.size() * 4), 0);
}

}  // namespace
