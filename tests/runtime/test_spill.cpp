// Cold-block spill: a generation whose KV outgrows the hot budget completes with the same
// greedy output as with an unlimited budget.
#include <algorithm>

#include "engine_impl.h"
#include "kvboost/runtime.h"
#include "request.h"
#include "scheduler.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;

TEST(ColdSpill, QuarterHotBudgetGivesTheSameGreedyOutput) {
  const std::string stories = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(stories);
  GenerateOptions opt;
  opt.max_new_tokens = 251;  // 5 prompt tokens + 251 = 256 tokens = 16 blocks of 16
  opt.ignore_eos = true;
  auto full = Engine::load(stories);
  GenerateResult want = full->generate("Once upon a time", opt);
  ASSERT_EQ(want.output_ids.size(), 251u);

  const auto& c = full->model().config();
  const size_t per_block = size_t(16 * 2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  EngineOptions eo;
  eo.kv_budget_bytes = 4 * per_block;  // a quarter of the sequence's 16 blocks
  eo.cold_dir = test::make_temp_dir("cold_spill");
  auto small = Engine::load(stories, eo);
  GenerateResult got = small->generate("Once upon a time", opt);
  EXPECT_EQ(got.output_ids, want.output_ids);
  EXPECT_EQ(got.text, want.text);
  kv::KvStats st = small->kv_stats();
  EXPECT_EQ(st.n_blocks, 4);
  EXPECT_GT(st.spills, 0);
  EXPECT_GT(st.page_ins, 0);
  std::printf("hot pool 4 blocks for a 16-block sequence: %lld spills, %lld page-ins\n", (long long)st.spills,
              (long long)st.page_ins);
  // without a cold tier the same budget runs out: an error, not a crash or wrong output
  eo.cold_dir.clear();
  auto nocold = Engine::load(stories, eo);
  EXPECT_THROW(nocold->generate("Once upon a time", opt), Error);
  // and the engine keeps working afterwards
  opt.max_new_tokens = 20;
  EXPECT_EQ(nocold->generate("Once upon a time", opt).output_ids,
            std::vector<int32_t>(want.output_ids.begin(), want.output_ids.begin() + 20));
}

TEST(ColdSpill, SlidingWindowModelWithSpill) {
  // a mistral-style model with a small window: ranges entirely outside the window are skipped
  const std::string dir = test::make_temp_dir("cold_swa");
  FixtureSpec s = fixture_preset("tiny");
  s.arch = "mistral", s.sliding_window = 24, s.tokenizer_kind = "bytelevel", s.vocab = 512;
  write_fixture_model(dir, s);
  GenerateOptions opt;
  opt.max_new_tokens = 120;
  opt.ignore_eos = true;
  auto full = Engine::load(dir);
  auto want = full->generate("hello world", opt);
  const auto& c = full->model().config();
  EngineOptions eo;
  eo.kv_budget_bytes = size_t(3 * 16 * 2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  eo.cold_dir = test::make_temp_dir("cold_swa_store");
  auto small = Engine::load(dir, eo);
  auto got = small->generate("hello world", opt);
  EXPECT_EQ(got.output_ids, want.output_ids);
  EXPECT_GT(small->kv_stats().spills, 0);
}

// The device's residency rule (a pass reads whole block tables: scheduler.cpp device_slice) on
// the CPU, whose cold tier would page by range anyway: requests whose K/V together are twice the
// pool take turns, one table resident at a time, and give the same greedy output as all of them
// batched in a pool that holds everything.
TEST(ColdSpill, DeviceSlicesTakeTurnsWithTheSameGreedyOutput) {
  const std::string stories = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(stories);
  const std::vector<std::string> prompts = {"Once upon a time there was a little girl", "The cat sat on the mat and",
                                            "Lily and Ben went to the park to play"};
  GenerateOptions g;
  g.max_new_tokens = 86;
  g.ignore_eos = true;
  g.prefix_cache = false;
  g.sampling.temperature = 0.0f;
  EngineOptions eo;
  eo.max_batch = 3;
  eo.spec.mode = SpecMode::kOff;
  // Steps through schedule() / execute(); counts the steps in which some running request sat out.
  auto run = [&](Engine& e, int64_t* sat_out) {
    std::vector<std::shared_ptr<Request>> reqs;
    for (const auto& p : prompts) reqs.push_back(e.submit(e.tokenizer().encode(p, true), g));
    Engine::Impl& impl = e.impl();
    while (std::any_of(reqs.begin(), reqs.end(), [](const auto& r) { return !r->done(); })) {
      StepPlan plan = impl.schedule();
      if (plan.batch.size() < impl.running_.size()) ++*sat_out;
      impl.execute(plan);
    }
    std::vector<std::vector<int32_t>> ids;
    for (const auto& r : reqs) {
      EXPECT_EQ(r->result().error, "");
      ids.push_back(r->result().output_ids);
    }
    return ids;
  };
  auto full = Engine::load(stories, eo);
  int64_t full_out = 0;
  const auto want = run(*full, &full_out);
  EXPECT_EQ(full_out, 0);
  const auto& c = full->model().config();
  const size_t per_block = size_t(16 * 2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  eo.kv_budget_bytes = 10 * per_block;  // ~21 blocks of K/V in all; 7 + 2 at most at once
  eo.cold_dir = test::make_temp_dir("cold_slices");
  auto small = Engine::load(stories, eo);
  small->impl().slice_for_testing_ = true;
  int64_t sat_out = 0;
  const auto got = run(*small, &sat_out);
  EXPECT_EQ(got, want);
  EXPECT_GT(sat_out, 0);
  const kv::KvStats st = small->kv_stats();
  EXPECT_GT(st.spills, 0);
  EXPECT_GT(st.page_ins, 0);
}
