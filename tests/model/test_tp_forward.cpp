// Tensor-parallel forward (TpShard, src/model/tp_forward.cpp) over the shared-memory
// collectives: TP = 2 and 4 in forked processes agree with TP = 1 and with the plain forward
// (logits within float tolerance, the same greedy tokens) on stories260K and on generated GQA
// fixtures (llama, qwen2 with q/k/v/o biases, qwen3 with q/k norms).
//
// Every model load and forward runs inside a child of dist::run_ranks (the reference too): the
// parent never starts the kernels' thread pool, which a fork would not carry.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>

#include "kvboost/dist.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;

using kvboost::test::error_of;

namespace {

constexpr int64_t kGen = 12;  // greedy tokens after the prompt

// What rank 0 of a run leaves in shared memory: the prompt's logits [n, vocab], then per
// generated step its logits [vocab], and the greedy tokens.
struct Shared {
  float* logits = nullptr;
  int32_t* tokens = nullptr;
  size_t n_logits = 0;
  Shared(int64_t n_prompt, int64_t vocab) {
    n_logits = size_t((n_prompt + kGen) * vocab);
    const size_t bytes = n_logits * sizeof(float) + size_t(kGen) * sizeof(int32_t);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    logits = static_cast<float*>(p);
    tokens = reinterpret_cast<int32_t*>(logits + n_logits);
    std::fill(logits, logits + n_logits, std::nanf(""));
    std::fill(tokens, tokens + kGen, -1);
  }
};

struct Run {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};

// world 0: the plain Model::forward (packed weights, the default load); else TpShard.
Run run(const std::string& dir, int world, const std::vector<int32_t>& prompt, int64_t vocab) {
  const int64_t n = int64_t(prompt.size());
  Shared sh(n, vocab);
  dist::run_ranks(std::max(world, 1), [&](dist::Comm& c) {
    LoadOptions o;
    o.pack_weights = world == 0;
    auto m = Model::load(dir, o);
    std::unique_ptr<TpShard> shard = world ? TpShard::create(*m, c.rank(), world) : nullptr;
    KvCache kv(shard ? shard->config() : m->config(), n + kGen + 1);
    std::vector<float> lg(static_cast<size_t>(n * vocab));
    auto fwd = [&](const int32_t* t, int64_t k, bool all) {
      if (shard) shard->forward(t, k, kv, lg.data(), all, c);
      else m->forward(t, k, kv, lg.data(), all);
    };
    fwd(prompt.data(), n, true);
    if (c.rank() == 0) std::copy(lg.begin(), lg.end(), sh.logits);
    int32_t tok = int32_t(kernels::argmax(&lg[size_t((n - 1) * vocab)], vocab));
    for (int64_t g = 0; g < kGen; ++g) {
      if (c.rank() == 0) sh.tokens[g] = tok;
      fwd(&tok, 1, false);
      if (c.rank() == 0) std::copy(lg.begin(), lg.begin() + vocab, sh.logits + (n + g) * vocab);
      tok = int32_t(kernels::argmax(lg.data(), vocab));
    }
  }, size_t(1) << 16, 120);
  Run r;
  r.logits.assign(sh.logits, sh.logits + sh.n_logits);
  r.tokens.assign(sh.tokens, sh.tokens + kGen);
  return r;
}

// Relative to the reference's largest |logit|: float reassociation of the split sums only.
void expect_logits_agree(const std::vector<float>& ref, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  float scale = 0, worst = 0;
  for (float v : ref) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " logit " << i;
    worst = std::max(worst, std::fabs(ref[i] - got[i]));
  }
  EXPECT_LT(worst, 2e-4f * std::max(scale, 1.0f)) << what << ": max |diff| " << worst << " (max |logit| " << scale << ")";
}

void expect_agree(const Run& ref, const Run& got, const std::string& what) {
  expect_logits_agree(ref.logits, got.logits, what);
  EXPECT_EQ(ref.tokens, got.tokens) << what;
}

