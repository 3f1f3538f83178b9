// The engine's step as data (src/runtime/scheduler.h): Engine::Impl::schedule() returns a
// StepPlan, Engine::Impl::execute() runs it. These tests look at each plan between the two
// (single-threaded, as Engine::step does under its lock): admission within max_batch, prefill
// chunks within prefill_chunk, decode rows at n_past, a CacheBlend repair as an entry of its
// own with the reuse plan's copy-ins recorded, preemption under KV pressure; and the outputs
// equal those of plain generation, so looking at a plan changes nothing.
#include <algorithm>

#include "engine_impl.h"
#include "kvboost/runtime.h"
#include "request.h"
#include "scheduler.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

const std::vector<std::string> kPrompts = {"Once upon a time there was a little girl", "The cat sat on the mat and",
                                           "Lily and Ben went to the park to play"};

EngineOptions small_steps() {
  EngineOptions eo;
  eo.max_batch = 2;
  eo.prefill_chunk = 8;
  eo.spec.mode = SpecMode::kOff;
  return eo;
}

GenerateOptions greedy(int n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.prefix_cache = false;
  o.sampling.temperature = 0.0f;
  return o;
}

TEST(StepPlan, AdmissionPrefillChunksAndDecodeRows) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories(), small_steps());
  const GenerateOptions o = greedy(6);
  std::vector<GenerateResult> alone;
  for (const auto& p : kPrompts) alone.push_back(e->generate(p, o));
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : kPrompts) reqs.push_back(e->submit(e->tokenizer().encode(p, true), o));
  Engine::Impl& impl = e->impl();

  StepPlan first = impl.schedule();
  ASSERT_EQ(first.admitted.size(), 2u);  // max_batch 2: the third waits
  EXPECT_EQ(first.admitted[0], &reqs[0]->state());
  EXPECT_EQ(first.admitted[1], &reqs[1]->state());
  EXPECT_TRUE(first.blends.empty());
  EXPECT_TRUE(first.copy_ins.empty());  // nothing stored yet
  // Prefill: the first request's first 8 positions (the step's whole budget), in order, with no
  // logits (its prefill goes on next step); the second gets no rows this step.
  ASSERT_EQ(first.batch.size(), 1u);
  const PlannedRows& rows = first.batch[0];
  EXPECT_FALSE(rows.decode);
  EXPECT_EQ(rows.req, &reqs[0]->state());
  ASSERT_EQ(rows.positions.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(rows.positions[i], int32_t(i));
  const std::vector<int32_t> ids0 = e->tokenizer().encode(kPrompts[0], true);
  EXPECT_TRUE(std::equal(rows.tokens.begin(), rows.tokens.end(), ids0.begin()));
  EXPECT_EQ(rows.logits, nullptr);
  EXPECT_EQ(first.n_prefill_tokens, 8);
  EXPECT_EQ(first.n_decode, 0);
  impl.execute(first);

  // Step until both admitted requests decode: their rows are one token each at n_past = the
  // tokens stored, with logits; the prefill budget is never exceeded.
  bool saw_decode = false;
  for (int step = 0; step < 200 && e->has_work(); ++step) {
    StepPlan p = impl.schedule();
    EXPECT_LE(p.n_prefill_tokens, 8);
    EXPECT_LE(p.batch.size(), 2u);
    int64_t n_decode = 0;
    for (const PlannedRows& b : p.batch) {
      if (!b.decode) continue;
      ++n_decode;
      ASSERT_EQ(b.tokens.size(), 1u);
      EXPECT_EQ(b.n_past, int64_t(b.req->history.size()) - 1);
      EXPECT_EQ(b.tokens[0], b.req->history.back());
      EXPECT_NE(b.logits, nullptr);
      EXPECT_EQ(b.n_logits, 1);
    }
    EXPECT_EQ(n_decode, p.n_decode);
    saw_decode |= p.n_decode == 2;
    impl.execute(p);
  }
  EXPECT_TRUE(saw_decode);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(reqs[i]->done());
    EXPECT_EQ(reqs[i]->result().output_ids, alone[i].output_ids) << kPrompts[i];
  }
}

const char* kDocs[] = {
    "Tom had a red ball. He liked to throw it high in the sky. One day the ball fell in the pond and Tom was sad.",
    "The little dog ran to the park. It saw a big tree and a small bird. The bird sang a happy song for the dog.",
};

