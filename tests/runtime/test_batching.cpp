// Continuous batching: requests stepped together (and preempted under KV pressure) give exactly
// the output each gives alone.
#include <thread>

#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

const std::vector<std::string> kPrompts = {"Once upon a time", "The cat sat on the", "Lily and Ben went to the park",
                                           "One day, a little bird"};

TEST(Batching, SteppedTogetherEqualsAlone) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.prefix_cache = false;
  std::vector<GenerateResult> alone;
  for (const auto& p : kPrompts) alone.push_back(e->generate(p, o));
  std::vector<std::shared_ptr<Request>> reqs;
  std::vector<std::string> streamed(kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    GenerateOptions oi = o;
    oi.on_text = [&streamed, i](std::string_view t) {
      streamed[i] += t;
      return true;
    };
    reqs.push_back(e->submit(e->tokenizer().encode(kPrompts[i], true), oi));
  }
  int64_t max_decode = 0, steps = 0;
  while (e->has_work()) {
    const StepStats s = e->step();
    max_decode = std::max(max_decode, s.n_decode);
    ++steps;
  }
  EXPECT_EQ(max_decode, int64_t(kPrompts.size()));  // all decoded in the same passes
  EXPECT_LT(steps, 45);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(reqs[i]->done());
    const GenerateResult r = reqs[i]->result();
    EXPECT_EQ(r.output_ids, alone[i].output_ids) << kPrompts[i];
    EXPECT_EQ(r.text, alone[i].text);
    EXPECT_EQ(streamed[i], alone[i].text);
  }
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
}

TEST(Batching, PreemptionUnderKvPressureKeepsOutputs) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.block_size = 16;
  auto probe = Engine::load(stories());
  const auto& c = probe->model().config();
  const size_t per_block = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim * 16) * sizeof(float);
  eo.kv_budget_bytes = per_block * 8;  // 8 blocks: 128 tokens for 3 sequences of ~70
  auto e = Engine::load(stories(), eo);
  GenerateOptions o;
  o.max_new_tokens = 60;
  o.ignore_eos = true;
  std::vector<GenerateResult> alone;
  for (int i = 0; i < 3; ++i) alone.push_back(e->generate(kPrompts[size_t(i)], o));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(e->submit(e->tokenizer().encode(kPrompts[size_t(i)], true), o));
  while (e->has_work()) e->step();
  int64_t preempted = 0;
  for (int i = 0; i < 3; ++i) {
    const GenerateResult r = reqs[size_t(i)]->result();
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.output_ids, alone[size_t(i)].output_ids) << kPrompts[size_t(i)];
    preempted += r.n_preempted;
  }
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
}

TEST(Batching, CancelFreesKvAndConcurrentGenerateCallsShareSteps) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions o;
  o.max_new_tokens = 200;
  o.ignore_eos = true;
  auto r = e->submit(e->tokenizer().encode("Once upon a time", true), o);
  for (int i = 0; i < 5; ++i) e->step();
  EXPECT_GT(e->kv_stats().blocks_used, 0);
  r->cancel();
  e->step();
  EXPECT_TRUE(r->done());
  EXPECT_EQ(r->result().finish_reason, "cancelled");
  EXPECT_EQ(e->kv_stats().blocks_used, 0);
  // two threads calling generate: both finish with their own outputs
  o.max_new_tokens = 30;
  const auto a_alone = e->generate(kPrompts[0], o), b_alone = e->generate(kPrompts[1], o);
  GenerateResult a, b;
  std::thread ta([&] { a = e->generate(kPrompts[0], o); });
  std::thread tb([&] { b = e->generate(kPrompts[1], o); });
  ta.join(), tb.join();
  EXPECT_EQ(a.output_ids, a_alone.output_ids);
  EXPECT_EQ(b.output_ids, b_alone.output_ids);
}

}  // namespace

namespace {
TEST(Batching, RequestsSharingAPrefixAreGroupedBehindItsPrefill) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.prefill_chunk = 16;  // the first request's prefill takes several steps
  auto e = Engine::load(stories(), eo);
  const std::string shared = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";
  GenerateOptions o;
  o.max_new_tokens = 8;
  auto a = e->submit(e->tokenizer().encode(shared + " with her dog.", true), o);
  auto b = e->submit(e->tokenizer().encode(shared + " with her cat.", true), o);
  auto c = e->submit(e->tokenizer().encode("The cat sat on the mat.", true), o);  // unrelated: not held back
  const StepStats s1 = e->step();
  EXPECT_EQ(s1.n_running, 2);  // a and c; b waits for a's prefix
  EXPECT_EQ(s1.n_waiting, 1);
  while (e->has_work()) e->step();
  const GenerateResult rb = b->result();
  EXPECT_GE(rb.n_cached, 16);  // b reused a's committed blocks
  GenerateOptions alone = o;
  alone.prefix_cache = false;
  EXPECT_EQ(rb.output_ids, e->generate(shared + " with her cat.", alone).output_ids);
  EXPECT_TRUE(a->done() && c->done());
}
}  // namespace