void check_model(const std::string& dir, const std::vector<int32_t>& prompt) {
  const int64_t vocab = ModelConfig::from_dir(dir).vocab_size;
  const Run plain = run(dir, 0, prompt, vocab);
  for (int32_t t : plain.tokens) ASSERT_GE(t, 0);
  const Run tp1 = run(dir, 1, prompt, vocab);
  expect_agree(plain, tp1, "TP=1 vs the plain forward");
  for (int world : {2, 4}) expect_agree(tp1, run(dir, world, prompt, vocab), "TP=" + std::to_string(world) + " vs TP=1");
}

}  // namespace

TEST(TpForward, Stories260KAgreesAtTp2AndTp4) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  // "Once upon a time, there was a little" in stories260K's vocabulary, and more.
  check_model(dir, {1, 403, 407, 261, 378, 274, 291, 412, 312, 304, 375, 433, 293, 261});
}

class TpFixture : public ::testing::TestWithParam<std::string> {};

// GQA: 16 query heads over 4 K/V heads (groups of 4), head_dim 8; TP=4 leaves one K/V head and
// its four query heads per rank. intermediate 172: an uneven split at TP=4 is 43 each, at 2 86.
TEST_P(TpFixture, GqaFixtureAgreesAtTp2AndTp4) {
  FixtureSpec s;
  s.arch = GetParam();
  s.hidden = 128, s.heads = 16, s.kv_heads = 4, s.head_dim = 8, s.intermediate = 172, s.layers = 3;
  s.tokenizer_kind = "";
  s.vocab = 300;
  s.init_std = 0.08f;  // larger weights: logits far from a tie, attention far from uniform
  s.seed = 7;
  const std::string dir = test::make_temp_dir("tp_fixture_" + s.arch);
  dist::run_ranks(1, [&](dist::Comm&) { write_fixture_model(dir, s); });  // the parent stays pool-free
  check_model(dir, {5, 17, 240, 3, 99, 150, 150, 42, 7, 260, 11});
}

