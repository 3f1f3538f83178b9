// Tensor parallelism under the engine (EngineOptions::tp; src/runtime/tp_ranks.*, runner_tp.cpp):
// tp ranks in the engine's process, each with its shard of the model and the K/V of its heads,
// under the one scheduler, prefix cache and chunk store. Every test compares TP = 2 and 4 with
// TP = 1 on the same requests: batched greedy decodes, prefix-cache hits, chunk reuse in every
// repair mode (copy-in with key re-rotation scattered to the ranks by heads, CacheBlend's
// selection over all heads), chunks gathered from the ranks into a store that a TP = 1 engine
// then serves, and the Errors for what does not split.
#include "error_of.h"
#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "greedy.h"
#include "test_util.h"
#include "tp_ranks.h"  // src/runtime

using namespace kvboost;
using kvboost::test::greedy;
using kvboost::test::error_of;

namespace {

std::string stories() { return test::model_path("stories260K"); }

const std::vector<std::string> kPrompts = {"Once upon a time", "The cat sat on the", "Lily and Ben went to the park",
                                           "One day, a little bird"};

// A tiny fixture of `arch` (8 heads over 4 K/V heads) with logits far from a tie; layers 0 and
// dtype "" keep the preset's.
std::string tp_fixture(const std::string& arch, const std::string& name, int64_t layers = 0, const std::string& dtype = "") {
  FixtureSpec s = fixture_preset("tiny");
  s.arch = arch;
  if (layers > 0) s.layers = layers;
  if (!dtype.empty()) s.dtype = dtype;
  s.init_std = 0.08f;
  const std::string dir = test::make_temp_dir(name);
  write_fixture_model(dir, s);
  return dir;
}

std::unique_ptr<Engine> load(const std::string& dir, int tp, EngineOptions eo = {}) {
  eo.tp = tp;
  return Engine::load(dir, eo);
}

// The prompts submitted together and stepped to the end: each one's greedy ids.
std::vector<std::vector<int32_t>> batched(Engine& e, int64_t max_new, bool prefix_cache = false) {
  GenerateOptions o;
  o.max_new_tokens = max_new;
  o.prefix_cache = prefix_cache;
  o.sampling.temperature = 0.0f;
  o.ignore_eos = true;
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : kPrompts) reqs.push_back(e.submit(e.tokenizer().encode(p, true), o));
  int64_t max_decode = 0;
  while (e.has_work()) max_decode = std::max(max_decode, e.step().n_decode);
  EXPECT_EQ(max_decode, int64_t(kPrompts.size())) << "the requests did not decode in the same passes";
  std::vector<std::vector<int32_t>> out;
  for (auto& r : reqs) {
    EXPECT_TRUE(r->done());
    EXPECT_TRUE(r->result().error.empty()) << r->result().error;
    out.push_back(r->result().output_ids);
  }
  return out;
}

const std::string kSys = "You are a helpful assistant who tells short stories.";
const std::string kDocA = "Tom had a red ball. He liked to play with it in the park every day after lunch. ";
const std::string kDocB = "Sue saw a big dog. The dog was happy and ran to her with a stick in its mouth. ";

// System prompt, two documents, a question; segment starts between them.
std::vector<int32_t> rag(const Engine& e, const std::string& d1, const std::string& d2, std::vector<int64_t>* segs) {
  const Tokenizer& t = e.tokenizer();
  std::vector<int32_t> ids = t.encode(kSys, true);
  segs->assign({int64_t(ids.size())});
  for (const std::string* d : {&d1, &d2}) {
    const auto x = t.encode(*d + *d + *d, false);
    ids.insert(ids.end(), x.begin(), x.end());
    segs->push_back(int64_t(ids.size()));
  }
  const auto q = t.encode(" What did they do?", false);
  ids.insert(ids.end(), q.begin(), q.end());
  return ids;
}

GenerateOptions reuse_opts(const std::vector<int64_t>& segs, ReuseMode m) {
  GenerateOptions o;
  o.max_new_tokens = 16;
  o.ignore_eos = true;
  o.sampling.temperature = 0.0f;
  o.segment_starts = segs;
  o.reuse.mode = m;
  return o;
}

EngineOptions chunked() {
  EngineOptions eo;
  eo.chunk_size = 16;
  return eo;
}

}  // namespace