TEST(StepPlan, ACacheBlendRepairIsAnEntryOfThePlan) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.chunk_size = 32;
  eo.spec.mode = SpecMode::kOff;
  auto e = Engine::load(stories(), eo);
  GenerateOptions o = greedy(4);
  o.prefix_cache = true;
  const std::vector<std::string> ab = {"Here are some stories.", std::string(" ") + kDocs[0], std::string(" ") + kDocs[1], " Once upon a time"};
  const std::vector<std::string> ba = {ab[0], ab[2], ab[1], ab[3]};
  e->generate_segments(ab, o);  // stores the chunks of both documents
  GenerateOptions r = o;
  r.reuse.mode = ReuseMode::kCacheBlend;
  r.reuse.guard_lead = 0;  // no guard: the repair stands
  std::vector<int64_t> segs;
  const std::vector<int32_t> ids = e->encode_segments(ba, true, &segs);
  r.segment_starts = segs;
  auto req = e->submit(ids, r);
  Engine::Impl& impl = e->impl();
  StepPlan p = impl.schedule();
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_TRUE(p.batch.empty());  // the repair runs in a pass of its own
  ASSERT_EQ(p.blends.size(), 1u);
  const PlannedBlend& b = p.blends[0];
  EXPECT_EQ(b.req, &req->state());
  EXPECT_EQ(b.n_past + b.n, int64_t(ids.size()));
  EXPECT_GT(b.n, 0);
  EXPECT_EQ(b.opts.check_layer, r.reuse.blend_check_layer);
  EXPECT_NE(b.opts.reused, nullptr);
  // The documents' chunks were copied in (content hits at new positions), recorded in order.
  ASSERT_FALSE(p.copy_ins.empty());
  for (const auto& c : p.copy_ins) {
    EXPECT_EQ(c.seq, req->state().seq);
    ASSERT_NE(c.op.chunk, nullptr);
    EXPECT_GE(c.op.begin + int64_t(c.op.chunk->tokens.size()), b.n_past);
  }
  bool moved = false;
  for (const auto& c : p.copy_ins) moved |= c.op.chunk->pos0 != c.op.begin;
  EXPECT_TRUE(moved);  // at least one chunk is re-positioned
  impl.execute(p);
  while (e->has_work()) e->step();
  const GenerateResult res = req->result();
  EXPECT_EQ(res.finish_reason, "length");
  EXPECT_GT(res.n_reused, 0);
  ASSERT_FALSE(res.reuse_steps.empty());
  EXPECT_EQ(res.reuse_steps[0].repair, "cacheblend");
}

TEST(StepPlan, PreemptionIsPlannedAndTheRequestResumes) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo = small_steps();
  eo.block_size = 16;
  eo.prefill_chunk = 512;
  auto probe = Engine::load(stories());
  const auto& c = probe->model().config();
  const size_t per_block = size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim * 16) * sizeof(float);
  eo.kv_budget_bytes = per_block * 6;  // 96 tokens for two sequences that grow to ~70 each
  auto e = Engine::load(stories(), eo);
  const GenerateOptions o = greedy(60);
  std::vector<GenerateResult> alone;
  for (int i = 0; i < 2; ++i) alone.push_back(e->generate(kPrompts[size_t(i)], o));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 2; ++i) reqs.push_back(e->submit(e->tokenizer().encode(kPrompts[size_t(i)], true), o));
  Engine::Impl& impl = e->impl();
  int64_t preempted = 0;
  for (int step = 0; step < 1000 && e->has_work(); ++step) {
    StepPlan p = impl.schedule();
    for (Request::State* v : p.preempted) {
      ++preempted;
      EXPECT_EQ(v, &reqs[1]->state());  // the newest request gives way
      EXPECT_EQ(v->seq, 0);             // its KV is freed
      for (const PlannedRows& b : p.batch) EXPECT_NE(b.req, v);  // and it has no rows this step
    }
    impl.execute(p);
  }
  EXPECT_GT(preempted, 0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(reqs[size_t(i)]->done());
    EXPECT_EQ(reqs[size_t(i)]->result().output_ids, alone[size_t(i)].output_ids);
    EXPECT_GT(reqs[1]->result().n_preempted, 0);
  }
}

}  // namespace
