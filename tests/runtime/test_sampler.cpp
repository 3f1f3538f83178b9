// Sampler and stop strings, without a model.
#include <cmath>
#include <limits>
#include <map>

#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
SamplingParams cfg(float t, int k = 0, float p = 1, float minp = 0, float rep = 1, uint64_t seed = 1) {
  SamplingParams c;
  c.temperature = t, c.top_k = k, c.top_p = p, c.min_p = minp, c.repetition_penalty = rep, c.seed = seed;
  return c;
}
std::map<int32_t, int> histogram(SamplingParams c, std::vector<float> logits, int n) {
  Sampler s(c);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    h[s.sample(l.data(), int64_t(l.size()), {})]++;
  }
  return h;
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  Sampler s(cfg(0));
  std::vector<float> l = {0.1f, 2.0f, 1.9f, -5};
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
}

TEST(Sampler, RepetitionPenaltyFollowsHuggingFace) {
  // id 1 (positive logit) is divided, id 3 (negative) multiplied: 2.0/2 = 1.0 < 1.5
  Sampler s(cfg(0, 0, 1, 0, 2.0f));
  std::vector<float> l = {0.0f, 2.0f, 1.5f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {1, 1, 3}), 2);
  EXPECT_FLOAT_EQ(l[1], 1.0f);
  EXPECT_FLOAT_EQ(l[3], -2.0f);  // applied once per distinct id
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  std::vector<float> l = {3.0f, 2.9f, 1.0f, 0.5f, -1.0f};
  auto h = histogram(cfg(1.0f, 2), l, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(0) && h.count(1));
  // top-p 0.5: token 0 alone holds ~0.43 < 0.5, so tokens 0 and 1 are kept
  h = histogram(cfg(1.0f, 0, 0.5f), l, 2000);
  EXPECT_EQ(h.size(), 2u);
  // min-p 0.5: keeps tokens with p >= 0.5 * p_max: 0 and 1 (exp(-0.1) = 0.9), not 2
  h = histogram(cfg(1.0f, 0, 1.0f, 0.5f), l, 2000);
  EXPECT_EQ(h.size(), 2u);
  // no restriction: all five appear, frequencies near the softmax
  h = histogram(cfg(1.0f), l, 20000);
  EXPECT_EQ(h.size(), 5u);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(h[0] / 20000.0, std::exp(3.0) / z, 0.02);
  // low temperature concentrates on the argmax
  h = histogram(cfg(0.01f), l, 500);
  EXPECT_GT(h[0], 495);
}

TEST(Sampler, SeedIsReproducible) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[size_t(i)] = float(std::sin(i));
  auto run = [&](uint64_t seed) {
    Sampler s(cfg(1.0f, 0, 1, 0, 1, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 30; ++i) {
      auto x = l;
      out.push_back(s.sample(x.data(), 50, {}));
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, RejectsOutOfRangeValues) {
  EXPECT_THROW(Sampler(cfg(-1)), Error);
  EXPECT_THROW(Sampler(cfg(1, -2)), Error);
  EXPECT_THROW(Sampler(cfg(1, 0, 0.0f)), Error);
  EXPECT_THROW(Sampler(cfg(1, 0, 1.5f)), Error);
  EXPECT_THROW(Sampler(cfg(1, 0, 1, 2.0f)), Error);
  EXPECT_THROW(Sampler(cfg(1, 0, 1, 0, 0.0f)), Error);
  try {
    Sampler(cfg(1, 0, 1.5f));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p = 1.5"), std::string::npos);
  }
}

TEST(Sampler, ResolvesGenerationConfigDefaults) {
  SamplingParams d;  // a model's generation_config.json
  d.do_sample = true, d.temperature = 0.7f, d.top_p = 0.8f, d.top_k = 20, d.repetition_penalty = 1.05f;
  SamplingParams c = resolve_sampling({}, d);
  EXPECT_FLOAT_EQ(*c.temperature, 0.7f);
  EXPECT_EQ(*c.top_k, 20);
  EXPECT_FLOAT_EQ(*c.min_p, 0.0f);  // never the model's
  EXPECT_FLOAT_EQ(*c.repetition_penalty, 1.05f);
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_FLOAT_EQ(*resolve_sampling(p, d).temperature, 0.0f);
  EXPECT_FLOAT_EQ(*resolve_sampling(p, d).top_p, 0.8f);  // the rest still the model's
  d.do_sample = false;
  EXPECT_FLOAT_EQ(*resolve_sampling({}, d).temperature, 0.0f);  // greedy unless the model samples
  EXPECT_FLOAT_EQ(*resolve_sampling({}, d).top_p, 1.0f);
  EXPECT_FLOAT_EQ(*resolve_sampling({}, d).repetition_penalty, 1.05f);  // applies either way
  const SamplingParams none = resolve_sampling({}, {});  // no generation_config.json: neutral
  EXPECT_FLOAT_EQ(*none.temperature, 0.0f);
  EXPECT_EQ(*none.top_k, 0);
  EXPECT_FLOAT_EQ(*none.top_p, 1.0f);
  EXPECT_FLOAT_EQ(*none.repetition_penalty, 1.0f);
}

TEST(StopMatcher, HoldsBackPrefixesAndCutsAtStop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("hello E"), "hello ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X"), "ENX");  // not a stop after all
  EXPECT_EQ(m.push(" and\n"), " and");
  EXPECT_EQ(m.push("\nmore"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
  StopMatcher n({"ab"});
  EXPECT_EQ(n.push("xa"), "x");
  EXPECT_EQ(n.flush(), "a");  // end of generation releases what was held
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

TEST(Sampler, LogitBiasForcesAndBansTokens) {
  // +100 on id 3 beats the argmax (greedy and sampled); -100 on the argmax removes it; a masked
  // (-inf) token stays masked whatever its bias.
  SamplingParams c = cfg(0);
  c.logit_bias = {{3, 100.0f}};
  std::vector<float> l = {0.1f, 2.0f, 1.9f, -5};
  EXPECT_EQ(Sampler(c).sample(l.data(), 4, {}), 3);
  c = cfg(1.0f);
  c.logit_bias = {{1, -100.0f}, {2, -100.0f}};
  auto h = histogram(c, {0.1f, 5.0f, 4.9f, 0.0f}, 200);
  EXPECT_EQ(h.count(1) + h.count(2), 0u);
  c = cfg(0);
  c.logit_bias = {{0, 100.0f}};
  std::vector<float> m = {-std::numeric_limits<float>::infinity(), 1.0f, 0.5f};
  EXPECT_EQ(Sampler(c).sample(m.data(), 3, {}), 1);
  c.logit_bias = {{0, 101.0f}};
  EXPECT_THROW(Sampler{c}, Error);
}