TEST(EngineTp, BatchedGreedyDecodesMatchTp1) {
  KVBOOST_REQUIRE_PATH(stories());
  const auto want = batched(*load(stories(), 1), 40);
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto e = load(stories(), tp);
    EXPECT_EQ(batched(*e, 40), want);
    EXPECT_EQ(e->kv_stats().blocks_used, 0);
  }
}

// The prompt's blocks committed by one request are the next one's prefix hit: the ranks' K/V
// of those blocks (each its heads) are what the second request attends to.
TEST(EngineTp, PrefixCacheHitsGiveTheSameOutput) {
  KVBOOST_REQUIRE_PATH(stories());
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.sampling.temperature = 0.0f;
  o.ignore_eos = true;
  const std::string p = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.";
  auto one = load(stories(), 1);
  const GenerateResult ref = one->generate(p, o);
  auto e = load(stories(), 2);
  const GenerateResult first = e->generate(p, o), second = e->generate(p, o);
  EXPECT_EQ(first.output_ids, ref.output_ids);
  EXPECT_EQ(second.output_ids, ref.output_ids);
  EXPECT_GT(second.n_cached, 16) << "no prefix hit";
}

// Documents cached in one order, asked in the other: copy-in at new positions (keys re-rotated
// on every rank), then each repair mode; the same output and the same reuse counts as TP = 1.
TEST(EngineTp, ReorderedChunkReuseMatchesTp1InEveryMode) {
  KVBOOST_REQUIRE_PATH(stories());
  for (ReuseMode m : {ReuseMode::kNone, ReuseMode::kSelective, ReuseMode::kCacheBlend, ReuseMode::kAuto}) {
    SCOPED_TRACE(reuse_mode_name(m));
    std::vector<GenerateResult> got;
    for (int tp : {1, 2}) {
      auto e = load(stories(), tp, chunked());
      std::vector<int64_t> segs;
      e->warm(rag(*e, kDocA, kDocB, &segs), segs);
      const std::vector<int32_t> ids = rag(*e, kDocB, kDocA, &segs);
      got.push_back(e->generate_ids(ids, reuse_opts(segs, m)));
      EXPECT_GT(got.back().n_reused, 32) << "tp " << tp << ": the documents were not reused";
    }
    EXPECT_EQ(got[1].output_ids, got[0].output_ids);
    EXPECT_EQ(got[1].n_reused, got[0].n_reused);
    EXPECT_EQ(got[1].n_cached, got[0].n_cached);
  }
}

// Chunks computed under TP = 2 are gathered from both ranks' heads into the store; a TP = 1
// engine sharing the store serves the whole prompt from them, and answers as from its own.
TEST(EngineTp, ChunksStoredUnderTpServeATp1Engine) {
  KVBOOST_REQUIRE_PATH(stories());
  std::vector<int64_t> segs;
  std::vector<int32_t> ids;
  std::vector<int32_t> own;  // TP = 1 from chunks it stored itself
  {
    auto e = load(stories(), 1, chunked());
    ids = rag(*e, kDocA, kDocB, &segs);
    e->warm(ids, segs);
    own = e->generate_ids(ids, reuse_opts(segs, ReuseMode::kPrefixOnly)).output_ids;
  }
  auto probe = load(stories(), 1, chunked());
  kv::ChunkStoreOptions so;
  so.ram_bytes = size_t(64) << 20;
  auto shared = std::make_shared<kv::ChunkStore>(probe->chunk_store()->shape(), so);
  EngineOptions eo = chunked();
  eo.shared_chunk_store = shared;
  auto tp2 = load(stories(), 2, eo);
  tp2->warm(ids, segs);
  ASSERT_GT(shared->stats().entries, 3);
  auto tp1 = load(stories(), 1, eo);
  GenerateOptions o = reuse_opts(segs, ReuseMode::kNone);  // the stored K/V as they are
  o.reuse.store = false;
  const GenerateResult r = tp1->generate_ids(ids, o);
  EXPECT_GE(r.n_reused, int64_t(ids.size()) - 16) << "the TP = 1 engine did not use TP = 2's chunks";
  EXPECT_EQ(r.output_ids, own);
}

