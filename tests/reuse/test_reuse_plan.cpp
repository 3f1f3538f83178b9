// The reuse module (kvboost/reuse.h) on its own, without a model: the plan of a prompt over a
// real chunk store (which positions come from where, what the first pass computes under each
// repair), the CacheBlend budget, the chunk keys, the ladder's cost model and the guard's state.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "error_of.h"
#include "kvboost/common.h"
#include "kvboost/reuse.h"
#include "test_util.h"

namespace kvboost {
namespace {

const kv::ChunkShape kShape{2, 1, 4};
constexpr int64_t kChunk = 16;

std::vector<int32_t> iota_tokens(int64_t n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

reuse::PromptInput input(const std::vector<int32_t>& ctx, int64_t n_cached, kv::ChunkStore* store,
                         const ReusePolicy& pol) {
  reuse::PromptInput in;
  in.context = ctx;
  in.n_cached = n_cached;
  in.chunk_size = kChunk;
  in.chunk_window = 0;
  in.store = store;
  in.model_id = "kvb1-test";
  in.ns = "";
  in.policy = &pol;
  in.n_layers = kShape.n_layers;
  return in;
}

// A chunk of `tokens` computed at pos0, under `keys`, with K/V all equal to `fill`.
std::shared_ptr<kv::Chunk> make_chunk(std::span<const int32_t> tokens, int64_t pos0, const kv::ChunkKeys& keys,
                                      uint64_t parent, float fill) {
  auto c = std::make_shared<kv::Chunk>();
  c->tokens.assign(tokens.begin(), tokens.end());
  c->pos0 = pos0;
  c->keys = keys;
  c->parent_prefix = parent;
  const int64_t n = int64_t(tokens.size());
  kv::chunk_init(*c, kShape, kv::KvQuant::kF32, n);
  std::vector<float> k(size_t(n * kShape.n_kv_heads * kShape.head_dim), fill), v = k;
  for (int64_t l = 0; l < kShape.n_layers; ++l) kv::chunk_put_layer(*c, kShape, l, k.data(), v.data());
  return c;
}

// The prompt P = [A0 A1 X D] (4 chunks of 16): A0 A1 were computed as a prefix before (stored
// under prefix keys), X is new, D was computed at position 16 after another chunk (a content
// entry). The paged block cache holds nothing.
struct Fixture {
  kv::ChunkStore store{kShape, kv::ChunkStoreOptions{}};
  std::vector<int32_t> prompt;
  Fixture() {
    const auto a = iota_tokens(32, 100), x = iota_tokens(16, 500), d = iota_tokens(16, 900), y = iota_tokens(16, 700);
    prompt = a;
    prompt.insert(prompt.end(), x.begin(), x.end());
    prompt.insert(prompt.end(), d.begin(), d.end());
    const ReusePolicy pol;
    // The keys the prompt's own chunks get: the prefix chunks are stored under them.
    const reuse::PromptPlan keys = reuse::plan_prompt(input(prompt, 0, nullptr, pol));
    for (int i = 0; i < 2; ++i)
      store.put(make_chunk(std::span(prompt).subspan(size_t(16 * i), 16), 16 * i, keys.chunk_keys[size_t(i)],
                           i ? keys.chunk_keys[0].prefix : 0, float(i + 1)));
    // D's content entry: computed in Q = [Y D] at position 16.
    std::vector<int32_t> q = y;
    q.insert(q.end(), d.begin(), d.end());
    const reuse::PromptPlan qk = reuse::plan_prompt(input(q, 0, nullptr, pol));
    store.put(make_chunk(std::span(q).subspan(16, 16), 16, qk.chunk_keys[1], qk.chunk_keys[0].prefix, 9.0f));
  }
};

TEST(ReusePlan, WithoutAStoreEverythingAfterTheCachedPrefixIsComputed) {
  const auto ctx = iota_tokens(100, 1);
  ReusePolicy pol;
  const reuse::PromptPlan p = reuse::plan_prompt(input(ctx, 32, nullptr, pol));
  ASSERT_EQ(p.chunks.size(), 7u);  // 6 x 16 + 4
  EXPECT_EQ(p.chunk_src[0], reuse::ChunkSrc::kBlockCache);
  EXPECT_EQ(p.chunk_src[1], reuse::ChunkSrc::kBlockCache);
  EXPECT_EQ(p.chunk_src[2], reuse::ChunkSrc::kComputed);
  EXPECT_TRUE(p.copy_ins.empty());
  EXPECT_FALSE(p.approximate());
  EXPECT_EQ(p.exact_limit, INT64_MAX);
  ASSERT_EQ(p.todo.size(), 68u);
  EXPECT_EQ(p.todo.front(), 32);
  EXPECT_EQ(p.todo.back(), 99);
  EXPECT_EQ(p.n_cached, 32);
  EXPECT_EQ(p.n_reused, 32);
  EXPECT_EQ(p.n_new, 68);
  EXPECT_EQ(p.rung, ReuseMode::kPrefixOnly);
}

TEST(ReusePlan, PrefixHitsThenAContentHitUnderEachRepair) {
  Fixture f;
  const int64_t n = int64_t(f.prompt.size());
  ReusePolicy pol;
  pol.mode = ReuseMode::kSelective;
  pol.repair_tokens = 4;
  const reuse::PromptPlan p = reuse::plan_prompt(input(f.prompt, 0, &f.store, pol));
  ASSERT_EQ(p.chunk_src.size(), 4u);
  EXPECT_EQ(p.chunk_src[0], reuse::ChunkSrc::kStorePrefix);
  EXPECT_EQ(p.chunk_src[1], reuse::ChunkSrc::kStorePrefix);
  EXPECT_EQ(p.chunk_src[2], reuse::ChunkSrc::kComputed);
  EXPECT_EQ(p.chunk_src[3], reuse::ChunkSrc::kStoreContent);
  ASSERT_EQ(p.copy_ins.size(), 3u);
  EXPECT_EQ(p.copy_ins[0].begin, 0);
  EXPECT_EQ(p.copy_ins[1].begin, 16);
  EXPECT_EQ(p.copy_ins[2].begin, 48);
  EXPECT_EQ(p.copy_ins[2].chunk->pos0, 16);  // re-rotated from 16 to 48 by the runner
  for (int64_t q = 0; q < n; ++q)
    EXPECT_EQ(p.pos_state[size_t(q)], q < 32 ? reuse::kExact : q < 48 ? reuse::kNew : reuse::kApprox) << q;
  EXPECT_EQ(p.frontier, 32);
  EXPECT_EQ(p.first_approx, 48);
  EXPECT_EQ(p.exact_limit, 48);
  EXPECT_EQ(p.context_limit, 48);
  EXPECT_EQ(p.run_starts, std::vector<int64_t>{48});
  EXPECT_EQ(p.rung, ReuseMode::kSelective);
  // Selective: the new chunk, the run's first 4 tokens and the last token.
  std::vector<int32_t> want = iota_tokens(16, 32);
  for (int32_t q : {48, 49, 50, 51, 63}) want.push_back(q);
  EXPECT_EQ(p.todo, want);
  EXPECT_EQ(p.probe_rows, (std::vector<int64_t>{48, 49, 50, 51}));
  EXPECT_EQ(p.n_recomputed, 5);
  EXPECT_EQ(p.n_reused, 48);
  EXPECT_EQ(p.n_new, 16);

  pol.mode = ReuseMode::kNone;  // reused as they are: only the new chunk and the last token
  const reuse::PromptPlan none = reuse::plan_prompt(input(f.prompt, 0, &f.store, pol));
  EXPECT_EQ(none.todo.size(), 17u);
  EXPECT_EQ(none.todo.back(), 63);
  EXPECT_TRUE(none.probe_rows.empty());

  pol.mode = ReuseMode::kCacheBlend;  // one pass from the frontier; no row list
  const reuse::PromptPlan cb = reuse::plan_prompt(input(f.prompt, 0, &f.store, pol));
  EXPECT_TRUE(cb.blend);
  EXPECT_TRUE(cb.todo.empty());
  EXPECT_EQ(cb.blend_plan.from, 32);
  ASSERT_EQ(cb.blend_plan.reused.size(), 32u);
  EXPECT_EQ(std::accumulate(cb.blend_plan.reused.begin(), cb.blend_plan.reused.end(), 0), 16);
  EXPECT_EQ(cb.n_recomputed, 0);  // the pass reports what it selected

  pol.mode = ReuseMode::kPrefixOnly;  // the content hit is not taken
  const reuse::PromptPlan pre = reuse::plan_prompt(input(f.prompt, 0, &f.store, pol));
  EXPECT_EQ(pre.chunk_src[3], reuse::ChunkSrc::kComputed);
  EXPECT_FALSE(pre.approximate());
  EXPECT_EQ(pre.copy_ins.size(), 2u);
  EXPECT_EQ(pre.todo.size(), 32u);

  // auto: the ladder's first rung is the cost model's choice for these counts.
  pol.mode = ReuseMode::kAuto;
  reuse::Guard g;
  reuse::PromptInput in = input(f.prompt, 0, &f.store, pol);
  in.guard = &g;
  const reuse::PromptPlan au = reuse::plan_prompt(in);
  const int64_t sel_rows = 5;  // from the first approximate token: repair_tokens 4, and the last token
  EXPECT_EQ(au.rung, reuse::first_rung(kShape.n_layers, sel_rows, n - 48, 0, 16, 0.5, 0.5));
  // A selective repair that always trips makes CacheBlend the first rung.
  for (int i = 0; i < 50; ++i) g.record_check(ReuseMode::kSelective, true);
  for (int i = 0; i < 50; ++i) g.record_check(ReuseMode::kCacheBlend, false);
  EXPECT_EQ(reuse::plan_prompt(in).rung, ReuseMode::kCacheBlend);
}

TEST(ReusePlan, CachedPrefixInsideAChunkIsNotCopiedAgain) {
  Fixture f;
  ReusePolicy pol;
  pol.mode = ReuseMode::kSelective;
  const reuse::PromptPlan p = reuse::plan_prompt(input(f.prompt, 8, &f.store, pol));
  ASSERT_GE(p.copy_ins.size(), 1u);
  EXPECT_EQ(p.copy_ins[0].begin, 0);
  EXPECT_EQ(p.copy_ins[0].from, 8);  // rows 0..7 are the block cache's
  EXPECT_EQ(p.n_cached, 32);
}

TEST(ReusePlan, BlendBudgetCountsForcedRunStarts) {
  std::vector<uint8_t> st(100, reuse::kApprox);
  for (int q = 0; q < 20; ++q) st[size_t(q)] = reuse::kNew;
  ReusePolicy pol;
  pol.blend_ratio = 0.125f;  // 80 candidates: a budget of 10
  pol.blend_first_ratio = 0.5f;
  pol.blend_run_starts = 3;
  const std::vector<int64_t> starts{20, 60};
  const reuse::BlendPlan b = reuse::plan_blend(pol, st, 10, starts);
  EXPECT_EQ(b.from, 10);
  EXPECT_EQ(b.forced, 6);
  EXPECT_EQ(b.reused[size_t(20 - 10)], 0);  // forced out of the candidates
  EXPECT_EQ(b.reused[size_t(23 - 10)], 1);
  EXPECT_EQ(std::accumulate(b.reused.begin(), b.reused.end(), 0), 74);
  EXPECT_FLOAT_EQ(b.ratio, 4.0f / 74.0f);          // the 4 left of the budget of 10
  EXPECT_FLOAT_EQ(b.first_ratio, 34.0f / 74.0f);   // ceil(0.5 * 80) - 6
  pol.sink_tokens = 30;  // sink tokens are always computed: never candidates
  const reuse::BlendPlan s = reuse::plan_blend(pol, st, 0, {});
  EXPECT_EQ(std::accumulate(s.reused.begin(), s.reused.end(), 0), 70);
}

TEST(ReusePlan, DirtyContentKeysDependOnTheRepairSettings) {
  const auto t = iota_tokens(16, 3);
  ReusePolicy a, b;
  b.repair_tokens = a.repair_tokens + 1;
  EXPECT_EQ(reuse::dirty_content_key("m", a, "", t), reuse::dirty_content_key("m", a, "", t));
  EXPECT_NE(reuse::dirty_content_key("m", a, "", t), reuse::dirty_content_key("m", b, "", t));
  EXPECT_NE(reuse::dirty_content_key("m", a, "", t), reuse::dirty_content_key("m", a, "tenant", t));
  EXPECT_NE(reuse::dirty_content_key("m", a, "", t), reuse::dirty_content_key("m2", a, "", t));
  EXPECT_NE(reuse::repair_tag(a), reuse::repair_tag(b));
}

TEST(ReuseGuard, ThresholdTripRateAndFile) {
  reuse::Guard g;
  ReusePolicy pol;
  pol.guard_lead = 0.7f;
  pol.guard_risk = 0.1f;
  EXPECT_EQ(g.threshold(ReuseMode::kSelective, pol), 0.7f);  // nothing learned: the fixed lead
  EXPECT_DOUBLE_EQ(g.trip_rate(ReuseMode::kSelective), 0.5);
  g.record_check(ReuseMode::kSelective, true);
  g.record_check(ReuseMode::kSelective, false);
  g.record_check(ReuseMode::kSelective, false);
  EXPECT_DOUBLE_EQ(g.trip_rate(ReuseMode::kSelective), 2.0 / 5.0);
  const std::vector<float> errs{0.1f, -0.2f, 0.3f, 0.05f, 0.0f};
  for (float e : errs) g.observe(ReuseMode::kSelective, e);
  EXPECT_FLOAT_EQ(g.threshold(ReuseMode::kSelective, pol), guard_threshold(errs, 0.1f, 0.7f));
  EXPECT_EQ(g.threshold(ReuseMode::kCacheBlend, pol), 0.7f);  // per repair
  pol.guard_risk = 0;
  EXPECT_EQ(g.threshold(ReuseMode::kSelective, pol), 0.7f);  // risk 0: always the fixed lead
  pol.guard_lead = 0;
  EXPECT_EQ(g.threshold(ReuseMode::kSelective, pol), 0.0f);  // off
  EXPECT_NE(test::error_of([&] { g.observe(ReuseMode::kAuto, 0.1f); }).find("not auto"), std::string::npos);
  for (int i = 0; i < int(kGuardWindow) + 5; ++i) g.observe(ReuseMode::kNone, float(i));
  EXPECT_EQ(g.calibration().errors[size_t(ReuseMode::kNone)].size(), kGuardWindow);
  EXPECT_EQ(g.calibration().errors[size_t(ReuseMode::kNone)].front(), 5.0f);  // the oldest left

  const std::string dir = test::make_temp_dir("reuse_guard");
  const std::string file = dir + "/guard.txt";
  g.save(file, "kvb1-a");
  reuse::Guard h;
  h.load(file, "kvb1-a");
  EXPECT_EQ(h.calibration().errors, g.calibration().errors);
  EXPECT_EQ(h.calibration().n_checked, g.calibration().n_checked);
  reuse::Guard other;
  const std::string why = test::error_of([&] { other.load(file, "kvb1-b"); });
  EXPECT_NE(why.find(file), std::string::npos) << why;
  EXPECT_NE(why.find("calibration of model kvb1-a"), std::string::npos) << why;
  EXPECT_TRUE(other.calibration().errors[size_t(ReuseMode::kSelective)].empty());  // unchanged
}

TEST(ReuseCost, TheLadderFollowsTheTripRates) {
  // 18 layers, a 1000-token approximate span, 100 new tokens: selective recomputes 150 rows.
  const int64_t L = 18, span = 1000, n_new = 100, n_approx = 900, sel = 150;
  const double blend = reuse::blend_cost(L, span, n_new, n_approx);
  EXPECT_GT(blend, double(sel));  // CacheBlend costs more rows than selective ...
  EXPECT_LT(blend, double(span));  // ... and less than the recompute
  EXPECT_EQ(reuse::first_rung(L, sel, span, n_new, n_approx, 0.0, 0.0), ReuseMode::kSelective);
  EXPECT_EQ(reuse::first_rung(L, sel, span, n_new, n_approx, 1.0, 0.0), ReuseMode::kCacheBlend);
  EXPECT_TRUE(reuse::blend_step_pays(L, span, n_new, n_approx, 0.0));
  EXPECT_FALSE(reuse::blend_step_pays(L, span, n_new, n_approx, 1.0));  // it would always trip
}

}  // namespace
}  // namespace kvboost
