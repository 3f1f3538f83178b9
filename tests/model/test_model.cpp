// The decoder against the stories260K oracle (llama2.c greedy output, PyTorch top-5 logits),
// and internal consistency: batched prefill == token-by-token decode, sharded == single file.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
using nlohmann::json;

namespace {
std::string stories() { return test::model_path("stories260K"); }

std::vector<int32_t> greedy(const Model& m, std::vector<int32_t> ids, int max_new, const std::vector<int32_t>& stop) {
  const auto& c = m.config();
  KvCache kv(c, int64_t(ids.size()) + max_new);
  std::vector<float> logits(size_t(c.vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, logits.data());
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    int32_t t = int32_t(kernels::argmax(logits.data(), c.vocab_size));
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    out.push_back(t);
    if (i + 1 < max_new) m.forward(&t, 1, kv, logits.data());
  }
  return out;
}
}  // namespace

TEST(Stories260K, ConfigParsed) {
  KVBOOST_REQUIRE_PATH(stories());
  ModelConfig c = ModelConfig::from_dir(stories());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 2}));  // generation_config wins
}

TEST(Stories260K, GreedyMatchesOracleTokenForToken) {
  KVBOOST_REQUIRE_PATH(stories());
  auto m = Model::load(stories());
  json ref = json::parse(read_file(stories() + "/reference_greedy.json"));
  ASSERT_EQ(ref["cases"].size(), 5u);
  for (const auto& cs : ref["cases"]) {
    auto prompt = cs["prompt_ids"].get<std::vector<int32_t>>();
    auto want = cs["greedy_ids"].get<std::vector<int32_t>>();
    // The oracle ran 256 steps or stopped at BOS; ask for one more token than it has, unless
    // it hit the step limit.
    const bool hit_limit = prompt.size() + want.size() >= 257;
    int max_new = int(want.size()) + (hit_limit ? 0 : 1);
    auto got = greedy(*m, prompt, max_new, m->config().eos_token_ids);
    EXPECT_EQ(got, want) << "prompt: " << cs["prompt"];

    // top-5 logits at the last prompt position, from an independent PyTorch implementation
    KvCache kv(m->config(), int64_t(prompt.size()));
    std::vector<float> logits(512);
    m->forward(prompt.data(), int64_t(prompt.size()), kv, logits.data());
    auto ids = cs["last_position_top5"]["ids"].get<std::vector<int>>();
    auto vals = cs["last_position_top5"]["logits"].get<std::vector<float>>();
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_NEAR(logits[size_t(ids[i])], vals[i], 2e-3) << "top5 #" << i;
  }
}

TEST(Stories260K, PrefillEqualsTokenByTokenDecode) {
  KVBOOST_REQUIRE_PATH(stories());
  auto m = Model::load(stories());
  const auto& c = m->config();
  std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421};
  const int64_t n = int64_t(ids.size());
  KvCache a(c, n), b(c, n);
  std::vector<float> all(size_t(n * c.vocab_size)), one(size_t(c.vocab_size));
  m->forward(ids.data(), n, a, all.data(), true);
  for (int64_t t = 0; t < n; ++t) {
    m->forward(&ids[size_t(t)], 1, b, one.data());
    for (int64_t v = 0; v < c.vocab_size; ++v)
      ASSERT_NEAR(one[size_t(v)], all[size_t(t * c.vocab_size + v)], 1e-4) << "t=" << t << " v=" << v;
  }
  // K/V written by both paths agree
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t i = 0; i < n * c.n_kv_heads * c.head_dim; ++i) ASSERT_NEAR(a.k(l)[i], b.k(l)[i], 1e-5);
}

TEST(Fixture, ShardedEqualsSingleFileAndDtypesClose) {
  const std::string base = test::make_temp_dir("fixture_shards");
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  s.vocab = 300;
  s.arch = "qwen2";
  write_fixture_model(base + "/one", s);
  s.shards = 3;
  write_fixture_model(base + "/three", s);
  auto m1 = Model::load(base + "/one");
  auto m3 = Model::load(base + "/three");
  std::vector<int32_t> ids = {5, 17, 3, 250, 9, 9, 40};
  std::vector<float> l1(300), l3(300);
  KvCache k1(m1->config(), 8), k3(m3->config(), 8);
  m1->forward(ids.data(), 7, k1, l1.data());
  m3->forward(ids.data(), 7, k3, l3.data());
  EXPECT_EQ(l1, l3);
  // the same fixture in bf16 stays close to f32 (weights rounded to 8 mantissa bits)
  s.shards = 1;
  s.dtype = "bf16";
  write_fixture_model(base + "/bf16", s);
  auto mb = Model::load(base + "/bf16");
  std::vector<float> lb(300);
  KvCache kb(mb->config(), 8);
  mb->forward(ids.data(), 7, kb, lb.data());
  float maxdiff = 0, maxabs = 0;
  for (int i = 0; i < 300; ++i) {
    maxdiff = std::max(maxdiff, std::fabs(lb[i] - l1[i]));
    maxabs = std::max(maxabs, std::fabs(l1[i]));
  }
  EXPECT_GT(maxdiff, 0.0f);
  EXPECT_LT(maxdiff, 0.05f * maxabs);
}