// Other layer layouts: q/k/v biases split by rows (qwen2), q/k norms (qwen3).
TEST(EngineTp, FixtureArchitecturesMatchTp1) {
  for (const std::string arch : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    const std::string dir = tp_fixture(arch, "engine_tp_" + arch);
    const GenerateOptions o = greedy(16);
    const std::string p = "Hello there, this is a test of the shards.";
    const GenerateResult ref = load(dir, 1)->generate(p, o);
    for (int tp : {2, 4}) EXPECT_EQ(load(dir, tp)->generate(p, o).output_ids, ref.output_ids) << "tp " << tp;
  }
}

TEST(EngineTp, WhatDoesNotSplitIsAClearError) {
  KVBOOST_REQUIRE_PATH(stories());
  const std::string e3 = error_of([&] { load(stories(), 3); });
  EXPECT_NE(e3.find("8 attention heads and 4 K/V heads do not split over 3 ranks"), std::string::npos) << e3;
  EXPECT_NE(e3.find("stories260K"), std::string::npos) << e3;
  EXPECT_NE(error_of([&] { load(stories(), 0); }).find("tp (--tp) 0: tensor parallelism needs 1 .. 64 ranks"),
            std::string::npos);
}

// A cold tier under TP: a block spills with every rank's heads (TpHotTier) and the ranks' pagers
// page back in step (rank 0 pages in for all; kv::PagerSync). A quarter of the sequence's blocks
// hot, then three requests submitted together (the CPU's cold tier runs one at a time) each
// outgrowing the pool: the same greedy ids as a TP = 1 engine with all its K/V hot.
TEST(EngineTp, ColdTierSpillsEveryRanksHeadsAndPagesThemBack) {
  KVBOOST_REQUIRE_PATH(stories());
  const GenerateOptions o = greedy(251);  // 5 prompt tokens + 251 = 16 blocks of 16
  auto full = load(stories(), 1);
  const std::vector<int32_t> want = full->generate("Once upon a time", o).output_ids;
  const ModelConfig& c = full->model().config();
  const size_t per_block = size_t(16 * 2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  for (int tp : {2, 4}) {
    SCOPED_TRACE(tp);
    EngineOptions eo;
    eo.kv_budget_bytes = 4 * per_block;
    eo.cold_dir = test::make_temp_dir("engine_tp_cold");
    auto e = load(stories(), tp, eo);
    EXPECT_EQ(e->generate("Once upon a time", o).output_ids, want);
    const kv::KvStats st = e->kv_stats();
    EXPECT_EQ(st.n_blocks, 4);
    EXPECT_GT(st.spills, 0);
    EXPECT_GT(st.page_ins, 0);
  }
  // Three requests of 6 blocks over a hot pool of 4.
  EngineOptions eo;
  eo.max_batch = 3;
  const std::vector<std::string> prompts = {"Once upon a time there was a little girl", "The cat sat on the mat and",
                                            "Lily and Ben went to the park to play"};
  auto run = [&](Engine& e) {
    GenerateOptions g = o;
    g.max_new_tokens = 86;
    g.prefix_cache = false;
    std::vector<std::shared_ptr<Request>> reqs;
    for (const auto& p : prompts) reqs.push_back(e.submit(e.tokenizer().encode(p, true), g));
    while (e.has_work()) e.step();
    std::vector<std::vector<int32_t>> ids;
    for (const auto& r : reqs) {
      EXPECT_EQ(r->result().error, "");
      ids.push_back(r->result().output_ids);
    }
    return ids;
  };
  const auto want3 = run(*load(stories(), 1, eo));
  eo.kv_budget_bytes = 4 * per_block;
  eo.cold_dir = test::make_temp_dir("engine_tp_cold3");
  auto e = load(stories(), 2, eo);
  EXPECT_EQ(run(*e), want3);
  EXPECT_GT(e->kv_stats().spills, 0);
  EXPECT_GT(e->kv_stats().page_ins, 0);
}

// Layer streaming under TP (--weight-budget): the ranks share the model's streamer, each pass
// reading every layer once as at TP = 1, each rank taking its slices of the slot. Budgets of two
// and three layers at tp 2 and 4 give the resident tp's ids; the layers read stay one pass's
// worth per pass (one streamer per rank would read each layer `tp` times).
TEST(EngineTp, LayerStreamingSharesOneStreamerOverTheRanks) {
  for (const std::string arch : {"llama", "qwen2"}) {
    SCOPED_TRACE(arch);
    const int64_t n_layers = 4;
    const std::string dir = tp_fixture(arch, "engine_tp_stream_" + arch, n_layers, "bf16");
    const GenerateOptions o = greedy(16);
    const std::vector<std::string> prompts = {"Hello there, this is a test of the shards.", "Once upon a time"};
    LoadOptions probe;
    probe.weight_budget = Model::load(dir, LoadOptions{})->weight_bytes() / 2;
    const std::unique_ptr<Model> streamed = Model::load(dir, probe);
    const uint64_t slot = streamed->stream_info().slot_bytes;
    ASSERT_GT(slot, 0u);
    const std::string e1 = error_of([&] { TpShard::create(*streamed, 0, 2); });
    EXPECT_NE(e1.find("the model is layer-streamed"), std::string::npos) << e1;
    for (int tp : {2, 4}) {
      auto resident = load(dir, tp);
      std::vector<std::vector<int32_t>> want;
      for (const auto& p : prompts) want.push_back(resident->generate(p, o).output_ids);
      for (uint64_t n : {2, 3}) {
        SCOPED_TRACE(testing::Message() << "tp " << tp << ", " << n << " slots");
        EngineOptions eo;
        eo.load.weight_budget = n * slot;
        auto e = load(dir, tp, eo);
        ASSERT_TRUE(e->model().stream_info().streaming);
        for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(e->generate(prompts[i], o).output_ids, want[i]);
        const Model::StreamInfo si = e->model().stream_info();
        EXPECT_GT(si.passes, 0u);
        EXPECT_GE(si.layers_read, si.passes * uint64_t(n_layers));
        EXPECT_LE(si.layers_read, (si.passes + 1) * uint64_t(n_layers));  // read-ahead: under one pass more
      }
    }
  }
}

// Gemma 3's sandwich norms are not in the TP layer: refused by name, before any rank is made.
TEST(EngineTp, Gemma3IsAClearError) {
  const std::string g = test::gemma3_path();
  KVBOOST_REQUIRE_PATH(g);
  const std::string eg = error_of([&] { load(g, 2); });
  EXPECT_NE(eg.find("model_type \"gemma3\" is not supported (llama, mistral, qwen2, qwen3)"), std::string::npos) << eg;
}

// The rank team itself: a rank that fails while the others wait in a collective aborts the
// group (no wait for the collective's timeout), its own message is the error, and the next call
// runs on a fresh group with every rank in step.
TEST(EngineTp, AFailingRankIsTheErrorAndTheNextCallRuns) {
  KVBOOST_REQUIRE_PATH(stories());
  LoadOptions lo;
  lo.pack_weights = false;
  auto m = Model::load(stories(), lo);
  const ModelConfig& c = m->config();
  kv::PagedKvStorage store(4, 16, c.n_layers, c.n_kv_heads / 2, c.head_dim);
  TpRanks ranks(*m, 2, store, kernels::Device{}, 64, 0);
  ASSERT_EQ(ranks.world(), 2);
  const double t0 = now_ms();
  const std::string e = error_of([&] {
    ranks.run([&](int r) {
      if (r == 1) fail("rank one could not go on");
      float x = 1;
      ranks.rank(r).comm.all_reduce_sum(&x, 1);  // rank 0 waits here for rank 1
    });
  });
  EXPECT_EQ(e, "rank one could not go on");
  EXPECT_LT(now_ms() - t0, 10'000.0) << "rank 0 waited for the collective's timeout";
  for (int round = 0; round < 3; ++round) {
    std::vector<float> got(2, 0.0f);
    ranks.run([&](int r) {
      float x = float(r + 1);
      ranks.rank(r).comm.all_reduce_sum(&x, 1);
      got[size_t(r)] = x;
    });
    EXPECT_EQ(got, (std::vector<float>{3.0f, 3.0f})) << "round " << round;
  }
  EXPECT_NE(error_of([&] { TpRanks(*m, 3, store, kernels::Device{}, 64, 0); }).find("do not split over 3 ranks"),
            std::string::npos);
  kv::PagedKvStorage whole(4, 16, c.n_layers, c.n_kv_heads, c.head_dim);
  EXPECT_NE(error_of([&] { TpRanks(*m, 2, whole, kernels::Device{}, 64, 0); })
                .find("the engine's K/V pools hold 4 K/V heads; a rank of 2 holds 2"),
            std::string::npos);
}
