// Model::forward_batch (several sequences in one pass, scattered recompute positions) and
// Model::forward_blend (CacheBlend) against plain per-sequence forwards.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

namespace kvboost {
namespace {

std::unique_ptr<Model> tiny_model(const std::string& name, const std::string& arch = "qwen2") {
  const std::string dir = test::make_temp_dir(name);
  FixtureSpec s = fixture_preset("tiny");
  s.arch = arch, s.tokenizer_kind = "", s.vocab = 300, s.layers = 4;
  write_fixture_model(dir, s);
  return Model::load(dir);
}

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + seed * 101 + 7) % 300);
  return t;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(ForwardBatch, ViewOfAnotherRowWidthIsAnError) {
  // KvView is a kv::KvLayout: a row width of 0 is the model's; another one (pools built for
  // another model) or a view without pools is refused by name, before anything is written
  auto m = tiny_model("fb_view");
  const auto& c = m->config();
  const auto t = tokens(5, 3);
  KvCache kv(c, 16);
  std::vector<float> logits(size_t(c.vocab_size));
  KvView v = kv.view();
  EXPECT_EQ(v.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(v.head_dim, c.head_dim);
  v.n_kv_heads = 0, v.head_dim = 0;  // the model's
  m->forward(t.data(), 5, v, logits.data());
  std::vector<float> want(logits.size());
  KvCache kv2(c, 16);
  m->forward(t.data(), 5, kv2, want.data());
  EXPECT_EQ(logits, want);
  EXPECT_EQ(std::memcmp(kv.k(1), kv2.k(1), size_t(5 * c.n_kv_heads * c.head_dim) * sizeof(float)), 0);
  v.head_dim = c.head_dim * 2, v.n_kv_heads = c.n_kv_heads;
  try {
    m->forward(t.data(), 5, v, logits.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K/V view of sequence 0 has rows of"), std::string::npos) << e.what();
  }
  BlendOptions bo;
  EXPECT_THROW(m->forward_blend(t.data(), 5, v, bo, logits.data()), Error);
  KvView empty;
  EXPECT_THROW(m->forward(t.data(), 5, empty, logits.data()), Error);
}

TEST(ForwardBatch, TwoSequencesInOnePassEqualSeparatePasses) {
  auto m = tiny_model("fb_two");
  const auto& c = m->config();
  const auto a = tokens(21, 1), b = tokens(9, 2);
  // reference: each alone, prefill then one decode step
  KvCache ka(c, 64), kb(c, 64);
  std::vector<float> ra(size_t(c.vocab_size)), rb(size_t(c.vocab_size));
  m->forward(a.data(), 20, ka, ra.data());
  m->forward(&a[20], 1, ka, ra.data());
  m->forward(b.data(), int64_t(b.size()), kb, rb.data());
  // batched: a's prefill of 20 alone, then a's decode token together with b's whole prefill
  KvCache ba(c, 64), bb(c, 64);
  std::vector<float> la(size_t(c.vocab_size)), lb(size_t(c.vocab_size));
  m->forward(a.data(), 20, ba, la.data());
  SeqBatch s[2];
  s[0].tokens = &a[20], s[0].n = 1, s[0].kv = ba.view(), s[0].logits = la.data();
  s[1].tokens = b.data(), s[1].n = int64_t(b.size()), s[1].kv = bb.view(), s[1].logits = lb.data();
  m->forward_batch(s, 2);
  EXPECT_LT(max_diff(la, ra), 1e-4f);
  EXPECT_LT(max_diff(lb, rb), 1e-4f);
}

TEST(ForwardBatch, ScatteredRecomputeOverExactCacheEqualsFullPrefill) {
  auto m = tiny_model("fb_scatter", "llama");
  const auto& c = m->config();
  const auto t = tokens(40, 3);
  KvCache full(c, 64);
  std::vector<float> ref(size_t(c.vocab_size));
  m->forward(t.data(), int64_t(t.size()), full, ref.data());
  // the cache already holds exact K/V for every position; recomputing any subset (ending with
  // the last token) must reproduce the same K/V and logits
  std::vector<int32_t> pos{0, 1, 5, 6, 7, 20, 33, 39}, sub;
  for (int32_t p : pos) sub.push_back(t[size_t(p)]);
  std::vector<float> got(size_t(c.vocab_size));
  SeqBatch s;
  s.tokens = sub.data(), s.positions = pos.data(), s.n = int64_t(pos.size()), s.kv = full.view(), s.logits = got.data();
  m->forward_batch(&s, 1);
  EXPECT_LT(max_diff(got, ref), 1e-4f);
  // positions must increase
  std::vector<int32_t> bad{3, 2};
  s.positions = bad.data(), s.n = 2;
  EXPECT_THROW(m->forward_batch(&s, 1), Error);
}

TEST(ForwardBlend, ExactCacheGivesFullPrefillLogitsAtAnyRatio) {
  auto m = tiny_model("fb_blend");
  const auto& c = m->config();
  const auto t = tokens(48, 4);
  KvCache full(c, 64);
  std::vector<float> ref(size_t(c.vocab_size));
  m->forward(t.data(), int64_t(t.size()), full, ref.data());
  std::vector<uint8_t> reused(t.size(), 1);
  for (float ratio : {0.0f, 0.15f, 1.0f}) {
    KvCache kv(c, 64);  // holds exact K/V of all 48 tokens
    std::vector<float> tmp(size_t(c.vocab_size));
    m->forward(t.data(), int64_t(t.size()), kv, tmp.data());
    KvView v = kv.view();
    v.n_past = 0;
    BlendOptions bo;
    bo.ratio = ratio, bo.reused = reused.data();
    std::vector<float> got(size_t(c.vocab_size));
    const BlendStats st = m->forward_blend(t.data(), int64_t(t.size()), v, bo, got.data());
    EXPECT_LT(max_diff(got, ref), 1e-4f) << "ratio " << ratio;
    EXPECT_EQ(st.n_full_layers, 1);
    EXPECT_EQ(st.n_selected, int64_t(std::ceil(ratio * 47)));
    EXPECT_EQ(st.n_rows_late, st.n_selected + 1);
  }
}

// A 32-token prompt whose cached K/V of positions 10 and 20 are far off in layers l0 and up,
// with the full prefill's logits; blend() runs CacheBlend over it, every token a candidate.
struct CorruptedCache {
  std::unique_ptr<Model> m;
  std::vector<int32_t> t = tokens(32, 5);
  std::unique_ptr<KvCache> kv;
  std::vector<float> logits;
  CorruptedCache(const std::string& name, int64_t l0) : m(tiny_model(name)) {
    const ModelConfig& c = m->config();
    kv = std::make_unique<KvCache>(c, 64);
    logits.resize(size_t(c.vocab_size));
    m->forward(t.data(), int64_t(t.size()), *kv, logits.data());
    const int64_t nkv = c.n_kv_heads * c.head_dim;
    for (int64_t l = l0; l < c.n_layers; ++l)
      for (int64_t p : {10, 20})
        for (int64_t i = 0; i < nkv; ++i) kv->k(l)[p * nkv + i] += 3.0f, kv->v(l)[p * nkv + i] -= 2.0f;
  }
  // The blend's logits minus the full prefill's (max abs); stats into *st when given.
  float blend(BlendOptions bo, BlendStats* st = nullptr) {
    std::vector<uint8_t> reused(t.size(), 1);
    KvView v = kv->view();
    v.n_past = 0;
    bo.reused = reused.data();
    std::vector<float> got(logits.size());
    const BlendStats s = m->forward_blend(t.data(), int64_t(t.size()), v, bo, got.data());
    if (st) *st = s;
    return max_diff(got, logits);
  }
};

TEST(ForwardBlend, RecomputesTheMostDeviatedTokens) {
  // 10 and 20 wrong in every layer: blend at ratio 2/31 must pick exactly them and restore the
  // full-prefill logits
  CorruptedCache x("fb_blend_dev", 0);
  BlendOptions bo;
  bo.ratio = 2.0f / 31.0f;
  BlendStats st;
  EXPECT_LT(x.blend(bo, &st), 1e-4f);
  EXPECT_EQ(st.n_selected, 2);
}

TEST(ForwardBlend, GradualFilteringFindsTokensThatDeviateOnlyInLaterLayers) {
  // 10 and 20 wrong from layer 2 on: the check layer (1) cannot see it
  CorruptedCache x("fb_blend_gradual", 2);
  ASSERT_EQ(x.m->config().n_layers, 4);
  BlendOptions bo;
  bo.ratio = 2.0f / 31.0f;
  // one selection at the check layer: no deviation there, the ties pick tokens 0 and 1 (and
  // recompute them with the last token from layer 2 on: 10 and 20 stay wrong there)
  EXPECT_GT(x.blend(bo), 1e-3f);
  // gradual: all 31 candidates at layer 1, narrowed to 2 at layer 2 by layer 2's deviation
  bo.first_ratio = 1.0f, bo.taper_layers = 1;
  BlendStats st;
  EXPECT_LT(x.blend(bo, &st), 1e-4f);
  EXPECT_EQ(st.n_selected, 2);
  EXPECT_EQ(st.n_rows_late, 3);
  EXPECT_EQ(st.n_row_layers, 32 + 3 * 2);
  // (that repaired x's cache) taper over 2 layers: 31 at layer 1, 16 at layer 2 (2 + 29/2
  // rounded down), 2 at layer 3
  CorruptedCache y("fb_blend_gradual2", 2);
  bo.taper_layers = 2;
  EXPECT_LT(y.blend(bo, &st), 1e-4f);
  EXPECT_EQ(st.n_row_layers, 32 + (2 + 29 / 2 + 1) + 3);
  bo.first_ratio = 1.5f;
  EXPECT_THROW(y.blend(bo), Error);
}


// The schedule both the CPU pass and the device pass select by (BlendSchedule).
TEST(BlendSchedule, CountsTaperSelectionAndDeviation) {
  std::vector<uint8_t> reused(11, 1);
  reused[3] = 0;  // a new token: never a candidate
  BlendOptions bo;
  bo.check_layer = 1, bo.ratio = 0.2f, bo.first_ratio = 0.6f, bo.taper_layers = 2, bo.reused = reused.data();
  const BlendSchedule s(bo, 11, 4);
  // candidates: 0..9 but 3 (the last token, 10, is always computed) = 9
  EXPECT_EQ(s.n_candidates(), 9);
  EXPECT_FALSE(s.is_candidate(3));
  EXPECT_FALSE(s.is_candidate(10));
  EXPECT_EQ(s.keep_at(1), 6);          // ceil(0.6 * 9)
  EXPECT_EQ(s.keep_at(2), 2 + 4 / 2);  // halfway down to ceil(0.2 * 9) = 2
  EXPECT_EQ(s.keep_at(3), 2);
  EXPECT_TRUE(s.selects_at(1, 9));
  EXPECT_TRUE(s.selects_at(2, 6));
  EXPECT_FALSE(s.selects_at(3, 2));
  // rows in order 0..10; deviation rises with the row, ties go to the earlier row
  std::vector<int64_t> tok(11);
  std::vector<float> dev(11);
  for (int64_t i = 0; i < 11; ++i) tok[size_t(i)] = i, dev[size_t(i)] = float(i % 5);
  int64_t kept = -1;
  const std::vector<uint8_t> keep = s.select(3, tok, dev, &kept);
  EXPECT_EQ(kept, 2);
  // two largest among candidates: 4 (dev 4) and 9 (dev 4); 3 and 10 kept as non-candidates
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1}));
  EXPECT_THROW(s.select(3, tok, std::vector<float>(3), &kept), Error);
  bo.ratio = -0.1f;
  EXPECT_THROW(BlendSchedule(bo, 11, 4), Error);
  const float k[2] = {1, 0}, v[2] = {0, 2}, ck[2] = {0, 0}, cv[2] = {0, 1};
  EXPECT_FLOAT_EQ(BlendSchedule::deviation(k, v, ck, cv, 2), 1.0f + 1.0f / 4.0f);
}

}  // namespace
}  // namespace kvboost