INSTANTIATE_TEST_SUITE_P(Archs, TpFixture, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(TpForward, BadShardsAreClearErrors) {
  const std::string dir = test::make_temp_dir("tp_errors");
  FixtureSpec s = fixture_preset("tiny");  // 8 heads, 4 K/V heads
  s.tokenizer_kind = "";
  write_fixture_model(dir, s);
  // Loading in the parent is fine here: no forward runs, and no fork follows.
  LoadOptions o;
  o.pack_weights = false;
  o.prefault = false;
  auto m = Model::load(dir, o);
  EXPECT_NE(error_of([&] { TpShard::create(*m, 0, 3); }).find("8 attention heads and 4 K/V heads do not split over 3 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TpShard::create(*m, 2, 2); }).find("rank 2 of world 2"), std::string::npos);
  auto packed = Model::load(dir);
  const std::string e = error_of([&] { TpShard::create(*packed, 0, 2); });
  EXPECT_TRUE(e.empty() || e.find("pack_weights = false") != std::string::npos) << e;  // tiny matrices may stay unpacked
  auto shard = TpShard::create(*m, 1, 2);
  EXPECT_EQ(shard->config().n_heads, 4);
  EXPECT_EQ(shard->config().n_kv_heads, 2);
  EXPECT_EQ(shard->config().intermediate_size, 86);
  dist::Comm local = dist::Comm::local();
  KvCache kv(shard->config(), 4);
  int32_t t = 1;
  float lg[1];
  EXPECT_NE(error_of([&] { shard->forward(&t, 1, kv, lg, false, local); }).find("shard 1/2 run with communicator rank 0/1"),
            std::string::npos);
}

// The plan TpShard and the device runner's shards share (tp_plan): contiguous heads, the
// uneven intermediate split, the o_proj bias on rank 0, and its errors; the slices' byte counts
// and copies (tp_slice_bytes, tp_copy_slice), quantized blocks included.
TEST(TpForward, PlanAndSlicesAreTheShardsRules) {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 64, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 8, c.intermediate_size = 172, c.n_layers = 2;
  const TpPlan whole = tp_plan(c, 0, 1);
  EXPECT_EQ(whole.q1, 64);
  EXPECT_EQ(whole.k1, 32);
  EXPECT_EQ(whole.i1, 172);
  EXPECT_TRUE(whole.o_bias);
  EXPECT_EQ(whole.config.n_heads, 8);
  const TpPlan r1 = tp_plan(c, 1, 2);
  EXPECT_EQ(r1.rank, 1);
  EXPECT_EQ(r1.world, 2);
  EXPECT_EQ(r1.q0, 32);
  EXPECT_EQ(r1.q1, 64);
  EXPECT_EQ(r1.k0, 16);
  EXPECT_EQ(r1.k1, 32);
  EXPECT_EQ(r1.i0, 86);
  EXPECT_EQ(r1.i1, 172);
  EXPECT_FALSE(r1.o_bias);
  EXPECT_EQ(r1.config.n_heads, 4);
  EXPECT_EQ(r1.config.n_kv_heads, 2);
  EXPECT_EQ(r1.config.intermediate_size, 86);
  EXPECT_EQ(r1.config.hidden_size, 64);
  EXPECT_TRUE(tp_plan(c, 0, 2).o_bias);
  // World 4: one K/V head and its two query heads per rank; 172 = 43 x 4.
  for (int r = 0; r < 4; ++r) {
    const TpPlan p = tp_plan(c, r, 4);
    EXPECT_EQ(p.q0, r * 16);
    EXPECT_EQ(p.k0, r * 8);
    EXPECT_EQ(p.k1 - p.k0, 8);
    EXPECT_EQ(p.i0, 43 * r);
    EXPECT_EQ(p.i1 - p.i0, 43);
  }
  c.intermediate_size = 173;  // uneven: 43, 43, 43, 44
  EXPECT_EQ(tp_plan(c, 3, 4).i0, 129);
  EXPECT_EQ(tp_plan(c, 3, 4).i1, 173);
  EXPECT_EQ(tp_plan(c, 0, 4).i1, 43);
  EXPECT_EQ(error_of([&] { tp_plan(c, 0, 3); }),
            "tensor parallel: 8 attention heads and 4 K/V heads do not split over 3 ranks (both must be multiples of the "
            "world size)");
  EXPECT_EQ(error_of([&] { tp_plan(c, 2, 2); }), "tensor parallel: rank 2 of world 2");
  EXPECT_EQ(error_of([&] { tp_plan(c, 0, 0); }), "tensor parallel: rank 0 of world 0");
  ModelConfig g = c;
  g.model_type = "gemma3";
  EXPECT_EQ(error_of([&] { tp_plan(g, 0, 2); }),
            "tensor parallel: model_type \"gemma3\" is not supported (llama, mistral, qwen2, qwen3)");
  ModelConfig small = c;
  small.intermediate_size = 3;
  EXPECT_EQ(error_of([&] { tp_plan(small, 0, 4); }), "tensor parallel: intermediate_size 3 is smaller than the world size 4");

  // F32 [3, 10]: rows 1..3, columns 2..5.
  std::vector<float> m(30);
  for (int i = 0; i < 30; ++i) m[size_t(i)] = float(i);
  EXPECT_EQ(tp_slice_bytes(kernels::WType::F32, 10, 1, 3, 2, 5, "m"), size_t(2 * 3 * 4));
  std::vector<float> out(6, -1);
  tp_copy_slice(m.data(), kernels::WType::F32, 10, 1, 3, 2, 5, out.data(), "m");
  EXPECT_EQ(out, (std::vector<float>{12, 13, 14, 22, 23, 24}));
  // BF16 (2 bytes): any column; Q4_Z128 (68 bytes per 128 columns): only at multiples of 128.
  EXPECT_EQ(tp_slice_bytes(kernels::WType::BF16, 10, 0, 4, 3, 4, "b"), size_t(4 * 2));
  EXPECT_EQ(tp_slice_bytes(kernels::WType::Q4_Z128, 256, 0, 5, 128, 256, "q"), size_t(5 * 68));
  EXPECT_EQ(tp_slice_bytes(kernels::WType::Q4_Z, 256, 2, 5, 0, 96, "q"), size_t(3 * 3 * 20));
  std::vector<uint8_t> q(size_t(3 * 2 * 68));
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 7 + 1);
  std::vector<uint8_t> qo(size_t(3 * 68));
  tp_copy_slice(q.data(), kernels::WType::Q4_Z128, 256, 0, 3, 128, 256, qo.data(), "q");
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(std::equal(qo.begin() + r * 68, qo.begin() + (r + 1) * 68, q.begin() + r * 136 + 68)) << r;
  EXPECT_EQ(error_of([&] { tp_slice_bytes(kernels::WType::Q4_Z128, 256, 0, 5, 0, 64, "layer 0 down_proj"); }),
            "tensor parallel: layer 0 down_proj (Q4_Z128, blocks of 128 columns) cannot be split at columns 0..64: use a "
            "world size that keeps the split at block boundaries");
  EXPECT_NE(error_of([&] { tp_slice_bytes(kernels::WType::F32, 10, 0, 1, 4, 11, "m"); }).find("columns 4..11 of a 10-column"),
            std::string::npos);
}

namespace {

// CacheBlend under tensor parallelism: a prompt prefilled exactly, then the cached K/V of every
// reused row in layers 1.. moved by a row-specific amount (a function of the global K/V column,
// so each rank moves its heads' share of the same change); forward_blend recomputes the rows
// that deviate most. world 0: Model::forward_blend on the whole model.
struct BlendRun {
  std::vector<float> logits, rank1_logits;
  BlendStats st;
};

BlendRun run_blend(const std::string& dir, int world, const std::vector<int32_t>& prompt, int64_t vocab,
                   const BlendOptions& base) {
  const int64_t n = int64_t(prompt.size());
  const size_t bytes = size_t(2 * vocab) * sizeof(float) + sizeof(BlendStats);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* out = static_cast<float*>(mem);
  std::fill(out, out + 2 * vocab, std::nanf(""));
  auto* st = reinterpret_cast<BlendStats*>(out + 2 * vocab);
  dist::run_ranks(std::max(world, 1), [&](dist::Comm& c) {
    LoadOptions o;
    o.pack_weights = world == 0;
    auto m = Model::load(dir, o);
    std::unique_ptr<TpShard> shard = world ? TpShard::create(*m, c.rank(), world) : nullptr;
    const ModelConfig& cfg = shard ? shard->config() : m->config();
    KvCache kv(cfg, n + 1);
    std::vector<float> lg(static_cast<size_t>(n * vocab));
    if (shard) shard->forward(prompt.data(), n, kv, lg.data(), false, c);
    else m->forward(prompt.data(), n, kv, lg.data(), false);
    const int64_t nkv = cfg.n_kv_heads * cfg.head_dim, col0 = (shard ? c.rank() : 0) * nkv;
    for (int64_t l = 1; l < cfg.n_layers; ++l)
      for (int64_t p = 0; p < n - 1; ++p) {
        const float amp = 0.03f * float(1 + (p * 5) % (n - 1));  // distinct per row
        for (int64_t j = 0; j < nkv; ++j) {
          const float f = std::sin(float(l * 13 + p * 7) + 0.37f * float(col0 + j));
          kv.k(l)[p * nkv + j] += amp * f;
          kv.v(l)[p * nkv + j] -= amp * f;
        }
      }
    std::vector<uint8_t> reused(size_t(n), 1);
    BlendOptions bo = base;
    bo.reused = reused.data();
    KvView v = kv.view();
    v.n_past = 0;
    const BlendStats s = shard ? shard->forward_blend(prompt.data(), n, v, bo, lg.data(), c)
                               : m->forward_blend(prompt.data(), n, v, bo, lg.data());
    if (c.rank() == 0) *st = s, std::copy(lg.begin(), lg.begin() + vocab, out);
    if (c.rank() == 1) std::copy(lg.begin(), lg.begin() + vocab, out + vocab);
  }, size_t(1) << 16, 120);
  BlendRun r;
  r.logits.assign(out, out + vocab);
  r.rank1_logits.assign(out + vocab, out + 2 * vocab);
  r.st = *st;
  munmap(mem, bytes);
  return r;
}

void expect_blend_agree(const BlendRun& ref, const BlendRun& got, const std::string& what) {
  expect_logits_agree(ref.logits, got.logits, what);
  EXPECT_EQ(ref.st.n_full_layers, got.st.n_full_layers) << what;
  EXPECT_EQ(ref.st.n_selected, got.st.n_selected) << what;
  EXPECT_EQ(ref.st.n_rows_late, got.st.n_rows_late) << what;
  EXPECT_EQ(ref.st.n_row_layers, got.st.n_row_layers) << what;
}

}  // namespace

// The same rows kept at TP = 1, 2, 4 as Model::forward_blend: logits agree, and rank 1's are
// rank 0's bit for bit. The moved K/V make the logits depend on which rows are recomputed (a
// blend at another ratio is far off), so agreement means the same selection. One selection at
// the check layer, and gradual filtering (50% at the check layer, 25% from the next).
TEST(TpForward, CacheBlendSelectsTheSameRowsAtTp2AndTp4) {
  FixtureSpec s;
  s.arch = "qwen2";
  s.hidden = 128, s.heads = 16, s.kv_heads = 4, s.head_dim = 8, s.intermediate = 172, s.layers = 4;
  s.tokenizer_kind = "";
  s.vocab = 300;
  s.init_std = 0.08f;
  s.seed = 11;
  const std::string dir = test::make_temp_dir("tp_blend");
  dist::run_ranks(1, [&](dist::Comm&) { write_fixture_model(dir, s); });
  const std::vector<int32_t> prompt{5, 17, 240, 3, 99, 150, 150, 42, 7, 260, 11, 64, 201, 33, 8, 190, 77, 120, 2, 9};
  BlendOptions one;
  one.check_layer = 1, one.ratio = 0.25f;
  BlendOptions taper = one;
  taper.first_ratio = 0.5f, taper.taper_layers = 1;
  for (const auto& [name, bo] : {std::pair{"one selection", one}, std::pair{"gradual", taper}}) {
    SCOPED_TRACE(name);
    const BlendRun plain = run_blend(dir, 0, prompt, s.vocab, bo);
    EXPECT_EQ(plain.st.n_full_layers, 1);
    EXPECT_EQ(plain.st.n_selected, 5);  // ceil(0.25 x 19 candidates)
    const BlendRun tp1 = run_blend(dir, 1, prompt, s.vocab, bo);
    expect_blend_agree(plain, tp1, "TP=1 vs Model::forward_blend");
    for (int world : {2, 4}) {
      const BlendRun t = run_blend(dir, world, prompt, s.vocab, bo);
      expect_blend_agree(tp1, t, "TP=" + std::to_string(world) + " vs TP=1");
      EXPECT_EQ(t.logits, t.rank1_logits) << "TP=" << world << ": rank 1's logits are not rank 0's";
    }
  }
  // Which rows are recomputed matters here: another ratio gives other logits.
  BlendOptions more = one;
  more.ratio = 0.6f;
  const BlendRun a = run_blend(dir, 1, prompt, s.vocab, one), b = run_blend(dir, 1, prompt, s.vocab, more);
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.logits.size(); ++i)
    diff = std::max(diff, std::fabs(a.logits[i] - b.logits[i])), scale = std::max(scale, std::fabs(a.logits[i]));
  EXPECT_GT(diff, 1e-2f * std::max(scale, 1.0f)) << "the moved K/V do not change the logits: the test would not see a wrong selection";
}
