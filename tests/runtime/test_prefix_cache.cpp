// Automatic prefix caching end to end: a prefix hit gives the same output as a full prefill.
#include <cmath>

#include "kvboost/kv.h"
#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::string stories() { return test::model_path("stories260K"); }

// Last-position logits of `ids` through paged memory shared via the manager (prefix reuse).
std::vector<float> paged_logits(const Model& m, kv::KvCacheManager& mgr, kv::PagedKvStorage& st, kv::SeqId seq,
                                const std::vector<int32_t>& ids, int64_t* n_cached) {
  const auto& c = m.config();
  auto a = mgr.allocate_for_prompt(seq, ids, "t");
  EXPECT_TRUE(a.has_value());
  for (auto cp : a->copies) st.copy_block(cp.src, cp.dst);
  std::vector<float*> kp, vp;
  for (int64_t l = 0; l < c.n_layers; ++l) kp.push_back(st.k_pool(l)), vp.push_back(st.v_pool(l));
  KvView v;
  v.k_pools = kp.data(), v.v_pools = vp.data(), v.block_table = mgr.block_table(seq).data();
  v.block_size = mgr.block_size(), v.n_past = a->n_cached;
  std::vector<float> logits(size_t(c.vocab_size));
  m.forward(ids.data() + a->n_cached, int64_t(ids.size()) - a->n_cached, v, logits.data());
  mgr.commit_full_blocks(seq, ids);
  mgr.free(seq);
  *n_cached = a->n_cached;
  return logits;
}
}  // namespace

TEST(PrefixCache, Stories260KSameGreedyTokensWithAndWithoutHit) {
  KVBOOST_REQUIRE_PATH(stories());
  auto e = Engine::load(stories());
  GenerateOptions opt;
  opt.max_new_tokens = 60;
  const std::string prefix = "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
  opt.prefix_cache = false;
  auto cold_a = e->generate(prefix + "One day", opt);
  auto cold_b = e->generate(prefix + "Her mom", opt);
  EXPECT_EQ(cold_a.n_cached, 0);
  opt.prefix_cache = true;
  auto warm0 = e->generate(prefix + "One day", opt);  // fills the cache
  auto warm_a = e->generate(prefix + "One day", opt);
  auto warm_b = e->generate(prefix + "Her mom", opt);
  EXPECT_GE(warm_a.n_cached, 16);
  // whole blocks from the paged cache, the rest of the prompt from the chunk store's exact
  // prefix entry: everything but the last token, which always runs to give the logits
  EXPECT_EQ(warm_a.n_cached, int64_t(warm_a.prompt_ids.size()) - 1);
  EXPECT_GE(warm_b.n_cached, 16);
  EXPECT_LT(warm_b.n_cached, int64_t(warm_b.prompt_ids.size()));
  EXPECT_EQ(warm0.output_ids, cold_a.output_ids);
  EXPECT_EQ(warm_a.output_ids, cold_a.output_ids);
  EXPECT_EQ(warm_b.output_ids, cold_b.output_ids);
  EXPECT_EQ(warm_b.text, cold_b.text);
  // another tenant does not see this tenant's cache
  opt.cache_namespace = "other";
  auto other = e->generate(prefix + "One day", opt);
  EXPECT_EQ(other.n_cached, 0);
  EXPECT_EQ(other.output_ids, cold_a.output_ids);
  auto st = e->kv_stats();
  EXPECT_GT(st.hit_tokens, 0);
  EXPECT_GT(st.blocks_cached, 0);
  EXPECT_EQ(st.blocks_used, 0);  // every request freed its blocks
}

TEST(PrefixCache, Bf16ModelLogitsMatchFullPrefill) {
  const std::string dir = test::make_temp_dir("prefix_bf16");
  FixtureSpec s = fixture_preset("tiny");
  s.arch = "qwen2", s.dtype = "bf16", s.tokenizer_kind = "", s.vocab = 400, s.layers = 3;
  write_fixture_model(dir, s);
  auto m = Model::load(dir);
  const auto& c = m->config();
  kv::KvCacheManager mgr(64, 16);
  kv::PagedKvStorage st(64, 16, c.n_layers, c.n_kv_heads, c.head_dim);
  std::vector<int32_t> prefix;
  for (int i = 0; i < 40; ++i) prefix.push_back((i * 37 + 11) % 400);
  auto a = prefix, b = prefix;
  for (int i = 0; i < 9; ++i) a.push_back((i * 13 + 5) % 400), b.push_back((i * 29 + 3) % 400);
  int64_t n_cached = 0;
  paged_logits(*m, mgr, st, 1, a, &n_cached);
  EXPECT_EQ(n_cached, 0);
  auto hit = paged_logits(*m, mgr, st, 2, b, &n_cached);
  EXPECT_EQ(n_cached, 32);  // two full blocks of the shared 40-token prefix
  KvCache full(c, int64_t(b.size()));
  std::vector<float> ref(size_t(c.vocab_size));
  m->forward(b.data(), int64_t(b.size()), full, ref.data());
  double dot = 0, na = 0, nb = 0;
  float maxdiff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    maxdiff = std::max(maxdiff, std::fabs(hit[i] - ref[i]));
    dot += double(hit[i]) * ref[i], na += double(hit[i]) * hit[i], nb += double(ref[i]) * ref[i];
  }
  EXPECT_LT(maxdiff, 1e-4f);
  EXPECT_GT(dot / std::sqrt(na * nb), 0.999999);
  // fully cached prompt: the last token is recomputed and its logits are the same
  auto again = paged_logits(*m, mgr, st, 3, b, &n_cached);
  EXPECT_EQ(n_cached, int64_t(b.size()) - 1);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(again[i], ref[i], 1e-4f);
}

// A chat-style continuation: the next prompt is the previous prompt + its output + new text.
// Full blocks and the partly filled last block (commit_tail) of the finished request are reused,
// so everything but the previous output's last token (whose K/V were never computed) is cached,
// and the output equals a run without any cache.
TEST(PrefixCache, ContinuationReusesTheFinishedRequestToTheToken) {
  KVBOOST_REQUIRE_PATH(stories());
  EngineOptions eo;
  eo.chunk_store.ram_bytes = 0;  // block cache only: what the chunk store would add is not tested here
  auto e = Engine::load(stories(), eo);
  GenerateOptions opt;
  opt.max_new_tokens = 21;  // 1 + 21 + prompt: a partly filled last block for most prompts
  const std::vector<int32_t> p1 = e->tokenizer().encode("Once upon a time, there was a little dog named Max.");
  const GenerateResult r1 = e->generate_ids(p1, opt);
  ASSERT_EQ(r1.output_ids.size(), 21u);
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.output_ids.begin(), r1.output_ids.end());
  ASSERT_NE(p2.size() % 16, 1u) << "pick a prompt whose tail is longer than one token";
  const std::vector<int32_t> more = e->tokenizer().encode(" Then he ran home.", false);
  p2.insert(p2.end(), more.begin(), more.end());
  const GenerateResult warm = e->generate_ids(p2, opt);
  EXPECT_EQ(warm.n_cached, int64_t(p1.size() + r1.output_ids.size()) - 1);
  opt.prefix_cache = false;
  const GenerateResult cold = e->generate_ids(p2, opt);
  EXPECT_EQ(warm.output_ids, cold.output_ids);
}
